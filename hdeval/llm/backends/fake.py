"""A deterministic, offline backend for tests and examples: it answers a request with the
*responder* registered for its prompt kind (``CompletionRequest.kind``), never by reading the
wording. Each method registers its own when imported; this module knows no method."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

from hdeval.core.errors import BackendError, ConfigError
from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.constraints import constraint_of, obeys


def stable_hash(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


def stable_unit(*parts: str) -> float:
    return stable_hash(*parts) / 2**64


# A responder answers one kind of prompt: (request, the fake's options) -> Completion.
Responder = Callable[[CompletionRequest, "FakeBackend"], Completion]
RESPONDERS: dict[str, Responder] = {}


def responder(kind: str) -> Callable[[Responder], Responder]:
    """Register the fake LLM's answer to prompts of ``kind`` (a decorator)."""

    def register(fn: Responder) -> Responder:
        RESPONDERS[kind] = fn
        return fn

    return register


_ON, _OFF = ("", "1", "true", "yes", "on"), ("0", "false", "no", "off")  # "" : fake:logprobs


@dataclass
class FakeBackend:
    """``garbage``: share of scoring replies that are unparseable prose (such a fake does not
    honour answer constraints, as a server asked only by the prompt does not);
    ``logprobs``: whether top logprobs come back; ``children``: cap on sub-criteria."""

    garbage: float = 0.0
    logprobs: bool = True
    calls: int = 0
    requests: list[CompletionRequest] = field(default_factory=list)
    # keep every request in ``requests`` (tests); not ``--llm fake``, whose memory must not grow
    record: bool = True
    # None: the registered RESPONDERS (read at call time, so later registrations count)
    responders: Mapping[str, Responder] | None = None
    # False: replies go out as written, like a server that does not honour answer constraints
    honour_constraints: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def identity(self) -> str:
        opts = []
        if self.garbage:
            opts.append(f"garbage={self.garbage:g}")
        if not self.logprobs:
            opts.append("logprobs=0")
        return "fake:v1" + (":" + ",".join(opts) if opts else "")

    @classmethod
    def from_spec(cls, spec: str) -> "FakeBackend":
        """``fake`` or ``fake:garbage=0.1,logprobs=0``; a bad option is one ConfigError naming it."""
        kwargs: dict = {}
        _, _, opts = spec.partition(":")
        for part in filter(None, opts.split(",")):
            name, eq, value = part.partition("=")
            if name == "garbage":
                try:
                    share = float(value)
                except ValueError:
                    raise ConfigError(f"--llm {spec}: {value!r} is not a number") from None
                if not 0 <= share <= 1:  # NaN fails too
                    raise ConfigError(
                        f"--llm {spec}: garbage is a share of replies, from 0 to 1; got {value}"
                    )
                kwargs["garbage"] = share
            elif name == "logprobs":
                if value.lower() not in _ON + _OFF or (eq and not value):
                    raise ConfigError(f"--llm {spec}: logprobs is 0 or 1 (on or off), got {value!r}")
                kwargs["logprobs"] = value.lower() not in _OFF
            else:
                raise ConfigError(f"unknown fake backend option {name!r} in --llm {spec}")
        return cls(record=False, **kwargs)

    def complete(self, request: CompletionRequest) -> Completion:
        with self._lock:
            self.calls += 1
            if self.record:
                self.requests.append(request)
        table = RESPONDERS if self.responders is None else self.responders
        answer = table.get(request.kind)
        if answer is None:
            raise BackendError(
                f"the fake LLM has no responder for prompt kind {request.kind!r} "
                f"(known: {', '.join(sorted(table)) or 'none'}; a method's package registers its own when "
                "imported, e.g. hdeval.methods.hdeval)"
            )
        reply = answer(request, self)
        constraint = constraint_of(request)
        # decoding under the constraint as the local models do, a responder that breaks it is a
        # bug; ``garbage`` models an LLM that does not honour constraints
        if self.honour_constraints and not self.garbage and not obeys(constraint, reply.text):
            raise BackendError(
                f"the fake LLM's {request.kind!r} responder broke the request's answer "
                f"constraint {constraint!r}: {reply.text[:60]!r}"
            )
        return reply
