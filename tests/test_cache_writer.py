"""Cache writes (one writer, batched transactions) lose nothing that was paid for: slow
commits, an interrupted fill, an exit without close(); a reopened cache sees every reply."""

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

from hdeval.judge.fill import Cell, fill_matrix
from hdeval.llm.backends.base import Completion, CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend, request_key

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
        import hdeval.methods.hdeval  # registers the fake LLM's "score" responder
        from hdeval.llm.backends.base import CompletionRequest, Message
        from hdeval.llm.backends.fake import FakeBackend
        from hdeval.llm.cache.client import CachedBackend

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
    assert len(cb.store) == 150  # every reply returned is committed
    cb.close()
    assert len(cache_entries(tmp_path / "cache")) == 150




@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("call", ["complete", "complete_many", "stored"])
def test_a_client_used_in_a_forked_child_is_refused_in_one_line_and_the_parent_goes_on(tmp_path, call):
    """A forked child has none of the client's threads: it used to wait forever. It is told to
    open its own client; the parent's client, and its cache, go on as before."""
    script = textwrap.dedent(f"""
        import os
        import hdeval.methods.hdeval  # registers the fake LLM's "score" responder
        from hdeval.llm.backends.base import CompletionRequest, Message
        from hdeval.llm.backends.fake import FakeBackend
        from hdeval.llm.cache.client import CachedBackend
        from hdeval.core.errors import ConfigError

        def req(text):
            return CompletionRequest((Message("user", text),), kind="score")

        cb = CachedBackend(FakeBackend(), {str(tmp_path / "cache")!r})
        cb.complete(req("parent"))
        pid = os.fork()
        if pid == 0:
            try:
                {{"complete": lambda: cb.complete(req("child")), "complete_many": lambda: cb.complete_many([req("child")]),
                 "stored": lambda: cb.stored([cb.key(req("parent"))])}}[{call!r}]()
                os._exit(3)
            except ConfigError as exc:
                print(exc, flush=True)
            cb.close()  # only lets go of the parent's threads
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert cb.complete(req("parent")).cached
        cb.complete(req("after"))
        cb.close()
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line, = done.stdout.strip().splitlines()
    assert "a forked process cannot use its cache writer" in line and "open one in the new process" in line
    reopened = CachedBackend(Refuses(), tmp_path / "cache")
    assert reopened.complete(_req("parent")).cached and reopened.complete(_req("after")).cached
    assert reopened.stored([reopened.key(_req("child"))]) == set()
    reopened.close()
