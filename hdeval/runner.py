"""The one place LLM requests run concurrently."""

from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Callable, Sequence, TypeVar, Union

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
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if concurrency == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="hdeval")
    try:
        futures = [pool.submit(fn, x) for x in items]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]
    finally:
        # On error or Ctrl-C: drop queued work, let running calls finish and be cached.
        pool.shutdown(wait=True, cancel_futures=True)
