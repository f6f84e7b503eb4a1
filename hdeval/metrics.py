"""Agreement of predictions with human judgments: correlations of scores, agreement of pair labels.
Pure numpy/scipy."""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

METRICS = ("pearson", "spearman", "kendall")


def _clean(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def correlations(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float | None]:
    """Pearson, Spearman and Kendall tau; ``None`` where undefined (constant input, NaN)."""
    y_true = np.asarray(y_true, float)
    y_pred = np.asarray(y_pred, float)
    ok = np.isfinite(y_true) & np.isfinite(y_pred)
    y_true, y_pred = y_true[ok], y_pred[ok]
    if len(y_true) < 3 or np.ptp(y_true) == 0 or np.ptp(y_pred) == 0:
        return {m: None for m in METRICS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "pearson": _clean(stats.pearsonr(y_true, y_pred)[0]),
            "spearman": _clean(stats.spearmanr(y_true, y_pred)[0]),
            "kendall": _clean(stats.kendalltau(y_true, y_pred)[0]),
        }


def metric_table(
    y_true: np.ndarray, y_pred: np.ndarray, aspects: Sequence[str]
) -> dict[str, dict[str, float | None]]:
    """Per-aspect correlations plus their ``average`` (over aspects where defined)."""
    table = {a: correlations(y_true[:, j], y_pred[:, j]) for j, a in enumerate(aspects)}
    table["average"] = average(table)
    return table


def average(table: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for m in METRICS:
        vals = [row[m] for k, row in table.items() if k != "average" and row.get(m) is not None]
        out[m] = _clean(float(np.mean(vals))) if vals else None
    return out


def mean_spearman(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    vals = [correlations(y_true[:, j], y_pred[:, j])["spearman"] for j in range(y_true.shape[1])]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else float("-inf")


def pair_agreement(human: Sequence[str | None], pred: Sequence[str | None],
              pred_ab: Sequence[str | None]) -> dict[str, Any]:
    """The paper's two numbers on labelled pairs, plus confusion counts.

    ``w_ties``: 3-way accuracy over the pairs with a prediction. ``wo_ties``: accuracy on the
    pairs whose human label is not a tie, the prediction forced to a or b (``pred_ab``; equal
    totals give no side and count as a miss). Pairs without a prediction (failures) are left out
    of both and counted in ``failed``.
    """
    confusion: dict[str, dict[str, int]] = {}
    n = hit = n_ab = hit_ab = failed = 0
    for h, p, q in zip(human, pred, pred_ab):
        if h is None:
            continue
        confusion.setdefault(h, {})
        key = p if p is not None else "failed"
        confusion[h][key] = confusion[h].get(key, 0) + 1
        if p is None:
            failed += 1
            continue
        n += 1
        hit += p == h
        if h != "tie":
            n_ab += 1
            hit_ab += q == h
    return {
        "w_ties": round(hit / n, 6) if n else None,
        "wo_ties": round(hit_ab / n_ab, 6) if n_ab else None,
        "n": n, "n_wo_ties": n_ab, "failed": failed,
        "confusion": {h: dict(sorted(c.items())) for h, c in sorted(confusion.items())},
    }
