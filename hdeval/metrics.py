"""Correlation metrics between predicted and human scores. Pure numpy/scipy."""

from __future__ import annotations

import math
import warnings
from typing import Mapping, Sequence

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
