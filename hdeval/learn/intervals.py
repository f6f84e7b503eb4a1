"""Prediction intervals for pointwise scores: split conformal on the training split's
out-of-fold residuals (``direct``: its plain residuals). The half-width per aspect is the
``ceil((n + 1) * level)``-th smallest of ``n`` absolute residuals, which covers a new
exchangeable row with probability at least ``level``. Numpy rather than MAPIE: the residuals
come from the methods' own grouped folds (MAPIE would refit). Stored in ``metrics.json``
(``intervals``) and read back by ``apply`` as untrusted input."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from hdeval.core.errors import ArtifactError, ConfigError

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


def normalised_quantile(
    residuals: np.ndarray, difficulty: np.ndarray, level: float = DEFAULT_LEVEL
) -> tuple[list[float | None], list[int]]:
    """Normalised split conformal: per column, the finite-sample ``level`` quantile of
    ``|residual| / difficulty`` (rows with a NaN or a difficulty <= 0 skipped) and the rows it
    rests on; a row's half-width is then that quantile times its own difficulty, so the
    interval widens where the difficulty model expects larger errors and keeps the coverage."""
    r = np.abs(np.asarray(residuals, float))
    d = np.asarray(difficulty, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d > 0, r / d, np.nan)
    return half_widths(ratio, level)


def calibrate(
    y: np.ndarray, pred: np.ndarray, aspects: Sequence[str], source: str, level: float = DEFAULT_LEVEL
) -> dict[str, Any]:
    """The calibration a method stores: level, method, where the residuals came from, and the
    half-width per aspect (None: too few calibration rows)."""
    widths, counts = half_widths(np.asarray(y, float) - np.asarray(pred, float), level)
    return {
        "level": level,
        "method": METHOD,
        "residuals": source,
        "calibration_rows": dict(zip(aspects, counts)),
        "half_width": dict(zip(aspects, widths)),
    }


def bounds(
    half_width: Sequence[float | None], pred: np.ndarray, ranges: Sequence[tuple[float, float]]
) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper), rows x aspects, clipped to each aspect's range (a score never leaves it,
    so clipping costs no coverage); NaN where the prediction or the half-width is missing."""
    pred = np.asarray(pred, float)
    h = np.array([np.nan if w is None else w for w in half_width], float)
    lo, hi = np.array(ranges, float).T
    return np.clip(pred - h, lo, hi), np.clip(pred + h, lo, hi)


def fitted_intervals(
    Y: np.ndarray,
    calib_pred: np.ndarray,
    tr: np.ndarray,
    test_pred: np.ndarray,
    te: np.ndarray,
    aspects: Sequence[str],
    ranges: Sequence[tuple[float, float]],
    source: str,
    level: float = DEFAULT_LEVEL,
    X: np.ndarray | None = None,
    columns: Sequence[str] | None = None,
) -> dict[str, Any]:
    """What a pointwise method puts in ``metrics["intervals"]``: the calibration on the training
    rows ``tr`` (``calib_pred``: their out-of-fold predictions, training rows x aspects) and, as
    ``test``, the empirical coverage and mean width of its intervals on the test rows ``te``
    (``test_pred``), per aspect and on average (rows missing a prediction or human score left out).
    Given the criterion scores ``X`` (every row; ``columns``: their keys) and at least
    :data:`MIN_ADAPTIVE_ROWS` training rows, also the adaptive calibration
    (:func:`adaptive_calibration`) under ``adaptive``."""
    cal = calibrate(Y[tr], calib_pred, aspects, source, level)
    # a model that reads no criterion (every one constant, or weighed 0) has no difficulty to
    # model: its intervals are the fixed ones, and an artifact never holds an empty column list
    if X is not None and columns is not None and len(columns) and len(tr) >= MIN_ADAPTIVE_ROWS:
        cal["adaptive"] = adaptive_calibration(
            Y, calib_pred, tr, test_pred, te, X, columns, aspects, ranges, level
        )
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
    cal["test"] = {
        "rows": int(len(y)),
        "coverage": cov,
        "mean_width": width,
        **held_out_means(y, pred, aspects, level),
    }
    return cal


def held_out_means(
    y: np.ndarray, pred: np.ndarray, aspects: Sequence[str], level: float = DEFAULT_LEVEL
) -> dict[str, Any]:
    """The labels behind the test figures, per aspect, and what they say of the human mean: its
    interval at ``level`` (every test row is labelled, so the PPI++ estimate is the labels' mean
    and its interval the classical one of :func:`hdeval.learn.ppi.ppi_mean`, as ``hdeval
    estimate`` gives it), beside the evaluator's mean on the same rows (its bias); None for an
    aspect with fewer than 2 labels or labels that never vary."""
    from hdeval.learn.ppi import Moments, ppi_mean

    labels: dict[str, int] = {}
    means: dict[str, dict[str, float] | None] = {}
    for j, a in enumerate(aspects):
        ok = ~(np.isnan(y[:, j]) | np.isnan(pred[:, j]))
        n = int(ok.sum())
        labels[a] = n
        # labels that never vary give a zero-width interval, a certainty they cannot give:
        # none, as hdeval estimate gives none
        if n < 2 or np.ptp(y[ok, j]) == 0:
            means[a] = None
            continue
        e = ppi_mean(y[ok, j], pred[ok, j], Moments(0, 0.0, 0.0), alpha=1 - level)
        means[a] = {
            "estimate": round(e.estimate, 6),
            "low": round(e.low, 6),
            "high": round(e.high, 6),
            "evaluator_mean": round(float(pred[ok, j].mean()), 6),
        }
    return {"labels": labels, "human_mean": means}


ADAPTIVE_METHOD = (
    "normalised split conformal: |residual| / difficulty, the difficulty linear in the spread "
    "of the row's standardised criterion scores and its prediction's distance from the "
    "middle of the scale, fitted to the out-of-fold |residuals|"
)
#: Fewer training rows than this and no difficulty model is fitted (its three coefficients would
#: follow the calibration rows' noise): every row keeps the aspect's one width.
MIN_ADAPTIVE_ROWS = 40
#: The difficulty never falls below this share of the mean |residual| (no zero-width interval).
DIFFICULTY_FLOOR = 0.25


def difficulty_features(
    X: np.ndarray,
    pred: np.ndarray,
    center: np.ndarray,
    scale: np.ndarray,
    ranges: Sequence[tuple[float, float]],
) -> np.ndarray:
    """rows x aspects x 3: a constant, the spread (sd) of the row's standardised criterion scores
    (a judge that answers a sample's criteria inconsistently is unsure of it; 0 when fewer than
    two are read), and per aspect the prediction's distance from the middle of its range (0 at
    the middle, 1 at an end: a score cannot err beyond an end)."""
    Z = (np.asarray(X, float) - center) / scale
    read = np.isfinite(Z)
    k = read.sum(axis=1)
    Z0 = np.where(read, Z, 0.0)
    mean = Z0.sum(axis=1) / np.maximum(k, 1)
    var = (np.where(read, Z0 - mean[:, None], 0.0) ** 2).sum(axis=1) / np.maximum(k - 1, 1)
    spread = np.where(k >= 2, np.sqrt(var), 0.0)
    lo, hi = np.array(ranges, float).T
    half = np.where(hi > lo, (hi - lo) / 2, 1.0)
    edge = np.clip(np.abs(np.asarray(pred, float) - (lo + hi) / 2) / half, 0, 1)
    n, m = edge.shape
    return np.stack([np.ones((n, m)), np.repeat(spread[:, None], m, axis=1), edge], axis=2)


def difficulty(features: np.ndarray, coef: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """rows x aspects: the difficulty model's expected |residual|, at least ``floor``."""
    return np.maximum(np.einsum("nmk,mk->nm", features, coef), floor)


def adaptive_calibration(
    Y: np.ndarray,
    calib_pred: np.ndarray,
    tr: np.ndarray,
    test_pred: np.ndarray,
    te: np.ndarray,
    X: np.ndarray,
    columns: Sequence[str],
    aspects: Sequence[str],
    ranges: Sequence[tuple[float, float]],
    level: float = DEFAULT_LEVEL,
) -> dict[str, Any]:
    """Per-sample intervals that keep the coverage: a difficulty model fitted (least squares) to
    the training rows' out-of-fold ``|residual|``, then the normalised conformal quantile of
    ``|residual| / difficulty``; a row's half-width is that quantile times its difficulty. With
    its held-out check on the test rows: coverage overall and per width quintile, and the mean
    absolute error of the widest fifth of rows against the rest (``error_lift``)."""
    X = np.asarray(X, float)
    Xtr = X[tr]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: centre 0, scale 1
        center = np.nan_to_num(np.nanmean(Xtr, axis=0))
        sd = np.nan_to_num(np.nanstd(Xtr, axis=0))
    scale = np.where(sd > 0, sd, 1.0)
    Ytr, ptr = np.asarray(Y[tr], float), np.asarray(calib_pred, float)
    F = difficulty_features(Xtr, ptr, center, scale, ranges)
    r = np.abs(Ytr - ptr)
    coef = np.zeros((len(aspects), F.shape[2]))
    floor = np.zeros(len(aspects))
    for j in range(len(aspects)):
        ok = np.isfinite(r[:, j]) & np.isfinite(F[:, j]).all(axis=1)
        if ok.sum() >= 3:
            coef[j] = np.linalg.lstsq(F[ok, j], r[ok, j], rcond=None)[0]
            floor[j] = max(DIFFICULTY_FLOOR * float(r[ok, j].mean()), 1e-9)
        else:
            coef[j, 0], floor[j] = 1.0, 1.0
    q, counts = normalised_quantile(r, difficulty(F, coef, floor), level)
    out: dict[str, Any] = {
        "method": ADAPTIVE_METHOD,
        "columns": list(columns),
        "center": [float(v) for v in center],
        "scale": [float(v) for v in scale],
        "coef": {a: [float(v) for v in coef[j]] for j, a in enumerate(aspects)},
        "floor": {a: float(floor[j]) for j, a in enumerate(aspects)},
        "quantile": dict(zip(aspects, q)),
        "calibration_rows": dict(zip(aspects, counts)),
    }
    y, pred = np.asarray(Y[te], float), np.asarray(test_pred, float)
    if len(te):
        h = adaptive_half_widths(out, X[te], pred, aspects, ranges)
        out["test"] = interval_check(y, pred, h, ranges)
    return out


def adaptive_half_widths(
    adaptive: Mapping[str, Any],
    X: np.ndarray,
    pred: np.ndarray,
    aspects: Sequence[str],
    ranges: Sequence[tuple[float, float]],
) -> np.ndarray:
    """rows x aspects half-widths of a (checked) adaptive calibration; NaN where an aspect has
    no quantile."""
    F = difficulty_features(X, pred, np.array(adaptive["center"]), np.array(adaptive["scale"]), ranges)
    coef = np.array([adaptive["coef"][a] for a in aspects], float)
    floor = np.array([adaptive["floor"][a] for a in aspects], float)
    q = np.array([np.nan if adaptive["quantile"][a] is None else adaptive["quantile"][a] for a in aspects])
    return q * difficulty(F, coef, floor)


def interval_check(
    y: np.ndarray, pred: np.ndarray, half: np.ndarray, ranges: Sequence[tuple[float, float]]
) -> dict[str, Any]:
    """Held-out figures of per-row half-widths (all aspects' rows pooled, each aspect's width as
    a share of its range): coverage, coverage per width quintile (narrowest first), mean width as
    a share of the range, and ``error_lift``: mean absolute error of the widest fifth of rows over
    that of the rest. Rows without a prediction, a human score or a width are left out."""
    lo, hi = np.array(ranges, float).T
    span = np.where(hi > lo, hi - lo, 1.0)
    lower, upper = np.clip(pred - half, lo, hi), np.clip(pred + half, lo, hi)
    ok = np.isfinite(y) & np.isfinite(pred) & np.isfinite(half)
    inside = ((y >= lower - 1e-9) & (y <= upper + 1e-9))[ok]
    width = ((upper - lower) / span)[ok]
    err = (np.abs(y - pred) / span)[ok]
    if not ok.any():
        return {
            "rows": 0,
            "coverage": None,
            "coverage_by_width_quintile": [],
            "mean_width": None,
            "error_lift": None,
        }
    order = np.argsort(width, kind="stable")
    quint = [round(float(inside[part].mean()), 6) for part in np.array_split(order, 5) if len(part)]
    top = order[len(order) - max(1, len(order) // 5) :]
    rest = np.setdiff1d(order, top)
    lift = float(err[top].mean() / err[rest].mean()) if len(rest) and err[rest].mean() > 0 else None
    return {
        "rows": int(ok.sum()),
        "coverage": round(float(inside.mean()), 6),
        "coverage_by_width_quintile": quint,
        "mean_width": round(float(width.mean()), 6),
        "error_lift": None if lift is None else round(lift, 6),
    }


@dataclass(frozen=True)
class Calibration:
    """A stored calibration, checked: the level and one half-width (or None) per aspect; and the
    adaptive calibration when the artifact has one (checked: :func:`read_adaptive`)."""

    level: float
    half_width: tuple[float | None, ...]
    adaptive: Mapping[str, Any] | None = None


def read_calibration(metrics: Any, aspects: Sequence[str], where: str) -> Calibration | None:
    """The calibration in an artifact's metrics (None: the artifact has none, e.g. made before
    intervals existed). Anything malformed is a one-line :class:`ArtifactError`."""
    if not isinstance(metrics, dict) or metrics.get("intervals") is None:
        return None
    raw = metrics["intervals"]
    level = raw.get("level") if isinstance(raw, dict) else None
    hw = raw.get("half_width") if isinstance(raw, dict) else None
    if not (_number(level) and 0 < level < 1) or not isinstance(hw, dict):
        raise ArtifactError(
            f"{where}: intervals must hold a level between 0 and 1 and a half_width per aspect"
        )
    out: list[float | None] = []
    for a in aspects:
        w = hw.get(a)
        if w is not None and not (_number(w) and w >= 0):
            raise ArtifactError(
                f"{where}: intervals half_width of aspect {a!r} must be a finite number >= 0 "
                f"or null, got {w!r}"
            )
        out.append(None if w is None else float(w))
    adaptive = read_adaptive(raw.get("adaptive"), aspects, where) if raw.get("adaptive") is not None else None
    return Calibration(float(level), tuple(out), adaptive)


def read_adaptive(raw: Any, aspects: Sequence[str], where: str) -> dict[str, Any]:
    """An artifact's adaptive calibration, every field checked (one-line :class:`ArtifactError`)."""

    def bad(what: str) -> ArtifactError:
        return ArtifactError(f"{where}: intervals.adaptive {what}")

    if not isinstance(raw, dict):
        raise bad("must be an object")
    cols = raw.get("columns")
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) for c in cols):
        raise bad("columns must be a non-empty list of criterion keys")
    vecs = {}
    for name in ("center", "scale"):
        v = raw.get(name)
        if not isinstance(v, list) or len(v) != len(cols) or not all(_number(x) for x in v):
            raise bad(f"{name} must hold one finite number per column")
        vecs[name] = [float(x) for x in v]
    if not all(x > 0 for x in vecs["scale"]):
        raise bad("scale must be positive")
    out: dict[str, Any] = {"columns": list(cols), **vecs, "coef": {}, "floor": {}, "quantile": {}}
    for a in aspects:
        c = (raw.get("coef") or {}).get(a) if isinstance(raw.get("coef"), dict) else None
        f = (raw.get("floor") or {}).get(a) if isinstance(raw.get("floor"), dict) else None
        q = (raw.get("quantile") or {}).get(a) if isinstance(raw.get("quantile"), dict) else None
        if not isinstance(c, list) or len(c) != 3 or not all(_number(x) for x in c):
            raise bad(f"coef of aspect {a!r} must be 3 finite numbers")
        if not (_number(f) and f > 0):
            raise bad(f"floor of aspect {a!r} must be a finite number > 0")
        if q is not None and not (_number(q) and q >= 0):
            raise bad(f"quantile of aspect {a!r} must be a finite number >= 0 or null")
        out["coef"][a], out["floor"][a] = [float(x) for x in c], float(f)
        out["quantile"][a] = None if q is None else float(q)
    return out


def check_max_width(value: Any) -> float:
    if not (_number(value) and 0 < value <= 1):
        raise ConfigError(
            f"--max-interval-width must be a share of the score range above 0 and at most 1, got {value!r}"
        )
    return float(value)


def row_intervals(
    cal: Calibration,
    pred: np.ndarray,
    aspects: Sequence[str],
    ranges: Sequence[tuple[float, float]],
    max_width: float,
    criteria: tuple[np.ndarray, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Per row: ``lower``/``upper`` per aspect (None where no bound) and ``needs_human``: some
    aspect's interval is wider than ``max_width`` of its range, or has no bound at all. With an
    adaptive calibration and the rows' ``criteria`` (values, keys) holding its columns, each row
    gets its own width; otherwise every row the aspect's one width."""
    pred = np.asarray(pred, float)
    ad = cal.adaptive
    keys = list(criteria[1]) if criteria is not None else []
    if ad is not None and criteria is not None and all(c in keys for c in ad["columns"]):
        X = np.asarray(criteria[0], float)[:, [keys.index(c) for c in ad["columns"]]]
        h = adaptive_half_widths(ad, X, pred, aspects, ranges)
        lo, hi = np.array(ranges, float).T
        lower, upper = np.clip(pred - h, lo, hi), np.clip(pred + h, lo, hi)
    else:
        lower, upper = bounds(cal.half_width, pred, ranges)
    span = np.array([r[1] - r[0] for r in ranges], float)
    rows = []
    for i in range(len(lower)):
        lo = {
            a: (None if np.isnan(lower[i, j]) else round(float(lower[i, j]), 6))
            for j, a in enumerate(aspects)
        }
        up = {
            a: (None if np.isnan(upper[i, j]) else round(float(upper[i, j]), 6))
            for j, a in enumerate(aspects)
        }
        wide = any(
            lo[a] is None or (up[a] - lo[a]) > max_width * span[j] + 1e-9 for j, a in enumerate(aspects)
        )
        rows.append({"lower": lo, "upper": up, "needs_human": bool(wide)})
    return rows


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
