"""The one event loop every LLM call runs on (a daemon thread, so synchronous callers and a
notebook's own loop all reach the same connections), and :func:`run`, the synchronous door."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_guard = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """The loop, started on first use."""
    global _loop, _thread
    with _guard:
        if _loop is None or _thread is None or not _thread.is_alive():
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="hdeval-llm-loop", daemon=True)
            _thread.start()
        return _loop


async def _carry(aw: Awaitable[T]) -> tuple[bool, Any]:
    # A KeyboardInterrupt raised by a backend in a worker thread must reach the caller, not
    # stop the loop (asyncio lets KeyboardInterrupt and SystemExit out of run_forever).
    try:
        return True, await aw
    except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
        return False, exc


def run(aw: Awaitable[T], on_interrupt: Callable[[], None] | None = None) -> T:
    """Run ``aw`` on the loop and return its result (or raise its error) in this thread. If this
    thread is interrupted meanwhile, ``on_interrupt`` is called on the loop (it should make ``aw``
    start nothing new) and ``aw`` is waited for, so running calls finish and are cached first."""
    lp = loop()
    if threading.current_thread() is _thread:
        raise RuntimeError("hdeval.llm.aio.run called from the LLM loop itself; await the coroutine instead")
    fut = asyncio.run_coroutine_threadsafe(_carry(aw), lp)
    try:
        ok, value = fut.result()
    except BaseException:
        if not fut.done():
            if on_interrupt is not None:
                lp.call_soon_threadsafe(on_interrupt)
            try:
                fut.result()  # the calls in flight finish and are cached
            except BaseException:  # noqa: BLE001 - a second interrupt: give up waiting
                pass
        raise
    if not ok:
        raise value
    return value
