"""Aggregation (paper 2.2): white-box regressors from criterion scores to human aspects; aspects
that share a score range share one multi-output regressor. Pure scikit-learn: no LLM, no disk."""

from __future__ import annotations

import gc
import os
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import threadpoolctl
from joblib import Parallel, delayed
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.ensemble import RandomForestRegressor
from sklearn.exceptions import ConvergenceWarning
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, RidgeCV
from sklearn.model_selection import GroupKFold, KFold, ParameterGrid
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import ThreadpoolController

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn: the estimator's own method
    _validate_data = None

from hdeval.core.errors import ConfigError
from hdeval.core.metrics import average_spearman, mean_spearman, metric_table
from hdeval.core.types import Task

KINDS = ("lr", "dt", "rf", "nn")  # the learned models (pairwise HD-Eval's classifiers too)
# Aggregators with few or no free weights, simplest first: the plain mean of every criterion,
# each aspect's own layer-1 score (direct), each aspect's subtree mean, linear weights shrunk
# toward equal ones, non-negative weights, a ridge. Each is a linear map of the criterion
# scores (a LinearRegression in the artifact), calibrated onto the aspect's scale.
SIMPLE_KINDS = ("mean", "direct", "aspect_mean", "shrink", "nnls", "ridge")
# Every candidate of ``auto``, in the order the one-standard-error rule prefers (simplest first).
CANDIDATES = SIMPLE_KINDS + ("lr", "dt", "nn", "rf")
# The kinds whose weights are fixed equal ones over some columns: nothing is learned but a scale.
FIXED_KINDS = ("mean", "direct", "aspect_mean")
# How much each candidate learns, for the one-standard-error rule: of the candidates within one
# standard error of the best, the least complex are kept (between equals, the better figure).
COMPLEXITY = {
    "mean": 0,
    "direct": 0,
    "aspect_mean": 0,
    "shrink": 1,
    "nnls": 2,
    "ridge": 2,
    "lr": 3,
    "dt": 4,
    "nn": 5,
    "rf": 6,
}
# Penalties RidgeCV (efficient leave-one-out on the training rows it is given) chooses among.
RIDGE_ALPHAS = tuple(np.logspace(-2, 4, 13))
N_FOLDS = 5
# The MLP's defaults and the grid ``tune`` searches: the paper's (64, 32) MLP overfits a few
# hundred rows, so one narrow width, strong penalties and L-BFGS (benchmarks/bench_mlp.py).
# Larger alpha first, so ties go to the stronger regularisation.
NN_ALPHA = 10.0
NN_HIDDEN = (32,)
NN_SOLVER = "lbfgs"
NN_GRID = {"alpha": (30.0, 10.0, 3.0, 1.0), "hidden_layer_sizes": ((32,),)}
NN_MAX_ITER = 300  # solver iterations; if it has not converged by then, training records a note
# Worker processes with HDEVAL_JOBS=auto; results do not depend on the number (fits are seeded).
MAX_JOBS = 4
JOBS_BACKEND = "loky"


def default_jobs() -> int:
    """Worker processes for model fitting: ``HDEVAL_JOBS`` (``auto``: the CPUs this process
    may use, at most ``MAX_JOBS``); unset: 1, no worker processes. Opt-in: workers outlive
    a killed process for a while (holding its output pipes) and cost more CPU in all."""
    env = os.environ.get("HDEVAL_JOBS", "").strip()
    if not env:
        return 1
    if env == "auto":
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            n = os.cpu_count() or 1
        return max(1, min(n, MAX_JOBS))
    if not env.isdigit() or int(env) < 1:
        raise ConfigError(f"HDEVAL_JOBS must be a whole number >= 1 or 'auto', not {env!r}")
    return int(env)


_THREADPOOLS: ThreadpoolController | None = None
_ONE_THREAD = threading.Lock()
_one_thread_users = 0
_one_thread_limiter: Any = None


def _any_thread_may_set() -> None:
    """threadpoolctl (3.6+) lets only the thread that last set OpenBLAS's process-wide pool
    change it, until that thread's own ``with`` block ends, and ignores the others; here the
    first of overlapping users sets the limit and the last lifts it, often another thread."""
    clear = getattr(threadpoolctl.OpenBLASController, "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


@contextmanager
def one_thread() -> Iterator[None]:
    """BLAS and OpenMP limited to one thread while models are fitted: on matrices of a few
    hundred rows threads only add hand-over and spinning (joblib already limits workers).
    BLAS's pool is the process's: its limit is held from the first of overlapping users (the
    labelling app re-fits in one thread while it picks in another) to the last, so one leaving
    never lifts it under another, and the last restores what there was before the first.
    OpenMP's limit is each thread's own, so each user sets and restores its own."""
    global _THREADPOOLS, _one_thread_users, _one_thread_limiter
    with _ONE_THREAD:
        if _THREADPOOLS is None:  # found once; every library it needs is loaded by now
            _THREADPOOLS = ThreadpoolController()
        if _one_thread_users == 0:
            _any_thread_may_set()
            _one_thread_limiter = _THREADPOOLS.select(user_api="blas").limit(limits=1)
            _any_thread_may_set()
        _one_thread_users += 1
        per_thread = _THREADPOOLS.select(user_api="openmp")
    try:
        with per_thread.limit(limits=1):
            yield
    finally:
        with _ONE_THREAD:
            _one_thread_users -= 1
            if _one_thread_users == 0:
                _any_thread_may_set()
                _one_thread_limiter.restore_original_limits()
                _any_thread_may_set()
                _one_thread_limiter = None


@contextmanager
def numpy_global_rng(seed: int | None = None) -> Iterator[None]:
    """For a library that draws from NumPy's global generator and takes no generator of ours
    (shap's beeswarm plot and permutation explainer): seeded with ``seed`` when given, and the
    caller's state put back afterwards, so neither the result nor the caller depends on the other."""
    state = np.random.get_state()
    if seed is not None:
        np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


_PASSING = threading.local()  # .passed: what this thread's outermost fit_warnings passes on


@contextmanager
def fit_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning the code in the block raises in this thread (filter "always"), recorded for
    the caller's notes. ``catch_warnings`` catches the whole process's warnings, and an artifact's
    notes must not depend on timing: a warning from another thread (the LLM loop), or one raised
    while the garbage collector frees some earlier object (an unclosed socket's ResourceWarning),
    is passed on when the outermost block ends, as if never caught."""
    me, collector = threading.get_ident(), [None]

    def on_gc(phase: str, info: dict) -> None:  # finalizers run in the collecting thread
        collector[0] = threading.get_ident() if phase == "start" else None

    outermost = getattr(_PASSING, "passed", None) is None
    passed = _PASSING.passed = [] if outermost else _PASSING.passed
    caught: list[warnings.WarningMessage] = []

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        ours = threading.get_ident() == me and collector[0] != me
        (caught if ours else passed).append(
            warnings.WarningMessage(message, category, filename, lineno, file, line)
        )

    gc.callbacks.append(on_gc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            yield caught
    finally:
        gc.callbacks.remove(on_gc)
        if outermost:
            _PASSING.passed = None
    if outermost:  # under the caller's own filters, as they would have been without the block
        for w in passed:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def recorded(fn: Any, *args: Any) -> tuple[Any, list[tuple]]:
    """``fn(*args)`` and the warnings it raised (as picklable tuples), for ``run_jobs``."""
    with fit_warnings() as caught:
        result = fn(*args)
    return result, [(w.message, w.category, w.filename, w.lineno) for w in caught]


def run_jobs(calls: Sequence[tuple[Any, tuple]], n_jobs: int | None = None) -> list[Any]:
    """``[fn(*args) for fn, args in calls]``, in up to ``n_jobs`` worker processes (default
    ``default_jobs()``); ``fn`` must be module-level. The calls' warnings are re-issued here in
    call order, so a caller sees the same ones whatever ``n_jobs`` is."""
    n_jobs = default_jobs() if n_jobs is None else max(1, int(n_jobs))
    if n_jobs == 1 or len(calls) <= 1:
        with one_thread():
            done = [recorded(fn, *args) for fn, args in calls]
    else:
        done = Parallel(n_jobs=min(n_jobs, len(calls)), backend=JOBS_BACKEND)(
            delayed(recorded)(fn, *args) for fn, args in calls
        )
    for _, caught in done:
        for message, category, filename, lineno in caught:
            warnings.warn_explicit(message, category, filename, lineno)
    return [result for result, _ in done]


def pipeline(model: Any) -> Pipeline:
    """Imputer (median; a failed LLM score is NaN) -> standardiser -> model."""
    impute = SimpleImputer(strategy="median", keep_empty_features=True)
    return Pipeline([("impute", impute), ("scale", StandardScaler()), ("model", model)])


def make_regressor(
    kind: str, random_state: int = 0, alpha: float = NN_ALPHA, hidden_layer_sizes: tuple[int, ...] = NN_HIDDEN
) -> Pipeline:
    if kind == "lr" or kind in SIMPLE_KINDS:
        # the simple kinds are fitted by ``_fit_linear`` into this model's coef_ and intercept_
        model = LinearRegression()
    elif kind == "dt":
        model = DecisionTreeRegressor(random_state=random_state)
    elif kind == "rf":
        model = RandomForestRegressor(random_state=random_state, n_jobs=1)
    elif kind == "nn":
        # ReLU MLP (the paper's "shallow 3-layer MLP" is hidden_layer_sizes=(64, 32)); alpha and
        # width are chosen by ``tune`` unless given.
        model = MLPRegressor(
            hidden_layer_sizes=tuple(hidden_layer_sizes),
            alpha=alpha,
            activation="relu",
            solver=NN_SOLVER,
            max_iter=NN_MAX_ITER,
            early_stopping=False,
            random_state=random_state,
        )
    else:
        raise ConfigError(f"unknown aggregator {kind!r}: choose from {', '.join(CANDIDATES)} or auto")
    return pipeline(model)


def aspect_groups(task: Task) -> list[list[str]]:
    """Aspects grouped by identical score range, in task order; an aspect the task lists in
    ``own_regressor`` (a preset's, e.g. Topical-Chat groundedness) is a group of its own."""
    groups: dict[Any, list[str]] = {}
    own = set(getattr(task, "own_regressor", ()))
    for a in task.aspects:
        groups.setdefault(("own", a.key) if a.key in own else a.range, []).append(a.key)
    return list(groups.values())


class Aggregator(RegressorMixin, BaseEstimator):
    """Maps criterion scores to aspect scores, clipped to each aspect's range: a scikit-learn
    regressor (``clone``, ``cross_val_predict`` and searches over ``kind`` work on it). Without
    ``aspects``/``ranges``/``groups`` it is a plain regressor (outputs ``y0``, ``y1``, ...; no
    clipping; one model). ``alpha`` and ``hidden_layer_sizes`` are used by ``kind="nn"`` only;
    ``aspect_columns`` (per aspect, its own column first, then the rest of its subtree's) by
    ``direct`` and ``aspect_mean`` (without it, or past the columns given, each uses every column)."""

    def __init__(
        self,
        kind: str = "lr",
        aspects: Sequence[str] | None = None,
        ranges: Sequence[tuple[float, float]] | None = None,
        groups: Sequence[Sequence[str]] | None = None,
        random_state: int = 0,
        alpha: float = NN_ALPHA,
        hidden_layer_sizes: tuple[int, ...] = NN_HIDDEN,
        aspect_columns: Sequence[Sequence[int]] | None = None,
    ):
        self.kind = kind
        self.aspects = aspects
        self.ranges = ranges
        self.groups = groups
        self.random_state = random_state
        self.alpha = alpha
        self.hidden_layer_sizes = hidden_layer_sizes
        self.aspect_columns = aspect_columns

    @classmethod
    def for_task(cls, kind: str, task: Task, random_state: int = 0, **params: Any) -> "Aggregator":
        return cls(
            kind,
            list(task.aspect_keys),
            [a.range for a in task.aspects],
            aspect_groups(task),
            random_state,
            **params,
        )

    @classmethod
    def from_fitted(
        cls,
        kind: str,
        aspects: Sequence[str],
        ranges: Sequence[Sequence[float]],
        groups: Sequence[Sequence[str]],
        random_state: int,
        models: list[Pipeline],
        n_features: int,
    ) -> "Aggregator":
        """An aggregator around already fitted pipelines (a loaded artifact). The nn
        hyper-parameters are read back from the fitted MLP, so ``clone`` refits the same model."""
        params: dict[str, Any] = {}
        est = models[0].named_steps["model"] if models else None
        if isinstance(est, MLPRegressor):
            params = {"alpha": est.alpha, "hidden_layer_sizes": tuple(est.hidden_layer_sizes)}
        if kind in FIXED_KINDS:  # the columns each aspect's equal weights cover, read back
            cols: dict[str, list[int]] = {}
            for g, m in zip(groups, models):
                coef = np.atleast_2d(m.named_steps["model"].coef_)
                for j, a in enumerate(g):
                    cols[a] = [int(i) for i in np.flatnonzero(coef[min(j, len(coef) - 1)])]
            params["aspect_columns"] = [cols.get(a, []) for a in aspects]
        agg = cls(
            kind, list(aspects), [tuple(r) for r in ranges], [list(g) for g in groups], random_state, **params
        )
        agg.models_ = models
        agg.n_features_in_ = n_features
        agg.aspects_, agg.groups_, agg.ranges_ = agg._layout(len(agg.aspects))
        agg.single_output_ = False
        return agg

    def __sklearn_tags__(self):  # scikit-learn >= 1.6
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # a failed LLM score is NaN; the pipeline imputes it
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags

    def _more_tags(self) -> dict[str, bool]:  # scikit-learn < 1.6
        return {"allow_nan": True, "multioutput": True}

    def _layout(self, n_outputs: int) -> tuple[list[str], list[list[str]], list[tuple[float, float]]]:
        """(aspects, groups, ranges) with the defaults filled in for ``n_outputs`` outputs."""
        aspects = list(self.aspects) if self.aspects is not None else [f"y{j}" for j in range(n_outputs)]
        if len(aspects) != n_outputs:
            raise ValueError(f"Y has {n_outputs} column(s) but the aggregator has {len(aspects)} aspect(s)")
        groups = [list(g) for g in self.groups] if self.groups is not None else [aspects]
        ranges = (
            [tuple(r) for r in self.ranges] if self.ranges is not None else [(-np.inf, np.inf)] * n_outputs
        )
        if len(ranges) != n_outputs or sorted(a for g in groups for a in g) != sorted(aspects):
            raise ValueError("aggregator ranges/groups do not match its aspects")
        return aspects, groups, ranges

    def _cols(self, group: Sequence[str]) -> list[int]:
        return [self.aspects_.index(a) for a in group]

    def _columns_of(self, aspect: str, n_features: int) -> list[int]:
        """The columns ``direct`` (the first) and ``aspect_mean`` (all) read for ``aspect``."""
        every = list(range(n_features))
        if self.aspect_columns is None or self.kind == "mean":
            return every
        cols = [int(c) for c in self.aspect_columns[self.aspects_.index(aspect)] if 0 <= int(c) < n_features]
        if not cols:
            return every
        return cols[:1] if self.kind == "direct" else cols

    def fit(self, X: np.ndarray, Y: np.ndarray) -> "Aggregator":
        X, Y = _validate(self, X, Y, reset=True)
        self.single_output_ = Y.ndim == 1
        Y = Y.reshape(len(Y), -1)
        self.aspects_, self.groups_, self.ranges_ = self._layout(Y.shape[1])
        models = []
        with one_thread():
            for g in self.groups_:
                y = Y[:, self._cols(g)]
                model = make_regressor(self.kind, self.random_state, self.alpha, self.hidden_layer_sizes)
                if self.kind in SIMPLE_KINDS:
                    _fit_linear(self.kind, model, X, y, [self._columns_of(a, X.shape[1]) for a in g])
                else:
                    _fit_quietly(model, X, y[:, 0] if y.shape[1] == 1 else y)
                models.append(model)
        self.models_ = models
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "models_")
        X = _validate(self, X, reset=False)
        out = np.zeros((X.shape[0], len(self.aspects_)))
        for g, model in zip(self.groups_, self.models_):
            out[:, self._cols(g)] = np.asarray(model.predict(X)).reshape(X.shape[0], -1)
        out = np.clip(out, *np.array(self.ranges_, float).T)
        return out[:, 0] if self.single_output_ else out

    def model_for(self, aspect: str) -> tuple[Pipeline, int | None]:
        """The pipeline that predicts ``aspect`` and its output column (None if single)."""
        check_is_fitted(self, "models_")
        for g, model in zip(self.groups_, self.models_):
            if aspect in g:
                return model, (g.index(aspect) if len(g) > 1 else None)
        raise KeyError(aspect)

    def used_features(self) -> np.ndarray:
        """Boolean mask of features some model actually uses (a tree may ignore some)."""
        check_is_fitted(self, "models_")
        used = np.zeros(self.n_features_in_, bool)
        for model in self.models_:
            used |= used_features(model, self.n_features_in_)
        return used


def used_features(model: Pipeline, n_features: int) -> np.ndarray:
    """Boolean mask of the features one fitted pipeline's model uses (a tree may ignore some)."""
    est = model.named_steps["model"]
    if hasattr(est, "feature_importances_"):
        return np.asarray(est.feature_importances_) > 0
    if hasattr(est, "coef_"):
        return np.any(np.atleast_2d(est.coef_) != 0, axis=0)
    return np.ones(n_features, bool)


def _fit_linear(kind: str, model: Pipeline, X: np.ndarray, y: np.ndarray, columns: list[list[int]]) -> None:
    """Fits a simple kind's pipeline: its imputer and scaler as usual, then weights on the
    standardised scores written into the final LinearRegression's ``coef_``/``intercept_`` (so
    apply, SHAP's linear explainer and the artifact see a plain linear model). ``y``: rows x
    outputs; ``columns``: per output, the columns a fixed kind averages."""
    Z = model[:-1].fit_transform(X, y)
    scale = model.named_steps["scale"].scale_
    n, p = Z.shape
    coef, icpt = np.zeros((y.shape[1], p)), np.zeros(y.shape[1])
    for j in range(y.shape[1]):
        t = y[:, j]
        if kind in FIXED_KINDS:
            # equal weights on the raw 1-5 scores of the columns (the plain mean, less a constant),
            # then the one slope and intercept that put it on the aspect's scale
            w = np.zeros(p)
            w[columns[j]] = scale[columns[j]] / len(columns[j])
            s = Z @ w
            var = float(np.var(s))
            slope = float(np.mean((s - s.mean()) * (t - t.mean())) / var) if var > 0 else 0.0
            coef[j], icpt[j] = slope * w, t.mean() - slope * s.mean()
        elif kind == "ridge":
            r = RidgeCV(alphas=RIDGE_ALPHAS).fit(Z, t)
            coef[j], icpt[j] = r.coef_, r.intercept_
        elif kind == "nnls":  # a criterion that measures quality should not lower the score
            r = LinearRegression(positive=True).fit(Z, t)
            coef[j], icpt[j] = r.coef_, r.intercept_
        elif kind == "shrink":
            coef[j], icpt[j] = _shrunk_to_equal(Z, t)
        else:  # pragma: no cover - callers pass SIMPLE_KINDS only
            raise ValueError(kind)
    est = model.named_steps["model"]
    single = y.shape[1] == 1
    est.coef_ = coef[0] if single else coef
    est.intercept_ = float(icpt[0]) if single else icpt
    est.n_features_in_ = p
    est.rank_, est.singular_ = p, np.ones(p)


def _shrunk_to_equal(Z: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
    """Linear weights penalised by their distance from equal weights (a ridge on the part of
    the weights that is not a common level, the penalty chosen by RidgeCV): (weights, intercept)."""
    Zc, tc = Z - Z.mean(axis=0), t - t.mean()
    m = Zc.mean(axis=1)  # the equal-weights score
    mm = float(m @ m)
    if mm <= 0:
        return np.zeros(Z.shape[1]), float(t.mean())
    Zt = Zc - np.outer(m, (m @ Zc) / mm)  # what the equal-weights score does not explain
    tt = tc - m * float(m @ tc) / mm
    v = RidgeCV(alphas=RIDGE_ALPHAS, fit_intercept=False).fit(Zt, tt).coef_
    level = float(m @ (tc - Zc @ v)) / mm
    w = v + level / Z.shape[1]
    return w, float(t.mean() - Z.mean(axis=0) @ w)


def _fit_quietly(model: Pipeline, X: np.ndarray, y: np.ndarray) -> None:
    """``model.fit``, the MLP's L-BFGS convergence warnings reworded to one per cause (notes count them)."""
    est = model.named_steps["model"]
    if not isinstance(est, MLPRegressor) or est.solver != "lbfgs":
        model.fit(X, y)
        return
    with fit_warnings() as caught:
        model.fit(X, y)
    for w in caught:
        if issubclass(w.category, ConvergenceWarning):
            text = str(w.message)
            if "LIMIT" in text:
                why = f"stopped at its iteration limit ({est.max_iter}) before converging"
            elif "ABNORMAL" in text:
                why = "stopped where its line search could not improve the fit any further"
            else:
                why = "did not report convergence"
            warnings.warn(f"nn aggregator (L-BFGS) {why}", ConvergenceWarning, stacklevel=2)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _validate(est: Aggregator, X, *Y, reset: bool):
    """scikit-learn's input validation (NaN allowed in X, never in Y); sets or checks ``n_features_in_``."""
    kw: dict[str, Any] = {"y": Y[0], "multi_output": True, "y_numeric": True} if Y else {}
    if _validate_data is not None:
        return _validate_data(est, X, reset=reset, ensure_all_finite="allow-nan", dtype=np.float64, **kw)
    return est._validate_data(X, reset=reset, force_all_finite="allow-nan", dtype=np.float64, **kw)


def cv_folds(
    groups: Sequence[str], random_state: int, n_folds: int = N_FOLDS
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, held-out) index pairs: grouped by doc_id when there are enough documents,
    else plain shuffled folds (tiny ``--limit`` runs)."""
    idx = np.arange(len(groups))
    if len(set(groups)) >= n_folds:
        return list(GroupKFold(n_splits=n_folds).split(idx, groups=list(groups)))
    k = min(n_folds, max(2, len(groups) // 2))
    return list(KFold(n_splits=k, shuffle=True, random_state=random_state).split(idx))


def _fit_predict(
    template: Aggregator, X: np.ndarray, Y: np.ndarray, train: np.ndarray, test: np.ndarray
) -> np.ndarray:
    return clone(template).fit(X[train], Y[train]).predict(X[test])


def _oof_many(
    templates: Sequence[Aggregator],
    X: np.ndarray,
    Y: np.ndarray,
    groups: Sequence[str],
    n_jobs: int | None = None,
) -> list[np.ndarray]:
    """``cross_val_predictions`` of every template, every fold one job of a single batch."""
    X, Y = np.asarray(X), np.asarray(Y)
    folds = [cv_folds(groups, t.random_state) for t in templates]
    calls = [(_fit_predict, (t, X, Y, tr, va)) for t, fs in zip(templates, folds) for tr, va in fs]
    done = iter(run_jobs(calls, n_jobs))
    out = []
    for fs in folds:
        parts = [np.asarray(next(done)) for _ in fs]
        pred = np.zeros((len(X), *parts[0].shape[1:]), dtype=parts[0].dtype)
        pred[np.concatenate([va for _, va in fs])] = np.concatenate(parts)
        out.append(pred)
    return out


def cross_val_predictions(
    template: Aggregator, X: np.ndarray, Y: np.ndarray, groups: Sequence[str], n_jobs: int | None = None
) -> np.ndarray:
    """Out-of-fold predictions on the training split (the "cross-validated train" figure)."""
    return _oof_many([template], X, Y, groups, n_jobs)[0]


def _grid_name(point: dict[str, Any]) -> str:
    hidden = "x".join(str(h) for h in point["hidden_layer_sizes"])
    return f"alpha={point['alpha']:g},hidden={hidden}"


def select_cv(
    template: Aggregator,
    X: np.ndarray,
    Y: np.ndarray,
    groups: Sequence[str],
    kinds: Sequence[str] = KINDS,
    n_jobs: int | None = None,
) -> tuple[Aggregator, dict[str, float], dict[str, float], np.ndarray]:
    """The best of ``kinds`` by grouped-CV mean Spearman, ``nn`` tuned over the ``NN_GRID``
    points (ties: the earlier kind, the earlier, more regularised point): (its template, score
    per kind, nn grid scores, its out-of-fold predictions). Every fold of every kind and grid
    point is one job of one batch. ``kinds=(template.kind,)`` only tunes (an nn) or
    cross-validates the template."""
    cands = []  # (kind, grid point or None, template)
    for k in kinds:
        base = template if k == template.kind else clone(template).set_params(kind=k)
        points = list(ParameterGrid(NN_GRID)) if k == "nn" else [None]
        cands += [(k, p, base if p is None else clone(base).set_params(**p)) for p in points]
    preds = _oof_many([t for _, _, t in cands], X, Y, groups, n_jobs)
    scores = [mean_spearman(Y, p) for p in preds]
    best_of: dict[str, int] = {}  # kind -> its best candidate
    for i, (k, _, _) in enumerate(cands):
        if k not in best_of or scores[i] > scores[best_of[k]]:
            best_of[k] = i
    per_kind = {k: scores[i] for k, i in best_of.items()}
    best = best_of[max(kinds, key=lambda k: (per_kind[k], -list(kinds).index(k)))]
    grid = {_grid_name(p): scores[i] for i, (_, p, _) in enumerate(cands) if p is not None}
    return cands[best][2], per_kind, grid, preds[best]


@dataclass
class CandidateCV:
    """One candidate aggregator's grouped cross-validation on the training split."""

    kind: str
    template: Aggregator
    # mean Spearman (-inf: undefined) of the out-of-fold predictions, each fold's standardised
    # first: pooling raw folds would mix the folds' calibrations, which for a weak predictor move
    # its scores as much as what it ranks does; a held-out set is ranked by one model too
    spearman: float
    ranked: np.ndarray  # those standardised out-of-fold predictions (rows x aspects)
    predictions: np.ndarray  # the out-of-fold predictions as they are
    grid: dict[str, float] = field(default_factory=dict)  # nn: the score per grid point

    def figures(self, Y: np.ndarray, aspects: Sequence[str]) -> dict[str, dict[str, Any]]:
        """metric_table of the figures it was chosen on (``ranked``); an aspect none of whose
        folds ranks anything says so, not "every prediction is 0", which is true only of
        the standardised values."""
        table = metric_table(Y, self.ranked, aspects)
        for j, a in enumerate(aspects):
            enough = np.isfinite(Y[:, j]).sum() >= 3  # else the why counts samples: left as it is
            if table[a].get("why") and enough and not np.ptp(self.ranked[:, j]) > 0:
                table[a]["why"] = "every cross-validation fold predicts one value for all its samples"
        return table


def _standardised(part: np.ndarray) -> np.ndarray:
    """The columns of ``part`` (finite) standardised, each on its own. A column of one value up
    to rounding ranks nothing: its std can be 4e-16, not 0, and standardising that rounding would
    invent an order, so it becomes 0."""
    spread = np.ptp(part, axis=0) > 1e-9 * np.maximum(1.0, np.abs(part).max(axis=0))
    sd = np.where(spread, part.std(axis=0), 1.0)
    return np.where(spread, (part - part.mean(axis=0)) / sd, 0.0)


def _per_fold_standardised(pred: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    out = np.zeros(pred.shape)
    for _, va in folds:
        part = pred[va]
        if np.isfinite(part).all():
            out[va] = _standardised(part)
            continue
        for j in range(part.shape[1]):  # an unfitted baseline's failed score: left out, as figures leave it
            ok = np.isfinite(part[:, j])
            out[va, j] = np.nan
            if ok.any():
                out[va[ok], j] = _standardised(part[ok, j : j + 1])[:, 0]
    return out


def fold_ranked_spearman(
    pred: np.ndarray, Y: np.ndarray, groups: Sequence[str], random_state: int = 0
) -> float | None:
    """The figure every candidate is chosen on (:class:`CandidateCV`'s), of predictions that
    learn nothing, such as a baseline's mean of criteria: each of the same grouped folds
    standardised on its own, then the mean Spearman over aspects; None where undefined. A
    pooled in-sample figure is another statistic, and would not compare with the candidates'."""
    Y2 = np.asarray(Y, float).reshape(len(Y), -1)
    ranked = _per_fold_standardised(
        np.asarray(pred, float).reshape(len(Y2), -1), cv_folds(groups, random_state)
    )
    score = mean_spearman(Y2, ranked)
    return score if np.isfinite(score) else None


def cv_candidates(
    template: Aggregator,
    X: np.ndarray,
    Y: np.ndarray,
    groups: Sequence[str],
    kinds: Sequence[str] = CANDIDATES,
    n_jobs: int | None = None,
) -> list[CandidateCV]:
    """Every kind of ``kinds`` cross-validated on the same grouped folds (nn: its best grid
    point), in the order given. Every fold of every kind and grid point is one job of one batch."""
    X, Y = np.asarray(X), np.asarray(Y)
    cands = []  # (kind, grid point or None, template)
    for k in kinds:
        base = template if k == template.kind else clone(template).set_params(kind=k)
        points = list(ParameterGrid(NN_GRID)) if k == "nn" else [None]
        cands += [(k, p, base if p is None else clone(base).set_params(**p)) for p in points]
    preds = _oof_many([t for _, _, t in cands], X, Y, groups, n_jobs)
    folds = cv_folds(groups, template.random_state)
    Y2 = Y.reshape(len(Y), -1)
    out: dict[str, CandidateCV] = {}
    for (k, p, t), pred in zip(cands, preds):
        ranked = _per_fold_standardised(pred.reshape(len(pred), -1), folds)
        score = mean_spearman(Y2, ranked)
        cand = CandidateCV(k, t, score, ranked, pred)
        if p is not None:
            grid = out[k].grid if k in out else {}
            grid[_grid_name(p)] = score
            cand.grid = grid
        if k not in out or score > out[k].spearman:  # ties: the earlier, more regularised point
            out[k] = cand
    return [out[k] for k in dict.fromkeys(kinds)]


@dataclass(frozen=True)
class Choice:
    kept: int  # index of the kept candidate
    best: int  # index of the candidate with the best cross-validated figure
    tolerance: float  # the standard error (at least the floor) the kept one was within


N_BOOTSTRAP = 200  # document resamples for the standard error of a difference in CV figures


def one_standard_error(
    cands: Sequence[CandidateCV],
    Y: np.ndarray,
    groups: Sequence[str],
    floor: float = 0.0,
    random_state: int = 0,
    n_boot: int = N_BOOTSTRAP,
    levels: Sequence[int] | None = None,
) -> Choice:
    """The one-standard-error rule: of the candidates whose cross-validated figure is within one
    standard error (at least ``floor``) of the best one's, the least complex (``levels``; default:
    each kind's COMPLEXITY), between equals the better figure. The standard error is that of the
    difference from the best, paired (the same out-of-fold rows), by a bootstrap over the
    training documents: no model is refitted."""
    if levels is None:
        levels = [COMPLEXITY.get(c.kind, len(COMPLEXITY)) for c in cands]
    scores = [c.spearman if np.isfinite(c.spearman) else -np.inf for c in cands]
    best = int(np.argmax(scores))
    if not np.isfinite(scores[best]) or len(cands) == 1:
        return Choice(best, best, floor)
    Y2 = np.asarray(Y, float).reshape(len(Y), -1)
    rows: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        rows.setdefault(g, []).append(i)
    docs = [np.array(r) for r in rows.values()]
    rng = np.random.default_rng(random_state)
    draws = [np.concatenate([docs[j] for j in rng.integers(0, len(docs), len(docs))]) for _ in range(n_boot)]
    best_b = np.array([average_spearman(Y2[d], cands[best].ranked[d]) for d in draws])
    within: dict[int, float] = {best: floor}  # candidate -> its tolerance
    for i, c in enumerate(cands):
        if i == best or not np.isfinite(scores[i]) or levels[i] > levels[best]:
            continue
        diff = best_b - np.array([average_spearman(Y2[d], c.ranked[d]) for d in draws])
        diff = diff[np.isfinite(diff)]
        tol = max(float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0, floor)
        if scores[i] >= scores[best] - tol:
            within[i] = tol
    kept = min(within, key=lambda i: (levels[i], -scores[i], i))
    return Choice(kept, best, within[kept])


def compared_kinds(asked: str) -> tuple[str, ...]:
    """The aggregators cross-validated on a layer: every candidate for ``auto``; for one asked
    kind, it and the simpler linear ones (to warn when one of them did better)."""
    if asked == "auto":
        return CANDIDATES
    simpler = CANDIDATES[: CANDIDATES.index(asked)] if asked in CANDIDATES else ()
    return tuple(k for k in simpler if k in SIMPLE_KINDS + ("lr",)) + (asked,)


def choose_aggregator(
    template: Aggregator,
    X: np.ndarray,
    Y: np.ndarray,
    groups: Sequence[str],
    asked: str = "auto",
    n_jobs: int | None = None,
) -> tuple[CandidateCV, list[CandidateCV], Choice | None]:
    """``train``'s choice of one layer's aggregator (``--aggregator``, ``asked``): the candidates
    (:func:`compared_kinds`) cross-validated on the same grouped folds; for ``auto`` the one the
    one-standard-error rule keeps (seeded by the template's ``random_state``), else the asked
    one. Returns (the kept candidate, every candidate, the rule's choice or None). The labelling
    app's panel re-fits with it, so it shows the aggregator ``train`` would keep."""
    cands = cv_candidates(template, X, Y, groups, compared_kinds(asked), n_jobs)
    pick = one_standard_error(cands, Y, groups, 0.0, template.random_state) if asked == "auto" else None
    chosen = cands[pick.kept] if pick is not None else next(c for c in cands if c.kind == asked)
    return chosen, cands, pick
