"""Attribution pruning (paper 2.3): permutation importance picks the criteria to expand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from sklearn.base import clone
from sklearn.inspection import permutation_importance
from sklearn.metrics import r2_score

from hdeval.learn.aggregate import Aggregator, cv_folds, run_jobs

N_REPEATS = 5


@dataclass(frozen=True)
class PruneResult:
    importance: dict[str, float]  # candidate key -> importance summed over aspects
    per_aspect: dict[str, dict[str, float]] = field(default_factory=dict)
    selected: tuple[str, ...] = ()
    n_positive: int = 0  # candidates whose importance is real (only these may be expanded)
    spread: dict[str, float] = field(default_factory=dict)  # key -> std of its importance over folds


def _group_scorer(group: Sequence[str]):
    """R^2 of every aspect of a (possibly multi-output) pipeline from one prediction."""

    def score(estimator, X, y) -> dict[str, float]:
        pred = np.asarray(estimator.predict(X)).reshape(len(X), -1)
        yy = np.asarray(y).reshape(len(X), -1)
        return {a: r2_score(yy[:, j], pred[:, j]) for j, a in enumerate(group)}

    return score


class _OnColumns:
    """A fitted pipeline seen through some columns of ``X`` (the others held at their values),
    so permutation importance shuffles only those columns. scikit-learn shuffles every column
    with the same seed, so a column's importance does not depend on which others are asked."""

    def __init__(self, model, X: np.ndarray, columns: Sequence[int]):
        self.model, self.X, self.columns = model, X, list(columns)

    def fit(self, X, y):  # permutation_importance asks for an estimator; this one is fitted
        raise NotImplementedError("a view of a fitted pipeline")

    def predict(self, Xc: np.ndarray) -> np.ndarray:
        full = self.X.copy()
        full[:, self.columns] = Xc
        return self.model.predict(full)


def aspect_importance(
    agg: Aggregator,
    X: np.ndarray,
    Y: np.ndarray,
    n_repeats: int = N_REPEATS,
    random_state: int = 0,
    columns: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """Permutation importance (mean drop in R^2 of the unclipped pipeline output) of every
    feature (or only of ``columns``, in that order: the same values) for every aspect of a
    fitted aggregator, on the data given (held-out data, never the test split when pruning).
    One prediction per shuffle serves every aspect of a multi-output group."""
    X, Y = np.asarray(X, float), np.asarray(Y, float)
    out = {}
    for group, model in zip(agg.groups_, agg.models_):
        cols = [agg.aspects_.index(a) for a in group]
        y = Y[:, cols] if len(cols) > 1 else Y[:, cols[0]]
        est, Xs = (model, X) if columns is None else (_OnColumns(model, X, columns), X[:, list(columns)])
        res = permutation_importance(
            est, Xs, y, scoring=_group_scorer(group), n_repeats=n_repeats, random_state=random_state
        )
        for a in group:
            out[a] = np.asarray(res[a].importances_mean)
    return {a: out[a] for a in agg.aspects_}


def _fold_importance(
    agg_template: Aggregator,
    X: np.ndarray,
    Y: np.ndarray,
    tr: np.ndarray,
    va: np.ndarray,
    n_repeats: int,
    columns: Sequence[int],
) -> dict[str, np.ndarray]:
    """One pruning fold: fit on its training rows, importance of ``columns`` on its held-out rows."""
    agg = clone(agg_template).fit(X[tr], Y[tr])
    return aspect_importance(agg, X[va], Y[va], n_repeats, agg_template.random_state, columns)


def prune(
    agg_template: Aggregator,
    X: np.ndarray,
    Y: np.ndarray,
    feature_keys: Sequence[str],
    candidates: Sequence[str],
    doc_groups: Sequence[str],
    top_k: int,
    n_repeats: int = N_REPEATS,
    n_jobs: int | None = None,
) -> PruneResult:
    """Fit on training folds, measure importance on the held-out fold, average over folds;
    sum over aspects; select up to ``top_k`` candidates whose importance is real, most
    important first (ties broken by tree order). Real means: its mean importance less its
    spread across the folds (standard deviation) still beats the best shuffled shadow
    column's mean plus spread. On ~100 training rows a tree finds positive importance in a
    pure-noise column now and then; a bare ``> 0`` expanded it. Fewer than ``top_k`` (even
    none) may be selected. Only the candidates (and their shadows) are shuffled."""
    cand_idx = [list(feature_keys).index(c) for c in candidates]
    # Shadows (as in Boruta): each candidate's column shuffled across the training rows, so it
    # keeps its values but loses any link to the humans. The aggregator is fitted with them
    # beside the real columns, and a candidate counts only when it beats every shadow.
    X = np.asarray(X, float)
    rng = np.random.default_rng(agg_template.random_state)
    shadows = X[:, cand_idx][rng.permutation(len(X))]
    X = np.hstack([X, shadows])
    shadow_idx = list(range(X.shape[1] - len(cand_idx), X.shape[1]))
    per_aspect = {a: np.zeros(2 * len(candidates)) for a in agg_template.aspects}
    per_fold: list[np.ndarray] = []  # each fold's importance summed over aspects
    calls = [
        (_fold_importance, (agg_template, X, Y, tr, va, n_repeats, cand_idx + shadow_idx))
        for tr, va in cv_folds(doc_groups, agg_template.random_state)
    ]
    for imp in run_jobs(calls, n_jobs):  # the folds in parallel, summed in fold order
        for a, values in imp.items():
            per_aspect[a] += values
        per_fold.append(sum(imp.values()))
    n, k = len(per_fold), len(candidates)
    per_aspect = {a: v[:k] / max(n, 1) for a, v in per_aspect.items()}
    folds_all = np.array(per_fold)
    spread = folds_all.std(axis=0, ddof=1) if n > 1 else np.zeros(2 * k)
    # the best a column with no link to the humans reached: a shadow's mean plus its spread
    shadow_best = float(max(0.0, (folds_all.mean(axis=0) + spread)[k:].max())) if k else 0.0
    total = sum(per_aspect.values())
    importance = {c: float(total[i]) for i, c in enumerate(candidates)}
    positive = [i for i in range(k) if total[i] - spread[i] > shadow_best]
    order = sorted(positive, key=lambda i: (-total[i], i))
    selected = tuple(candidates[i] for i in order[:top_k])
    return PruneResult(
        importance,
        {a: {c: float(v[i]) for i, c in enumerate(candidates)} for a, v in per_aspect.items()},
        selected,
        len(positive),
        {c: float(spread[i]) for i, c in enumerate(candidates)},
    )
