"""How DnA reads the LLM's replies: the JSON of aspects and weights, and the two 1-10 scores of a
pairwise reply (its text, its top logprobs, or the last line of a chain of thought)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hdeval.backends.base import Completion, CompletionRequest
from hdeval.judge import score_pair
from hdeval.types import LONE_SURROGATE_PROBLEM, has_lone_surrogate

SCALE10 = (1.0, 10.0)

# The reply of a pairwise score prompt as a schema servers can enforce (OpenAI-compatible
# ``response_format``, a local model's grammar): one whole 1-10 score per response, named by side,
# so no reader has to guess which number belongs to which response. The text reader stays the
# fallback for servers that ignore it.
def json_object(properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema of an object with exactly these properties."""
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}


_SCORE = {"type": "integer", "minimum": 1, "maximum": 10}
PAIR_SCHEMA = json.dumps(json_object({"score_a": _SCORE, "score_b": _SCORE}), sort_keys=True)
_PAIR_JSON_TOKENS = 24  # '{"score_a": 10, "score_b": 10}' with room for a tokenizer's spaces


def structured_pair(request: CompletionRequest) -> CompletionRequest:
    """``request`` asking for its two scores as :data:`PAIR_SCHEMA` JSON."""
    return dataclasses.replace(request, json_schema=PAIR_SCHEMA,
                               max_tokens=max(request.max_tokens or 0, _PAIR_JSON_TOKENS))


def _feedback(problem: str) -> str:
    return (f"That reply could not be used: {problem}. Reply again with only the JSON object "
            "in the requested form.")


@dataclass(frozen=True)
class AspectSpec:
    key: str
    name: str
    definition: str


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def validate_aspects(k: int):
    def check(obj: Any) -> list[AspectSpec]:
        items = obj.get("aspects") if isinstance(obj, dict) else None
        if not isinstance(items, list):
            raise ValueError('the reply needs the form {"aspects": [{"name": ..., "definition": ...}]}')
        if len(items) != k:
            raise ValueError(f"expected exactly {k} aspects, got {len(items)}")
        out: list[AspectSpec] = []
        seen: set[str] = set()
        for i, item in enumerate(items, 1):
            name = item.get("name") if isinstance(item, dict) else None
            definition = item.get("definition") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name.strip() or len(name) > 100:
                raise ValueError(f"aspect {i}: 'name' must be a short non-empty string")
            if not isinstance(definition, str) or not definition.strip() or len(definition) > 600:
                raise ValueError(f"aspect {i}: 'definition' must be a non-empty string of at most 600 characters")
            if has_lone_surrogate(name + definition):
                raise ValueError(f"aspect {i} {LONE_SURROGATE_PROBLEM}")
            name = _one_line(name, 100)
            if name.lower() in seen:
                raise ValueError(f"aspect {i}: {name!r} is listed twice")
            seen.add(name.lower())
            out.append(AspectSpec(name, name, _one_line(definition, 600)))
        return out

    return check


def validate_weights(keys: Sequence[str]):
    def check(obj: Any) -> np.ndarray:
        w = obj.get("weights") if isinstance(obj, dict) else None
        if not isinstance(w, dict):
            raise ValueError('the reply needs the form {"weights": {"<aspect key>": <percentage>, ...}}')
        missing = [k for k in keys if k not in w]
        if missing:
            raise ValueError(f"no weight for {', '.join(missing)}")
        extra = sorted(str(k) for k in w if k not in keys)
        if extra:
            raise ValueError(f"unknown aspect key(s) {', '.join(extra)[:200]}")
        vals = []
        for key in keys:
            x = w[key]
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise ValueError(f"the weight of {key} is not a number ({str(x)[:40]!r})")
            if x < 0:
                raise ValueError(f"the weight of {key} is negative ({x})")
            vals.append(float(x))
        total = sum(vals)
        if not math.isfinite(total):  # 1e308 + 1e308: normalising would give zeros
            raise ValueError("the weights are too large to add up; give percentages")
        if total <= 0:
            raise ValueError("the weights add up to 0")
        return np.array(vals) / total

    return check


def _read_pair(c: Completion):
    return score_pair(c, SCALE10)


_WHOLE = re.compile(r"[0-9]{1,2}")
_MIN_SCORE_MASS = 0.05  # below this the score tokens are not what the model meant to say


def _read_pair_weighted(c: Completion):
    """Two 1-10 scores, each the probability-weighted mean of the score tokens offered where its
    number was generated (as G-Eval weights one score; the paper reads the text only), when the top
    logprobs line up with the text: the most likely token at a position (temperature 0) must be the
    whole number, and the two so found the two the text gives; else the text as :func:`_read_pair`
    reads it. A tokenizer splitting "10" into "1" "0" has its "1" alternative read as 1."""
    got, why = score_pair(c, SCALE10)
    if got is None or not c.top_logprobs:
        return got, why
    chosen: list[str] = []
    for position in c.top_logprobs[:64]:
        alts = [a for a in position if isinstance(a.token, str) and isinstance(a.logprob, (int, float))
                and math.isfinite(a.logprob)]
        if not alts:
            return got, None
        chosen.append(max(alts, key=lambda a: a.logprob).token)
    numbers = []
    for i, tok in enumerate(chosen):
        t = tok.strip()
        before = chosen[i - 1] if i else ""
        after = chosen[i + 1] if i + 1 < len(chosen) else ""
        if (_WHOLE.fullmatch(t) and not (before[-1:].isdigit() and tok[:1].isdigit())
                and not (tok[-1:].isdigit() and after[:1].isdigit())):
            numbers.append(i)
    if len(numbers) < 2:
        return got, None
    values = []
    for i, expected in zip(numbers[:2], got):
        if float(chosen[i].strip()) != expected:
            return got, None  # the tokens do not line up with the text
        mass = total = 0.0
        for alt in c.top_logprobs[i]:
            t = alt.token.strip() if isinstance(alt.token, str) else ""
            lp = alt.logprob
            if not _WHOLE.fullmatch(t) or not 1 <= int(t) <= 10:
                continue
            if not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 1e-6:
                return got, None
            p = math.exp(max(lp, -1e4))
            mass += p
            total += p * int(t)
        if mass < _MIN_SCORE_MASS:
            return got, None
        values.append(total / mass)
    return (values[0], values[1]), None


_SCORES_LINE = re.compile(r"scores?\s*:", re.I)


def _read_cot(c: Completion):
    """Chain-of-thought: the two scores on the last non-empty line (``Scores: 7 4``)."""
    lines = [ln for ln in (c.text or "")[-4000:].splitlines() if ln.strip()]
    if not lines:
        return None, "the reply is empty"
    last = lines[-1]
    got, why = score_pair(Completion(last), SCALE10)
    if got is None:
        return None, f"the last line does not hold two scores in 1-10: {_one_line(last, 60)!r}"
    return got, None


def _side(parsed, i: int) -> tuple[float, str | None]:
    got, why = parsed
    return (math.nan, why) if got is None else (float(got[i]), None)
