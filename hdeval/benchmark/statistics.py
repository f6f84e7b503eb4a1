"""The benchmark's statistics: bootstrap intervals and paired differences over resampled
whole documents, summary-level correlation, ranking exact-match, mean/std over seeds."""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

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


Case = tuple  # one seed's arrays: (y, pred, groups) or, paired, (y, pred, base, groups)


def _joint_resamples(cases: Sequence[Case], n_resamples: int, seed: int):
    """Per resample, each case's row indices: the documents of all cases drawn once with
    replacement (seeded), each case keeping the drawn documents among its own rows, as often as
    they were drawn. The seeds' splits share documents: one draw for all keeps them dependent."""
    docs = sorted({str(g) for c in cases for g in c[-1]})
    where = {d: i for i, d in enumerate(docs)}
    codes = [np.array([where[str(g)] for g in c[-1]], int) for c in cases]
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        counts = np.bincount(rng.integers(0, len(docs), len(docs)), minlength=len(docs))
        yield [np.repeat(np.arange(len(code)), counts[code]) for code in codes]


def _new_split(
    cases: Sequence[Case],
    value: Callable[..., float],
    n_resamples: int,
    seed: int,
    train_sizes: Sequence[int] | None,
    level: float,
) -> dict[str, Any]:
    """The mean over seeds of ``value`` and a t interval for what it estimates: the expected
    figure of a new split of new data of the same sizes. Its variance is the test documents'
    part (:func:`_joint_resamples`, the fitted evaluators held fixed) plus the training part
    (each seed's evaluator was fitted on other documents), the latter from the spread between
    seeds less what their test sets explain. Seeds split the same documents, so their training
    sets overlap: the spread between them shows only the non-shared share of the training
    variability, scaled back up by that overlap. One seed shows no training variability."""
    arrays = [tuple(_as2d(a) for a in c[:-1]) for c in cases]
    per_seed = np.array([value(*a) for a in arrays], float)
    ok = np.isfinite(per_seed)
    est = float(np.mean(per_seed[ok])) if ok.any() else float("nan")
    draws = np.array(
        [
            # a seed none of whose test documents was drawn has no figure on this resample
            [value(*(a[i] for a in arr)) if len(i) else math.nan for arr, i in zip(arrays, idx)]
            for idx in _joint_resamples(cases, n_resamples, seed)
        ],
        float,
    ).reshape(n_resamples, len(cases))[:, ok]
    with warnings.catch_warnings():  # a resample with no seed's figure is left out just below
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(draws, axis=1) if ok.any() else np.array([])
    means = means[np.isfinite(means)]
    test_var = float(np.var(means, ddof=1)) if len(means) > 1 else float("nan")
    out: dict[str, Any] = {"test_sd": _num(math.sqrt(test_var)) if math.isfinite(test_var) else None}
    train_var, df = 0.0, math.inf
    k = int(ok.sum())
    total = 0.0 if not math.isfinite(test_var) else test_var
    if k > 1 and train_sizes is not None:
        n_test = np.array([len(c[-1]) for c, good in zip(cases, ok) if good], float)
        n_train = np.array([t for t, good in zip(train_sizes, ok) if good], float)
        test_share = float(np.mean(n_test / (n_test + n_train)))
        own = np.nanvar(draws, axis=0, ddof=1)  # each seed's test variance alone
        between = float(np.var(per_seed[ok], ddof=1))
        # training sets of two splits share a (1 - test share) part of their documents
        scale = (1 - test_share) / test_share + 1 / k
        # between seeds of the same documents, a test set varies around all documents' figure by
        # its own variance times (1 - test share); the rest of the spread is the training's
        train_var = max(0.0, between - float(np.nanmean(own)) * (1 - test_share)) * scale
        total += train_var
        # Satterthwaite: the training part is the spread between seeds (k - 1 degrees of freedom)
        # less a precise test part, so its uncertainty is the spread's, also where the difference
        # is clipped at 0 (a small spread from 3 seeds is often chance, not a small training part).
        # Never fewer than the seeds give: where the test part explains the whole spread, the
        # approximation would put a few tenths of a degree of freedom on it, an unbounded quantile.
        if between > 0 and total > 0:
            df = max(k - 1.0, total**2 / ((scale * between) ** 2 / (k - 1)))
    out["training_sd"] = _num(math.sqrt(train_var)) if k > 1 and train_sizes is not None else None
    half = float(stats.t.ppf(0.5 + level / 2, df) if math.isfinite(df) else stats.norm.ppf(0.5 + level / 2))
    sd = math.sqrt(total) if math.isfinite(test_var) else float("nan")
    return {**out, "estimate": est, "sd": sd, "half": half * sd, "df": df}


def _clipped(x: float, lo: float, hi: float) -> float | None:
    # a bound of no figure is no bound: max() and min() would pass the limit for a NaN
    return _num(min(hi, max(lo, x))) if math.isfinite(x) else None


def _covers(result: Mapping[str, Any]) -> str:
    return "test documents and training" if result["training_sd"] is not None else "test documents only"


def pooled_bootstrap_ci(
    cases: Sequence[Case],
    statistic: Statistic = avg_spearman,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
    train_sizes: Sequence[int] | None = None,
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> dict[str, Any]:
    """The mean over seeds of ``statistic(y, pred)`` with a ``level`` interval for the figure a
    new split of new data would give on average (:func:`_new_split`). ``cases``: (y, pred,
    groups) per seed, ``groups`` the doc_id of each row; ``train_sizes``: each seed's training
    rows (without them, or with one seed, the interval covers the test documents only);
    ``bounds``: the values the statistic can take, which the interval stays within."""
    r = _new_split(cases, statistic, n_resamples, seed, train_sizes, level)
    lo, hi = bounds
    return {
        "estimate": _num(r["estimate"]),
        "low": _clipped(r["estimate"] - r["half"], lo, hi),
        "high": _clipped(r["estimate"] + r["half"], lo, hi),
        "test_sd": r["test_sd"],
        "training_sd": r["training_sd"],
        "covers": _covers(r),
        "level": level,
        "resamples": n_resamples,
    }


def pooled_paired_bootstrap(
    cases: Sequence[Case],
    statistic: Statistic = avg_spearman,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
    train_sizes: Sequence[int] | None = None,
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> dict[str, Any]:
    """``statistic(y, pred) - statistic(y, base)`` averaged over seeds (``cases``: (y, pred,
    base, groups) per seed), its interval as :func:`pooled_bootstrap_ci`'s (both evaluators on
    the same resampled documents; ``bounds``: the statistic's, so a difference stays within
    their width), and the two-sided p-value of the same t distribution."""

    def diff(y: np.ndarray, pred: np.ndarray, base: np.ndarray) -> float:
        return statistic(y, pred) - statistic(y, base)

    r = _new_split(cases, diff, n_resamples, seed, train_sizes, level)
    est, sd = r["estimate"], r["sd"]
    p = None
    if math.isfinite(est) and math.isfinite(sd):
        if sd > 0:
            t = abs(est) / sd
            p = float(2 * (stats.t.sf(t, r["df"]) if math.isfinite(r["df"]) else stats.norm.sf(t)))
        else:
            p = 1.0 if est == 0 else 0.0  # every resample gives the same difference
    return {
        "difference": _num(est),
        "low": _clipped(est - r["half"], bounds[0] - bounds[1], bounds[1] - bounds[0]),
        "high": _clipped(est + r["half"], bounds[0] - bounds[1], bounds[1] - bounds[0]),
        "p_value": _num(p),
        "test_sd": r["test_sd"],
        "training_sd": r["training_sd"],
        "covers": _covers(r),
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
