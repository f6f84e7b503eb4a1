"""The one place LLM requests run concurrently."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Sequence, TypeVar, Union

from hdeval.backends.base import Backend, Completion, CompletionRequest
from hdeval.errors import RequestRejected
from hdeval.progress import Progress

T = TypeVar("T")


def run_requests(
    backend: Backend,
    requests: Sequence[CompletionRequest],
    concurrency: int,
    progress: Progress | None = None,
    *,
    keep_rejected: bool = False,
) -> list[Union[Completion, RequestRejected]]:
    """Complete ``requests`` with at most ``concurrency`` in flight; results in input order.

    With ``keep_rejected``, a request the server rejected on its own account
    (:class:`RequestRejected`: too long, filtered) is returned in its place as the exception
    object and the others go on; without it, it is raised like any other error.

    Replies the backend has cached (``lookup_many``: the disk cache) are read first, in bulk,
    and counted on ``progress`` as cached; only the rest go to the threads. Those are
    submitted in order, so a single-worker backend (a local model) sees all
    criteria of one sample back to back and can reuse its KV cache. The first error
    (backend unreachable, budget reached, Ctrl-C) cancels what has not started and is
    raised; every completion that finished before it is already in the cache.
    """

    # one query per few hundred keys instead of a lookup per request through the thread
    # pool (issue #15.4); a fully cached stage never starts a thread
    lookup = getattr(backend, "lookup_many", None)
    got: list = lookup(requests) if callable(lookup) and requests else [None] * len(requests)
    todo = [i for i, c in enumerate(got) if c is None]
    if progress is not None and len(todo) < len(requests):
        progress.advance(len(requests) - len(todo), cached=True)
    if not todo:
        return got

    cap = getattr(backend, "max_concurrency", None)
    if cap:
        concurrency = min(concurrency, cap)  # a local model runs one call at a time anyway

    def one(req: CompletionRequest) -> Union[Completion, RequestRejected]:
        try:
            c: Union[Completion, RequestRejected] = backend.complete(req)
        except RequestRejected as exc:
            if not keep_rejected:
                raise
            c = exc
        if progress is not None:
            progress.advance(1, cached=getattr(c, "cached", False))
        return c

    for i, c in zip(todo, map_concurrent(one, [requests[i] for i in todo], concurrency)):
        got[i] = c
    return got


def map_concurrent(fn: Callable[..., T], items: Sequence, concurrency: int) -> list[T]:
    """``[fn(x) for x in items]`` on ``concurrency`` threads, in input order.

    The threads take the next item themselves (no future or queue entry per item: at 64
    threads and thousands of requests, a ThreadPoolExecutor's per-item bookkeeping was a
    tenth of the client's CPU). On the first error, or Ctrl-C in the calling thread, no new
    item is started; the calls already running finish (and are cached) before the error of
    the earliest failed item is raised.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if concurrency == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    n = len(items)
    results: list[Any] = [None] * n
    errors: list[tuple[int, BaseException]] = []
    taken = itertools.count()  # next() on it is atomic: each index goes to one thread
    stop = threading.Event()

    # Threads still running, counted by the threads themselves: waiting on Thread.join() is
    # not safe here, since a Ctrl-C or SIGTERM that interrupts join() on Python 3.11 marks the
    # joined thread as stopped while it still runs (bpo-45274), and a finished LLM call that
    # thread was making would then be dropped at exit instead of cached.
    running = [0]
    ended = threading.Condition()

    def work() -> None:
        try:
            while not stop.is_set():
                i = next(taken)
                if i >= n:
                    return
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
                    errors.append((i, exc))
                    stop.set()
                    return
        finally:
            with ended:
                running[0] -= 1
                ended.notify_all()

    def wait_all() -> None:
        with ended:
            while running[0]:
                ended.wait()

    threads = [threading.Thread(target=work, name=f"hdeval_{k}") for k in range(min(concurrency, n))]
    try:
        for t in threads:
            with ended:
                running[0] += 1
            try:
                t.start()
            except Exception:  # the thread never started (an interrupt means it did)
                with ended:
                    running[0] -= 1
                raise
        wait_all()
    finally:
        # On error or Ctrl-C: start nothing new, let running calls finish and be cached.
        stop.set()
        wait_all()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return results
