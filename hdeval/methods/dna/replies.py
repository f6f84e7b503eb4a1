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

from hdeval.core.types import LONE_SURROGATE_PROBLEM, has_lone_surrogate
from hdeval.judge.fill import extract_json, score_pair
from hdeval.llm.backends.base import Completion, CompletionRequest, generated_tokens

SCALE10 = (1.0, 10.0)


# The reply of a pairwise score prompt as a schema servers can enforce (OpenAI-compatible
# ``response_format``, a local model's grammar): one whole 1-10 score per response, named by side,
# so no reader has to guess which number belongs to which response. The text reader stays the
# fallback for servers that ignore it.
def json_object(properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema of an object with exactly these properties."""
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


_SCORE = {"type": "integer", "minimum": 1, "maximum": 10}
PAIR_SCHEMA = json.dumps(json_object({"score_a": _SCORE, "score_b": _SCORE}), sort_keys=True)
_LONGEST_PAIR = {"score_a": 10, "score_b": 10}


def json_budget(longest: Any) -> int:
    """Tokens for a schema's longest reply: pretty-printed with 2-space indents, at one token a
    character (a small model's tokenizer spells JSON's spaces and digits nearly one by one), and
    room for a ```json fence around it."""
    return len(json.dumps(longest, indent=2)) + len("```json\n\n```") + 4


_PAIR_JSON_TOKENS = json_budget(_LONGEST_PAIR)


def structured_pair(request: CompletionRequest) -> CompletionRequest:
    """``request`` asking for its two scores as :data:`PAIR_SCHEMA` JSON."""
    return dataclasses.replace(
        request, json_schema=PAIR_SCHEMA, max_tokens=max(request.max_tokens or 0, _PAIR_JSON_TOKENS)
    )


def more_room(request: CompletionRequest, reply: Completion) -> CompletionRequest | None:
    """For a JSON reply cut short at its token budget (an object never closed), the request
    again with twice the room; None for any other reply (:func:`hdeval.judge.fill.fill_matrix`'s retry)."""
    text = (reply.text or "").strip()
    if request.json_schema is None or "{" not in text or reply.completion_tokens < request.max_tokens:
        return None
    try:
        extract_json(text)
        return None
    except ValueError:
        return dataclasses.replace(request, max_tokens=2 * request.max_tokens)


def _feedback(problem: str) -> str:
    return (
        f"That reply could not be used: {problem}. Reply again with only the JSON object "
        "in the requested form."
    )


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
                raise ValueError(
                    f"aspect {i}: 'definition' must be a non-empty string of at most 600 characters"
                )
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
_JSON_SIDE = re.compile(r'"score_([ab])"\s*:\s*([0-9]+)')
_INTEGER = re.compile(r"(?<![0-9.])[0-9]+(?![0-9.])")


def _score_spans(text: str) -> list[tuple[int, int]] | None:
    """Where the text writes side A's and side B's score: by their JSON keys, else its only two
    whole numbers; None when it cannot tell."""
    by_key = {m.group(1): m.span(2) for m in _JSON_SIDE.finditer(text)}
    if len(_JSON_SIDE.findall(text)) == 2 and set(by_key) == {"a", "b"}:
        return [by_key["a"], by_key["b"]]
    spans = [m.span() for m in _INTEGER.finditer(text)]
    return spans if len(spans) == 2 else None


def _weighted_at(position, expected: float) -> tuple[float | None, str | None]:
    """The probability-weighted 1-10 score at the position where ``expected`` was generated."""
    mass = total = 0.0
    best = -math.inf
    for alt in position:
        t = alt.token.strip() if isinstance(alt.token, str) else ""
        lp = alt.logprob
        if not _WHOLE.fullmatch(t) or not 1 <= int(t) <= 10:
            continue
        if not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 1e-6:
            return None, f"an unreadable logprob for token {t!r}"
        best = max(best, lp)
        p = math.exp(max(lp, -1e4))
        mass += p
        total += p * int(t)
    if mass < _MIN_SCORE_MASS:
        return None, f"the score tokens have {mass:.0%} of the probability where {expected:g} was generated"
    if position[0].logprob < best - 1e-6:
        # at temperature 0 the generated score is the likeliest allowed one: these probabilities
        # are not the ones it was chosen from (a server reporting them from before its constraint)
        return None, f"{expected:g} was generated but is not the likeliest score token there"
    return total / mass, None


def read_pair_weighted(c: Completion) -> tuple[tuple[tuple[float, float] | None, str | None], str | None]:
    """The two 1-10 scores of a reply, each the probability-weighted mean of the score tokens offered
    where the text's number was generated (as G-Eval weights one score; the paper reads the text
    only), and why the text was read instead (None when the logprobs were used or absent).

    The logprobs are used only when they line up with the text: each position's generated token
    (see :func:`~hdeval.llm.backends.base.generated_tokens`) spelling the text, each score one token,
    the likeliest score token at its position. A tokenizer whose "1" begins "10" has it read as 1."""
    got, why = score_pair(c, SCALE10)
    if got is None or not c.top_logprobs:
        return (got, why), None
    tokens = generated_tokens(c)
    if tokens is None:
        return (
            got,
            None,
        ), "the reply's tokens do not spell its text (a prefix or fence the server stripped?)"
    spans = _score_spans(c.text)
    if spans is None:
        return (got, None), "its two scores cannot be told apart in the text"
    starts = [0]
    for tok in tokens:
        starts.append(starts[-1] + len(tok))
    values = []
    for (start, end), expected in zip(spans, got):
        i = next(i for i in range(len(tokens)) if starts[i] <= start < starts[i + 1])
        tok = tokens[i]
        if tok.strip() != c.text[start:end] or starts[i + 1] < end:
            return (got, None), f"the score {c.text[start:end]} is not one token"
        value, doubt = _weighted_at(c.top_logprobs[i], expected)
        if value is None:
            return (got, None), doubt
        values.append(value)
    return ((values[0], values[1]), None), None


def _read_pair_weighted(c: Completion):
    """:func:`read_pair_weighted`'s scores."""
    return read_pair_weighted(c)[0]


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
