"""The cache: what its key contains, zero calls on a rerun, and resume after interruption."""

from __future__ import annotations

import pytest

from hdeval.core.errors import BudgetExceeded
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend, request_key
from hdeval.run.train import train


def _req(**kw):
    kw.setdefault("kind", "score")  # the fake LLM answers by kind; kind is not key material
    return CompletionRequest((Message("user", "hello"),), **kw)


def test_key_covers_output_relevant_fields_only():
    base = request_key("openai:m@http://a/v1", _req())
    assert base == request_key("openai:m@http://a/v1", _req())
    assert base != request_key("openai:m@http://b/v1", _req())  # base URL
    assert base != request_key("openai:other@http://a/v1", _req())  # model
    assert base != request_key("openai:m@http://a/v1", _req(max_tokens=99))
    assert base != request_key("openai:m@http://a/v1", _req(top_logprobs=5))
    assert base != request_key("openai:m@http://a/v1", CompletionRequest((Message("user", "hello!"),)))


def test_identical_second_train_makes_zero_calls(toy, tmp_path):
    task, data = toy
    opts = dict(task=str(task), data=str(data), layers=3, cache_dir=str(tmp_path / "c"), aggregator="lr")
    first = FakeBackend()
    ev1 = train(backend=first, **opts)
    assert first.calls > 0
    second = FakeBackend()
    ev2 = train(backend=second, **opts)
    assert second.calls == 0
    assert ev2.metrics["usage"]["cache_hits"] >= first.calls
    assert ev1.tree == ev2.tree
    assert ev1.metrics["final"] == ev2.metrics["final"]


class Interrupting(FakeBackend):
    """Raises KeyboardInterrupt (a Ctrl-C) after ``stop_after`` calls."""

    def __init__(self, stop_after: int):
        super().__init__()
        self.stop_after = stop_after

    def complete(self, request):
        if self.calls >= self.stop_after:
            raise KeyboardInterrupt
        return super().complete(request)


def test_interrupted_run_resumes_without_repeating_calls(toy, tmp_path):
    task, data = toy
    opts = dict(task=str(task), data=str(data), layers=2, cache_dir=str(tmp_path / "c"),
                aggregator="lr", concurrency=1)
    full = FakeBackend()
    reference = train(backend=full, cache_dir=str(tmp_path / "ref"), **{k: v for k, v in opts.items() if k != "cache_dir"})
    stopped = Interrupting(stop_after=full.calls // 2)
    with pytest.raises(KeyboardInterrupt):
        train(backend=stopped, **opts)
    done = stopped.requests[:]
    resumed = FakeBackend()
    ev = train(backend=resumed, **opts)
    seen = {request_key("fake:v1", r) for r in done}
    again = [r for r in resumed.requests if request_key("fake:v1", r) in seen]
    assert not again, "finished calls were made again"
    assert len(done) + resumed.calls == full.calls
    assert ev.tree == reference.tree and ev.metrics["final"] == reference.metrics["final"]


def test_max_calls_stops_cleanly_and_rerun_continues(toy, tmp_path):
    task, data = toy
    opts = dict(task=str(task), data=str(data), layers=2, cache_dir=str(tmp_path / "c"), aggregator="lr")
    total = FakeBackend()
    train(backend=total, **{**opts, "cache_dir": str(tmp_path / "ref")})
    limited = FakeBackend()
    with pytest.raises(BudgetExceeded, match="--max-calls 50"):
        train(backend=limited, max_calls=50, **opts)
    assert limited.calls <= 50
    rest = FakeBackend()
    train(backend=rest, **opts)
    assert limited.calls + rest.calls == total.calls


def test_cached_backend_counts_tokens(tmp_path):
    cb = CachedBackend(FakeBackend(), tmp_path / "c")
    cb.complete(_req())
    cb.complete(_req())
    assert cb.stats.calls == 1 and cb.stats.hits == 1 and cb.stats.prompt_tokens > 0
    cb.close()
