"""A deterministic, offline backend for tests and examples.

A request names its prompt kind (``CompletionRequest.kind``); the fake answers it with the
*responder* registered for that kind (``RESPONDERS``, or ones passed in), never by reading the
prompt's wording to guess what it is. Each method registers responders for its own prompts.
HD-Eval's: decomposition requests get a JSON list of sub-criteria; scoring requests get a digit
with a probability distribution over the digits 1-5 as top logprobs. Scores are a deterministic
function of the sample text and the criterion, loosely tied to simple text features so that
trained aggregators have something to learn.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

from hdeval.backends.base import Completion, CompletionRequest, TokenLogprob
from hdeval.backends.constraints import constraint_of, obeys

_MAX_CHILDREN = re.compile(r"at most (\d+) sub-criteria")
_CRITERION = re.compile(r"^Criterion to decompose: (.+?) \(key: ([^)]+)\)", re.M)
_SAMPLE = re.compile(r"<sample>(.*?)</sample>", re.S)


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


def _unit(*parts: str) -> float:
    return _h(*parts) / 2**64


# A responder answers one kind of prompt: (request, the fake's options) -> Completion.
Responder = Callable[[CompletionRequest, "FakeBackend"], Completion]
RESPONDERS: dict[str, Responder] = {}


def responder(kind: str) -> Callable[[Responder], Responder]:
    """Register the fake LLM's answer to prompts of ``kind`` (a decorator)."""

    def register(fn: Responder) -> Responder:
        RESPONDERS[kind] = fn
        return fn

    return register


@dataclass
class FakeBackend:
    """``garbage``: share of scoring replies that are unparseable prose (such a fake does not
    honour answer constraints, as a server asked only by the prompt does not);
    ``logprobs``: whether top logprobs come back; ``children``: cap on sub-criteria."""

    garbage: float = 0.0
    logprobs: bool = True
    calls: int = 0
    requests: list[CompletionRequest] = field(default_factory=list)
    # keep every request in ``requests`` (for tests); ``--llm fake`` does not, so a long apply's
    # memory is the tool's own, as with a real backend
    record: bool = True
    # None: the registered RESPONDERS (read at call time, so later registrations count)
    responders: Mapping[str, Responder] | None = None
    # False: replies go out as the responders write them, like a server that does not honour
    # answer constraints (tests of replies the methods cannot read)
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
        kwargs: dict = {}
        _, _, opts = spec.partition(":")
        for part in filter(None, opts.split(",")):
            name, _, value = part.partition("=")
            if name == "garbage":
                kwargs["garbage"] = float(value)
            elif name == "logprobs":
                kwargs["logprobs"] = value not in ("0", "false", "no")
            else:
                from hdeval.errors import ConfigError

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
            from hdeval.errors import BackendError

            raise BackendError(
                f"the fake LLM has no responder for prompt kind {request.kind!r} "
                f"(known: {', '.join(sorted(table)) or 'none'})"
            )
        reply = answer(request, self)
        constraint = constraint_of(request)
        # The fake decodes under the request's constraint as the local models do, so a
        # responder that breaks it is a bug to report, not a reply. ``garbage`` models an LLM
        # that does not honour constraints (an OpenAI-compatible server asked for a digit),
        # whose unusable replies the methods must record as failures.
        if self.honour_constraints and not self.garbage and not obeys(constraint, reply.text):
            from hdeval.errors import BackendError

            raise BackendError(f"the fake LLM's {request.kind!r} responder broke the request's answer "
                               f"constraint {constraint!r}: {reply.text[:60]!r}")
        return reply

    def decompose_reply(self, prompt: str) -> str:
        m = _MAX_CHILDREN.search(prompt)
        n = int(m.group(1)) if m else 3
        crit = _CRITERION.search(prompt)
        name, key = (crit.group(1), crit.group(2)) if crit else ("criterion", "c")
        facets = ["clarity", "accuracy", "coverage", "style", "detail", "focus", "order", "tone"]
        start = _h(key) % len(facets)
        subs = []
        for i in range(n):
            facet = facets[(start + i) % len(facets)]
            subs.append(
                {
                    "key": facet,
                    "name": f"{name}: {facet}",
                    "definition": f"How well the text shows {facet} with respect to {name.lower()}.",
                }
            )
        return json.dumps({"subcriteria": subs})

    def score_reply(self, prompt: str, request: CompletionRequest, n_prompt: int) -> Completion:
        sample = _SAMPLE.search(prompt)
        body = sample.group(1) if sample else prompt
        criterion = prompt[sample.end():] if sample else ""
        if self.garbage and _unit("garbage", prompt) < self.garbage:
            return Completion("I am not able to rate this text.", None, n_prompt, 8)
        words = re.findall(r"\w+", body.lower())
        uniq = len(set(words)) / max(1, len(words))
        length = math.tanh(len(words) / 400)
        w1, w2 = _unit("w1", criterion), _unit("w2", criterion)
        noise = _unit("noise", body, criterion)
        x = 0.45 * (w1 * uniq + (1 - w1) * length) + 0.35 * w2 * uniq + 0.2 * noise
        score = 1.0 + 4.0 * min(1.0, max(0.0, x))
        digits = [1, 2, 3, 4, 5]
        weights = [math.exp(-((d - score) ** 2) / 0.6) for d in digits]
        total = sum(weights)
        probs = [w / total for w in weights]
        best = digits[max(range(5), key=lambda i: probs[i])]
        top = None
        if self.logprobs and request.top_logprobs:
            alts = sorted(
                (TokenLogprob(str(d), math.log(max(p, 1e-12))) for d, p in zip(digits, probs)),
                key=lambda t: -t.logprob,
            )[: request.top_logprobs]
            top = (tuple(alts),)
        return Completion(str(best), top, n_prompt, 1)


def _prompt(request: CompletionRequest) -> tuple[str, int]:
    prompt = "\n".join(m.content for m in request.messages)
    return prompt, max(1, len(prompt) // 4)


@responder("decompose")
def _hdeval_decompose(request: CompletionRequest, fake: FakeBackend) -> Completion:
    prompt, n_prompt = _prompt(request)
    text = fake.decompose_reply(prompt)
    return Completion(text, None, n_prompt, max(1, len(text) // 4))


@responder("score")
def _hdeval_score(request: CompletionRequest, fake: FakeBackend) -> Completion:
    prompt, n_prompt = _prompt(request)
    return fake.score_reply(prompt, request, n_prompt)
