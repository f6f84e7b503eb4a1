"""Prediction-powered estimates of a human mean: a few human labels correct the evaluator's bias
on many rows, with a valid interval (PPI++, Angelopoulos, Duchi and Zrnic 2023).

The estimate is ``lam * mean(evaluator on the unlabelled rows) + mean(human - lam * evaluator
on the labelled rows)``: with ``lam = 0`` it is the classical mean of the labels, with ``lam = 1``
plain PPI. ``lam`` is tuned to make the interval narrowest ("power tuning") and clipped to [0, 1],
so a useless evaluator costs almost nothing against the labels alone.

Validity needs the labelled rows to be a random sample of the rows. Rows labelled with unequal
probabilities (a stratified or an active selection) must carry those probabilities
(``sampling_prob``): each labelled row is then weighted by its inverse, as in active statistical
inference (Zrnic and Candes 2024). Labels chosen by an active strategy without their
probabilities give no valid interval, and the caller must refuse them.

A pairwise task estimates the win rate of A over B: a human label is 1 (A better), 0.5 (tie) or
0 (B better), and the evaluator's value is its probability of A plus half its probability of a
tie (or its label coded the same way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Difference", "MeanEstimate", "Moments", "difference", "pair_value", "ppi_mean"]

#: What a pairwise label is worth towards the win rate of A over B.
WIN_VALUE = {"a": 1.0, "tie": 0.5, "b": 0.0}


@dataclass(frozen=True)
class Moments:
    """Count, mean and variance (ddof 1) of the evaluator's values on rows: all the estimate
    needs of the unlabelled rows, so a stream of them need not be kept."""

    count: int
    mean: float
    var: float

    @classmethod
    def of(cls, values: Any) -> Moments:
        v = np.asarray(values, float).ravel()
        return cls(
            int(v.size), float(v.mean()) if v.size else 0.0, float(v.var(ddof=1)) if v.size > 1 else 0.0
        )

    def merge(self, other: Moments) -> Moments:
        """The moments of both sets of rows together (Chan et al.'s pairwise update)."""
        n = self.count + other.count
        if not n:
            return self
        delta = other.mean - self.mean
        m2 = (
            self.var * max(self.count - 1, 0)
            + other.var * max(other.count - 1, 0)
            + delta * delta * self.count * other.count / n
        )
        return Moments(n, self.mean + delta * other.count / n, m2 / (n - 1) if n > 1 else 0.0)


#: Resamples of the studentised bootstrap that sets the interval's critical values below
#: :data:`BOOTSTRAP_MAX_LABELS` labels; fixed seed, so the same labels give the same interval.
BOOTSTRAP_RESAMPLES = 1000
#: Past this many labels the mean is close enough to normal that Student's t serves, and the
#: resamples (resamples x labels values) would cost memory for nothing.
BOOTSTRAP_MAX_LABELS = 200


def _z(alpha: float, df: float | None = None) -> float:
    """The two-sided critical value: normal, or Student's t with ``df`` degrees of freedom."""
    from scipy.stats import norm, t

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    # isf, not ppf(1 - alpha / 2): below alpha ~ 1e-16 that rounds to ppf(1), an infinite bound
    return float(norm.isf(alpha / 2) if df is None else t.isf(alpha / 2, df))


@dataclass(frozen=True)
class MeanEstimate:
    """The PPI++ estimate of a human mean with its ``1 - alpha`` interval, beside the classical
    one from the labelled rows alone and the evaluator's own (biased) mean over every row.

    ``n_labelled`` rows carry a human label out of ``n`` rows in all. ``fixed_var``: the part
    of ``se**2`` that more labels do not shrink (the evaluator's own noise over the ``n`` rows);
    the rest shrinks as ``1 / n_labelled``."""

    estimate: float
    se: float
    classical: float
    classical_se: float
    evaluator_mean: float
    lam: float
    n_labelled: int
    n: int
    alpha: float
    fixed_var: float
    weighted: bool = False  # the labelled rows carried sampling probabilities
    df: float | None = None  # Student's t degrees of freedom of the intervals; None: normal
    #: The studentised bootstrap's (lower, upper) quantiles of ``(estimate - mean) / se``, which
    #: replace ``-t`` and ``+t`` (None: the symmetric quantile); ``classical_crit`` the same
    #: for the classical interval.
    crit: tuple[float, float] | None = None
    classical_crit: tuple[float, float] | None = None
    #: Given an array of resampled row indices (resamples x labelled rows), the estimate, its
    #: standard error, the classical mean and its standard error in each resample, as the
    #: estimate itself was computed: what :func:`difference` studentises; None past
    #: :data:`BOOTSTRAP_MAX_LABELS` labels or without ``small_sample``.
    resample: Callable[[np.ndarray], _Resampled] | None = field(default=None, repr=False, compare=False)

    def _crit(self, crit: tuple[float, float] | None) -> tuple[float, float]:
        if crit is not None:
            return crit
        z = _z(self.alpha, self.df)
        return -z, z

    @property
    def half_width(self) -> float:
        """Half the interval's width (the interval itself may sit unevenly around the estimate)."""
        lo, hi = self._crit(self.crit)
        return (hi - lo) / 2 * self.se

    @property
    def low(self) -> float:
        return self.estimate - self._crit(self.crit)[1] * self.se

    @property
    def high(self) -> float:
        return self.estimate - self._crit(self.crit)[0] * self.se

    @property
    def classical_low(self) -> float:
        return self.classical - self._crit(self.classical_crit)[1] * self.classical_se

    @property
    def classical_high(self) -> float:
        return self.classical - self._crit(self.classical_crit)[0] * self.classical_se

    @property
    def effective_labels(self) -> float:
        """How many labels the classical interval would need to be as narrow as this one."""
        if self.se <= 0:
            return math.inf if self.classical_se > 0 else float(self.n_labelled)
        return self.n_labelled * (self.classical_se / self.se) ** 2

    @property
    def labels_gained(self) -> float:
        """What the evaluator is worth in labels: effective labels minus the labels used."""
        return self.effective_labels - self.n_labelled

    def labels_for(self, margin: float) -> int | None:
        """About how many more labels (drawn as these were) bring the half-width to ``margin``;
        0 when it is there already, None when labelling every row would not (the evaluator's
        own noise over these rows is wider)."""
        if not margin > 0:
            raise ValueError(f"the margin must be positive, got {margin}")
        if self.half_width <= margin:
            return 0
        lo, hi = self._crit(self.crit)
        target = (margin / ((hi - lo) / 2)) ** 2 - self.fixed_var
        per_label = (self.se**2 - self.fixed_var) * self.n_labelled  # the variance that is ~ 1/labels
        if target <= 0 or per_label <= 0:
            return None
        need = math.ceil(per_label / target)
        return need - self.n_labelled if need <= self.n else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "se": self.se,
            "classical": self.classical,
            "classical_low": self.classical_low,
            "classical_high": self.classical_high,
            "evaluator_mean": self.evaluator_mean,
            "lam": self.lam,
            "n_labelled": self.n_labelled,
            "n": self.n,
            "alpha": self.alpha,
            "effective_labels": self.effective_labels,
            "labels_gained": self.labels_gained,
            "weighted": self.weighted,
        }


def _checked(name: str, values: Any) -> np.ndarray:
    v = np.asarray(values, float).ravel()
    if not np.isfinite(v).all():
        raise ValueError(f"{name} holds a value that is not a finite number")
    return v


def ppi_mean(
    y: Any,
    yhat: Any,
    unlabelled: Any,
    *,
    alpha: float = 0.1,
    lam: float | None = None,
    sampling_prob: Any = None,
    small_sample: bool = True,
) -> MeanEstimate:
    """The PPI++ estimate of the mean of the human values.

    ``y``, ``yhat``: the human and the evaluator's values on the labelled rows; ``unlabelled``:
    the evaluator's values on the other rows (an array, or their :class:`Moments`). ``lam``:
    None tunes it (PPI++); 1 is plain PPI, 0 the classical mean. ``sampling_prob``: the
    probability with which each labelled row was chosen for labelling, when that was not one
    uniform random sample; the estimate then weights each label by its inverse.
    ``small_sample``: the labelled rows' variances with ``n - 1`` and, instead of the normal
    quantile, critical values from a studentised bootstrap of the labelled rows (``lam`` tuned
    again in each resample; :func:`_bootstrap_t`) up to :data:`BOOTSTRAP_MAX_LABELS` labels and
    Student's t with ``n - 1`` degrees of freedom past it. At a few dozen labels of skewed scores
    (most at the top of the scale) the mean is not yet normal and a symmetric interval covers
    too little: the bootstrap's interval reaches further on the side of the long tail.

    Without ``sampling_prob`` and ``small_sample`` this is ``ppi_py.ppi_mean_ci`` (same tuning,
    same interval)."""
    y, yhat = _checked("the human values", y), _checked("the evaluator's values", yhat)
    if y.size != yhat.size:
        raise ValueError(f"{y.size} human values but {yhat.size} evaluator values")
    if y.size < 2:
        raise ValueError(f"an interval needs at least 2 labelled rows, got {y.size}")
    rest = (
        unlabelled
        if isinstance(unlabelled, Moments)
        else Moments.of(_checked("the evaluator's values", unlabelled))
    )
    if lam is not None and not 0 <= lam <= 1:
        raise ValueError(f"lam must be between 0 and 1, got {lam}")
    if sampling_prob is not None:
        return _weighted(y, yhat, rest, _checked("sampling_prob", sampling_prob), alpha, lam, small_sample)
    _z(alpha)
    n, N = y.size, rest.count
    every = Moments.of(yhat).merge(rest)
    tuned = lam is None and N > 0
    if lam is None:
        # the variance-minimising lam (PPI++ for a mean), as ppi_py computes it
        cov = float(np.mean((y - y.mean()) * (yhat - yhat.mean())))
        lam = 0.0 if not N or every.var <= 0 else float(np.clip(cov / ((1 + n / N) * every.var), 0, 1))
    if not N:
        lam = 0.0  # nothing unlabelled: the labels alone
    rect = y - lam * yhat
    fixed = lam * lam * rest.var * (N - 1) / N / N if N else 0.0  # ppi_py: ddof 0
    ddof = 1 if small_sample else 0
    se = math.sqrt(fixed + rect.var(ddof=ddof) / n)
    estimate = lam * rest.mean + float(rect.mean())
    crit = classical_crit = None
    resample = None
    if small_sample and n <= BOOTSTRAP_MAX_LABELS:
        resample = _plain_resampler(y, yhat, rest, None if tuned else lam)
        crit, classical_crit, _, _ = _bootstrap_t(y, resample, alpha, estimate, float(y.mean()))
    return MeanEstimate(
        estimate=estimate,
        se=se,
        classical=float(y.mean()),
        classical_se=float(y.std(ddof=ddof) / math.sqrt(n)),
        evaluator_mean=every.mean,
        lam=lam,
        n_labelled=n,
        n=n + N,
        alpha=alpha,
        fixed_var=fixed,
        df=n - 1 if small_sample else None,
        crit=crit,
        classical_crit=classical_crit,
        resample=resample,
    )


#: Per resample: the estimate, its standard error, the classical mean, its standard error.
_Resampled = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _plain_resampler(
    y: np.ndarray, yhat: np.ndarray, rest: Moments, lam: float | None
) -> Callable[[np.ndarray], _Resampled]:
    """The unweighted estimate recomputed on resamples of the labelled rows (the unlabelled ones
    are many and stay as they are). ``lam`` None: tuned again in each resample, as
    :func:`ppi_mean` tunes it (its own noise belongs in the interval)."""
    n, N = y.size, rest.count

    def resample(idx: np.ndarray) -> _Resampled:
        yb, fb = y[idx], yhat[idx]
        ym = yb.mean(axis=1)
        yvar = yb.var(axis=1, ddof=1)
        if lam is None:
            fm = fb.mean(axis=1)
            cov = ((yb - ym[:, None]) * (fb - fm[:, None])).mean(axis=1)
            delta = rest.mean - fm
            m2 = fb.var(axis=1, ddof=1) * (n - 1) + rest.var * (N - 1) + delta * delta * n * N / (n + N)
            var = m2 / (n + N - 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                lams = np.where(var > 0, np.clip(cov / ((1 + n / N) * var), 0, 1), 0.0)
        else:
            lams = np.full(len(idx), lam)
        rect = yb - lams[:, None] * fb
        fixed = lams * lams * rest.var * (N - 1) / N / N if N else np.zeros(len(idx))
        est = lams * rest.mean + rect.mean(axis=1)
        se = np.sqrt(fixed + rect.var(axis=1, ddof=1) / n)
        return est, se, ym, np.sqrt(yvar / n)

    return resample


def _studentised(t: np.ndarray, ok: np.ndarray, alpha: float) -> tuple[float, float] | None:
    """The ``alpha / 2`` and ``1 - alpha / 2`` quantiles of the studentised resamples ``t``
    (``ok``: those with a spread); None when too many have none."""
    if ok.mean() < 0.9:
        return None
    lo, hi = np.quantile(t[ok], [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _resolvable(alpha: float) -> bool:
    """Whether :data:`BOOTSTRAP_RESAMPLES` place the ``alpha / 2`` quantiles (10 beyond each)."""
    return alpha / 2 * BOOTSTRAP_RESAMPLES >= 10


def _bootstrap_t(
    y: np.ndarray,
    resample: Callable[[np.ndarray], _Resampled],
    alpha: float,
    estimate: float,
    classical: float,
) -> tuple[tuple[float, float] | None, tuple[float, float] | None, float, float]:
    """The studentised (bootstrap-t) critical values of the estimate and of the classical mean:
    the ``alpha / 2`` and ``1 - alpha / 2`` quantiles of ``(estimate* - estimate) / se*`` over
    resamples of the labelled rows, then the standard deviations of ``estimate*`` and of
    ``classical*``. A None pair: the resamples cannot resolve ``alpha``, or too many have no
    spread; the caller keeps Student's t."""
    if not _resolvable(alpha):
        return None, None, 0.0, 0.0
    idx = np.random.default_rng(0).integers(0, y.size, size=(BOOTSTRAP_RESAMPLES, y.size))
    est, se, cl, cl_se = resample(idx)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (
            _studentised((est - estimate) / se, se > 0, alpha),
            _studentised((cl - classical) / cl_se, cl_se > 0, alpha),
            float(est.std(ddof=1)),
            float(cl.std(ddof=1)),
        )


def _weighted(
    y: np.ndarray,
    yhat: np.ndarray,
    rest: Moments,
    prob: np.ndarray,
    alpha: float,
    lam: float | None,
    small_sample: bool,
) -> MeanEstimate:
    """Labels drawn with known, unequal probabilities: ``lam * mean(evaluator, every row) +
    the inverse-probability-weighted (Hajek) mean of ``human - lam * evaluator`` over the
    labelled rows. Its variance: the rows' own spread (``var(human) / n``) plus the sampling's,
    ``sum((1 - p) / p**2 * (r - mean r)**2) / (sum 1/p)**2`` (Poisson sampling); ``lam``
    minimises the latter.

    ``small_sample``: up to :data:`BOOTSTRAP_MAX_LABELS` labels, critical values from a
    studentised bootstrap of the labelled rows, each keeping its probability (so its weight),
    with ``lam`` tuned again in each resample; past it Student's t on ``n - 1``. A few dozen
    weighted labels carry fewer labels' worth of information than their count (a few rows of
    low probability weigh as much as many others), and their variance estimate is noisy: the
    t interval covered 0.74-0.83 for 90% at 30 labels (``benchmarks/ppi.md``)."""
    if prob.size != y.size:
        raise ValueError(f"{prob.size} sampling probabilities for {y.size} labelled rows")
    if not ((prob > 0) & (prob <= 1)).all():
        raise ValueError("a sampling probability is not in (0, 1]")
    _z(alpha)
    every = Moments.of(yhat).merge(rest)
    resample = _weighted_resampler(y, yhat, prob, every, lam)
    # the estimate itself is the resampler's on the identity resample: one formula, not two
    one = np.arange(y.size)[None, :]
    est, se, classical, classical_se = (float(a[0]) for a in resample(one))
    lam_used = float(_weighted_lams(y[None, :], yhat[None, :], prob[None, :], lam)[0])
    crit = classical_crit = None
    if small_sample and y.size <= BOOTSTRAP_MAX_LABELS:
        crit, classical_crit, spread, classical_spread = _bootstrap_t(y, resample, alpha, est, classical)
        # the formula leaves out the noise of lam tuned on these few weighted labels (and of the
        # weights' own sum), which the resampled estimates carry: at 30 labels their spread was
        # ~1.3 times the formula's (benchmarks/ppi.md), so the larger of the two scales the interval
        if crit is not None:
            se = max(se, spread)
        if classical_crit is not None:
            classical_se = max(classical_se, classical_spread)
    return MeanEstimate(
        estimate=est,
        se=se,
        classical=classical,
        classical_se=classical_se,
        evaluator_mean=every.mean,
        lam=lam_used,
        n_labelled=int(y.size),
        n=every.count,
        alpha=alpha,
        fixed_var=float(_y_spread(y[None, :], 1 / prob[None, :], every.count)[0]),
        weighted=True,
        df=y.size - 1 if small_sample else None,
        crit=crit,
        classical_crit=classical_crit,
        resample=resample if small_sample and y.size <= BOOTSTRAP_MAX_LABELS else None,
    )


def _wmean(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per row of ``x`` (resamples x labels), the mean weighted by ``w``."""
    return (w * x).sum(axis=1) / w.sum(axis=1)


def _y_spread(y: np.ndarray, w: np.ndarray, count: int) -> np.ndarray:
    # the rows are a sample of a population too: var(human) / rows
    return _wmean((y - _wmean(y, w)[:, None]) ** 2, w) / count


def _weighted_lams(y: np.ndarray, yhat: np.ndarray, prob: np.ndarray, lam: float | None) -> np.ndarray:
    """Per resample, the ``lam`` that minimises the sampling variance, in [0, 1] (or ``lam``)."""
    if lam is not None:
        return np.full(len(y), lam)
    v = (1 - prob) / prob**2  # each label's weight in the sampling variance
    total = v.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        dy = y - ((v * y).sum(axis=1) / total)[:, None]
        df = yhat - ((v * yhat).sum(axis=1) / total)[:, None]
        var_f = (v * df * df).sum(axis=1)
        lams = np.clip((v * dy * df).sum(axis=1) / var_f, 0, 1)
    return np.where((total > 0) & (var_f > 0), lams, 0.0)


def _weighted_resampler(
    y: np.ndarray, yhat: np.ndarray, prob: np.ndarray, every: Moments, lam: float | None
) -> Callable[[np.ndarray], _Resampled]:
    def resample(idx: np.ndarray) -> _Resampled:
        yb, fb, pb = y[idx], yhat[idx], prob[idx]
        w = 1 / pb
        v = (1 - pb) * w * w
        lams = _weighted_lams(yb, fb, pb, lam)
        spread = _y_spread(yb, w, every.count)

        def sampling_var(r: np.ndarray) -> np.ndarray:
            return (v * (r - _wmean(r, w)[:, None]) ** 2).sum(axis=1) / w.sum(axis=1) ** 2

        rect = yb - lams[:, None] * fb
        est = lams * every.mean + _wmean(rect, w)
        return est, np.sqrt(spread + sampling_var(rect)), _wmean(yb, w), np.sqrt(spread + sampling_var(yb))

    return resample


@dataclass(frozen=True)
class Difference:
    """``first - second`` of two estimates on disjoint rows (two systems), with its interval
    and the classical one: the rows are independent, so the variances add.

    ``crit`` / ``classical_crit``: the studentised bootstrap's (lower, upper) quantiles of
    ``(difference - true difference) / se`` (each group's labelled rows resampled on their own),
    which replace ``-t`` and ``+t``; None: Student's t on ``df`` (Welch's degrees of freedom),
    or the normal quantile when ``df`` is None."""

    estimate: float
    se: float
    classical: float
    classical_se: float
    alpha: float
    df: float | None = None
    crit: tuple[float, float] | None = None
    classical_crit: tuple[float, float] | None = None
    classical_df: float | None = None

    def _crit(self, crit: tuple[float, float] | None, df: float | None) -> tuple[float, float]:
        if crit is not None:
            return crit
        z = _z(self.alpha, df)
        return -z, z

    @property
    def low(self) -> float:
        return self.estimate - self._crit(self.crit, self.df)[1] * self.se

    @property
    def high(self) -> float:
        return self.estimate - self._crit(self.crit, self.df)[0] * self.se

    @property
    def classical_low(self) -> float:
        return self.classical - self._crit(self.classical_crit, self.classical_df)[1] * self.classical_se

    @property
    def classical_high(self) -> float:
        return self.classical - self._crit(self.classical_crit, self.classical_df)[0] * self.classical_se

    def as_dict(self) -> dict[str, Any]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "se": self.se,
            "classical": self.classical,
            "classical_low": self.classical_low,
            "classical_high": self.classical_high,
            "alpha": self.alpha,
        }


def _welch(se1: float, df1: float | None, se2: float, df2: float | None) -> float | None:
    """Welch-Satterthwaite degrees of freedom of a sum of two variances (None: normal)."""
    if df1 is None or df2 is None:
        return None
    v1, v2 = se1 * se1, se2 * se2
    if v1 + v2 <= 0:
        return float(df1 + df2)
    return float((v1 + v2) ** 2 / (v1 * v1 / df1 + v2 * v2 / df2))


def difference(first: MeanEstimate, second: MeanEstimate) -> Difference:
    """``first - second`` with its interval. Up to :data:`BOOTSTRAP_MAX_LABELS` labels in each
    (the estimates' default ``small_sample``), a studentised bootstrap: each group's labelled
    rows resampled on their own (fixed seed), the difference and its standard error
    recomputed; else Student's t on Welch's degrees of freedom (the normal quantile for
    estimates made without ``small_sample``). The normal quantile covered 0.83-0.84 for 90%
    at 10 labels a group (``benchmarks/ppi.md``)."""
    if first.alpha != second.alpha:
        raise ValueError(f"the two estimates have different levels ({first.alpha} and {second.alpha})")
    alpha = first.alpha
    est = first.estimate - second.estimate
    se = math.hypot(first.se, second.se)
    classical = first.classical - second.classical
    classical_se = math.hypot(first.classical_se, second.classical_se)
    crit = classical_crit = None
    if first.resample is not None and second.resample is not None and _resolvable(alpha):
        rng = np.random.default_rng(1)
        e1, s1, c1, cs1 = first.resample(
            rng.integers(0, first.n_labelled, (BOOTSTRAP_RESAMPLES, first.n_labelled))
        )
        e2, s2, c2, cs2 = second.resample(
            rng.integers(0, second.n_labelled, (BOOTSTRAP_RESAMPLES, second.n_labelled))
        )
        boot_se, boot_cse = np.hypot(s1, s2), np.hypot(cs1, cs2)
        with np.errstate(divide="ignore", invalid="ignore"):
            crit = _studentised((e1 - e2 - est) / boot_se, boot_se > 0, alpha)
            classical_crit = _studentised((c1 - c2 - classical) / boot_cse, boot_cse > 0, alpha)
    return Difference(
        est,
        se,
        classical,
        classical_se,
        alpha,
        df=_welch(first.se, first.df, second.se, second.df),
        crit=crit,
        classical_crit=classical_crit,
        classical_df=_welch(first.classical_se, first.df, second.classical_se, second.df),
    )


def pair_value(label: str | None = None, probabilities: Mapping[str, float] | None = None) -> float | None:
    """A pair's worth towards the win rate of A over B: from class probabilities when given
    (``a`` + half of ``tie``), else from the label; None when neither says."""
    if probabilities:
        try:
            p = {k: float(probabilities.get(k, 0.0)) for k in WIN_VALUE}
        except (TypeError, ValueError):
            return None
        total = sum(p.values())
        if total > 0 and all(math.isfinite(x) and x >= 0 for x in p.values()):
            return (p["a"] + 0.5 * p["tie"]) / total
    return WIN_VALUE.get(label) if isinstance(label, str) else None
