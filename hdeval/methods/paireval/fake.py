"""The fake LLM's answers to DIRECTEVAL prompts (kind ``yesno``)."""

from __future__ import annotations

import math

from hdeval.methods.comparisons_fake import fake_quality, label_responder

YES_NO = ("Yes", "No")


@label_responder("yesno", YES_NO, 2)
def _fake_yesno(blocks: list[str], question: str) -> float:
    return 1 / (1 + math.exp(-6 * (fake_quality(blocks[0], blocks[1], question) - 0.5)))
