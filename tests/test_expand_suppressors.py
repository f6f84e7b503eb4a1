"""With a halo (an error every criterion of a sample shares), a pure-noise
criterion carries the halo and nothing of the human score; the aggregator gives it a negative
weight to subtract the halo from the others (a suppressor), its permutation importance is real, and
pruning expands it. Decided by measurement (``benchmarks/bench_expand_suppressors.py``): skipping
such criteria for expansion lowers held-out agreement, since their children carry the halo too
and subtract it better, and the skip also drops informative criteria that get a negative weight
beside correlated ones. So expansion keeps choosing by importance alone, whatever the sign."""

from __future__ import annotations

import numpy as np
import pytest
from simcriteria import Judge, children, criteria_sheet, load_human

from hdeval.core.metrics import average_spearman
from hdeval.learn.aggregate import Aggregator
from hdeval.methods.hdeval.prune import prune

JUDGE = Judge(halo=0.6, misread=0.3, noise=0.7, noise_criteria=1)  # a halo, little misreading


def _task(seed: int):
    """SFHOT's human scores, the simulated judge's criteria on them, half the documents for training."""
    human = load_human("sfhot")
    if human is None:
        pytest.skip("sfhot.jsonl not in HDEVAL_DATA_DIR")
    docs = np.unique(human.groups)
    train = np.isin(human.groups, np.random.default_rng(1000 + seed).permutation(docs)[: len(docs) // 2])
    return human, criteria_sheet(human.scores, JUDGE, seed=seed), train


def _aggregator(human, seed: int) -> Aggregator:
    return Aggregator(
        "lr", list(human.aspects), list(human.ranges), [[a] for a in human.aspects], random_state=seed
    )


def _slope(agg: Aggregator, X: np.ndarray, column: int) -> float:
    """How the fitted predictions move, summed over aspects, when ``column`` rises: its weight's sign."""
    up, down = X.copy(), X.copy()
    up[:, column] += 0.5
    down[:, column] -= 0.5
    return float((agg.predict(up) - agg.predict(down)).mean(axis=0).sum())


def _held_out(human, sheet, train, expanded: list[int], seed: int) -> float:
    """Held-out agreement once ``expanded`` are decomposed into children (the next layer)."""
    X = np.hstack([sheet.scores, children(sheet, JUDGE, expanded, 3, seed=seed)])
    agg = _aggregator(human, seed).fit(X[train], human.scores[train])
    return average_spearman(human.scores[~train], agg.predict(X[~train]))


TOP_K = 4


@pytest.mark.slow
def test_a_suppressor_is_expanded_and_skipping_suppressors_would_lower_agreement() -> None:
    noise_expanded, by_importance, skipping = 0, [], []
    for seed in range(3):
        human, sheet, train = _task(seed)
        X, Y = sheet.scores, human.scores
        keys = [f"c{j}" for j in range(X.shape[1])]
        candidates = [k for j, k in enumerate(keys) if j not in sheet.direct]
        # every candidate whose importance is real, most important first: today's choice is its head
        pr = prune(
            _aggregator(human, seed),
            X[train],
            Y[train],
            keys,
            candidates,
            list(human.groups[train]),
            len(candidates),
            n_jobs=1,
        )
        real = [keys.index(k) for k in pr.selected]
        fitted = _aggregator(human, seed).fit(X[train], Y[train])
        noise = [c for c in real[:TOP_K] if sheet.load[c] == 0]
        noise_expanded += len(noise)
        assert all(_slope(fitted, X[train], c) < 0 for c in noise)  # each one a suppressor
        by_importance.append(_held_out(human, sheet, train, real[:TOP_K], seed))
        positive = [c for c in real if _slope(fitted, X[train], c) > 0][:TOP_K]
        skipping.append(_held_out(human, sheet, train, positive, seed))
    assert noise_expanded >= 3  # the halo gives pure noise real importance: pruning expands it
    assert np.mean(by_importance) > np.mean(skipping)
