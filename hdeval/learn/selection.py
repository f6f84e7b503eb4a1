"""Which sample a person should label next, and how good the evaluator is on the labels so far.

Four strategies over a pool of criterion-score rows (``X``: rows x criterion columns, NaN where
a criterion could not be scored):

- ``random``: the control;
- ``uncertainty``: the rows whose normalised-conformal prediction interval is widest, the
  difficulty being the disagreement of the grouped cross-validation models (a committee);
- ``diversity``: k-center (greedy farthest-first) over the standardised criterion scores;
- ``hybrid``: k-center among the most uncertain rows.

With too few labels for a model (cold start) every strategy but ``random`` is diverse. Every
strategy is deterministic given ``seed``. The models are the aggregator HD-Eval's ``train`` fits
(:class:`hdeval.learn.aggregate.Aggregator`, its pipeline: median imputation, standardisation), one per
target on the rows that rate it; ``assess`` chooses its kind by grouped CV as ``--aggregator
auto`` does.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from sklearn.base import clone

from hdeval.core.errors import ConfigError
from hdeval.core.metrics import correlation
from hdeval.learn.aggregate import (
    CANDIDATES,
    KINDS,
    N_FOLDS,
    Aggregator,
    choose_aggregator,
    cv_folds,
    fit_warnings,
    one_thread,
)
from hdeval.learn.classify import cv_predictions, make_classifier
from hdeval.learn.intervals import DEFAULT_LEVEL, normalised_quantile

STRATEGIES: tuple[str, ...] = ("random", "uncertainty", "diversity", "hybrid")
#: Chosen by the learning-curve measurement (benchmarks/bench_learning_curves.md).
DEFAULT: str = "random"
#: Fewer labelled rows (or documents) than this: no model, the cold start is diverse.
MIN_MODEL_LABELS = 8
#: ``assess`` gives no figure below this many labelled rows of a target.
MIN_ASSESS_LABELS = 10
#: The hybrid strategy spreads its picks over this many of the most uncertain rows per pick.
HYBRID_POOL = 10
#: The model ``pick`` fits (fast enough for every click); ``assess`` chooses among all kinds.
PICK_KIND = "lr"
N_BOOTSTRAP = 400
PAIR_LABELS = {1.0: "a", 0.0: "tie", -1.0: "b"}


@dataclass(frozen=True)
class Pick:
    index: int  # row of X
    reason: str  # one plain sentence for the person labelling


@dataclass(frozen=True)
class Assessment:
    n_labels: int
    agreement: float | None  # held-out by document: mean Spearman over targets; pairwise: agreement rate
    low: float | None  # 90% interval of that figure (documents resampled)
    high: float | None
    reason: str | None  # why agreement is None
    aggregator: str | None = None  # the kind chosen (pointwise: as train's --aggregator would keep)


def pick(
    X: Any,
    labelled: Sequence[int],
    y: Any,
    *,
    k: int = 1,
    strategy: str = DEFAULT,
    groups: Sequence[Any] | None = None,
    seed: int = 0,
    exclude: Iterable[int] = (),
    pairwise: bool = False,
) -> list[Pick]:
    """``k`` distinct rows of ``X`` to label next, none in ``labelled`` or ``exclude`` (fewer
    when the pool has fewer). ``y``: the labels of ``labelled``, one row each, a column per
    target (NaN: not rated; pairwise: +1 A better, 0 tie, -1 B better). ``groups``: a document
    id per row of ``X``, the cross-validation groups."""
    X = _matrix(X, "X")
    labelled = _indices(labelled, len(X), "labelled")
    Y = _targets(y, len(labelled))
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown selection strategy {strategy!r}: choose from {', '.join(STRATEGIES)}")
    if not _whole(k) or k < 0:
        raise ConfigError(f"k must be a whole number >= 0, got {k!r}")
    k = int(k)
    if groups is not None and len(groups) != len(X):
        raise ConfigError(f"groups has {len(groups)} entries but X has {len(X)} rows")
    blocked = np.zeros(len(X), bool)
    blocked[labelled] = True
    blocked[_indices(list(exclude), len(X), "exclude")] = True
    free = np.flatnonzero(~blocked)
    k = min(k, len(free))
    if k == 0:
        return []
    rng = np.random.default_rng(seed)
    if strategy == "random":
        chosen = rng.choice(free, size=k, replace=False)
        return [
            Pick(int(i), "chosen at random, so the labels stay a fair sample of the pool") for i in chosen
        ]
    # the pool's products are too small to share out: BLAS threads only spin beside the app's
    with one_thread():
        return _pick_informed(X, labelled, Y, free, k, strategy, groups, seed, pairwise, rng)


def _pick_informed(
    X: np.ndarray,
    labelled: np.ndarray,
    Y: np.ndarray,
    free: np.ndarray,
    k: int,
    strategy: str,
    groups: Sequence[Any] | None,
    seed: int,
    pairwise: bool,
    rng: np.random.Generator,
) -> list[Pick]:
    """:func:`pick`'s choice for the strategies that read the samples' scores."""
    Z = _standardised(X)
    width = None
    if strategy in ("uncertainty", "hybrid"):
        width = uncertainty(X, labelled, Y, groups, seed=seed, pairwise=pairwise)
    if width is None:  # cold start, or no model could be fitted
        chosen = _k_center(Z, labelled, free, k, rng)
        why = (
            "no labels yet: a sample unlike those already labelled"
            if len(labelled) < MIN_MODEL_LABELS
            else "a sample unlike those already labelled"
        )
        return [Pick(int(i), why) for i in chosen]
    score, half = width
    if strategy == "uncertainty":
        order = free[np.lexsort((rng.random(len(free)), -score[free]))]
        chosen = order[:k]
    else:
        top = free[np.argsort(-score[free], kind="stable")][: max(k * HYBRID_POOL, k)]
        chosen = _k_center(Z, labelled, top, k, rng)
    return [Pick(int(i), _uncertain_reason(half[i], pairwise)) for i in chosen]


def uncertainty(
    X: np.ndarray,
    labelled: np.ndarray,
    Y: np.ndarray,
    groups: Sequence[Any] | None,
    *,
    seed: int = 0,
    pairwise: bool = False,
    level: float = DEFAULT_LEVEL,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row of ``X``: (a score to rank by: the interval width as a share of each target's
    spread of labels, summed over targets; the widest half-width). The half-width is the
    normalised conformal one: ``q * d(x)``, ``d`` the spread of the cross-validation models'
    predictions at ``x`` and ``q`` the ``level`` quantile of the labelled rows' out-of-fold
    ``|residual| / d``. None when too few labels for a model."""
    g = np.asarray(groups, object)[labelled] if groups is not None else np.arange(len(labelled))
    score = np.zeros(len(X))
    half = np.zeros(len(X))
    missing = np.isnan(X)
    X0 = np.where(missing, 0.0, X)
    fitted = False
    for j in range(Y.shape[1]):
        ok = np.isfinite(Y[:, j])
        rows, yj = labelled[ok], Y[ok, j]
        if len(rows) < MIN_MODEL_LABELS or len(set(g[ok])) < 2 or np.ptp(yj) == 0:
            continue
        if pairwise:
            spread = _pair_margin(X, rows, yj, seed)
            if spread is None:
                continue
            score += spread
            half = np.maximum(half, spread)
            fitted = True
            continue
        folds = cv_folds(list(g[ok]), seed)
        template = Aggregator(PICK_KIND, random_state=seed)
        oof = np.full(len(rows), np.nan)
        models = [clone(template).fit(X[rows[tr]], yj[tr]) for tr, _ in folds]
        preds = _linear_predictions(models, X0, missing)
        for (_, va), p in zip(folds, preds):
            oof[va] = p[rows[va]]
        d = _difficulty(preds)
        q, _ = normalised_quantile((yj - oof)[:, None], d[rows][:, None], level)
        if q[0] is None:
            continue
        h = q[0] * d
        score += h / max(float(np.std(yj)), 1e-9)
        half = np.maximum(half, h)
        fitted = True
    return (score, half) if fitted else None


def _linear_predictions(models: Sequence[Aggregator], X0: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """Every fitted linear aggregator's prediction on the pool in one product (models x rows):
    the pipeline (median imputation, standardisation, linear model) folded into one weight
    vector per model, which ``predict`` on a 10,000-row pool would take ten times longer to do."""
    W, B, F = [], [], []
    for m in models:
        pipe = m.models_[0]
        stat = pipe.named_steps["impute"].statistics_
        scale = pipe.named_steps["scale"]
        est = pipe.named_steps["model"]
        w = np.ravel(est.coef_) / scale.scale_
        W.append(w)
        F.append(stat * w)  # a missing cell takes the training median
        B.append(float(np.ravel(est.intercept_)[0]) - float(scale.mean_ @ w))
    W, F = np.array(W).T, np.array(F).T
    out = X0 @ W + np.array(B)
    if missing.any():
        out += missing @ F
    lo, hi = models[0].ranges_[0]
    return np.clip(out, lo, hi).T


def _difficulty(preds: np.ndarray) -> np.ndarray:
    """The committee's spread per row, floored at a tenth of its median so no row has zero width."""
    d = preds.std(axis=0)
    floor = 0.1 * float(np.median(d)) if np.median(d) > 0 else 1e-6
    return np.maximum(d, floor)


def _pair_margin(X: np.ndarray, rows: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray | None:
    """Pairwise: one minus the classifier's probability of its own verdict (most unsure first)."""
    labels = [PAIR_LABELS.get(float(v)) for v in y]
    if None in labels or len(set(labels)) < 2:
        return None
    model = make_classifier(PICK_KIND, seed).fit(X[rows], labels)
    return 1.0 - model.predict_proba(X).max(axis=1)


def _uncertain_reason(half: float, pairwise: bool) -> str:
    if pairwise:
        return f"the evaluator is least sure which response is better here (confidence {1 - half:.0%})"
    return f"the evaluator is least sure here: {DEFAULT_LEVEL:.0%} interval ±{half:.2g}"


def _standardised(X: np.ndarray) -> np.ndarray:
    """Columns median-imputed and scaled to unit spread (a constant column contributes nothing)."""
    missing = np.isnan(X)
    Z = X
    if missing.any():
        with warnings.catch_warnings():  # an all-NaN column: its median is NaN, then 0
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nan_to_num(np.nanmedian(X, axis=0))
        Z = np.where(missing, med, X)
    sd = Z.std(axis=0)
    return (Z - Z.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def _k_center(
    Z: np.ndarray, labelled: np.ndarray, candidates: np.ndarray, k: int, rng: np.random.Generator
) -> list[int]:
    """Greedy farthest-first: each pick is the candidate farthest from every labelled or already
    picked row (ties broken by ``rng``). With nothing labelled, the first is drawn by ``rng``."""
    C = Z[candidates]
    cn = (C * C).sum(axis=1)
    tiebreak = rng.random(len(candidates)) * 1e-9
    if len(labelled):
        nearest = np.full(len(candidates), np.inf)
        for start in range(0, len(labelled), 2048):
            L = Z[labelled[start : start + 2048]]
            d2 = cn[:, None] + (L * L).sum(axis=1)[None, :] - 2.0 * C @ L.T
            nearest = np.minimum(nearest, d2.min(axis=1))
    else:
        nearest = None
    chosen: list[int] = []
    for _ in range(k):
        if nearest is None:
            i = int(rng.integers(len(candidates)))
            nearest = np.full(len(candidates), np.inf)
        else:
            i = int(np.argmax(nearest + tiebreak))
        chosen.append(int(candidates[i]))
        d2 = cn + cn[i] - 2.0 * C @ C[i]
        nearest = np.minimum(nearest, d2)
        nearest[i] = -np.inf
    return chosen


def assess(
    X: Any,
    y: Any,
    groups: Sequence[Any],
    *,
    pairwise: bool = False,
    seed: int = 0,
    aggregator: str = "auto",
    template: Aggregator | None = None,
) -> Assessment:
    """Held-out agreement of the evaluator the labels so far would train: out-of-fold
    predictions grouped by document (pointwise: each fold's standardised, the figure ``train``
    records as ``cv_train``); the mean Spearman over targets (pairwise: the share of
    verdicts that agree, ties included) with a 90% interval from resampling documents.

    Pointwise, the aggregator is chosen by ``train``'s own chooser
    (:func:`hdeval.aggregate.choose_aggregator`: every candidate, the simple ones included, and
    the one-standard-error rule for ``auto``), on the rows with every target labelled, all
    targets at once; ``template``: the task's aggregator (its aspects, ranges and each aspect's
    columns, as ``train`` makes it); without, a plain regressor over ``X``. Pairwise, the
    classifier (lr, dt, rf or nn) with the best cross-validated agreement."""
    X = _matrix(X, "X")
    Y = _targets(y, len(X))
    if len(groups) != len(X):
        raise ConfigError(f"groups has {len(groups)} entries but X has {len(X)} rows")
    known = KINDS if pairwise else CANDIDATES
    if aggregator not in known + ("auto",):
        raise ConfigError(f"unknown aggregator {aggregator!r}: choose from {', '.join(known)} or auto")
    kinds = KINDS if aggregator == "auto" else (aggregator,)
    g = np.asarray(groups, object)
    n = int(np.isfinite(Y).any(axis=1).sum())
    preds = np.full(Y.shape, np.nan)
    kept: str | None = None
    if not pairwise:
        ok = np.flatnonzero(np.isfinite(Y).all(axis=1))
        varied = len(ok) and any(np.ptp(Y[ok, j]) > 0 for j in range(Y.shape[1]))
        # cv_folds groups by document only from N_FOLDS documents on (fewer: rows, documents leak)
        if len(ok) >= MIN_ASSESS_LABELS and len(set(g[ok])) >= N_FOLDS and varied:
            base = template if template is not None else Aggregator("lr", random_state=seed)
            with fit_warnings():  # a candidate kind that did not converge says nothing here
                chosen = choose_aggregator(
                    clone(base).set_params(random_state=seed),
                    X[ok],
                    Y[ok],
                    [str(x) for x in g[ok]],
                    aggregator,
                    n_jobs=1,
                )[0]
            # each fold standardised, as train's cv_train: the panel shows the figure train would
            preds[ok] = np.asarray(chosen.ranked).reshape(len(ok), -1)
            kept = chosen.kind
    for j in range(Y.shape[1] if pairwise else 0):
        ok = np.flatnonzero(np.isfinite(Y[:, j]))
        if len(ok) < MIN_ASSESS_LABELS or len(set(g[ok])) < N_FOLDS:
            continue
        labels = [PAIR_LABELS.get(float(v)) for v in Y[ok, j]]
        if None in labels:
            raise ConfigError("a pairwise label must be +1 (A better), 0 (tie) or -1 (B better)")
        if len(set(labels)) < 2:
            continue
        best, best_acc = None, -1.0
        for kind in kinds:
            with fit_warnings():
                pred = cv_predictions(kind, X[ok], labels, list(g[ok]), seed)[0]
            acc = np.mean([p == t for p, t in zip(pred, labels) if p is not None] or [float("nan")])
            if acc > best_acc:
                best, best_acc, kept = pred, float(acc), kind
        codes = {v: k for k, v in PAIR_LABELS.items()}
        preds[ok, j] = [codes[p] if p is not None else np.nan for p in best or []]
    if not np.isfinite(preds).any():
        return Assessment(
            n,
            None,
            None,
            None,
            f"too few labels: a held-out figure needs at least {MIN_ASSESS_LABELS} labelled rows "
            f"from {N_FOLDS} documents with differing labels, for some target",
        )
    value = _figure(Y, preds, np.arange(len(Y)), pairwise)
    if not math.isfinite(value):  # e.g. a judge that gave every labelled row one score
        return Assessment(
            n, None, None, None, "no held-out figure: the predictions rank nothing on these labels", kept
        )
    rng = np.random.default_rng(seed)
    docs = np.unique(g.astype(str))
    by_doc = {d: np.flatnonzero(g.astype(str) == d) for d in docs}
    boot = []
    for _ in range(N_BOOTSTRAP):
        rows = np.concatenate([by_doc[d] for d in rng.choice(docs, size=len(docs), replace=True)])
        v = _figure(Y, preds, rows, pairwise)
        if math.isfinite(v):
            boot.append(v)
    low, high = (float(np.quantile(boot, 0.05)), float(np.quantile(boot, 0.95))) if boot else (None, None)
    return Assessment(n, float(value), low, high, None, kept)


def task_template(task: Any, criteria: Sequence[str], seed: int = 0) -> Aggregator:
    """The aggregator ``train`` cross-validates for a pointwise ``task`` whose score table has the
    ``criteria`` columns (HD-Eval's keys: an aspect, then ``aspect/child`` under it): the task's
    aspects and ranges, each aspect's own column first, then its subtree's."""
    keys = list(criteria)
    columns = [
        [i for i, k in enumerate(keys) if k == a] + [i for i, k in enumerate(keys) if k.startswith(f"{a}/")]
        for a in task.aspect_keys
    ]
    return Aggregator.for_task("lr", task, seed, aspect_columns=columns)


def _figure(Y: np.ndarray, P: np.ndarray, rows: np.ndarray, pairwise: bool) -> float:
    """Mean over targets of Spearman (pairwise: agreement rate) on ``rows``; NaN if none is defined."""
    vals = []
    for j in range(Y.shape[1]):
        y, p = Y[rows, j], P[rows, j]
        ok = np.isfinite(y) & np.isfinite(p)
        if pairwise:
            if ok.any():
                vals.append(float(np.mean(y[ok] == p[ok])))
        else:
            r = correlation(y[ok], p[ok], "spearman")
            if math.isfinite(r):
                vals.append(r)
    return float(np.mean(vals)) if vals else float("nan")


def labels_to_reach(curve: Sequence[tuple[float, float]], target: float) -> int | None:
    """An estimate of the labels needed for ``target`` agreement from the curve so far
    (``[(n_labels, agreement), ...]``): the fewest labels at which the curve already reached it,
    else the fit ``agreement = a + b * log(n)`` solved for ``target``. None when it cannot be
    told: fewer than two points at distinct counts, a curve that does not rise, or an answer more
    than ten times beyond the labels seen."""
    pts = [
        (float(n), float(a))
        for n, a in curve
        if a is not None and math.isfinite(float(a)) and math.isfinite(float(n)) and float(n) > 0
    ]
    reached = [n for n, a in pts if a >= target]
    if reached:
        return math.ceil(min(reached))
    if len({n for n, _ in pts}) < 2:
        return None
    n = np.array([p[0] for p in pts])
    a = np.array([p[1] for p in pts])
    b, c = np.polyfit(np.log(n), a, 1)
    if not b > 0:
        return None
    need = math.exp((target - c) / b)
    if not math.isfinite(need) or need > 10 * n.max():
        return None
    return math.ceil(max(need, n.max()))


def _matrix(X: Any, name: str) -> np.ndarray:
    try:
        X = np.asarray(X, float)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name} must be a numeric array: {e}") from None
    if X.ndim != 2:
        raise ConfigError(f"{name} must be 2-D (rows x criterion columns), got {X.ndim}-D")
    if np.isinf(X).any():
        raise ConfigError(f"{name} holds an infinite value; a criterion not scored is NaN")
    return X


def _targets(y: Any, n: int) -> np.ndarray:
    Y = np.asarray(y, float)
    if Y.ndim == 1:
        Y = Y.reshape(len(Y), 1) if len(Y) else np.zeros((0, 1))
    if Y.ndim != 2 or len(Y) != n:
        raise ConfigError(f"y must hold one row per labelled sample ({n}), got shape {Y.shape}")
    if np.isinf(Y).any():
        raise ConfigError("y holds an infinite value; a target not rated is NaN")
    return Y


def _whole(x: Any) -> bool:
    """A whole number, numpy's included; never true/false or a float (which int() would cut)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _indices(idx: Sequence[int], n: int, name: str) -> np.ndarray:
    items = list(idx)
    if not all(_whole(i) for i in items):
        raise ConfigError(f"{name} must list rows of X (whole numbers 0 to {n - 1})")
    out = np.asarray(items, dtype=np.int64) if items else np.zeros(0, np.int64)
    if out.ndim != 1 or ((out < 0) | (out >= n)).any():
        raise ConfigError(f"{name} must list rows of X (0 to {n - 1})")
    if len(np.unique(out)) != len(out) and name == "labelled":
        raise ConfigError("labelled lists a row twice")
    return out
