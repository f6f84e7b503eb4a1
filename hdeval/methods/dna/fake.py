"""The fake LLM's answers to DnA's prompts (kinds ``dna_*``): deterministic stand-ins for the
aspects, weights and 1-10 scores, registered with the fake backend when DnA is used. They answer
from the question, responses, aspects and scores the request declares
(:mod:`hdeval.methods.dna.prompts`), never from the prompt's wording."""

from __future__ import annotations

import json
import math
import re

from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.fake import responder, stable_unit
from hdeval.methods.comparisons_fake import prompt_of

_FAKE_FACETS = [
    "clarity",
    "correctness",
    "completeness",
    "relevance",
    "conciseness",
    "depth",
    "safety",
    "creativity",
    "structure",
    "tone",
]


def _text(request: CompletionRequest, name: str) -> str:
    value = request.data.get(name, "")
    return value if isinstance(value, str) else ""


def fake_quality(text: str, aspect: str) -> float:
    """A deterministic 1-10 quality: longer and less repetitive is better, per aspect in varying
    measure, plus noise (so a weighted sum and a learned aggregator have something to find)."""
    words = re.findall(r"\w+", text.lower())
    uniq = len(set(words)) / max(1, len(words))
    length = math.tanh(len(words) / 120)
    w = stable_unit("dna-w", aspect)
    x = 0.55 * (w * length + (1 - w) * uniq) + 0.25 * length + 0.2 * stable_unit("dna-noise", aspect, text)
    return 1.0 + 9.0 * min(1.0, max(0.0, x))


def _fake_pair_scores(request: CompletionRequest, aspect: str) -> tuple[int, int]:
    first, second = _text(request, "response_a"), _text(request, "response_b")
    bias = 1.0 if stable_unit("dna-bias", aspect) < 0.4 else 0.0  # some aspects favour the first shown
    sa = min(10, max(1, round(fake_quality(first, aspect) + bias)))
    sb = min(10, max(1, round(fake_quality(second, aspect))))
    return sa, sb


@responder("dna_aspects")
def _fake_aspects(request: CompletionRequest, fake) -> Completion:
    _, n = prompt_of(request)
    k = int(request.data.get("k", 4))
    q = _text(request, "question")
    start = int(stable_unit("dna-aspects", q) * len(_FAKE_FACETS))
    names = [_FAKE_FACETS[(start + i) % len(_FAKE_FACETS)] for i in range(k)]
    text = json.dumps(
        {"aspects": [{"name": x, "definition": f"How well the response shows {x}."} for x in names]}
    )
    return Completion(text, None, n, max(1, len(text) // 4))


@responder("dna_weights")
def _fake_weights(request: CompletionRequest, fake) -> Completion:
    _, n = prompt_of(request)
    keys = list(request.data.get("aspect_keys", ()))
    q = _text(request, "question")
    text = json.dumps({"weights": {k: 5 + round(40 * stable_unit("dna-weight", q, str(k))) for k in keys}})
    return Completion(text, None, n, max(1, len(text) // 4))


def _fake_two(request: CompletionRequest, sa: int, sb: int) -> Completion:
    """The two scores as the request asks for them: by schema when it has one, else "7 4"."""
    text = json.dumps({"score_a": sa, "score_b": sb}) if request.json_schema else f"{sa} {sb}"
    return Completion(text, None, prompt_of(request)[1], 2)


@responder("dna_score")
def _fake_score(request: CompletionRequest, fake) -> Completion:
    return _fake_two(request, *_fake_pair_scores(request, _text(request, "aspect") or "aspect"))


@responder("dna_direct")
def _fake_direct(request: CompletionRequest, fake) -> Completion:
    return _fake_two(request, *_fake_pair_scores(request, "overall"))


@responder("dna_cot")
def _fake_cot(request: CompletionRequest, fake) -> Completion:
    _, n = prompt_of(request)
    sa, sb = _fake_pair_scores(request, "overall-cot")
    text = (
        f"Response A covers the question with {sa} of 10 in quality; 8 points matter here.\n"
        f"Response B is weaker or stronger in places.\nScores: {sa} {sb}"
    )
    return Completion(text, None, n, len(text) // 4)


@responder("dna_prompt_agg")
def _fake_prompt_agg(request: CompletionRequest, fake) -> Completion:
    rows = [(float(w), float(a), float(b)) for _, w, a, b in request.data.get("aspect_scores", ())]
    total = sum(w for w, _, _ in rows) or 1.0
    sa = sum(w * a for w, a, _ in rows) / total
    sb = sum(w * b for w, _, b in rows) / total
    return _fake_two(request, min(10, max(1, round(sa))), min(10, max(1, round(sb))))
