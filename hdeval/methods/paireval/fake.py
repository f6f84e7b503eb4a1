"""The fake LLM's answers to DIRECTEVAL prompts (kind ``yesno``)."""

from __future__ import annotations

import math

from hdeval.backends.base import Completion, CompletionRequest
from hdeval.backends.fake import FakeBackend, responder
from hdeval.methods.comparisons_fake import _BLOCK, _label_completion, fake_quality

YES_NO = ("Yes", "No")


@responder("yesno")
def _fake_yesno(request: CompletionRequest, fake: FakeBackend) -> Completion:
    user = request.messages[-1].content
    blocks = _BLOCK.findall(user)
    question = user[user.rfind("</sample>"):]
    if len(blocks) < 2:
        return Completion("?", None, 1, 1)
    q = fake_quality(blocks[0], blocks[1], question)
    return _label_completion(request, fake, YES_NO, 1 / (1 + math.exp(-6 * (q - 0.5))))
