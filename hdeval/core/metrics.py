"""Agreement of predictions with human judgments: correlations of scores, agreement of pair labels.
Pure numpy/scipy."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy import stats

METRICS = ("pearson", "spearman", "kendall")


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _rank_correlation(ry: np.ndarray, rp: np.ndarray) -> float:
    """Pearson's r of two rank arrays (both overwritten)."""
    ry -= ry.mean()
    rp -= rp.mean()
    return float((ry * rp).sum() / math.sqrt((ry * ry).sum() * (rp * rp).sum()))


def _ranks(x: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata``'s average ranks, with fewer copies of the column than it makes."""
    order = np.argsort(x)
    xs = x[order]
    ends = np.searchsorted(xs, xs, "left")  # a value's tie group is [left, right)
    ends += np.searchsorted(xs, xs, "right")
    del xs
    ends += 1
    out = np.empty(len(x))
    out[order] = ends
    out *= 0.5  # (left + 1 + right) / 2: the mean of the ranks left+1 .. right
    return out


def _order_codes(x: np.ndarray) -> np.ndarray:
    """Each value's lowest rank from 0: all Kendall's tau reads, as int32 where that holds it."""
    order = np.argsort(x)
    xs = x[order]
    out = np.empty(len(x), np.int32 if len(x) < 2**31 else np.int64)
    out[order] = np.searchsorted(xs, xs, "left")
    return out


def correlation(y: Any, p: Any, metric: str, min_n: int = 3) -> float:
    """``metric`` (pearson, spearman or kendall) over the finite pairs; NaN where undefined
    (fewer than ``min_n`` pairs, a constant side). The one implementation every figure uses;
    Spearman's ranks are correlated by hand: the bootstrap calls it hundreds of thousands of
    times and ``scipy.stats.spearmanr``'s checks dominate on small arrays."""
    y, p = np.asarray(y, float).ravel(), np.asarray(p, float).ravel()
    ok = np.isfinite(y) & np.isfinite(p)
    if not ok.all():  # no copies when every pair is finite
        y, p = y[ok], p[ok]
    if len(y) < min_n or np.ptp(y) == 0 or np.ptp(p) == 0:
        return float("nan")
    if metric == "spearman":
        return _rank_correlation(_ranks(y), _ranks(p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if metric == "pearson":
            return float(stats.pearsonr(y, p)[0])
        return float(stats.kendalltau(y, p)[0])


def correlations(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float | None]:
    """Pearson, Spearman and Kendall tau; ``None`` where undefined (constant input, NaN)."""
    return {m: finite_or_none(correlation(y_true, y_pred, m)) for m in METRICS}


def streamed_correlations(column: Callable[[str], np.ndarray]) -> dict[str, float | None]:
    """:func:`correlations` of ``column("human")`` and ``column("pred")``, each column read
    (a fresh array) only while a figure needs it: the same figures in less memory than
    :func:`correlations` on two held columns (apply's closing figures on every row)."""
    y, p = column("human"), column("pred")
    ok = np.isfinite(y) & np.isfinite(p)
    every = bool(ok.all())
    n = int(ok.sum())
    defined = n >= 3 and np.ptp(y[ok]) != 0 and np.ptp(p[ok]) != 0
    del y, p
    if not defined:
        return {m: None for m in METRICS}

    def get(name: str) -> np.ndarray:
        values = column(name)
        return values if every else values[ok]

    out: dict[str, float | None] = {
        "pearson": finite_or_none(correlation(get("human"), get("pred"), "pearson"))
    }
    ry = _ranks(get("human"))
    out["spearman"] = finite_or_none(_rank_correlation(ry, _ranks(get("pred"))))
    del ry
    cy = _order_codes(get("human"))
    cp = _order_codes(get("pred"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["kendall"] = finite_or_none(float(stats.kendalltau(cy, cp)[0]))
    return out


def undefined_why(y: Any, p: Any, min_n: int = 3) -> str | None:
    """Why :func:`correlation` of ``y`` and ``p`` is undefined (one line), or None when it is not."""
    y, p = np.asarray(y, float).ravel(), np.asarray(p, float).ravel()
    ok = np.isfinite(y) & np.isfinite(p)
    if ok.sum() < min_n:
        return f"{int(ok.sum())} samples with both a human and a predicted score (at least {min_n} needed)"
    if np.ptp(p[ok]) == 0:
        return f"every prediction is {float(p[ok][0]):g}"
    if np.ptp(y[ok]) == 0:
        return f"every human score is {float(y[ok][0]):g}"
    return None


def why_null(table: Mapping[str, Any]) -> str:
    """For a line of figures: " (null: <aspect>: <why>; ...)" naming why an aspect's figures are
    null in a :func:`metric_table`, or "" when none is."""
    whys = [f"{a}: {row['why']}" for a, row in table.items() if isinstance(row, Mapping) and row.get("why")]
    return f" (null: {'; '.join(whys[:3])}{'; ...' if len(whys) > 3 else ''})" if whys else ""


def metric_table(y_true: np.ndarray, y_pred: np.ndarray, aspects: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-aspect correlations plus their ``average`` (over aspects where defined); an aspect whose
    correlations are undefined says why under ``why``."""
    table: dict[str, dict[str, Any]] = {}
    for j, a in enumerate(aspects):
        row: dict[str, Any] = correlations(y_true[:, j], y_pred[:, j])
        why = undefined_why(y_true[:, j], y_pred[:, j]) if any(v is None for v in row.values()) else None
        table[a] = {**row, "why": why} if why else row
    table["average"] = average(table)
    return table


def average(table: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for m in METRICS:
        vals = [row[m] for k, row in table.items() if k != "average" and row.get(m) is not None]
        out[m] = finite_or_none(float(np.mean(vals))) if vals else None
    return out


def mean_spearman(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Spearman per column (rounded as ``metrics.json``), averaged over the columns where it is
    defined; -inf when none is (a model-selection score: never chosen)."""
    vals = [
        finite_or_none(correlation(y_true[:, j], y_pred[:, j], "spearman")) for j in range(y_true.shape[1])
    ]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else float("-inf")


def average_spearman(y: Any, pred: Any) -> float:
    """Dataset-level Spearman per column (aspect), averaged over the columns where it is
    defined (as ``metrics.json``'s ``average``, unrounded); NaN when none is."""
    y, pred = as2d(y), as2d(pred)
    vals = [correlation(y[:, j], pred[:, j], "spearman") for j in range(y.shape[1])]
    vals = [v for v in vals if math.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def as2d(a: Any) -> np.ndarray:
    """``a`` as a float array of one row per sample (a 1-D array becomes one column)."""
    a = np.asarray(a, float)
    return a.reshape(len(a), -1)


# Pair labels as numbers for array statistics (the bootstrap); a failed label is NaN.
LABEL_CODES = {"a": 0.0, "b": 1.0, "tie": 2.0}


def label_codes(labels: Sequence[str | None]) -> np.ndarray:
    return np.array([LABEL_CODES.get(x, np.nan) if isinstance(x, str) else np.nan for x in labels], float)


def agreement_w_ties(y: Any, p: Any) -> float:
    """3-way accuracy over the labelled pairs with a prediction, on label codes (``y`` the
    human codes, ``p`` n x 2: the predicted label and the label forced to a or b); NaN when
    no pair counts. The one implementation behind every agreement figure."""
    y, p = np.asarray(y, float).ravel(), as2d(p)
    ok = np.isfinite(y) & np.isfinite(p[:, 0])
    return float(np.mean(p[ok, 0] == y[ok])) if ok.any() else float("nan")


def agreement_wo_ties(y: Any, p: Any) -> float:
    """Over the pairs with a prediction whose human label is not a tie, the prediction forced
    to a or b (no side counts as a miss); NaN when no pair counts."""
    y, p = np.asarray(y, float).ravel(), as2d(p)
    ok = np.isfinite(y) & np.isfinite(p[:, 0]) & (y != LABEL_CODES["tie"])
    return float(np.mean(p[ok, 1] == y[ok])) if ok.any() else float("nan")


def pair_agreement(
    human: Sequence[str | None], pred: Sequence[str | None], pred_ab: Sequence[str | None]
) -> dict[str, Any]:
    """The paper's two numbers on labelled pairs, plus confusion counts.

    ``w_ties``: 3-way accuracy over the pairs with a prediction. ``wo_ties``: accuracy on the
    pairs whose human label is not a tie, the prediction forced to a or b (``pred_ab``; equal
    totals give no side and count as a miss). Pairs without a prediction (failures) are left out
    of both and counted in ``failed``.
    """
    confusion: dict[str, Counter] = {}
    for h, p in zip(human, pred):
        if h is not None:
            confusion.setdefault(h, Counter())[p if p is not None else "failed"] += 1
    y = label_codes(human)
    p2 = np.column_stack([label_codes(pred), label_codes(pred_ab)]) if len(y) else np.zeros((0, 2))
    judged = np.isfinite(y) & np.isfinite(p2[:, 0])
    return {
        "w_ties": finite_or_none(agreement_w_ties(y, p2)),
        "wo_ties": finite_or_none(agreement_wo_ties(y, p2)),
        "n": int(judged.sum()),
        "n_wo_ties": int((judged & (y != LABEL_CODES["tie"])).sum()),
        "failed": int((np.isfinite(y) & ~np.isfinite(p2[:, 0])).sum()),
        "confusion": {h: dict(sorted(c.items())) for h, c in sorted(confusion.items())},
    }
