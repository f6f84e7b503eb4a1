"""Cache writes leave the request path (one writer thread, batched transactions) without
losing what was paid for: queued replies are served from memory, written on close(), on an
interrupted fill and at interpreter exit, and a reopened cache sees every one of them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import diskcache
import pytest

from conftest import cache_entries
from hdeval.backends.base import Completion, CompletionRequest, Message
from hdeval.backends.fake import FakeBackend
from hdeval.cache import CachedBackend, request_key
from hdeval.judge import Cell, fill_matrix

REPO = Path(__file__).resolve().parent.parent


def _req(text: str) -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


class Refuses(FakeBackend):
    """Fails the test if it is asked anything: every request must come from the cache."""

    def complete(self, request: CompletionRequest) -> Completion:
        raise AssertionError(f"asked the LLM again: {request.messages[-1].content!r}")


class Recording(FakeBackend):
    """Answers like the fake LLM, remembers what it answered, and stops the run with
    ``KeyboardInterrupt`` (what Ctrl-C raises) at its ``stop_at``-th call."""

    def __init__(self, stop_at: int) -> None:
        super().__init__()
        self.stop_at = stop_at
        self.answered: dict[str, Completion] = {}
        self._n = 0
        self._guard = threading.Lock()

    def complete(self, request: CompletionRequest) -> Completion:
        with self._guard:
            self._n += 1
            n = self._n
        if n == self.stop_at:
            raise KeyboardInterrupt
        c = super().complete(request)
        with self._guard:
            self.answered[request.messages[-1].content] = c
        return c


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Holds every store write until ``state["open"]`` is set; counts finished writes."""
    real = diskcache.Cache.set
    state = {"open": threading.Event(), "done": 0}

    def set_(self, key, value, *a, **kw):
        state["open"].wait(10)
        result = real(self, key, value, *a, **kw)
        state["done"] += 1
        return result

    monkeypatch.setattr(diskcache.Cache, "set", set_)
    return state


def test_a_reply_is_returned_before_it_is_written_and_served_from_memory_meanwhile(tmp_path, slow_writes):
    fake = FakeBackend()
    cb = CachedBackend(fake, tmp_path / "cache")
    first = cb.complete(_req("a"))
    assert slow_writes["done"] == 0  # the caller did not wait for the disk
    again = cb.complete(_req("a"))  # a re-read while the write is queued
    assert again.cached and again.text == first.text and fake.calls == 1
    assert cb.is_cached(_req("a"))
    slow_writes["open"].set()
    cb.close()
    assert slow_writes["done"] == 1
    reopened = CachedBackend(Refuses(), tmp_path / "cache")
    assert reopened.complete(_req("a")).text == first.text
    reopened.close()


def test_an_interrupted_fill_keeps_every_finished_reply_after_close(tmp_path, slow_writes):
    inner = Recording(stop_at=25)
    cb = CachedBackend(inner, tmp_path / "cache")
    cells = [Cell(f"s{i}", "c", (_req(f"sample {i}"),)) for i in range(60)]
    threading.Timer(0.2, slow_writes["open"].set).start()  # writes lag behind the calls
    with pytest.raises(KeyboardInterrupt):
        fill_matrix(cb, cells, lambda got: (1.0, None), concurrency=4)
    cb.close()
    assert 0 < len(inner.answered) < 60
    on_disk = cache_entries(tmp_path / "cache")
    keys = {request_key(inner.identity, _req(t)): c for t, c in inner.answered.items()}
    assert set(on_disk) == set(keys)
    assert all(on_disk[k].text == keys[k].text for k in keys)
    reopened = CachedBackend(Refuses(), tmp_path / "cache")
    for text, c in inner.answered.items():
        got = reopened.complete(_req(text))
        assert got.cached and got.text == c.text
    reopened.close()


@pytest.mark.parametrize("ending", ["normal", "interrupt"])
def test_replies_queued_at_exit_are_written_without_close(tmp_path, ending):
    """A script that never closes its backend, ends normally or by an unhandled Ctrl-C, while
    writes are still queued (each is held 50 ms): the atexit hook writes them all."""
    script = textwrap.dedent(f"""
        import time, diskcache
        from hdeval.backends.base import CompletionRequest, Message
        from hdeval.backends.fake import FakeBackend
        from hdeval.cache import CachedBackend

        real = diskcache.Cache.set
        def slow(self, *a, **kw):
            time.sleep(0.05)
            return real(self, *a, **kw)
        diskcache.Cache.set = slow
        cb = CachedBackend(FakeBackend(), {str(tmp_path / "cache")!r})
        for i in range(20):
            cb.complete(CompletionRequest((Message("user", f"q{{i}}"),), kind="score"))
        if {ending!r} == "interrupt":
            raise KeyboardInterrupt
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode == 0) == (ending == "normal"), done.stderr  # Ctrl-C: killed by SIGINT
    entries = cache_entries(tmp_path / "cache")
    assert len(entries) == 20
    reopened = CachedBackend(Refuses(), tmp_path / "cache")
    assert all(reopened.complete(_req(f"q{i}")).cached for i in range(20))
    reopened.close()


def test_many_threads_one_writer_every_reply_on_disk(tmp_path):
    cb = CachedBackend(FakeBackend(), tmp_path / "cache")
    cells = [Cell(f"s{i}", "c", (_req(f"sample {i % 150}"),)) for i in range(300)]  # each twice
    fill_matrix(cb, cells, lambda got: (1.0, None), concurrency=16)
    assert cb.stats.calls == 150 and cb.stats.hits == 150
    assert len(cb.store) == 150  # reading the store waits for queued writes
    cb.close()
    assert len(cache_entries(tmp_path / "cache")) == 150


def test_a_request_finished_between_anothers_lookup_and_its_claim_is_not_paid_twice(tmp_path):
    """Thread B misses the cache, then (descheduled) sees thread A fetch, save and finish the
    same request before B claims it: B must take A's reply, not pay again."""
    fake = FakeBackend()
    missed, a_done = threading.Event(), threading.Event()

    class Paused(CachedBackend):
        def _lookup(self, key):
            got = super()._lookup(key)
            if threading.current_thread().name == "B" and got is None and not missed.is_set():
                missed.set()
                a_done.wait(10)
            return got

    cb = Paused(fake, tmp_path / "cache")
    results: list[Completion] = []
    b = threading.Thread(target=lambda: results.append(cb.complete(_req("same"))), name="B")
    b.start()
    assert missed.wait(10)
    a = cb.complete(_req("same"))
    a_done.set()
    b.join(10)
    assert fake.calls == 1
    assert results[0].cached and results[0].text == a.text
    cb.close()


def test_a_queued_reply_wakes_the_writer_not_every_thread_waiting_for_a_commit(tmp_path, slow_writes):
    """Threads that wait for their previous reply's commit are woken per committed batch, not
    once per reply any thread queues (that herd cost a quarter of the client's GIL time at
    --concurrency 64)."""
    cb = CachedBackend(FakeBackend(), tmp_path / "cache")
    commit_wakes = []
    notify_all = cb._wcond.notify_all
    cb._wcond.notify_all = lambda: (commit_wakes.append(1), notify_all())  # type: ignore[method-assign]
    threads = [threading.Thread(target=cb.complete, args=(_req(f"q{i}"),)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert cb.stats.calls == 20 and slow_writes["done"] == 0  # all 20 queued behind one write
    slow_writes["open"].set()
    cb.close()
    assert slow_writes["done"] == 20
    # the write held open, then the rest in one batch, then close(): never one per reply
    assert len(commit_wakes) <= 3


def test_a_thread_pays_again_only_once_its_previous_reply_is_committed(tmp_path, slow_writes):
    """The thread waits on its own event, set by the writer when its write is committed."""
    fake = FakeBackend()
    cb = CachedBackend(fake, tmp_path / "cache")
    done = []

    def two_calls() -> None:
        cb.complete(_req("first"))
        cb.complete(_req("second"))  # must wait: "first" is not on disk yet
        done.append(True)

    t = threading.Thread(target=two_calls)
    t.start()
    for _ in range(1000):  # until the thread waits for its commit (bounded, not timed)
        if cb._commit_waiters:
            break
        t.join(0.01)
    assert list(cb._commit_waiters) == [1]
    assert fake.calls == 1 and not done  # it did not pay for "second" before "first" was saved
    slow_writes["open"].set()
    t.join(10)
    assert done and fake.calls == 2 and not cb._commit_waiters
    cb.close()
    assert len(cache_entries(tmp_path / "cache")) == 2
