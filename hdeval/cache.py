"""The one cache every LLM call goes through.

Raw completions (text + logprobs + usage) are stored, never parsed scores, so a parser
fix costs no new calls. Each completion is committed to SQLite (diskcache) the moment it
arrives: a run killed at any point keeps every call it paid for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import diskcache

from hdeval.backends.base import Backend, Completion, CompletionRequest
from hdeval.errors import BudgetExceeded

CACHE_SCHEMA = 1


def request_key(identity: str, request: CompletionRequest) -> str:
    """The cache key: sha256 over canonical JSON of what changes the output, and nothing else.

    In: the cache schema version, the backend identity (kind, model, base URL; a local
    model's file digest), the rendered messages and the decoding parameters.
    Not in: API keys, timeouts, retry or concurrency settings.
    """
    payload = {"v": CACHE_SCHEMA, "backend": identity, **request.key_fields()}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class UsageStats:
    calls: int = 0  # requests that reached the backend and succeeded
    hits: int = 0  # requests answered from the cache
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_evaluated: int = 0

    def summary(self) -> str:
        return (
            f"LLM calls made: {self.calls}, cache hits: {self.hits}, "
            f"tokens used: {self.prompt_tokens} prompt + {self.completion_tokens} completion"
        )


class CachedBackend:
    """Wraps a backend with a disk cache, usage accounting and an optional call budget."""

    def __init__(self, inner: Backend, cache_dir: str | Path | None, max_calls: int | None = None):
        self.inner = inner
        self.identity = inner.identity
        self.store = diskcache.Cache(str(cache_dir)) if cache_dir is not None else None
        self.max_calls = max_calls
        self.stats = UsageStats()
        self._lock = threading.Lock()
        self._reserved = 0
        # keys being fetched right now: a second thread asking for the same request (two
        # samples with identical text) waits for the first instead of paying for it again
        self._inflight: dict[str, threading.Event] = {}

    @property
    def max_concurrency(self) -> int | None:
        """The inner backend's limit on useful parallel calls (a local model: 1)."""
        return getattr(self.inner, "max_concurrency", None)

    def key(self, request: CompletionRequest) -> str:
        return request_key(self.identity, request)

    def is_cached(self, request: CompletionRequest) -> bool:
        return self.store is not None and self.key(request) in self.store

    def _lookup(self, key: str) -> Completion | None:
        hit = self.store.get(key) if self.store is not None else None
        if hit is None:
            return None
        with self._lock:
            self.stats.hits += 1
        c = Completion.from_dict(json.loads(hit))
        return Completion(**{**c.__dict__, "cached": True})

    def complete(self, request: CompletionRequest) -> Completion:
        key = self.key(request)
        while True:
            hit = self._lookup(key)
            if hit is not None:
                return hit
            if self.store is None:
                break
            with self._lock:
                pending = self._inflight.get(key)
                if pending is None:
                    self._inflight[key] = threading.Event()
                    break
            # another thread is fetching this very request: take its cached reply, or
            # (if it failed) try ourselves
            pending.wait()
        try:
            return self._fetch(key, request)
        finally:
            if self.store is not None:
                with self._lock:
                    self._inflight.pop(key).set()

    def _fetch(self, key: str, request: CompletionRequest) -> Completion:
        with self._lock:
            if self.max_calls is not None and self._reserved >= self.max_calls:
                raise BudgetExceeded(
                    f"stopped at --max-calls {self.max_calls}: every finished call is cached; "
                    "rerun with a higher limit to continue"
                )
            self._reserved += 1
        try:
            result = self.inner.complete(request)
        except BaseException:
            with self._lock:
                self._reserved -= 1
            raise
        if self.store is not None:
            self.store.set(key, json.dumps(result.to_dict()))
        with self._lock:
            self.stats.calls += 1
            self.stats.prompt_tokens += result.prompt_tokens
            self.stats.completion_tokens += result.completion_tokens
            if result.prompt_tokens_evaluated is not None:
                self.stats.prompt_tokens_evaluated += result.prompt_tokens_evaluated
        return result

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def cache_stats(cache_dir: str | Path) -> dict[str, int | str]:
    path = Path(cache_dir)
    if not path.exists():
        return {"path": str(path), "entries": 0, "bytes": 0}
    with diskcache.Cache(str(path)) as c:
        entries = len(c)
        size = int(c.volume())
    return {"path": str(path), "entries": entries, "bytes": size}


def clear_cache(cache_dir: str | Path) -> int:
    path = Path(cache_dir)
    if not path.exists():
        return 0
    with diskcache.Cache(str(path)) as c:
        return int(c.clear())
