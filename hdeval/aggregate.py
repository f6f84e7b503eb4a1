"""Aggregation (paper 2.2): white-box regressors from criterion scores to human aspects.

Aspects that share a score range are fitted by one multi-output regressor; an aspect with a
different range gets its own (the paper does this for Topical-Chat's groundedness).
Pure scikit-learn: no LLM, no disk.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sklearn.ensemble import RandomForestRegressor
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GroupKFold, KFold
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor

from hdeval.errors import ConfigError
from hdeval.metrics import mean_spearman
from hdeval.types import Task

KINDS = ("lr", "dt", "rf", "nn")
N_FOLDS = 5


def make_regressor(kind: str, random_state: int = 0) -> Pipeline:
    """Imputer (median; a failed LLM score is NaN) -> standardiser -> model."""
    if kind == "lr":
        model = LinearRegression()
    elif kind == "dt":
        model = DecisionTreeRegressor(random_state=random_state)
    elif kind == "rf":
        model = RandomForestRegressor(random_state=random_state, n_jobs=1)
    elif kind == "nn":
        # "shallow 3-layer ReLU MLP": input -> two hidden ReLU layers -> output.
        model = MLPRegressor(
            hidden_layer_sizes=(64, 32),
            activation="relu",
            max_iter=2000,
            early_stopping=False,
            random_state=random_state,
        )
    else:
        raise ConfigError(f"unknown aggregator {kind!r}: choose from {', '.join(KINDS)} or auto")
    return Pipeline(
        [
            ("impute", SimpleImputer(strategy="median", keep_empty_features=True)),
            ("scale", StandardScaler()),
            ("model", model),
        ]
    )


def aspect_groups(task: Task) -> list[list[str]]:
    """Aspects grouped by identical score range, in task order."""
    groups: dict[tuple[float, float], list[str]] = {}
    for a in task.aspects:
        groups.setdefault(a.range, []).append(a.key)
    return list(groups.values())


class Aggregator:
    """Maps criterion scores (columns ``feature_keys``) to aspect scores, scikit-learn style.

    ``fit`` returns self; learned state ends in ``_``; predictions are clipped to each
    aspect's range.
    """

    def __init__(
        self,
        kind: str,
        aspects: Sequence[str],
        ranges: Sequence[tuple[float, float]],
        groups: Sequence[Sequence[str]],
        random_state: int = 0,
    ):
        self.kind = kind
        self.aspects = list(aspects)
        self.ranges = [tuple(r) for r in ranges]
        self.groups = [list(g) for g in groups]
        self.random_state = random_state

    @classmethod
    def for_task(cls, kind: str, task: Task, random_state: int = 0) -> "Aggregator":
        return cls(
            kind,
            task.aspect_keys,
            [a.range for a in task.aspects],
            aspect_groups(task),
            random_state,
        )

    def clone(self, kind: str | None = None) -> "Aggregator":
        """An unfitted copy with the same settings (optionally another ``kind``)."""
        return Aggregator(kind or self.kind, self.aspects, self.ranges, self.groups, self.random_state)

    def _cols(self, group: Sequence[str]) -> list[int]:
        return [self.aspects.index(a) for a in group]

    def fit(self, X: np.ndarray, Y: np.ndarray) -> "Aggregator":
        X = np.asarray(X, float)
        Y = np.asarray(Y, float)
        if X.shape[0] != Y.shape[0] or Y.shape[1] != len(self.aspects):
            raise ValueError("X and Y do not match")
        self.models_ = []
        for g in self.groups:
            y = Y[:, self._cols(g)]
            model = make_regressor(self.kind, self.random_state)
            model.fit(X, y[:, 0] if y.shape[1] == 1 else y)
            self.models_.append(model)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, float)
        out = np.zeros((X.shape[0], len(self.aspects)))
        for g, model in zip(self.groups, self.models_):
            pred = np.asarray(model.predict(X)).reshape(X.shape[0], -1)
            out[:, self._cols(g)] = pred
        lo = np.array([r[0] for r in self.ranges])
        hi = np.array([r[1] for r in self.ranges])
        return np.clip(out, lo, hi)

    def model_for(self, aspect: str) -> tuple[Pipeline, int | None]:
        """The pipeline that predicts ``aspect`` and its output column (None if single)."""
        for g, model in zip(self.groups, self.models_):
            if aspect in g:
                return model, (g.index(aspect) if len(g) > 1 else None)
        raise KeyError(aspect)

    def used_features(self) -> np.ndarray:
        """Boolean mask of features some model actually uses (a tree may ignore some)."""
        used = np.zeros(self.n_features_in_, bool)
        for model in self.models_:
            est = model.named_steps["model"]
            if hasattr(est, "feature_importances_"):
                used |= np.asarray(est.feature_importances_) > 0
            elif hasattr(est, "coef_"):
                coef = np.atleast_2d(est.coef_)
                used |= np.any(coef != 0, axis=0)
            else:
                used[:] = True
        return used


def cv_folds(groups: Sequence[str], random_state: int, n_folds: int = N_FOLDS) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, held-out) index pairs: grouped by doc_id when there are enough documents,
    else plain shuffled folds (tiny ``--limit`` runs)."""
    idx = np.arange(len(groups))
    if len(set(groups)) >= n_folds:
        return list(GroupKFold(n_splits=n_folds).split(idx, groups=list(groups)))
    k = min(n_folds, max(2, len(groups) // 2))
    return list(KFold(n_splits=k, shuffle=True, random_state=random_state).split(idx))


def cross_val_predictions(
    template: Aggregator, X: np.ndarray, Y: np.ndarray, groups: Sequence[str]
) -> np.ndarray:
    """Out-of-fold predictions on the training split (the "cross-validated train" figure)."""
    pred = np.zeros_like(Y, dtype=float)
    for tr, va in cv_folds(groups, template.random_state):
        pred[va] = template.clone().fit(X[tr], Y[tr]).predict(X[va])
    return pred


def select_kind(
    template: Aggregator, X: np.ndarray, Y: np.ndarray, groups: Sequence[str], kinds: Sequence[str] = KINDS
) -> tuple[str, dict[str, float]]:
    """``--aggregator auto``: the kind with the best cross-validated mean Spearman."""
    scores = {k: mean_spearman(Y, cross_val_predictions(template.clone(k), X, Y, groups)) for k in kinds}
    best = max(kinds, key=lambda k: (scores[k], -kinds.index(k)))
    return best, scores
