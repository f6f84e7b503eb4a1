"""The backend protocol and the request/response types every backend speaks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


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
    # A JSON schema for the reply. Backends that can constrain decoding to it (llama.cpp
    # grammars) do; others ask for plain JSON and rely on the caller's validation.
    json_schema: str | None = None  # canonical JSON text, so the request stays hashable
    # Which prompt this is ("score", "decompose", ...): lets the fake LLM and test servers pick
    # a responder without reading the wording. Metadata only: not part of the cache key.
    kind: str = field(default="", compare=False)

    def key_fields(self) -> dict[str, Any]:
        """Decoding parameters that change the output (cache key material)."""
        extra = {"json_schema": self.json_schema} if self.json_schema is not None else {}
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
    """A raw LLM reply: text, the top alternatives for each generated token (if any), token usage."""

    text: str
    top_logprobs: tuple[tuple[TokenLogprob, ...], ...] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # tokens the server actually had to evaluate (a local model reusing its KV cache
    # evaluates fewer than ``prompt_tokens``); None when the backend cannot tell
    prompt_tokens_evaluated: int | None = None
    cached: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("cached")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Completion":
        lp = d.get("top_logprobs")
        return cls(
            text=d["text"],
            top_logprobs=None
            if lp is None
            else tuple(tuple(TokenLogprob(t["token"], float(t["logprob"])) for t in pos) for pos in lp),
            prompt_tokens=int(d.get("prompt_tokens") or 0),
            completion_tokens=int(d.get("completion_tokens") or 0),
            prompt_tokens_evaluated=d.get("prompt_tokens_evaluated"),
        )


@runtime_checkable
class Backend(Protocol):
    """An LLM. ``identity`` names it for the cache (e.g. ``openai:gpt-4o-mini@https://...``)
    and must never contain a secret."""

    identity: str

    def complete(self, request: CompletionRequest) -> Completion:
        """Return the completion or raise :class:`hdeval.errors.BackendError`."""
        ...
