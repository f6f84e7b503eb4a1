"""The backend protocol and the request/response types every backend speaks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

from hdeval.llm.backends.constraints import Answer

#: a token count beyond this is not a count (``1e999``, a 5000-digit number): read as 0
MAX_TOKEN_COUNT = 10**12
#: a reply's top alternatives beyond these bounds are dropped when read back
MAX_POSITIONS = 4096
MAX_ALTERNATIVES = 64


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class CompletionRequest:
    """Everything that decides what the LLM answers. The cache key is built from this."""

    messages: tuple[Message, ...]
    temperature: float = 0.0
    max_tokens: int = 16
    top_logprobs: int | None = None  # ask for this many alternatives per generated token
    seed: int | None = None
    json_mode: bool = False
    # a JSON schema for the reply (canonical JSON text, so the request stays hashable)
    json_schema: str | None = None
    # which prompt this is ("score", ...) and what it was built from ({"sample": ..., "criterion":
    # ...}), as the method declares them: the fake LLM answers from these, never from the wording.
    # Never sent, not in the cache key
    kind: str = field(default="", compare=False)
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # never sent, only in the cache key: re-asking a request whose cached reply was unusable
    # keeps that reply cached for inspection; 0 leaves keys as they were
    attempt: int = 0
    # a scale (``Scale(1, 5)``) or label words (``Labels(("A", "B"))``); not in the key: an
    # OpenAI-compatible server is sent nothing for it, and the local backends, whose answers it
    # changes, carry a decoding version in their identity
    answer: Answer | None = None

    def key_fields(self) -> dict[str, Any]:
        """Decoding parameters that change the output (cache key material)."""
        extra: dict[str, Any] = {"json_schema": self.json_schema} if self.json_schema is not None else {}
        if self.attempt:
            extra["attempt"] = self.attempt
        return {
            **extra,
            "messages": [[m.role, m.content] for m in self.messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_logprobs": self.top_logprobs,
            "seed": self.seed,
            "json_mode": self.json_mode,
        }


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float


@dataclass(frozen=True)
class Completion:
    """A raw LLM reply: text, for each generated token (if asked) that token and then its top
    alternatives (see :func:`generated_tokens`), token usage."""

    text: str
    top_logprobs: tuple[tuple[TokenLogprob, ...], ...] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # tokens the server had to evaluate (fewer with KV-cache reuse); None when it cannot tell
    prompt_tokens_evaluated: int | None = None
    cached: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: an unreadable (NaN) logprob is stored as null and reads back as NaN."""
        # field by field: dataclasses.asdict deep-copies each logprob, the bulk of storing a reply
        lp = self.top_logprobs
        return {
            "text": self.text,
            "top_logprobs": None
            if lp is None
            else [
                [{"token": t.token, "logprob": None if math.isnan(t.logprob) else t.logprob} for t in pos]
                for pos in lp
            ],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_evaluated": self.prompt_tokens_evaluated,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Completion":
        """Read a stored completion with bounds: a non-string text reads as "", an unreadable
        logprob as NaN (the scorer records failures), a bad token count as 0. ValueError only when
        ``d`` is not a mapping."""
        if not isinstance(d, dict):
            raise ValueError(f"a stored completion must be a JSON object, not {type(d).__name__}")
        text = d.get("text")
        evaluated = d.get("prompt_tokens_evaluated")
        return cls(
            text=text if isinstance(text, str) else "",
            top_logprobs=read_top_logprobs(d.get("top_logprobs")),
            prompt_tokens=token_count(d.get("prompt_tokens")),
            completion_tokens=token_count(d.get("completion_tokens")),
            prompt_tokens_evaluated=None if evaluated is None else token_count(evaluated),
        )


def token_count(value: Any) -> int:
    """A token count from untrusted input: a non-negative integer up to MAX_TOKEN_COUNT (an
    int, an integral finite float, or a short string of ASCII digits); anything else is 0."""
    if isinstance(value, str):
        value = value.strip()
        value = int(value) if 0 < len(value) <= 13 and value.isascii() and value.isdigit() else 0
    elif isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool)  # a bool is an int
    return value if ok and 0 <= value <= MAX_TOKEN_COUNT else 0


def read_logprob(value: Any) -> float:
    """A log-probability from untrusted input, NaN when it is not one (a non-number, NaN, anything
    above 1e-6: ``1000`` would overflow ``exp``); below -10000 reads as -10000, a tiny positive as 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        lp = float(value)
    except (OverflowError, ValueError):  # an int too large for a float
        return math.nan
    if math.isnan(lp) or lp > 1e-6:
        return math.nan
    return min(max(lp, -1e4), 0.0)


def read_top_logprobs(lp: Any) -> tuple[tuple[TokenLogprob, ...], ...] | None:
    """Stored top alternatives (a list of positions, each a list of ``{"token", "logprob"}``),
    bounded: an alternative without a string token is dropped, an unreadable logprob is NaN."""
    if not isinstance(lp, (list, tuple)):
        return None
    positions = []
    for pos in lp[:MAX_POSITIONS]:
        alts = []
        for t in pos[:MAX_ALTERNATIVES] if isinstance(pos, (list, tuple)) else ():
            if not isinstance(t, dict) or not isinstance(t.get("token"), str):
                continue
            alts.append(TokenLogprob(t["token"], read_logprob(t.get("logprob"))))
        positions.append(tuple(alts))
    return tuple(positions)


def chat_completion(data: Any, logprobs: bool) -> Completion:
    """An OpenAI-style chat completion (a server's reply, a batch result, llama.cpp's), read with
    bounds; ValueError when it holds no ``choices[0].message``."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("not a chat completion") from None
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # some servers send content parts
        content = "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    prompt_tokens = token_count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    lp = choice.get("logprobs") if logprobs else None
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        # an unreadable logprob is NaN: the scorer records a failure, not a score from what is left
        top = (
            read_top_logprobs(
                [_generated_first(p) for p in lp["content"][:MAX_POSITIONS] if isinstance(p, dict)]
            )
            or None
        )
    else:
        top = None
    return Completion(
        text=content if isinstance(content, str) else "",
        top_logprobs=top,
        prompt_tokens=prompt_tokens,
        completion_tokens=token_count(usage.get("completion_tokens")),
        # the server reports prompt tokens it served from its prompt cache
        prompt_tokens_evaluated=max(0, prompt_tokens - token_count(cached)) if cached is not None else None,
    )


def _generated_first(position: dict) -> list:
    """One position of a reply's logprobs as :attr:`Completion.top_logprobs` holds it: the token
    the server generated first, then the other alternatives. A server may report probabilities
    from before its constraint was applied (llama.cpp's server), so the generated token need not
    be the likeliest, nor among the alternatives at all: then it goes first with its own logprob."""
    alts = [a for a in (position.get("top_logprobs") or [])[:MAX_ALTERNATIVES] if isinstance(a, dict)]
    token = position.get("token")
    if not isinstance(token, str):
        return alts
    mine = next((a for a in alts if a.get("token") == token), None)
    return [mine or {"token": token, "logprob": position.get("logprob")}, *(a for a in alts if a is not mine)]


def generated_tokens(completion: Completion) -> list[str] | None:
    """The tokens a reply was generated as (each position's first, see :func:`_generated_first`)
    when they spell its text exactly; None otherwise (no logprobs, an empty position, or tokens
    the text does not have, as a fence the server stripped), when positions cannot be trusted."""
    top = completion.top_logprobs
    if not top or not all(top):
        return None
    tokens = [pos[0].token for pos in top]
    return tokens if "".join(tokens) == completion.text else None


@runtime_checkable
class Backend(Protocol):
    """An LLM. ``identity`` names it for the cache (e.g. ``openai:gpt-4o-mini@https://...``)
    and must never contain a secret."""

    identity: str

    def complete(self, request: CompletionRequest) -> Completion:
        """Return the completion or raise :class:`hdeval.core.errors.BackendError`."""
        ...
