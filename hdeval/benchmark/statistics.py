"""The benchmark's statistics: bootstrap intervals and paired differences over resampled
whole documents, summary-level correlation, ranking exact-match, mean/std over seeds."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from hdeval.core.metrics import as2d as _as2d
from hdeval.core.metrics import average_spearman as avg_spearman
from hdeval.core.metrics import correlation
from hdeval.core.metrics import finite_or_none as _num

N_RESAMPLES = 1000
LEVEL = 0.95

Statistic = Callable[[np.ndarray, np.ndarray], float]


def group(items: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    """key -> its items, keys in first-seen order."""
    out: dict[Any, list[Any]] = {}
    for x in items:
        out.setdefault(key(x), []).append(x)
    return out


def _doc_rows(groups: Sequence[str]) -> list[np.ndarray]:
    """Row indices of each document, in first-seen order."""
    return [np.array(r) for r in group(range(len(groups)), lambda i: str(groups[i])).values()]


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


Case = tuple  # one seed's arrays: (y, pred, groups) or, paired, (y, pred, base, groups)


def _pooled(
    cases: Sequence[Case], seeds: Sequence[int], n_resamples: int, value: Callable[..., float]
) -> tuple[float, np.ndarray]:
    """``value`` averaged over the cases (seeds), and on each joint resample (each seed's own)."""
    cases = [tuple(_as2d(a) for a in c[:-1]) + (c[-1],) for c in cases]
    est = [value(*c[:-1]) for c in cases]
    est = [v for v in est if math.isfinite(v)]
    draws = zip(*(_resamples(c[-1], n_resamples, s) for c, s in zip(cases, seeds)))
    stats = np.array([np.mean([value(*(a[i] for a in c[:-1])) for c, i in zip(cases, idx)]) for idx in draws])
    return (float(np.mean(est)) if est else float("nan")), stats


def pooled_bootstrap_ci(
    cases: Sequence[Case],
    statistic: Statistic = avg_spearman,
    n_resamples: int = N_RESAMPLES,
    seeds: Sequence[int] = (0,),
    level: float = LEVEL,
) -> dict[str, Any]:
    """The mean over seeds of ``statistic(y, pred)`` with one percentile interval: each seed's
    test documents resampled with replacement (``groups``: the doc_id of each row), the
    statistic averaged over the seeds per resample. ``cases``: (y, pred, groups) per seed."""
    est, stats = _pooled(cases, seeds, n_resamples, statistic)
    lo, hi = _interval(stats, level)
    return {
        "estimate": _num(est),
        "low": _num(lo),
        "high": _num(hi),
        "level": level,
        "resamples": n_resamples,
    }


def pooled_paired_bootstrap(
    cases: Sequence[Case],
    statistic: Statistic = avg_spearman,
    n_resamples: int = N_RESAMPLES,
    seeds: Sequence[int] = (0,),
    level: float = LEVEL,
) -> dict[str, Any]:
    """``statistic(y, pred) - statistic(y, base)`` averaged over seeds, on the same resampled
    documents (``cases``: (y, pred, base, groups) per seed): the difference, its percentile
    interval, and a two-sided bootstrap p-value (twice the smaller share of resampled
    differences on either side of 0, with the +1 correction; 1 when the two are the same).
    ``p_floor``: the smallest p-value these resamples can give, 2 / (resamples + 1)."""

    def diff(y: np.ndarray, pred: np.ndarray, base: np.ndarray) -> float:
        return statistic(y, pred) - statistic(y, base)

    est, diffs = _pooled(cases, seeds, n_resamples, diff)
    lo, hi = _interval(diffs, level)
    d = diffs[np.isfinite(diffs)]
    p = None
    if len(d):
        below, above = (np.sum(d <= 0) + 1) / (len(d) + 1), (np.sum(d >= 0) + 1) / (len(d) + 1)
        p = min(1.0, 2 * min(below, above))
    return {
        "difference": _num(est),
        "low": _num(lo),
        "high": _num(hi),
        "p_value": _num(p),
        "p_floor": _num(2 / (len(d) + 1)) if len(d) else None,
        "level": level,
        "resamples": n_resamples,
    }


def summary_level_correlation(
    y: Any, pred: Any, groups: Sequence[str], metric: str = "spearman"
) -> dict[str, Any]:
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


def mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation of the defined values (std 0 for one value)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": _num(np.mean(vals)),
        "std": _num(np.std(vals, ddof=1) if len(vals) > 1 else 0.0),
        "n": len(vals),
    }
