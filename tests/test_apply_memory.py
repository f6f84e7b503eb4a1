"""Memory of ``apply`` flat in the input (issue #23 item 3): what used to grow per sample is on
disk or forgotten once not needed, with the same results."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np

from hdeval.backends.base import CompletionRequest, Message
from hdeval.backends.fake import FakeBackend
from hdeval.cache import CachedBackend
from hdeval.metrics import metric_table
from hdeval.run.apply import _Summary


def test_the_closing_correlations_from_disk_equal_those_of_every_row_in_memory(tmp_path) -> None:
    rng = np.random.default_rng(0)
    aspects = ["coherence", "fluency", "relevance"]
    summary = _Summary(str(tmp_path), "held-out")
    human, pred = [], []
    for size in (7, 1000, 3, 250):
        h = rng.integers(1, 6, size=(size, 3)) / rng.integers(1, 4, size=(size, 3))
        p = rng.normal(3, 1, size=(size, 3))
        samples = [SimpleNamespace(scores=dict(zip(aspects, row))) for row in h.tolist()]
        summary.add(samples, SimpleNamespace(aspects=aspects, predictions=p))
        human.append(h)
        pred.append(p)
    assert summary.correlations() == metric_table(np.concatenate(human), np.concatenate(pred), aspects)
    assert not [v for v in vars(summary).values() if isinstance(v, list) and v and not isinstance(v[0], str)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"held-out-{k}-{j}.f64" for k in ("human", "pred") for j in range(3))


def test_a_sample_without_human_scores_means_no_correlations(tmp_path) -> None:
    summary = _Summary(str(tmp_path), "held-out")
    summary.add([SimpleNamespace(scores={"a": 1.0}), SimpleNamespace(scores={})],
                SimpleNamespace(aspects=["a"], predictions=np.ones((2, 1))))
    assert summary.correlations() is None


def _reqs(n: int) -> list[CompletionRequest]:
    return [CompletionRequest((Message("user", f"rate {i}"),), kind="score") for i in range(n)]


def test_the_client_forgets_committed_keys_once_no_batch_runs_and_still_pays_each_request_once(tmp_path) -> None:
    """The keys a client committed were remembered for the whole run (~150 B a reply); they are
    needed only while a batch whose lookup came before the commit runs."""
    from hdeval import aio

    fake = FakeBackend()
    cb = CachedBackend(fake, tmp_path / "c", concurrency=4)
    try:
        cb.complete_many(_reqs(50))
        assert fake.calls == 50 and cb._saved == set()

        async def overlapping():
            return await asyncio.gather(cb.acomplete_many(_reqs(80)), cb.acomplete_many(_reqs(80)))

        first, second = aio.run(overlapping())
        assert fake.calls == 80  # 30 new requests, paid once though both batches asked them
        assert [c.text for c in first] == [c.text for c in second]
        assert cb._saved == set()
        again = cb.complete_many(_reqs(80))
        assert fake.calls == 80 and all(c.cached for c in again)
    finally:
        cb.close()
