"""A trained run's held-out predictions, read from its score table without any LLM call."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hdeval.benchmark.statistics import Statistic
from hdeval.core.errors import ConfigError
from hdeval.core.metrics import LABEL_CODES, agreement_w_ties, agreement_wo_ties
from hdeval.core.metrics import as2d as _as2d
from hdeval.core.metrics import label_codes as _codes
from hdeval.methods.base import HeldOutLabels, HeldOutScores


@dataclass
class HeldOut:
    """A trained evaluator's predictions on its test split, with the human scores."""

    sample_ids: list[str]
    doc_ids: list[str]
    aspects: list[str]
    y: np.ndarray
    pred: np.ndarray
    # rows with an empty LLM-filled cell or no prediction: a failure whatever the method does
    # with it (HD-Eval imputes, direct leaves it empty), so every method is compared without them
    failed: np.ndarray | None = None

    def rows(self, keep: np.ndarray) -> "HeldOut":
        return HeldOut(
            list(compress(self.sample_ids, keep)),
            list(compress(self.doc_ids, keep)),
            self.aspects,
            self.y[keep],
            self.pred[keep],
            None if self.failed is None else self.failed[keep],
        )


def held_out(fitted: Any, doc_of: Mapping[str, str], pairwise: bool = False) -> "HeldOut | PairHeldOut":
    """The test rows of a trained evaluator's score table (``scores.csv``) and what it predicts
    for them from its LLM-filled columns (pairwise: the method's ``held_out_labels``), without
    any LLM call."""
    _check_capability(fitted, pairwise)  # before its score table: the reason it has none
    table = _score_table(fitted)
    test = table[table["split"] == "test"]
    ids = [str(s) for s in test["pair_id" if pairwise else "sample_id"]]
    # a row with an empty cell the LLM fills (any number column but ids, split and human scores)
    cols = [
        c
        for c in test.columns
        if c not in ("sample_id", "pair_id", "split", "human")
        and not str(c).startswith("human:")
        and test[c].dtype.kind in "fiu"
    ]
    docs, failed = [doc_of[s] for s in ids], test[cols].isna().any(axis=1).to_numpy()
    if pairwise:
        preds = fitted.held_out_labels(test)
        failed = failed | np.array([p is None for p in preds["evaluator"][0]], bool)
        train = [_pair_label(x) for x in table[table["split"] == "train"]["human"]]
        return PairHeldOut(ids, docs, [_pair_label(x) for x in test["human"]], preds, failed, train)
    aspects = list(fitted.task.aspect_keys)
    pred = _as2d(fitted.held_out_predictions(table, test))
    failed = failed | ~np.isfinite(pred).all(axis=1)
    return HeldOut(ids, docs, aspects, test[[f"human:{a}" for a in aspects]].to_numpy(float), pred, failed)


def check_held_out(method: Any, pairwise: bool) -> None:
    """Before a sweep, a ConfigError when ``method`` (a registered Method) cannot give held-out
    figures: known where its ``load`` is its evaluator class's ``from_artifact`` (a plug-in's, as
    docs/plugins.md writes it); else :func:`held_out` finds out after its first run."""
    evaluator = getattr(method.load, "__self__", None)
    if isinstance(evaluator, type) and not issubclass(
        evaluator, HeldOutLabels if pairwise else HeldOutScores
    ):
        raise ConfigError(_refusal(method.name, evaluator.__name__, pairwise))


def _check_capability(fitted: Any, pairwise: bool) -> None:
    if not isinstance(fitted, HeldOutLabels if pairwise else HeldOutScores):
        raise ConfigError(_refusal(fitted.method, type(fitted).__name__, pairwise))


def _refusal(method: str, evaluator: str, pairwise: bool) -> str:
    need, member = (
        ("HeldOutLabels", "held_out_labels(test)")
        if pairwise
        else ("HeldOutScores", "held_out_predictions(table, test)")
    )
    return (
        f"benchmark cannot compare method {method!r}: its evaluator {evaluator} does not give "
        f"{need} (hdeval.methods.base: {member}; docs/plugins.md)"
    )


def _score_table(fitted: Any):
    table = fitted.score_table
    if table is None and getattr(fitted, "path", None) is not None:
        import pandas as pd

        table = pd.read_csv(Path(fitted.path) / "scores.csv")
    if table is None:
        raise ConfigError(f"the {fitted.method} evaluator has no score table to read held-out rows from")
    return table


@dataclass
class PairHeldOut:
    """A trained pairwise evaluator's labels for its test pairs, with the human labels.
    ``predictions``: variant -> (label a/b/tie or None when failed, label forced to a or b);
    ``evaluator`` always (DnA: its LLM-weights totals; HD-Eval: its classifier), ``learned``
    for DnA's logistic regression on aspect-score differences when it was fitted."""

    sample_ids: list[str]
    doc_ids: list[str]
    human: list[str | None]
    predictions: dict[str, tuple[list[str | None], list[str | None]]]
    failed: np.ndarray | None = None  # as HeldOut's: no label, or an empty LLM-filled cell
    train_human: list[str | None] | None = None  # the training split's labels (majority baseline)

    def rows(self, keep: np.ndarray) -> "PairHeldOut":
        def pick(xs: Any) -> list:
            return list(compress(xs, keep))

        return PairHeldOut(
            pick(self.sample_ids),
            pick(self.doc_ids),
            pick(self.human),
            {v: (pick(a), pick(b)) for v, (a, b) in self.predictions.items()},
            self.failed[keep] if self.failed is not None else None,
            self.train_human,
        )


def _pair_label(x: Any) -> str | None:
    return x if isinstance(x, str) and x in LABEL_CODES else None  # NaN / None / empty: failed


def pair_arrays(ho: PairHeldOut, variant: str = "evaluator") -> tuple[np.ndarray, np.ndarray]:
    """(human codes, n x 2 predicted codes: label, label forced to a or b) for the bootstrap
    statistics; a = 0, b = 1, tie = 2, none = NaN."""
    pred, ab = ho.predictions[variant]
    return _codes(ho.human), np.column_stack([_codes(pred), _codes(ab)])


PAIR_STATISTICS: dict[str, Statistic] = {"wo_ties": agreement_wo_ties, "w_ties": agreement_w_ties}
