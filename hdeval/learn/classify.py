"""Classifiers from per-criterion score differences (A minus B) to the human label a / b / tie,
for HD-Eval on a pairwise task: the kinds of :mod:`hdeval.learn.aggregate` as classifiers, in the
same pipeline (impute -> standardise -> model). Pure scikit-learn: no LLM, no disk."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
from sklearn.ensemble import RandomForestClassifier
from sklearn.inspection import permutation_importance
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.tree import DecisionTreeClassifier

from hdeval.core.errors import ConfigError
from hdeval.core.metrics import agreement_w_ties, label_codes
from hdeval.learn.aggregate import KINDS, NN_ALPHA, NN_HIDDEN, NN_MAX_ITER, cv_folds, pipeline

N_REPEATS = 5


def make_classifier(kind: str, random_state: int = 0) -> Pipeline:
    if kind == "lr":
        model = LogisticRegression(max_iter=2000, random_state=random_state)
    elif kind == "dt":
        # a fully grown tree memorises a few dozen pairs; a shallow one stays readable
        model = DecisionTreeClassifier(max_depth=4, min_samples_leaf=3, random_state=random_state)
    elif kind == "rf":
        model = RandomForestClassifier(min_samples_leaf=2, random_state=random_state, n_jobs=1)
    elif kind == "nn":
        model = MLPClassifier(
            hidden_layer_sizes=NN_HIDDEN,
            alpha=NN_ALPHA,
            activation="relu",
            max_iter=NN_MAX_ITER,
            random_state=random_state,
        )
    else:
        raise ConfigError(f"unknown aggregator {kind!r}: choose from {', '.join(KINDS)} or auto")
    return pipeline(model)


# kind -> the class name of the model its pipeline ends in (what a loaded artifact must hold)
CLASSIFIERS = {k: type(make_classifier(k).named_steps["model"]).__name__ for k in KINDS}


def predict_labels(model: Pipeline, X: np.ndarray) -> tuple[list[str], list[str]]:
    """(labels, labels forced to a or b): the second compares P(a) with P(b) when the model
    knows ties (the "without ties" figure never credits a tie)."""
    X = np.asarray(X, float)
    if len(X) == 0:
        return [], []
    labels = [str(x) for x in model.predict(X)]
    classes = [str(c) for c in model.classes_]
    if "tie" not in classes:
        return labels, list(labels)
    p = model.predict_proba(X)
    ia, ib = classes.index("a"), classes.index("b")
    return labels, ["a" if row[ia] >= row[ib] else "b" for row in p]


def _fold_fits(
    kind: str, X: np.ndarray, y: Sequence[str], groups: Sequence[str], random_state: int
) -> Iterator[tuple[Pipeline, np.ndarray]]:
    """(classifier, held-out rows) per fold grouped by doc_id whose training part holds two labels."""
    y = list(y)
    for tr, va in cv_folds(groups, random_state):
        ytr = [y[i] for i in tr]
        if len(set(ytr)) >= 2 and len(va):
            yield make_classifier(kind, random_state).fit(X[tr], ytr), va


def cv_predictions(
    kind: str, X: np.ndarray, y: Sequence[str], groups: Sequence[str], random_state: int
) -> tuple[list[str | None], list[str | None]]:
    """Out-of-fold predictions on the training split (None where a fold could not be fitted)."""
    pred: list[str | None] = [None] * len(y)
    pred_ab: list[str | None] = [None] * len(y)
    for model, va in _fold_fits(kind, X, y, groups, random_state):
        for i, a, b in zip(va, *predict_labels(model, X[va])):
            pred[i], pred_ab[i] = a, b
    return pred, pred_ab


def select_classifier(
    X: np.ndarray, y: Sequence[str], groups: Sequence[str], random_state: int, kinds: Sequence[str] = KINDS
) -> tuple[str, dict[str, float]]:
    """``--aggregator auto``: the kind with the best cross-validated agreement (3-way
    accuracy) on the training split; ties go to the earlier (simpler) kind."""
    scores = {}
    for k in kinds:
        acc = agreement_w_ties(label_codes(y), label_codes(cv_predictions(k, X, y, groups, random_state)[0]))
        scores[k] = round(acc if acc == acc else 0.0, 6)  # NaN: no pair predicted, never chosen
    best = max(kinds, key=lambda k: (scores[k], -list(kinds).index(k)))
    return best, scores


def prune_importance(
    kind: str,
    X: np.ndarray,
    y: Sequence[str],
    candidates: Sequence[int],
    groups: Sequence[str],
    random_state: int,
    n_repeats: int = N_REPEATS,
) -> np.ndarray:
    """Permutation importance of the ``candidates`` columns: the drop in held-out agreement
    (accuracy) when a column is shuffled, fitted on the training folds and measured on the
    held-out fold, averaged over folds (never the test split)."""
    y = np.asarray(list(y), dtype=object)
    total = np.zeros(len(candidates))
    n = 0
    for model, va in _fold_fits(kind, X, y, groups, random_state):
        total += heldout_importance(model, X[va], y[va], random_state, n_repeats)[list(candidates)]
        n += 1
    return total / max(n, 1)


def heldout_importance(
    model: Pipeline, X: np.ndarray, y: Sequence[str], random_state: int, n_repeats: int = N_REPEATS
) -> np.ndarray:
    """Permutation importance of every column of a fitted classifier on (held-out) rows."""
    if len(X) == 0:
        return np.zeros(X.shape[1])
    res = permutation_importance(
        model, X, list(y), scoring="accuracy", n_repeats=n_repeats, random_state=random_state
    )
    return np.asarray(res.importances_mean)
