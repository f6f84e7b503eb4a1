"""Retrain speed: what was made cheaper must give exactly what it gave before.

Pruning shuffles only the candidate columns; the ``nn`` aggregator fits with L-BFGS; fitting
runs BLAS on one thread. Numbers that did not depend on the MLP must not change at all, and a
run stays deterministic for its seed.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_info

import hdeval.learn.aggregate as aggregate
from hdeval.learn.aggregate import Aggregator, cross_val_predictions
from hdeval.methods.hdeval.prune import aspect_importance

ASPECTS = ["fluency", "coherence", "quality"]
RANGES = [(1.0, 5.0), (1.0, 5.0), (0.0, 1.0)]
GROUPS = [["fluency", "coherence"], ["quality"]]
SMALL_GRID = {"alpha": (10.0, 0.1), "hidden_layer_sizes": ((8,),)}


def _data(n_docs: int = 12, per_doc: int = 3, n_features: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = n_docs * per_doc
    X = rng.uniform(1, 5, size=(n, n_features))
    Y = np.column_stack([
        np.clip(X[:, 0] + 0.3 * rng.normal(size=n), 1, 5),
        np.clip(0.5 * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=n), 1, 5),
        np.clip((X[:, 3] - 1) / 4 + 0.05 * rng.normal(size=n), 0, 1),
    ])
    X[rng.random(X.shape) < 0.03] = np.nan
    return X, Y, [f"d{i // per_doc}" for i in range(n)]


def _agg(kind: str = "lr") -> Aggregator:
    return Aggregator(kind, ASPECTS, RANGES, GROUPS, random_state=0)


@pytest.fixture
def small_grid(monkeypatch):
    monkeypatch.setattr(aggregate, "NN_GRID", SMALL_GRID)


@pytest.mark.parametrize("kind", ["lr", "dt", "rf", "nn"])
def test_importance_of_some_columns_equals_those_columns_of_the_full_importance(kind):
    X, Y, _ = _data(n_docs=20, per_doc=4)
    agg = _agg(kind).fit(X[:60], Y[:60])
    full = aspect_importance(agg, X[60:], Y[60:], 5, 0)
    cols = [4, 1, 5]
    part = aspect_importance(agg, X[60:], Y[60:], 5, 0, columns=cols)
    assert set(part) == set(ASPECTS)
    for a in ASPECTS:
        np.testing.assert_array_equal(part[a], full[a][cols])  # exactly: same shuffles, same model


def test_nn_fits_with_lbfgs_deterministically_and_its_warnings_read_the_same_every_fit(monkeypatch):
    X, Y, _ = _data()
    a = _agg("nn").fit(X, Y)
    assert a.models_[0].named_steps["model"].solver == "lbfgs"
    np.testing.assert_array_equal(a.predict(X), _agg("nn").fit(X, Y).predict(X))
    monkeypatch.setattr(aggregate, "NN_MAX_ITER", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):
            Aggregator("nn", ASPECTS, RANGES, GROUPS, random_state=seed).fit(X, Y)
    texts = {str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)}
    # sklearn's own text names the iteration count and a URL; one wording per cause instead
    assert texts == {"nn aggregator (L-BFGS) stopped at its iteration limit (2) before converging"}


def test_models_are_fitted_with_one_blas_thread_and_the_limit_is_lifted_after(monkeypatch):
    seen: list[int] = []
    make = aggregate.make_regressor

    def probing(kind, *args, **kw):
        pipe = make(kind, *args, **kw)
        fit = pipe.fit

        def fit_and_look(X, y):
            seen.append(max(i["num_threads"] for i in threadpool_info()))
            return fit(X, y)

        pipe.fit = fit_and_look
        return pipe

    monkeypatch.setattr(aggregate, "make_regressor", probing)
    before = [i["num_threads"] for i in threadpool_info()]
    X, Y, docs = _data()
    _agg().fit(X, Y)
    cross_val_predictions(_agg(), X, Y, docs, n_jobs=1)
    assert seen and set(seen) == {1}
    assert [i["num_threads"] for i in threadpool_info()] == before


def test_a_three_layer_run_with_pruning_is_deterministic(toy, small_grid):
    from hdeval.run.train import train

    task, data = toy
    runs = []
    for _ in range(2):
        ev = train(task=str(task), data=str(data), llm="fake", layers=3, aggregator="auto",
                   children=2, top_k=2, cache_dir=str(toy[0].parent / "cache"))
        metrics = {k: v for k, v in ev.metrics.items() if k != "usage"}
        runs.append(json.dumps([metrics, ev.manifest_extra["layers"]], sort_keys=True))
        layers = ev.manifest_extra["layers"]
    assert runs[0] == runs[1]
    assert layers[1]["positive_importance"] is not None  # layer 2 was pruned


# --------------------------------------------------------------------------- bulk cache reads
def _reqs(n: int):
    from hdeval.llm.backends.base import CompletionRequest, Message

    return [CompletionRequest((Message("user", f"question {i}"),), top_logprobs=5, kind="score")
            for i in range(n)]


def test_unusable_and_expired_entries_are_asked_again_and_warned_about_once(tmp_path):
    import sqlite3

    import diskcache

    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.llm.cache.client import CachedBackend, CacheWarning, request_key

    reqs = _reqs(3)
    fake = FakeBackend()
    keys = [request_key(fake.identity, r) for r in reqs]
    with diskcache.Cache(str(tmp_path / "c")):
        pass
    con = sqlite3.connect(tmp_path / "c" / "cache.db")
    rows = [(keys[0], 1, None, "{not json", None), (keys[1], 3, "../../../../etc/passwd", None, None),
            (keys[2], 1, None, '{"text": "4"}', 1.0)]  # the last one expired in 1970
    con.executemany("INSERT INTO Cache(key, raw, store_time, access_time, mode, filename, value, expire_time) "
                    "VALUES (?, 1, 0, 0, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    cb = CachedBackend(fake, tmp_path / "c")
    with pytest.warns(CacheWarning):
        out = cb.complete_many(reqs)
    assert fake.calls == 3 and not any(c.cached for c in out)
    assert cb.stats.unreadable == 2  # each unusable entry counted once, not once per lookup
    cb.close()
