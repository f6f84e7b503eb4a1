"""Pruning expands only criteria whose importance is real: above its own
spread across folds and above shuffled shadow copies of the candidates. A pure-noise criterion
is never expanded, by any aggregator."""

from __future__ import annotations

import numpy as np
import pytest
from simjudge import pointwise_backend, pointwise_rows, write_pointwise

from hdeval.learn.aggregate import Aggregator
from hdeval.methods.hdeval.prune import prune
from hdeval.run.train import train

KINDS = ["lr", "dt", pytest.param("rf", marks=pytest.mark.slow), pytest.param("nn", marks=pytest.mark.slow)]  # fit slowly


def _columns(seed: int, n_docs: int = 35, per_doc: int = 3):
    """Two informative columns (the human score plus judge noise) and six of pure noise."""
    rng = np.random.default_rng(seed)
    n = n_docs * per_doc
    y = rng.uniform(1, 5, n)
    signal = [np.clip(np.round(y + rng.normal(0, s, n)), 1, 5) for s in (0.6, 0.9)]
    noise = [rng.integers(1, 6, n).astype(float) for _ in range(6)]
    X = np.column_stack(signal + noise)
    groups = [f"d{i // per_doc}" for i in range(n)]
    return X, y[:, None], groups


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(4))
def test_pure_noise_columns_are_never_expanded(kind, seed):
    X, Y, groups = _columns(seed)
    keys = ["good", "fair"] + [f"noise{i}" for i in range(6)]
    agg = Aggregator(kind, ["q"], [(1.0, 5.0)], [["q"]], random_state=seed)
    pr = prune(agg, X, Y, keys, keys, groups, top_k=4, n_jobs=1)
    assert not [k for k in pr.selected if k.startswith("noise")], (pr.selected, pr.importance)
    assert pr.n_positive == len(pr.selected) or len(pr.selected) == 4
    assert set(pr.spread) == set(keys)


@pytest.mark.parametrize("kind", KINDS)
def test_a_strong_criterion_is_still_expanded(kind):
    hits = 0
    for seed in range(4):
        X, Y, groups = _columns(seed)
        keys = ["good", "fair"] + [f"noise{i}" for i in range(6)]
        agg = Aggregator(kind, ["q"], [(1.0, 5.0)], [["q"]], random_state=seed)
        hits += "good" in prune(agg, X, Y, keys, keys, groups, top_k=4, n_jobs=1).selected
    assert hits >= 3


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_noise_criterion_of_the_simulated_judge_is_never_expanded(tmp_path, kind):
    for seed in range(3):
        run = tmp_path / str(seed)
        run.mkdir()
        task, data = write_pointwise(run, pointwise_rows(40, seed=seed))
        ev = train(task=str(task), data=str(data), llm="fake", aggregator=kind, layers=3, seed=seed,
                   cache_dir=str(run / "c"),
                   backend=pointwise_backend(noise=1.0, deep_signal=True, noise_criteria=("focus", "coverage")))
        layer2 = ev.manifest_extra["layers"][1]
        assert any(k.endswith(("focus", "coverage")) for k in layer2["added"])  # the noise was there
        assert not [k for k in layer2["expand_next"] if k.endswith(("focus", "coverage"))], layer2
