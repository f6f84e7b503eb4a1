"""The one LLM client (:class:`CachedBackend`) and the cache key (:func:`request_key`).

Raw completions are stored, never parsed scores, so a parser fix costs no new calls. One writer
commits a reply before its call returns, so a SIGKILL loses at most the commit in progress. An
entry hdeval cannot use is a miss plus a :class:`CacheWarning`, never an exception or code run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import sqlite3
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Awaitable, Iterable, Sequence

import diskcache

from hdeval.core.errors import BudgetExceeded, CacheError, ConfigError, RequestRejected, RetriesExhausted
from hdeval.core.progress import Progress
from hdeval.llm.backends.base import Backend, Completion, CompletionRequest
from hdeval.llm.cache.codec import EntryTooLarge, UnreadableEntry, encode_completion, parse_completion
from hdeval.llm.cache.guard import storage_error
from hdeval.llm.cache.store import ReplyStore, open_store
from hdeval.llm.config import DEFAULT_CONCURRENCY

CACHE_SCHEMA = 1


def request_key(identity: str, request: CompletionRequest) -> str:
    """The cache key: sha256 over canonical JSON of what changes the output: the cache schema
    version, the backend identity (kind, model, base URL; a local model's file digest), the
    rendered messages and the decoding parameters; never API keys, timeouts, retry or concurrency."""
    payload = {"v": CACHE_SCHEMA, "backend": identity, **request.key_fields()}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CacheWarning(UserWarning):
    """A cache entry could not be used: it was treated as a miss and the LLM is asked again."""


@dataclass
class UsageStats:
    calls: int = 0  # requests that reached the backend and succeeded (probes included: paid)
    hits: int = 0  # requests answered from the cache
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_evaluated: int = 0
    unreadable: int = 0  # cache entries that were not a readable completion (asked again)

    def add(self, c: Completion) -> None:
        """Count one paid call."""
        self.calls += 1
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        if c.prompt_tokens_evaluated is not None:
            self.prompt_tokens_evaluated += c.prompt_tokens_evaluated

    def summary(self) -> str:
        return (
            f"LLM calls made: {self.calls}, cache hits: {self.hits}, "
            f"tokens used: {self.prompt_tokens} prompt + {self.completion_tokens} completion"
        )


class CachedBackend:
    """The one LLM client: every call goes through :meth:`acomplete_many` (or its synchronous
    doors :meth:`complete_many` and :meth:`complete`), which owns the cache lookup, the Batch
    API strategy (``batch``), concurrency (one semaphore), the call budget (``max_calls``,
    shared by every stage that uses this client) and progress.

    The one writer commits a reply (batched, on the store's own thread) before its call returns
    and its concurrency slot is given back. Identical requests cost one call. Unreadable entries
    are misses, counted in ``stats.unreadable`` and described in ``warnings``. When the store
    cannot be written (a full disk), the reply just paid for is still returned (and kept in
    memory), and the next call that would be paid for raises the one-line :class:`CacheError`.
    """

    MAX_WARNINGS = 20
    WRITE_BATCH = 256  # replies committed in one transaction at most
    # requests in a row that exhaust their retries with no success between them: the server is
    # down (fewer are each that cell's recorded failure)
    STOP_STREAK = 3

    def __init__(
        self,
        inner: Backend,
        cache_dir: str | Path | None,
        max_calls: int | None = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        batch: Any = None,
        owns_inner: bool = False,
    ):
        self.inner = inner
        # open_llm made ``inner``, so nobody else will close its connections (or free its model);
        # an injected backend is its caller's, who may go on using it
        self._owns_inner = owns_inner
        self.identity = inner.identity
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # every call returned so far is committed to it
        self.store: ReplyStore | None = open_store(cache_dir) if cache_dir is not None else None
        self.max_calls = max_calls
        cap = self.max_concurrency  # a local model runs one call at a time
        self.concurrency = max(1, min(concurrency, cap) if cap else concurrency)
        self.batch = batch
        self.stats = UsageStats()
        self.warnings: list[str] = []
        self._reserved = 0
        self._streak = 0
        self._answered = 0  # requests of this run the server answered (cache hits and probes aside)
        self._probe_answered = -math.inf  # when the server last answered a probe
        self._probe_unanswered = -math.inf  # when a probe last got no answer
        self._probe_lock: asyncio.Lock | None = None
        # everything below is touched on the LLM loop only
        self._inflight: dict[str, asyncio.Future] = {}
        self._unsaved: dict[str, Completion] = {}  # replies that could not be written
        self._saved: set[str] = set()  # keys this client committed (a later lookup must see them)
        self._batches = 0  # acomplete_many calls running; _saved is needed only while one is
        self._write_error: CacheError | None = None
        self._queue: list[tuple[str, bytes, Completion, asyncio.Future]] = []
        self._writer: asyncio.Future | None = None
        self._sem = asyncio.Semaphore(self.concurrency)
        # the one thread that touches the store (diskcache keeps a connection per thread)
        self._io = (
            ThreadPoolExecutor(1, thread_name_prefix="hdeval-cache") if self.store is not None else None
        )
        self._pool: ThreadPoolExecutor | None = None  # a synchronous backend's calls run here
        self._pid = os.getpid()

    def _same_process(self) -> None:
        # A forked child has none of the parent's threads (the store's writer, the call pool) and
        # would share its connections: refused in one line instead of waiting forever.
        if os.getpid() != self._pid:
            raise ConfigError(
                f"this LLM client was opened in process {self._pid}, and a forked process "
                "cannot use its cache writer or connections: open one in the new process "
                "(hdeval.llm.client.open_llm, or pass no backend and the evaluator opens its own)"
            )

    @property
    def max_concurrency(self) -> int | None:
        return getattr(self.inner, "max_concurrency", None)

    def key(self, request: CompletionRequest) -> str:
        return request_key(self.identity, request)

    def flush(self) -> None:
        """Nothing to do: a call returns once its reply is committed."""

    def stored(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` have a reply this client would serve without a call: in the store
        (read on the store's thread) or kept in memory because the store could not take them.
        Whether an entry is readable is not checked here."""
        self._same_process()
        keys = list(dict.fromkeys(keys))
        found = {k for k in keys if k in self._unsaved}
        rest = [k for k in keys if k not in found]
        if rest and self._io is not None:
            try:
                found.update(self._io.submit(lambda: {k for k in rest if k in self.store}).result())
            except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
                raise storage_error(self.cache_dir, exc) from None
        return found

    def is_cached(self, request: CompletionRequest) -> bool:
        self._same_process()
        key = self.key(request)
        return key in self._unsaved or self._read(key) is not None

    # ---- synchronous doors ----------------------------------------------------------------
    def complete(self, request: CompletionRequest) -> Completion:
        from hdeval.llm import aio

        self._same_process()
        return aio.run(self.acomplete(request))

    def complete_many(
        self,
        requests: Sequence[CompletionRequest],
        progress: Progress | None = None,
        *,
        keep_rejected: bool = False,
        concurrency: int | None = None,
    ) -> list:
        from hdeval.llm import aio

        self._same_process()
        halt: list[bool] = []
        return aio.run(
            self.acomplete_many(
                requests, progress, keep_rejected=keep_rejected, concurrency=concurrency, halt=halt
            ),
            on_interrupt=lambda: halt.append(True),
        )

    def close(self) -> None:
        """Close the store and the client's threads (idempotent); in a forked child, only let go
        of them: they are the parent's."""
        if os.getpid() != self._pid:
            self._io = self._pool = self.batch = None
            return
        if self.batch is not None:
            self.batch.close()
        if self._io is not None:
            io, self._io = self._io, None
            io.submit(self.store.close).result()  # the store thread's own connection
            io.shutdown()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.store is not None:
            self.store.close()
        if self._owns_inner:
            self._owns_inner = False
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()

    # ---- the store (on its thread) -------------------------------------------------------------
    def _warn(self, key: str, reason: str) -> None:
        self.stats.unreadable += 1
        if len(self.warnings) < self.MAX_WARNINGS:
            self.warnings.append(f"cache entry {key[:12]}... in {self.cache_dir} ignored: {reason}")
        if self.stats.unreadable == 1:
            warnings.warn(
                f"the LLM reply cache {self.cache_dir} holds an entry hdeval cannot use ({reason}); "
                f"it is asked again (`hdeval cache check --cache-dir {self.cache_dir}` lists them)",
                CacheWarning,
                stacklevel=2,
            )

    def _read(self, key: str) -> Completion | None:
        if self.store is None:
            return None
        try:
            text = self.store.get(key)
            return None if text is None else parse_completion(text)
        except UnreadableEntry as exc:
            self._warn(key, str(exc))
            return None
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise storage_error(self.cache_dir, exc) from None

    def _read_many(self, keys: Iterable[str]) -> dict[str, Completion]:
        return {key: c for key in keys if (c := self._read(key)) is not None}

    def _write_batch(self, items: list[tuple[str, bytes]]) -> dict[str, BaseException]:
        """Commit ``items`` in one transaction; if the store fails, each on its own, so every
        one that can be written is. The keys that could not be written, and why."""
        store = self.store
        failed: dict[str, BaseException] = {}
        try:
            with store.transact():
                for key, text in items:
                    try:
                        store.set(key, text)
                    except EntryTooLarge as exc:  # raised before any SQL: the transaction goes on
                        failed[key] = exc
        except diskcache.Timeout as exc:  # another process held the lock all along: so would it now
            failed = {key: exc for key, _ in items}
        except (OSError, sqlite3.Error):
            failed = {}
            for key, text in items:
                try:
                    store.set(key, text)
                except (EntryTooLarge, OSError, sqlite3.Error, diskcache.Timeout) as exc:
                    failed[key] = exc
        return failed

    # ---- the call path (on the LLM loop) ---------------------------------------------------------
    async def acomplete(self, request: CompletionRequest) -> Completion:
        """One request (never through the Batch API); a rejection is raised."""
        (got,) = await self.acomplete_many([request], use_batch=False)
        return got

    async def acomplete_many(
        self,
        requests: Sequence[CompletionRequest],
        progress: Progress | None = None,
        *,
        keep_rejected: bool = False,
        concurrency: int | None = None,
        use_batch: bool = True,
        halt: list | None = None,
    ) -> list:
        """Complete ``requests``; results in input order.

        Replies in the cache, and requests that repeat another (one call answers both), are
        counted on ``progress`` as cached before any call; with ``batch``, the rest go through
        the Batch API first; what is still missing is asked with at most ``concurrency`` in
        flight, in order (a local model sees one sample's requests back to back). With ``keep_rejected``, a request the server refused on its own account
        (:class:`RequestRejected`, and a request that kept failing while others succeed) is
        returned in its place as the exception. Any other error (server down, budget, Ctrl-C)
        starts nothing new, lets the calls running finish (and be cached), and is raised.
        """
        self._same_process()
        self._batches += 1
        try:
            keys = [self.key(r) for r in requests]
            out: list[Any] = [None] * len(requests)
            found: dict[str, Completion] = {k: self._unsaved[k] for k in keys if k in self._unsaved}
            want = [k for k in dict.fromkeys(keys) if k not in found]
            found.update(await self.read_many(want))
            fresh: dict[str, Completion] = {}  # paid for through the Batch API just now
            if self.batch is not None and use_batch and self._io is not None:
                miss = {k: r for k, r in zip(keys, requests) if k not in found}
                if miss:
                    fresh = await self.batch.prefetch(self, miss, progress, halt)
                else:
                    await self.batch.tidy(self, progress)
            todo: list[int] = []
            first: dict[str, int] = {}
            later: list[int] = []
            for i, k in enumerate(keys):
                if k in found:
                    out[i] = replace(found[k], cached=True)
                elif k in first:
                    later.append(i)
                else:
                    first[k] = i
                    if k in fresh:
                        out[i] = fresh[k]
                    else:
                        todo.append(i)
            self.stats.hits += sum(k in found for k in keys)
            # what needs no call is counted before the calls start, repeats included (their
            # twin's call answers them), so a stage's "left" (and its ETA) is what will be paid
            if progress is not None and len(todo) < len(requests):
                progress.advance(len(requests) - len(todo), cached=True)
            errors: list[tuple[int, BaseException]] = []
            pending = iter(todo)

            async def work() -> None:
                for i in pending:
                    if errors or halt:
                        return
                    try:
                        got: Any = await self._fetch(keys[i], requests[i])
                    except RequestRejected as exc:
                        if not keep_rejected:
                            errors.append((i, exc))
                            return
                        got = exc
                    except BaseException as exc:  # noqa: BLE001 - raised below, once the others ended
                        errors.append((i, exc))
                        return
                    out[i] = got
                    if progress is not None:
                        progress.advance(1, cached=getattr(got, "cached", False))

            n = min(concurrency or self.concurrency, self.concurrency, len(todo))
            if n:
                await asyncio.gather(*(work() for _ in range(n)))
            if errors:
                raise min(errors, key=lambda e: e[0])[1]
            if halt:
                raise KeyboardInterrupt
            for i in later:  # the same request again: one call served both
                got = out[first[keys[i]]]
                if isinstance(got, Completion):
                    got = replace(got, cached=True)
                    self.stats.hits += 1
                out[i] = got
            return out
        finally:
            # once no batch runs, the keys committed are forgotten: later lookups read the store
            self._batches -= 1
            if not self._batches:
                self._saved.clear()

    async def _fetch(self, key: str, request: CompletionRequest) -> Completion:
        """``request``'s reply: joined to the same request in flight, re-read if this client
        committed it since the lookup, else paid for."""
        running = self._inflight.get(key)
        got = None
        if running is not None:
            try:
                got = await asyncio.shield(running)
            except BaseException:  # noqa: BLE001 - that call failed (its future is cancelled): try ourselves
                if not running.cancelled():
                    raise  # this joiner was cancelled itself: it must not pay for the call again
        if got is None:
            got = self._unsaved.get(key)
        if got is None and key in self._saved and self._io is not None:
            got = await asyncio.get_running_loop().run_in_executor(self._io, self._read, key)
        if got is not None:
            self.stats.hits += 1
            return replace(got, cached=True)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            got = await self._call(key, request)
        except BaseException:
            fut.cancel()
            raise
        finally:
            self._inflight.pop(key, None)
        fut.set_result(got)
        return got

    async def _call(self, key: str, request: CompletionRequest) -> Completion:
        if self._write_error is not None:
            raise self._write_error
        if self.max_calls is not None and self._reserved >= self.max_calls:
            raise BudgetExceeded(
                f"stopped at --max-calls {self.max_calls}: every finished call is cached; "
                "rerun with a higher limit to continue"
            )
        self._reserved += 1
        started = time.monotonic()
        try:
            async with self._sem:
                result = await self._ask(request)
                if self.store is not None:
                    await self.commit(key, result)
        except RetriesExhausted as exc:
            self._reserved -= 1
            self._streak += 1
            if self._streak < self.STOP_STREAK and self._answered > 0:
                raise RequestRejected(
                    f"{exc} (while other requests succeed: this one is recorded as failed, "
                    "and the next run asks again)"
                ) from None
            # no success yet (a rerun whose other requests are all cached) or a streak: the server
            # may be down, or these requests alone may fail; a small request tells them apart
            if await self._server_answers(request, started):
                self._streak = 0
                raise RequestRejected(
                    f"{exc} (the server answers the same request with a short prompt: this one "
                    "fails alone; the next run asks again)"
                ) from None
            raise
        except BaseException:
            self._reserved -= 1
            raise
        self._streak = 0
        self._answered += 1
        self.stats.add(result)
        return result

    async def _server_answers(self, request: CompletionRequest, started: float) -> bool:
        """Whether the server answered a probe (the backend's :meth:`aprobe`: ``request`` with a
        short prompt, a paid call counted as one) after ``started``, when the request that failed
        was sent; False for a backend that has none, or when ``--max-calls`` leaves no call."""
        aprobe = getattr(self.inner, "aprobe", None)
        if aprobe is None:
            return False
        if self._probe_lock is None:
            self._probe_lock = asyncio.Lock()
        async with self._probe_lock:  # requests failing side by side share one probe
            if self._probe_answered >= started:
                return True
            if self._probe_unanswered >= started:  # a server that gave no answer: no second probe
                return False
            if self.max_calls is not None and self._reserved >= self.max_calls:
                return False
            self._reserved += 1
            try:
                got = await aprobe(request)
            except BaseException:
                self._reserved -= 1
                raise
            if got is None:
                self._reserved -= 1
                self._probe_unanswered = time.monotonic()
                return False
            self.stats.add(got)
            self._probe_answered = time.monotonic()
            return True

    async def _ask(self, request: CompletionRequest) -> Completion:
        acomplete = getattr(self.inner, "acomplete", None)
        if acomplete is not None:
            return await acomplete(request)
        if self._pool is None:  # a synchronous backend (a local model, the fake): in threads
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="hdeval-llm")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.inner.complete, request)

    async def read_many(self, keys: Sequence[str]) -> dict[str, Completion]:
        """The replies the store holds for ``keys`` (read on the store's thread; none without a store)."""
        if not keys or self._io is None:
            return {}
        return await asyncio.get_running_loop().run_in_executor(self._io, self._read_many, keys)

    def calls_left(self) -> int | None:
        """How many more calls ``--max-calls`` allows now (None: no limit)."""
        return None if self.max_calls is None else self.max_calls - self._reserved

    def take(self, key: str, result: Completion) -> Awaitable[None]:
        """Count a reply paid for another way (a Batch API result) as a call, and commit it;
        the commit, to await."""
        self._reserved += 1
        self._answered += 1
        self.stats.add(result)
        return asyncio.ensure_future(self.commit(key, result))

    async def commit(self, key: str, result: Completion) -> None:
        """Store ``result`` under ``key`` through the one writer (also the Batch API strategy's
        way in); returns once it is committed (or known unwritable, then kept in memory)."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((key, encode_completion(result), result, fut))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_loop())
        # no shield needed: a cancelled waiter cancels only its future; the reply stays queued
        # and is written all the same
        await fut

    async def _write_loop(self) -> None:
        """The one writer: whatever is queued, one transaction at a time, until nothing is."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch = self._queue[: self.WRITE_BATCH]
                del self._queue[: self.WRITE_BATCH]
                try:
                    if self._io is None:
                        raise CacheError(f"the LLM reply cache {self.cache_dir} is closed")
                    failed = await loop.run_in_executor(
                        self._io, self._write_batch, [(k, t) for k, t, _, _ in batch]
                    )
                except BaseException as exc:  # noqa: BLE001 - never leave a call waiting
                    failed = {k: exc for k, _, _, _ in batch}
                for key, _text, result, fut in batch:
                    exc = failed.get(key)
                    if exc is None:
                        self._saved.add(key)
                    else:
                        self._unsaved[key] = result
                        if isinstance(exc, EntryTooLarge):
                            if len(self.warnings) < self.MAX_WARNINGS:
                                self.warnings.append(f"not cached: {exc}")
                        elif self._write_error is None:
                            self._write_error = (
                                exc
                                if isinstance(exc, CacheError)
                                else storage_error(self.cache_dir, exc, writing=True)
                            )
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._writer = None
