"""What a request accepts as its answer (``CompletionRequest.answer`` for a scale or label words;
``json_schema`` / ``json_mode`` for JSON), and how each backend is told: a llama.cpp grammar, the
body fields of llama.cpp's server, or of an OpenAI-compatible server. Only JSON goes to the latter:
``logit_bias`` for words needs token ids of a tokenizer hdeval does not know there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Union

MAX_SCALE_VALUES = 1000  # a grammar of 1000 alternatives is still small
MAX_SCALE_COUNT = 8
MAX_LABELS = 20
MAX_LABEL_CHARS = 40


@dataclass(frozen=True)
class Scale:
    """``count`` whole numbers from ``low`` to ``high``, separated by one space ("7 4")."""

    low: int
    high: int
    count: int = 1

    def __post_init__(self) -> None:
        for name in ("low", "high", "count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"Scale.{name} must be an int, got {v!r}")
        if not 0 <= self.low <= self.high or self.high - self.low + 1 > MAX_SCALE_VALUES:
            raise ValueError(
                f"Scale {self.low}-{self.high} is not a scale of 1 to {MAX_SCALE_VALUES} values from 0 up"
            )
        if not 1 <= self.count <= MAX_SCALE_COUNT:
            raise ValueError(f"Scale.count must be 1 to {MAX_SCALE_COUNT}, got {self.count}")

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(str(v) for v in range(self.low, self.high + 1))

    @property
    def single_token(self) -> bool:
        """One digit answers it: its distribution is read from the first token."""
        return self.count == 1 and self.high <= 9


@dataclass(frozen=True)
class Labels:
    """Exactly one of ``words`` (e.g. ``("A", "B")``, ``("Yes", "No")``)."""

    words: tuple[str, ...]

    def __post_init__(self) -> None:
        w = self.words
        if not isinstance(w, tuple) or not 2 <= len(w) <= MAX_LABELS:
            raise ValueError(f"Labels needs a tuple of 2 to {MAX_LABELS} words, got {w!r}")
        for word in w:
            if (
                not isinstance(word, str)
                or not 0 < len(word) <= MAX_LABEL_CHARS
                or not word.isprintable()
                or word != word.strip()
            ):
                raise ValueError(f"label {word!r} is not a short printable word without surrounding space")
        if len(set(w)) != len(w):
            raise ValueError(f"Labels has a word twice: {w!r}")

    @property
    def single_token(self) -> bool:
        """The first token tells the word (no word begins another, as "No" begins "Nope")."""
        return not any(a != b and b.startswith(a) for a in self.words for b in self.words)


@dataclass(frozen=True)
class JsonSchema:
    schema: str  # canonical JSON text


@dataclass(frozen=True)
class JsonObject:
    """Any JSON object."""


Answer = Union[Scale, Labels]  # what CompletionRequest.answer holds
Constraint = Union[Scale, Labels, JsonSchema, JsonObject]


def constraint_of(request: Any) -> Constraint | None:
    """The one constraint a request carries: its JSON schema, else JSON mode, else ``answer``."""
    schema = getattr(request, "json_schema", None)
    if schema is not None:
        return JsonSchema(schema if isinstance(schema, str) else json.dumps(schema))
    if getattr(request, "json_mode", False):
        return JsonObject()
    return getattr(request, "answer", None)


_GBNF_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}}


def _literal(word: str) -> str:
    """A GBNF string literal."""
    return '"' + word.translate(_GBNF_ESCAPES) + '"'


def to_gbnf(constraint: Constraint | None) -> str | None:
    """A llama.cpp grammar for a scale or label words; None for JSON (llama.cpp builds those
    from the schema itself) and for free text."""
    if isinstance(constraint, Labels):
        return "root ::= " + " | ".join(_literal(w) for w in constraint.words)
    if isinstance(constraint, Scale):
        if constraint.high <= 9:
            num = f"[{constraint.low}-{constraint.high}]"
        else:
            num = "(" + " | ".join(_literal(w) for w in constraint.words) + ")"
        return "root ::= " + ' " " '.join([num] * constraint.count)
    return None


def to_llama_params(constraint: Constraint | None) -> dict[str, Any]:
    """Body fields for llama.cpp's server (the local xllamacpp runtime): a grammar, or JSON as for
    an OpenAI-compatible server but without ``strict``."""
    grammar = to_gbnf(constraint)
    return {"grammar": grammar} if grammar else to_openai_params(constraint, strict=False)


def to_openai_params(
    constraint: Constraint | None, schema_supported: bool = True, strict: bool = True
) -> dict[str, Any]:
    """Body fields for an OpenAI-compatible server: structured outputs for a JSON schema (JSON
    mode where the server does not take schemas), nothing for a scale or labels."""
    if isinstance(constraint, JsonSchema) and schema_supported:
        # OpenAI structured outputs; vLLM and llama.cpp's server constrain decoding to it
        schema = {"name": "reply", "schema": json.loads(constraint.schema)}
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {**schema, "strict": True} if strict else schema,
            }
        }
    if isinstance(constraint, (JsonSchema, JsonObject)):
        return {"response_format": {"type": "json_object"}}
    return {}


def obeys(constraint: Constraint | None, text: str) -> bool:
    """Whether a reply's text is an answer the constraint allows (JSON: parses as an object;
    the schema's details are the caller's validation)."""
    if constraint is None:
        return True
    if not isinstance(text, str) or len(text) > 1_000_000:
        return False
    if isinstance(constraint, Labels):
        return text in constraint.words
    if isinstance(constraint, Scale):
        parts = text.split(" ")
        return len(parts) == constraint.count and all(
            re.fullmatch(r"[1-9][0-9]{0,5}|0", p) is not None and constraint.low <= int(p) <= constraint.high
            for p in parts
        )
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def first_token_word(constraint: Scale | Labels, token: str) -> str | None:
    """The one answer word a first token under the constraint's grammar begins, or None when it
    begins several (its probability cannot be given to one word) or none."""
    words = constraint.words
    if not token:
        return None
    hits = [w for w in words if w.startswith(token)]
    return hits[0] if len(hits) == 1 else None
