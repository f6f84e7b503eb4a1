"""What ``apply``'s closing summary keeps: the correlations come from columns on disk, read and
ranked one at a time, with the same figures as every row in memory; the client forgets the keys it
committed. Their memory is measured by benchmarks/bench_apply_parts_memory.py and
benchmarks/bench_apply_memory.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np

from hdeval.core.metrics import metric_table
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend
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
    from hdeval.llm import aio

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


def _columns(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Human scores with heavy ties (averages of three 1-5 ratings) and continuous predictions."""
    human = rng.integers(3, 16, size=n) / 3
    return human, human * 0.3 + rng.normal(0, 1, n)


def test_the_lean_ranks_are_scipys_average_ranks_bit_for_bit() -> None:
    from scipy.stats import rankdata

    from hdeval.core.metrics import _order_codes, _ranks

    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 64, 5000):
        for x in (rng.normal(size=n), rng.integers(0, 4, n).astype(float), np.full(n, 2.5),
                  np.where(rng.random(n) < 0.4, -0.0, rng.normal(size=n))):
            assert np.array_equal(_ranks(x), rankdata(x))
            codes = _order_codes(x)  # order and ties kept: the lowest rank from 0 of each value
            assert codes.dtype == np.int32 and np.array_equal(codes, rankdata(x, method="min").astype(int) - 1)


def test_the_streamed_correlations_are_the_same_figures_with_a_nan_a_constant_and_too_few_rows() -> None:
    from hdeval.core.metrics import correlations, streamed_correlations

    rng = np.random.default_rng(4)
    cases = [_columns(rng, n) for n in (3, 40, 3000)]
    y, p = _columns(rng, 500)
    y[7], p[9] = np.nan, np.inf  # rows without a finite pair are left out, as correlations does
    cases += [(y, p), (np.full(50, 3.0), rng.normal(size=50)), (np.array([1.0, 2.0]), np.array([2.0, 1.0])),
              (np.array([1.0, np.nan, 2.0, 3.0]), np.array([1.0, 2.0, np.nan, 3.0]))]
    for y, p in cases:
        read: list[str] = []

        def column(name: str, y=y, p=p) -> np.ndarray:
            read.append(name)
            return (y if name == "human" else p).copy()  # a fresh array, as read from disk

        assert streamed_correlations(column) == correlations(y, p)
        assert set(read) <= {"human", "pred"}


def test_the_duplicate_id_index_names_the_first_line_of_an_id_seen_before(tmp_path) -> None:
    """The index that replaced a dict of every id (its memory is in
    benchmarks/bench_apply_parts_memory.py): a new id is new, a repeat names its first line,
    an id that is not UTF-8 clean (a lone surrogate) is indexed too."""
    from hdeval.data.samples import DiskIds

    with DiskIds(tmp_path) as ids:
        for i in range(5_000):
            assert ids.first_line(f"sample-{i:08x}-{i * 7919 % 5_000}", i + 1) is None
        assert ids.first_line("sample-00000005-4595", 99) == 6
        assert ids.first_line("odd-\ud800", 7_000) is None
        assert ids.first_line("odd-\ud800", 7_001) == 7_000
        assert ids.first_line("odd-\ud801", 7_002) is None
