"""The benchmark's statistics: bootstrap intervals and paired differences over resampled
whole documents, summary-level correlation, ranking exact-match, mean/std over seeds."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from hdeval.metrics import average_spearman as avg_spearman, as2d as _as2d, correlation

N_RESAMPLES = 1000
LEVEL = 0.95

Statistic = Callable[[np.ndarray, np.ndarray], float]


def _doc_rows(groups: Sequence[str]) -> list[np.ndarray]:
    """Row indices of each document, in first-seen order."""
    rows: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        rows.setdefault(str(g), []).append(i)
    return [np.array(r) for r in rows.values()]


def _resamples(groups: Sequence[str], n_resamples: int, seed: int):
    """Row indices of ``n_resamples`` bootstrap samples of whole documents (seeded)."""
    docs = _doc_rows(groups)
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        yield np.concatenate([docs[d] for d in rng.integers(0, len(docs), len(docs))])


def _interval(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    values = values[np.isfinite(values)]
    if not len(values):
        return None, None
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_ci(y: Any, pred: Any, groups: Sequence[str], statistic: Statistic = avg_spearman,
                 n_resamples: int = N_RESAMPLES, seed: int = 0, level: float = LEVEL) -> dict[str, Any]:
    """``statistic(y, pred)`` and its percentile bootstrap interval over documents (``groups``:
    the doc_id of each row; a resample draws whole documents with replacement)."""
    y, pred = _as2d(y), _as2d(pred)
    stats = np.array([statistic(y[i], pred[i]) for i in _resamples(groups, n_resamples, seed)])
    lo, hi = _interval(stats, level)
    return {"estimate": _num(statistic(y, pred)), "low": _num(lo), "high": _num(hi), "level": level,
            "resamples": n_resamples}


def paired_bootstrap(y: Any, pred: Any, base: Any, groups: Sequence[str], statistic: Statistic = avg_spearman,
                     n_resamples: int = N_RESAMPLES, seed: int = 0, level: float = LEVEL) -> dict[str, Any]:
    """``statistic(y, pred) - statistic(y, base)`` on the same resampled documents: the
    difference, its percentile interval, and a two-sided bootstrap p-value (twice the smaller
    share of resampled differences on either side of 0, with the +1 correction; 1 when the
    two are the same)."""
    y, pred, base = _as2d(y), _as2d(pred), _as2d(base)
    diffs = np.array([statistic(y[i], pred[i]) - statistic(y[i], base[i])
                      for i in _resamples(groups, n_resamples, seed)])
    lo, hi = _interval(diffs, level)
    d = diffs[np.isfinite(diffs)]
    p = None
    if len(d):
        below, above = (np.sum(d <= 0) + 1) / (len(d) + 1), (np.sum(d >= 0) + 1) / (len(d) + 1)
        p = min(1.0, 2 * min(below, above))
    return {"difference": _num(statistic(y, pred) - statistic(y, base)), "low": _num(lo), "high": _num(hi),
            "p_value": _num(p), "level": level, "resamples": n_resamples}


def summary_level_correlation(y: Any, pred: Any, groups: Sequence[str], metric: str = "spearman") -> dict[str, Any]:
    """Summary-level correlation (as G-Eval reports SummEval): the correlation between human
    and predicted scores of the outputs of each document, averaged over the documents where
    it is defined (both sides vary). ``{"value": mean or None, "documents": count used}``."""
    y, pred = np.asarray(y, float).ravel(), np.asarray(pred, float).ravel()
    vals = [correlation(y[r], pred[r], metric, min_n=2) for r in _doc_rows(groups)]  # 2 outputs are enough
    vals = [v for v in vals if math.isfinite(v)]
    return {"value": _num(float(np.mean(vals))) if vals else None, "documents": len(vals)}


def ranking_exact_match(y: Any, pred: Any, groups: Sequence[str]) -> dict[str, Any]:
    """Share of documents whose outputs the prediction ranks exactly in the human order: every
    pair of outputs with different human scores is ordered the same way (a predicted tie is a
    miss; pairs the humans tied are not judged). Documents with fewer than two different human
    scores are skipped. ``{"value": share or None, "documents": count judged}``."""
    y, pred = np.asarray(y, float).ravel(), np.asarray(pred, float).ravel()
    judged = hits = 0
    for r in _doc_rows(groups):
        yy, pp = y[r], pred[r]
        ok = np.isfinite(yy)
        yy, pp = yy[ok], pp[ok]
        if len(np.unique(yy)) < 2:
            continue
        judged += 1
        dy = np.sign(yy[:, None] - yy[None, :])
        dp = np.sign(pp[:, None] - pp[None, :])
        human = dy != 0
        hits += bool(np.all(dp[human] == dy[human]))  # a NaN prediction never matches
    return {"value": _num(hits / judged) if judged else None, "documents": judged}


def _num(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), 6)


def mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation of the defined values (std 0 for one value)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": _num(np.mean(vals)), "std": _num(np.std(vals, ddof=1) if len(vals) > 1 else 0.0),
            "n": len(vals)}
