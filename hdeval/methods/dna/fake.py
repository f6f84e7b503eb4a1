"""The fake LLM's answers to DnA's prompts (kinds ``dna_*``): deterministic stand-ins for the
aspects, weights and 1-10 scores, registered with the fake backend when DnA is used."""

from __future__ import annotations

import json
import math
import re

from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.fake import responder, stable_unit
from hdeval.methods.comparisons_fake import prompt_of

_FAKE_SAMPLE = re.compile(r"<sample>\n(.*?)\n</sample>", re.S)
_FAKE_K = re.compile(r"exactly (\d+) aspects")
_FAKE_KEYS = re.compile(r"^Aspect keys: (.*)$", re.M)
_FAKE_ASPECT = re.compile(r"^Aspect: (.+?):", re.M)
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


def _fake_sample(request: CompletionRequest) -> str:
    user = next((m.content for m in request.messages if m.role == "user"), "")
    m = _FAKE_SAMPLE.search(user)
    return m.group(1) if m else user


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
    first, _, second = _fake_sample(request).partition("\n\nResponse A:\n")[2].partition("\n\nResponse B:\n")
    bias = 1.0 if stable_unit("dna-bias", aspect) < 0.4 else 0.0  # some aspects favour the first shown
    sa = min(10, max(1, round(fake_quality(first, aspect) + bias)))
    sb = min(10, max(1, round(fake_quality(second, aspect))))
    return sa, sb


@responder("dna_aspects")
def _fake_aspects(request: CompletionRequest, fake) -> Completion:
    prompt, n = prompt_of(request)
    m = _FAKE_K.search(prompt)
    k = int(m.group(1)) if m else 4
    q = _fake_sample(request)
    start = int(stable_unit("dna-aspects", q) * len(_FAKE_FACETS))
    names = [_FAKE_FACETS[(start + i) % len(_FAKE_FACETS)] for i in range(k)]
    text = json.dumps(
        {"aspects": [{"name": x, "definition": f"How well the response shows {x}."} for x in names]}
    )
    return Completion(text, None, n, max(1, len(text) // 4))


@responder("dna_weights")
def _fake_weights(request: CompletionRequest, fake) -> Completion:
    prompt, n = prompt_of(request)
    m = _FAKE_KEYS.search(prompt)
    try:
        keys = json.loads(m.group(1)) if m else []
    except json.JSONDecodeError:
        keys = []
    q = _fake_sample(request)
    text = json.dumps({"weights": {k: 5 + round(40 * stable_unit("dna-weight", q, str(k))) for k in keys}})
    return Completion(text, None, n, max(1, len(text) // 4))


def _fake_two(request: CompletionRequest, sa: int, sb: int) -> Completion:
    """The two scores as the request asks for them: by schema when it has one, else "7 4"."""
    text = json.dumps({"score_a": sa, "score_b": sb}) if request.json_schema else f"{sa} {sb}"
    return Completion(text, None, prompt_of(request)[1], 2)


@responder("dna_score")
def _fake_score(request: CompletionRequest, fake) -> Completion:
    m = _FAKE_ASPECT.search(prompt_of(request)[0])
    return _fake_two(request, *_fake_pair_scores(request, m.group(1) if m else "aspect"))


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


_FAKE_AGG_LINE = re.compile(r"^- .+? \((\d+)%\): Response A ([\d.]+); Response B ([\d.]+)$", re.M)


@responder("dna_prompt_agg")
def _fake_prompt_agg(request: CompletionRequest, fake) -> Completion:
    rows = [(float(w), float(a), float(b)) for w, a, b in _FAKE_AGG_LINE.findall(prompt_of(request)[0])]
    total = sum(w for w, _, _ in rows) or 1.0
    sa = sum(w * a for w, a, _ in rows) / total
    sb = sum(w * b for w, _, b in rows) / total
    return _fake_two(request, min(10, max(1, round(sa))), min(10, max(1, round(sb))))
