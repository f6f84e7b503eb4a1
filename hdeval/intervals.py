"""Prediction intervals for pointwise scores: split conformal on the training split's
out-of-fold residuals (``direct``: its plain residuals). The half-width per aspect is the
``ceil((n + 1) * level)``-th smallest of ``n`` absolute residuals, which covers a new
exchangeable row with probability at least ``level``. Numpy rather than MAPIE: the residuals
come from the methods' own grouped folds (MAPIE would refit). Stored in ``metrics.json``
(``intervals``) and read back by ``apply`` as untrusted input."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hdeval.errors import ArtifactError, ConfigError

DEFAULT_LEVEL = 0.9
#: apply flags a row ``needs_human`` when an aspect's interval is wider than this share of the
#: aspect's score range (0.5: e.g. wider than 2 points on a 1-5 scale).
DEFAULT_MAX_WIDTH = 0.5
METHOD = "split conformal, absolute residuals, finite-sample quantile ceil((n+1)*level)/n"


def half_widths(residuals: np.ndarray, level: float = DEFAULT_LEVEL) -> tuple[list[float | None], list[int]]:
    """Per column of ``residuals`` (rows x aspects; NaN rows skipped): the conformal half-width
    and the number of rows it rests on. None when too few rows for ``level`` (no finite bound)."""
    r = np.abs(np.asarray(residuals, float))
    out: list[float | None] = []
    counts: list[int] = []
    for j in range(r.shape[1]):
        col = np.sort(r[:, j][~np.isnan(r[:, j])])
        n = len(col)
        k = math.ceil((n + 1) * level)
        out.append(float(col[k - 1]) if 1 <= k <= n else None)
        counts.append(n)
    return out, counts


def calibrate(y: np.ndarray, pred: np.ndarray, aspects: Sequence[str], source: str,
              level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """The calibration a method stores: level, method, where the residuals came from, and the
    half-width per aspect (None: too few calibration rows)."""
    widths, counts = half_widths(np.asarray(y, float) - np.asarray(pred, float), level)
    return {"level": level, "method": METHOD, "residuals": source,
            "calibration_rows": dict(zip(aspects, counts)), "half_width": dict(zip(aspects, widths))}


def bounds(half_width: Sequence[float | None], pred: np.ndarray,
           ranges: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper), rows x aspects, clipped to each aspect's range (a score never leaves it,
    so clipping costs no coverage); NaN where the prediction or the half-width is missing."""
    pred = np.asarray(pred, float)
    h = np.array([np.nan if w is None else w for w in half_width], float)
    lo, hi = np.array(ranges, float).T
    return np.clip(pred - h, lo, hi), np.clip(pred + h, lo, hi)


def fitted_intervals(Y: np.ndarray, calib_pred: np.ndarray, tr: np.ndarray, test_pred: np.ndarray,
                     te: np.ndarray, aspects: Sequence[str], ranges: Sequence[tuple[float, float]],
                     source: str, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """What a pointwise method puts in ``metrics["intervals"]``: the calibration on the training
    rows ``tr`` (``calib_pred``: their out-of-fold predictions, training rows x aspects) and, as
    ``test``, the empirical coverage and mean width of its intervals on the test rows ``te``
    (``test_pred``), per aspect and on average (rows missing a prediction or human score left out)."""
    cal = calibrate(Y[tr], calib_pred, aspects, source, level)
    y, pred = np.asarray(Y[te], float), np.asarray(test_pred, float)
    lower, upper = bounds([cal["half_width"][a] for a in aspects], pred, ranges)
    cov: dict[str, float | None] = {}
    width: dict[str, float | None] = {}
    for j, a in enumerate(aspects):
        ok = ~(np.isnan(y[:, j]) | np.isnan(lower[:, j]))
        inside = (y[ok, j] >= lower[ok, j]) & (y[ok, j] <= upper[ok, j])
        cov[a] = round(float(inside.mean()), 6) if ok.any() else None
        width[a] = round(float((upper[ok, j] - lower[ok, j]).mean()), 6) if ok.any() else None
    for d in (cov, width):
        vals = [v for v in d.values() if v is not None]
        d["average"] = round(float(np.mean(vals)), 6) if vals else None
    cal["test"] = {"rows": int(len(y)), "coverage": cov, "mean_width": width,
                   **held_out_means(y, pred, aspects, level)}
    return cal


def held_out_means(y: np.ndarray, pred: np.ndarray, aspects: Sequence[str],
                   level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """The labels behind the test figures, per aspect, and what they say of the human mean: its
    interval at ``level`` (every test row is labelled, so the PPI++ estimate is the labels' mean:
    Student's t on ``n - 1``, as :func:`hdeval.learn.ppi.ppi_mean`), beside the evaluator's mean
    on the same rows (its bias)."""
    from scipy.stats import t

    labels: dict[str, int] = {}
    means: dict[str, dict[str, float] | None] = {}
    for j, a in enumerate(aspects):
        ok = ~(np.isnan(y[:, j]) | np.isnan(pred[:, j]))
        n = int(ok.sum())
        labels[a] = n
        if n < 2:
            means[a] = None
            continue
        m, half = float(y[ok, j].mean()), float(t.ppf((1 + level) / 2, n - 1) * y[ok, j].std(ddof=1) / math.sqrt(n))
        means[a] = {"estimate": round(m, 6), "low": round(m - half, 6), "high": round(m + half, 6),
                    "evaluator_mean": round(float(pred[ok, j].mean()), 6)}
    return {"labels": labels, "human_mean": means}


@dataclass(frozen=True)
class Calibration:
    """A stored calibration, checked: the level and one half-width (or None) per aspect."""

    level: float
    half_width: tuple[float | None, ...]


def read_calibration(metrics: Any, aspects: Sequence[str], where: str) -> Calibration | None:
    """The calibration in an artifact's metrics (None: the artifact has none, e.g. made before
    intervals existed). Anything malformed is a one-line :class:`ArtifactError`."""
    if not isinstance(metrics, dict) or metrics.get("intervals") is None:
        return None
    raw = metrics["intervals"]
    level = raw.get("level") if isinstance(raw, dict) else None
    hw = raw.get("half_width") if isinstance(raw, dict) else None
    if not (_number(level) and 0 < level < 1) or not isinstance(hw, dict):
        raise ArtifactError(f"{where}: intervals must hold a level between 0 and 1 and a half_width per aspect")
    out: list[float | None] = []
    for a in aspects:
        w = hw.get(a)
        if w is not None and not (_number(w) and w >= 0):
            raise ArtifactError(f"{where}: intervals half_width of aspect {a!r} must be a finite number >= 0 "
                                f"or null, got {w!r}")
        out.append(None if w is None else float(w))
    return Calibration(float(level), tuple(out))


def check_max_width(value: Any) -> float:
    if not (_number(value) and 0 < value <= 1):
        raise ConfigError(f"--max-interval-width must be a share of the score range above 0 and at most 1, "
                          f"got {value!r}")
    return float(value)


def row_intervals(cal: Calibration, pred: np.ndarray, aspects: Sequence[str],
                  ranges: Sequence[tuple[float, float]], max_width: float) -> list[dict[str, Any]]:
    """Per row: ``lower``/``upper`` per aspect (None where no bound) and ``needs_human``: some
    aspect's interval is wider than ``max_width`` of its range, or has no bound at all."""
    lower, upper = bounds(cal.half_width, pred, ranges)
    span = np.array([r[1] - r[0] for r in ranges], float)
    rows = []
    for i in range(len(lower)):
        lo = {a: (None if np.isnan(lower[i, j]) else round(float(lower[i, j]), 6)) for j, a in enumerate(aspects)}
        up = {a: (None if np.isnan(upper[i, j]) else round(float(upper[i, j]), 6)) for j, a in enumerate(aspects)}
        wide = any(lo[a] is None or (up[a] - lo[a]) > max_width * span[j] + 1e-9 for j, a in enumerate(aspects))
        rows.append({"lower": lo, "upper": up, "needs_human": bool(wide)})
    return rows


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
