"""The fake LLM's answers to comparison prompts (kind ``pair``): a deterministic stand-in for
which response is better, with a mild first-position bias for the swap to undo; and to
DIRECTEVAL's (kind ``yesno``). Both answer from the texts and question the request declares
(:func:`hdeval.methods.comparisons.label_request`), never from the prompt's wording."""

from __future__ import annotations

import math
import re

from hdeval.llm.backends.base import Completion, CompletionRequest, TokenLogprob
from hdeval.llm.backends.fake import FakeBackend, responder, stable_unit

LABELS = ("A", "B")

_WORD = re.compile(r"\w+")


def fake_quality(history: str, response: str, question: str) -> float:
    """A deterministic stand-in for response quality in [0, 1]: longer, more varied responses
    that pick up words of their own conversation do better; the weights depend on the question."""
    words = _WORD.findall(response.lower())
    if not words:
        return 0.0
    hist = set(_WORD.findall(history.lower()))
    uniq = len(set(words)) / len(words)
    length = math.tanh(len(words) / 20)
    overlap = len(set(words) & hist) / len(set(words))
    w = stable_unit("paireval-w", question)
    return (
        0.45 * length
        + 0.35 * (w * uniq + (1 - w) * overlap)
        + 0.2 * stable_unit("paireval-noise", response, question)
    )


def prompt_of(request: CompletionRequest) -> tuple[str, int]:
    """A fake responder's view of a request: its messages as one text, and their token count."""
    prompt = "\n".join(m.content for m in request.messages)
    return prompt, max(1, len(prompt) // 4)


def label_responder(kind: str, labels: tuple[str, str], shown: tuple[str, ...]):
    """Registers, as the fake LLM's answer to prompts of ``kind``, a label reply whose first
    label has the probability the decorated function gives from the texts the request declares
    it shows (its data's ``shown`` keys, in order) and its ``question``."""

    def register(probability):
        @responder(kind)
        def answer(request: CompletionRequest, fake: FakeBackend) -> Completion:
            found = [request.data.get(k) for k in shown]
            question = request.data.get("question")
            texts = [t for t in found if isinstance(t, str)]
            if len(texts) != len(found) or not isinstance(question, str):
                return Completion("?", None, 1, 1)
            n_prompt = prompt_of(request)[1]
            if fake.garbage and stable_unit("garbage", *texts, question) < fake.garbage:
                return Completion("I cannot decide.", None, n_prompt, 4)
            p = min(1 - 1e-6, max(1e-6, probability(texts, question)))
            top = None
            if fake.logprobs and request.top_logprobs:
                alts = sorted(
                    [TokenLogprob(labels[0], math.log(p)), TokenLogprob(labels[1], math.log(1 - p))],
                    key=lambda t: -t.logprob,
                )
                top = (tuple(alts),)
            return Completion(labels[0] if p >= 0.5 else labels[1], top, n_prompt, 1)

        return probability

    return register


FAKE_FIRST_BIAS = 0.4


@label_responder("pair", LABELS, ("history_a", "response_a", "history_b", "response_b"))
def _fake_pair(blocks: list[str], question: str) -> float:
    qa = fake_quality(blocks[0], blocks[1], question)
    qb = fake_quality(blocks[2], blocks[3], question)
    # a mild preference for what is shown first, as real LLMs have: the swap has something to
    # undo; and a pair-specific whim, so judgments are not perfectly transitive and the choice of
    # comparison examples matters (as it does with a real LLM)
    whim = 0.15 * (stable_unit("paireval-pair", *sorted((blocks[1], blocks[3]))) - 0.5)
    return 1 / (1 + math.exp(-8 * (qa - qb + whim) - FAKE_FIRST_BIAS))


@label_responder("yesno", ("Yes", "No"), ("history", "response"))
def _fake_yesno(blocks: list[str], question: str) -> float:
    return 1 / (1 + math.exp(-6 * (fake_quality(blocks[0], blocks[1], question) - 0.5)))
