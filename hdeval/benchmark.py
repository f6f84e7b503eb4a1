"""``hdeval benchmark``: the paper's analyses as one sweep over methods, aggregators, seeds and
training fractions, every run through the ordinary training code and one shared LLM cache
(a sweep pays only for calls no earlier run made).

The statistics are small pure functions (:func:`avg_spearman`, :func:`bootstrap_ci`,
:func:`paired_bootstrap`, :func:`summary_level_correlation`, :func:`ranking_exact_match`);
:func:`run_benchmark` computes ``results.json``'s content, :func:`write_benchmark` writes it
with ``results.md`` and ``report.html``. Library code: nothing here prints.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdeval.errors import BudgetExceeded, ConfigError
from hdeval.metrics import METRICS
from hdeval.progress import Progress

FORMAT = "hdeval-benchmark"
FORMAT_VERSION = 1
RESULTS, TABLE, HTML = "results.json", "results.md", "report.html"
OUTPUTS = (RESULTS, TABLE, HTML)
RUNS = "runs"  # --keep-artifacts: each run's artifact in runs/<setting>-seed<k>/
# the methods whose held-out predictions the benchmark reads, baselines first (their calls are
# the others' too); LEARNED ones fit an aggregator and run once per --aggregators kind
METHODS = ("direct", "direct-yesno", "dna-direct", "hdeval", "paireval", "dna")
LEARNED = ("hdeval", "paireval")
# benchmark entries that are a method with fixed options: dna-direct is DnA's `--dna-mode direct`
# baseline (overall scores from the same LLM, no aspects)
ENTRIES = {"dna-direct": ("dna", {"dna_mode": "direct"})}
BASELINE = "direct"  # the paired bootstrap is taken to it when it is among --methods
PAIR_BASELINE = "dna-direct"  # the pairwise difference is taken to it when it is among --methods
PAIR_VS = "vs_" + PAIR_BASELINE.replace("-", "_")
PAIR_LABEL_CODES = {"a": 0.0, "b": 1.0, "tie": 2.0}
N_RESAMPLES = 1000
LEVEL = 0.95
MAX_RESULTS_BYTES = 64 << 20  # a results.json this big is not one this module wrote

Statistic = Callable[[np.ndarray, np.ndarray], float]


# --------------------------------------------------------------------------- statistics
def _as2d(a: Any) -> np.ndarray:
    a = np.asarray(a, float)
    return a.reshape(len(a), -1)


def _spearman(y: np.ndarray, p: np.ndarray) -> float:
    """Spearman's rho of two 1-D arrays over their finite pairs; NaN when undefined."""
    from scipy.stats import rankdata

    ok = np.isfinite(y) & np.isfinite(p)
    y, p = y[ok], p[ok]
    if len(y) < 3 or np.ptp(y) == 0 or np.ptp(p) == 0:
        return float("nan")
    ry, rp = rankdata(y), rankdata(p)
    ry -= ry.mean()
    rp -= rp.mean()
    return float((ry * rp).sum() / math.sqrt((ry * ry).sum() * (rp * rp).sum()))


def avg_spearman(y: np.ndarray, pred: np.ndarray) -> float:
    """Dataset-level Spearman per column (aspect), averaged over the columns where it is
    defined (as ``metrics.json``'s ``average``); NaN when none is."""
    y, pred = _as2d(y), _as2d(pred)
    vals = [v for v in (_spearman(y[:, j], pred[:, j]) for j in range(y.shape[1])) if math.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


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


def _doc_correlation(y: np.ndarray, p: np.ndarray, metric: str) -> float:
    """One document's correlation; NaN unless both sides vary (2 outputs are enough)."""
    from scipy import stats

    ok = np.isfinite(y) & np.isfinite(p)
    y, p = y[ok], p[ok]
    if len(y) < 2 or np.ptp(y) == 0 or np.ptp(p) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if metric == "pearson":
            return float(stats.pearsonr(y, p)[0])
        if metric == "spearman":
            return float(stats.spearmanr(y, p)[0])
        return float(stats.kendalltau(y, p)[0])


def summary_level_correlation(y: Any, pred: Any, groups: Sequence[str], metric: str = "spearman") -> dict[str, Any]:
    """Summary-level correlation (as G-Eval reports SummEval): the correlation between human
    and predicted scores of the outputs of each document, averaged over the documents where
    it is defined (both sides vary). ``{"value": mean or None, "documents": count used}``."""
    y, pred = np.asarray(y, float).ravel(), np.asarray(pred, float).ravel()
    vals = [_doc_correlation(y[r], pred[r], metric) for r in _doc_rows(groups)]
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


# --------------------------------------------------------------------------- held-out predictions
@dataclass
class HeldOut:
    """A trained evaluator's predictions on its test split, with the human scores."""

    sample_ids: list[str]
    doc_ids: list[str]
    aspects: list[str]
    y: np.ndarray
    pred: np.ndarray


def held_out(fitted: Any, doc_of: Mapping[str, str]) -> HeldOut:
    """The test rows of a trained evaluator's score table (``scores.csv``: the LLM-filled
    columns and the human scores of every sample, marked train/test) and what the evaluator
    predicts for them, without any LLM call: HD-Eval's and PairEval's aggregator on their
    LLM-filled columns; ``direct``'s and ``direct-yesno``'s aspect scores mapped onto each
    aspect's range."""
    table = _score_table(fitted)
    aspects = list(fitted.task.aspect_keys)
    test = table[table["split"] == "test"]
    y = test[[f"human:{a}" for a in aspects]].to_numpy(float)
    pred = fitted.held_out_predictions(table, test)
    ids = [str(s) for s in test["sample_id"]]
    return HeldOut(ids, [doc_of[s] for s in ids], aspects, y, _as2d(pred))


def _score_table(fitted: Any):
    table = fitted.score_table
    if table is None and getattr(fitted, "path", None) is not None:
        import pandas as pd

        table = pd.read_csv(Path(fitted.path) / "scores.csv")
    if table is None:
        raise ConfigError(f"the {fitted.method} evaluator has no score table to read held-out rows from")
    return table


@dataclass
class PairHeldOut:
    """A trained pairwise evaluator's labels for its test pairs, with the human labels.
    ``predictions``: variant -> (label a/b/tie or None when failed, label forced to a or b);
    ``evaluator`` always (DnA: its LLM-weights totals; HD-Eval: its classifier), ``learned``
    for DnA's logistic regression on aspect-score differences when it was fitted."""

    sample_ids: list[str]
    doc_ids: list[str]
    human: list[str | None]
    predictions: dict[str, tuple[list[str | None], list[str | None]]]


def _pair_label(x: Any) -> str | None:
    return x if isinstance(x, str) and x in PAIR_LABEL_CODES else None  # NaN / None / empty: failed


def held_out_pairs(fitted: Any, doc_of: Mapping[str, str]) -> PairHeldOut:
    """The test rows of a pairwise evaluator's score table and its labels for them, without any
    LLM call: DnA's ``prediction`` column (forced to a or b by its ``total_a`` / ``total_b``, equal
    totals giving no side, as DnA does) and ``learned_prediction`` / ``learned_prediction_ab``;
    HD-Eval's classifier on the ``<criterion>:a`` minus ``<criterion>:b`` columns."""
    table = _score_table(fitted)
    test = table[table["split"] == "test"]
    human = [_pair_label(x) for x in test["human"]]
    preds = fitted.held_out_labels(test)
    ids = [str(s) for s in test["pair_id"]]
    return PairHeldOut(ids, [doc_of[s] for s in ids], human, preds)


def _codes(labels: Sequence[str | None]) -> np.ndarray:
    return np.array([PAIR_LABEL_CODES.get(x, np.nan) if x is not None else np.nan for x in labels], float)


def pair_arrays(ho: PairHeldOut, variant: str = "evaluator") -> tuple[np.ndarray, np.ndarray]:
    """(human codes, n x 2 predicted codes: label, label forced to a or b) for the bootstrap
    statistics; a = 0, b = 1, tie = 2, none = NaN."""
    pred, ab = ho.predictions[variant]
    return _codes(ho.human), np.column_stack([_codes(pred), _codes(ab)])


def agreement_w_ties(y: np.ndarray, p: np.ndarray) -> float:
    """:func:`hdeval.metrics.pair_agreement`'s ``w_ties`` on label codes (see
    :func:`pair_arrays`): accuracy over the labelled pairs with a prediction."""
    y, p = np.asarray(y, float).ravel(), _as2d(p)
    ok = np.isfinite(y) & np.isfinite(p[:, 0])
    return float(np.mean(p[ok, 0] == y[ok])) if ok.any() else float("nan")


def agreement_wo_ties(y: np.ndarray, p: np.ndarray) -> float:
    """``wo_ties`` on label codes: over the pairs with a prediction whose human label is not a
    tie, the prediction forced to a or b (no side counts as a miss)."""
    y, p = np.asarray(y, float).ravel(), _as2d(p)
    ok = np.isfinite(y) & np.isfinite(p[:, 0]) & (y != PAIR_LABEL_CODES["tie"])
    return float(np.mean(p[ok, 1] == y[ok])) if ok.any() else float("nan")


PAIR_STATISTICS: dict[str, Statistic] = {"wo_ties": agreement_wo_ties, "w_ties": agreement_w_ties}


# --------------------------------------------------------------------------- the sweep
@dataclass(frozen=True)
class BenchmarkSpec:
    """What to sweep. ``options``: TrainConfig fields shared by every run (llm, cache_dir,
    layers, limit, preset, test_frac, ...)."""

    task: str
    methods: tuple[str, ...] = METHODS
    aggregators: tuple[str, ...] = ("lr",)
    seeds: int = 1
    train_fracs: tuple[float, ...] = (0.5,)
    resamples: int = N_RESAMPLES
    options: Mapping[str, Any] = field(default_factory=dict)
    # per benchmark method (as in --methods): its method options, e.g. {"paireval": {"comparisons": 3}}
    method_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def validate(self) -> None:
        from hdeval.aggregate import KINDS

        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"--methods: unknown or unsupported {', '.join(unknown) or '(none given)'}; "
                              f"benchmark runs {', '.join(METHODS)}")
        bad = [a for a in self.aggregators if a not in KINDS + ("auto",)]
        if bad or not self.aggregators:
            raise ConfigError(f"--aggregators: unknown {', '.join(bad) or '(none given)'}; choose from "
                              f"{', '.join(KINDS)}, auto")
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {self.seeds}")
        if not self.train_fracs or not all(0 < f < 1 for f in self.train_fracs):
            raise ConfigError(f"--train-fracs must be numbers in (0, 1), got {list(self.train_fracs)}")
        if self.resamples < 1:
            raise ConfigError(f"--resamples must be at least 1, got {self.resamples}")
        for flag, values in (("--methods", self.methods), ("--aggregators", self.aggregators),
                             ("--train-fracs", self.train_fracs)):
            twice = sorted({str(v) for v in values if list(values).count(v) > 1})
            if twice:  # a setting run twice would count as two seeds
                raise ConfigError(f"{flag} lists {', '.join(twice)} more than once")
        for name in ("method", "aggregator", "seed", "train_frac", "task", "method_options"):
            if name in self.options:
                raise ConfigError(f"benchmark sets {name} itself" + (
                    " (give --method-option METHOD.NAME=VALUE)" if name == "method_options" else ""))
        check_method_options(self.method_options, self.methods)

    def artifact_names(self) -> list[str]:
        """The directory under ``runs/`` of every run's artifact (--keep-artifacts)."""
        return [artifact_name(*run) for run in self.runs()]

    def runs(self) -> list[tuple[str, str | None, float, int]]:
        """(method, aggregator or None for a method without one, train_frac, seed) of every run,
        baselines first (direct's calls are HD-Eval's layer 1)."""
        out = []
        for seed in range(self.seeds):
            for frac in self.train_fracs:
                for method in sorted(self.methods, key=METHODS.index):
                    for agg in (self.aggregators if method in LEARNED else (None,)):
                        out.append((method, agg, frac, seed))
        return out


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _option_of(entry: str, name: str) -> tuple[Any, str]:
    """(the registry's Option, its name) of benchmark method ``entry``'s option ``name``
    (``-`` or ``_``); a one-line error for an unknown method or option, or one the entry fixes."""
    from hdeval.methods.registry import get_method

    if entry not in METHODS:
        raise ConfigError(f"--method-option {entry}.{name}: unknown method {entry!r}; benchmark runs "
                          f"{', '.join(METHODS)}")
    base, fixed = ENTRIES.get(entry, (entry, {}))
    key = name.replace("-", "_")
    options = get_method(base).options
    if key not in options:
        known = ", ".join(sorted(k for k in options if k not in fixed)) or "none"
        raise ConfigError(f"--method-option {entry}.{name}: {entry} takes no option {name!r} (its options: {known})")
    if key in fixed:
        raise ConfigError(f"--method-option {entry}.{name}: {entry} is {base} with {key} = {fixed[key]} "
                          "(benchmark sets it)")
    return options[key], key


def parse_method_option(item: str) -> tuple[str, str, Any]:
    """``METHOD.NAME=VALUE`` -> (method, option name, value typed as the option's default:
    true/false, a whole number, a number or text, one of its choices). One-line errors."""
    head, eq, raw = item.partition("=")
    entry, dot, name = head.strip().partition(".")
    if not eq or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*\.[A-Za-z0-9_-]+", head.strip()):
        raise ConfigError(f"--method-option {item!r}: expected METHOD.NAME=VALUE, e.g. paireval.comparisons=3")
    opt, key = _option_of(entry, name.strip())
    raw = raw.strip()
    where = f"--method-option {entry}.{name.strip()}"
    default = opt.default if opt.kind is None else opt.kind()
    if opt.choices:
        if raw not in opt.choices:
            raise ConfigError(f"{where}: {raw!r} is not one of {', '.join(opt.choices)}")
        return entry, key, raw
    if isinstance(default, bool):
        if raw.lower() not in _TRUE + _FALSE:
            raise ConfigError(f"{where}: expected true or false, got {raw!r}")
        return entry, key, raw.lower() in _TRUE
    if isinstance(default, int):
        try:
            return entry, key, int(raw)
        except ValueError:
            raise ConfigError(f"{where}: expected a whole number, got {raw!r}") from None
    if isinstance(default, float):
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a number, got {raw!r}")
        return entry, key, value
    return entry, key, raw


def parse_method_options(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Repeated ``--method-option METHOD.NAME=VALUE`` -> {method: {name: value}}; an option
    given twice is an error (the later one would silently win)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        entry, key, value = parse_method_option(item)
        if key in out.get(entry, {}):
            raise ConfigError(f"--method-option {entry}.{key} is given more than once")
        out.setdefault(entry, {})[key] = value
    return out


def check_method_options(method_options: Mapping[str, Mapping[str, Any]], methods: Sequence[str]) -> None:
    """Every method's options name a method among ``methods`` and one of its options, and hold
    values the method accepts (DnA's settings and PairEval's comparison count are checked here,
    before any run, not when that method's first run starts)."""
    for entry, opts in method_options.items():
        for key in opts:
            _option_of(entry, key)
        if entry not in methods:
            raise ConfigError(f"--method-option {entry}.{next(iter(opts), '')}: {entry} is not among --methods "
                              f"({', '.join(methods)})")
        base, fixed = ENTRIES.get(entry, (entry, {}))
        merged = {**opts, **fixed}
        try:
            if base == "dna":
                from hdeval.methods.registry import get_method
                from hdeval.methods.dna.impl import Settings

                o = {k: v.default for k, v in get_method("dna").options.items()} | merged
                Settings(mode=o["dna_mode"], aspect_source=o["aspect_source"], k=o["k"],
                         tie_margin=o["tie_margin"], swap=o["swap"], logprobs=o["logprob_scores"]).check()
            if "comparisons" in merged:
                from hdeval.methods.paireval.impl import check_comparisons

                check_comparisons(merged["comparisons"])
        except ConfigError as exc:
            raise ConfigError(f"--method-option {entry}: {exc}") from None


def artifact_name(method: str, agg: str | None, frac: float, seed: int) -> str:
    """``<setting>-seed<k>``: e.g. ``hdeval-lr-frac0.5-seed0``, ``dna-direct-frac0.5-seed1``."""
    short = f"{frac:g}"  # the exact value when 6 significant digits would merge two fractions
    return f"{method}{'' if agg is None else '-' + agg}-frac{short if float(short) == frac else repr(frac)}-seed{seed}"


class _Quiet(Progress):
    """Forwards a run's progress bars but not its per-layer summaries (the sweep reports runs)."""

    def __init__(self, inner: Progress):
        self.inner = inner

    def stage(self, label: str, total: int) -> None:
        self.inner.stage(label, total)

    def advance(self, n: int = 1, cached: bool = False) -> None:
        self.inner.advance(n, cached)

    def end_stage(self) -> None:
        self.inner.end_stage()


def _config(spec: BenchmarkSpec, method: str, agg: str | None, frac: float, seed: int, max_calls: int | None):
    from hdeval.train import TrainConfig

    opts = dict(spec.options)
    given = dict(spec.method_options.get(method) or {})
    method, fixed = ENTRIES.get(method, (method, {}))
    if fixed or given:
        opts["method_options"] = {**given, **fixed}
    opts.update(task=spec.task, method=method, train_frac=frac, seed=seed, max_calls=max_calls)
    if agg is not None:
        opts["aggregator"] = agg
    return TrainConfig.from_options(**opts)


def _check_fit(config: Any, prep: Any, label: str) -> None:
    """The checks a run's fit makes before its first call, made for every run before the
    sweep's first call (an earlier run must not pay for a sweep that then stops): PairEval's and
    HD-Eval ``--scorer pairwise``'s comparison examples (the file, enough conversations in the
    training split) and that scorer on a pairwise task."""
    from hdeval.errors import HdevalError
    from hdeval.methods.base import FitContext
    from hdeval.methods.registry import get_method

    ctx = FitContext(config, prep, None, None, Progress())
    check = get_method(config.method).check_fit
    try:
        if check is not None:
            check(ctx)
    except HdevalError as exc:
        raise type(exc)(f"{label}: {exc}") from None


def run_benchmark(spec: BenchmarkSpec, progress: Progress | None = None, backend: Any = None,
                  artifacts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train every combination of ``spec`` and return ``results.json``'s content. Every
    configuration is checked (options, data, splits) before the first LLM call. ``artifacts``
    (--keep-artifacts): a dict that receives each run's fitted evaluator under its
    :func:`artifact_name` (each run's record names it as ``artifact``), for
    :func:`write_benchmark` to save."""
    from hdeval.train import prepare, train

    spec.validate()
    shape = check_shapes(spec)
    progress = progress or Progress()
    plan = spec.runs()
    budget = spec.options.get("max_calls")
    preps = {}
    for method, agg, frac, seed in plan:  # fail before paying for anything
        config = _config(spec, method, agg, frac, seed, budget)
        preps[(method, agg, frac, seed)] = prep = prepare(config)
        _check_fit(config, prep, f"{method} run (train-frac {frac:g}, seed {seed})")
    runs: list[dict[str, Any]] = []
    held: dict[tuple[str, str | None, float, int], Any] = {}
    task = None
    for n, (method, agg, frac, seed) in enumerate(plan, 1):
        spent = sum(r["usage"].get("calls", 0) for r in runs)
        left = None if budget is None else max(0, budget - spent)
        config = _config(spec, method, agg, frac, seed, left)
        label = f"{method}{'' if agg is None else ' ' + agg}, train-frac {frac:g}, seed {seed}"
        progress.message(f"run {n}/{len(plan)}: {label}")
        try:
            fitted = train(config, progress=_Quiet(progress), backend=backend)
        except BudgetExceeded:
            # the run saw only what was left of the sweep's budget: name the budget the user gave
            raise BudgetExceeded(
                f"stopped at --max-calls {budget} (the whole sweep's budget) in run {n}/{len(plan)} ({label}): "
                "every finished call is cached; rerun with a larger --max-calls to continue") from None
        prep = preps[(method, agg, frac, seed)]
        task = fitted.task
        doc_of = {s.id: s.doc_id for s in prep.samples}
        if shape == "pairwise":
            pho = held_out_pairs(fitted, doc_of)
            held[(method, agg, frac, seed)] = pho
            runs.append(_pair_run_record(fitted, pho, method, agg, frac, seed))
        else:
            ho = held_out(fitted, doc_of)
            held[(method, agg, frac, seed)] = ho
            runs.append(_run_record(fitted, ho, method, agg, frac, seed))
        if artifacts is not None:
            name = artifact_name(method, agg, frac, seed)
            artifacts[name] = fitted
            runs[-1]["artifact"] = f"{RUNS}/{name}"
    assert task is not None
    settings = _pair_settings(spec, runs, held) if shape == "pairwise" else _settings(spec, runs, held)
    cost: dict[str, dict[str, int]] = {}
    for r in runs:
        c = cost.setdefault(r["method"], {"runs": 0, "calls": 0, "cache_hits": 0, "prompt_tokens": 0,
                                          "completion_tokens": 0})
        c["runs"] += 1
        for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens"):
            c[k] += int(r["usage"].get(k, 0))
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "shape": shape,
        "aspects": list(task.aspect_keys),
        "own_regressor": list(task.own_regressor),
        "spec": {"methods": list(spec.methods), "aggregators": list(spec.aggregators), "seeds": spec.seeds,
                 "train_fracs": list(spec.train_fracs), "resamples": spec.resamples,
                 "options": {k: v for k, v in spec.options.items() if k != "cache_dir"},
                 "method_options": {m: dict(o) for m, o in spec.method_options.items()}},
        "definitions": DEFINITIONS,
        "runs": runs,
        "settings": settings,
        **({} if shape == "pairwise" else {"criteria_efficiency": criteria_efficiency(settings, runs)}),
        "cost": cost,
        "calls": sum(c["calls"] for c in cost.values()),
    }


def check_shapes(spec: BenchmarkSpec) -> str:
    """The task's shape (pointwise / pairwise); a method that does not run on it is a one-line
    error before anything is read or called."""
    from hdeval.methods.registry import get_method
    from hdeval.tasks import load_task

    shape = load_task(spec.task).shape
    fits = [m for m in METHODS if shape in get_method(ENTRIES.get(m, (m,))[0]).shapes]
    wrong = [m for m in spec.methods if m not in fits]
    if wrong:
        raise ConfigError(f"--methods: {', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not run on "
                          f"{shape} tasks (task {spec.task}); "
                          f"for a {shape} task choose from {', '.join(fits)}")
    return shape


DEFINITIONS = {
    "dataset": "Pearson/Spearman/Kendall between predicted and human scores over all test samples, per "
               "aspect; average = mean over aspects (as the paper and metrics.json).",
    "summary_level": "Per doc_id, the correlation of the outputs' predicted and human scores; mean over "
                     "the documents where both vary (as G-Eval reports SummEval).",
    "ranking": "exact_match: share of documents whose outputs are ranked exactly in the human order "
               "(pairs the humans tied are not judged); kendall_per_document: mean per-document Kendall tau.",
    "bootstrap": "Documents of the test split resampled with replacement (seeded): 95% percentile interval "
                 "of the average dataset-level Spearman, and of its difference to the direct method on the "
                 "same resamples, with a two-sided bootstrap p-value. One entry per seed.",
    "seeds": "mean and sample std over seeds (each seed: its own split and model randomness).",
    "agreement": "pairwise tasks: w_ties = 3-way accuracy (a/b/tie) over the test pairs with a prediction; "
                 "wo_ties = accuracy on the pairs whose human label is not a tie, the prediction forced to "
                 "a or b (as metrics.json and `agreement` of --method dna). 'evaluator' is the method's own "
                 "prediction (DnA: its LLM weights; HD-Eval: its classifier), 'learned' DnA's logistic "
                 "regression on aspect-score differences. The pairwise bootstrap resamples test documents "
                 "for both figures and takes the difference to dna-direct when it is among --methods; "
                 "for DnA's learned aggregation the same under 'learned', on the same resamples.",
    "layers": "HD-Eval's per-layer proxy aggregators (layer k = without the layers after k) and the "
              "'w/o aggregator' baselines, from each artifact's metrics.json.",
    "criteria_efficiency": "held-out average Spearman against the number of criteria the evaluator uses "
                           "(mean/std over seeds): HD-Eval a point per layer (its layer-k proxy aggregator "
                           "uses the criteria of layers 1..k, counted from its layer reports), direct one "
                           "point at its criteria count (the aspects).",
}


def _per_aspect(ho: HeldOut, fn: Callable[..., dict[str, Any]], **kw: Any) -> dict[str, Any]:
    table = {a: fn(ho.y[:, j], ho.pred[:, j], ho.doc_ids, **kw) for j, a in enumerate(ho.aspects)}
    vals = [t["value"] for t in table.values() if t["value"] is not None]
    table["average"] = {"value": _num(np.mean(vals)) if vals else None,
                        "documents": min((t["documents"] for t in table.values()), default=0)}
    return table


def _run_record(fitted: Any, ho: HeldOut, method: str, agg: str | None, frac: float, seed: int) -> dict[str, Any]:
    from hdeval.metrics import metric_table

    m = fitted.metrics
    rec: dict[str, Any] = {
        "method": method, "aggregator": agg, "train_frac": frac, "seed": seed,
        "fitted_aggregator": fitted.fitted_aggregator(),
        "n_train": m["split"]["train"], "n_test": m["split"]["test"],
        "usage": dict(m.get("usage") or {}),
        "dataset": metric_table(ho.y, ho.pred, ho.aspects),
        "summary_level": {metric: _per_aspect(ho, summary_level_correlation, metric=metric) for metric in METRICS},
        "ranking": {"exact_match": _per_aspect(ho, ranking_exact_match),
                    "kendall_per_document": _per_aspect(ho, summary_level_correlation, metric="kendall")},
    }
    rec.update(fitted.benchmark_record())
    return rec


def criteria_efficiency(settings: Sequence[Mapping[str, Any]],
                        runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Held-out average Spearman against the number of criteria an evaluator uses: per HD-Eval
    setting a point per layer (its layer-k proxy aggregator; criteria and Spearman as mean/std
    over seeds) and per direct setting one reference point at its criteria count (the aspects)."""
    out = []
    for s in settings:
        if s["method"] != BASELINE and "layers" not in s:  # no criteria count to plot
            continue
        mine = [r for r in runs if (r["method"], r["aggregator"], r["train_frac"])
                == (s["method"], s["aggregator"], s["train_frac"])]
        if s["method"] == BASELINE:
            points = [{"layer": None, "criteria": mean_std([r["criteria"] for r in mine]),
                       "spearman": s["dataset"]["average"]["spearman"]}]
        else:
            points = [{"layer": int(k), "criteria": mean_std([r["criteria_per_layer"].get(k) for r in mine]),
                       "spearman": s["layers"][k]} for k in s["layers"]]
        out.append({"method": s["method"], "aggregator": s["aggregator"], "train_frac": s["train_frac"],
                    "points": points})
    return out


def _avg(table: Mapping[str, Any], metric: str) -> float | None:
    return (table.get("average") or {}).get(metric)


def _settings(spec: BenchmarkSpec, runs: list[dict[str, Any]], held: Mapping[tuple, HeldOut]) -> list[dict[str, Any]]:
    """Per (method, aggregator, train_frac): mean/std over seeds, bootstraps, layer ablation."""
    out = []
    keys = list(dict.fromkeys((r["method"], r["aggregator"], r["train_frac"]) for r in runs))
    for method, agg, frac in keys:
        mine = [r for r in runs if (r["method"], r["aggregator"], r["train_frac"]) == (method, agg, frac)]
        aspects = [a for a in mine[0]["dataset"] if a != "average"]
        s: dict[str, Any] = {"method": method, "aggregator": agg, "train_frac": frac,
                             "method_options": dict(spec.method_options.get(method) or {}),
                             "seeds": [r["seed"] for r in mine]}
        s["dataset"] = {a: {m: mean_std([r["dataset"][a][m] for r in mine]) for m in METRICS}
                        for a in aspects + ["average"]}
        s["summary_level"] = {m: {a: mean_std([r["summary_level"][m][a]["value"] for r in mine])
                                  for a in aspects + ["average"]} for m in METRICS}
        s["ranking"] = {k: {a: mean_std([r["ranking"][k][a]["value"] for r in mine]) for a in aspects + ["average"]}
                        for k in ("exact_match", "kendall_per_document")}
        boot = []
        for r in mine:
            ho = held[(method, agg, frac, r["seed"])]
            entry: dict[str, Any] = {"seed": r["seed"], "average_spearman": bootstrap_ci(
                ho.y, ho.pred, ho.doc_ids, n_resamples=spec.resamples, seed=r["seed"])}
            base = held.get((BASELINE, None, frac, r["seed"]))
            if base is not None and method != BASELINE:
                if base.sample_ids != ho.sample_ids:  # same seed, same split: never expected
                    raise ConfigError(f"the direct and {method} runs of seed {r['seed']} have different test splits")
                entry["vs_direct"] = paired_bootstrap(ho.y, ho.pred, base.pred, ho.doc_ids,
                                                      n_resamples=spec.resamples, seed=r["seed"])
            boot.append(entry)
        s["bootstrap"] = boot
        if "layers" in mine[0]:  # a method with criteria layers: the layer ablation
            layers = sorted({k for r in mine for k in r["layers"]}, key=int)
            s["layers"] = {k: mean_std([_avg(r["layers"].get(k) or {}, "spearman") for r in mine]) for k in layers}
            names = sorted({k for r in mine for k in r["baselines"]})
            s["baselines"] = {k: mean_std([_avg(r["baselines"].get(k) or {}, "spearman") for r in mine])
                              for k in names}
        s["usage"] = {k: sum(int(r["usage"].get(k, 0)) for r in mine)
                      for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")}
        out.append(s)
    return out


def _pair_run_record(fitted: Any, ho: PairHeldOut, method: str, agg: str | None, frac: float,
                     seed: int) -> dict[str, Any]:
    from hdeval.metrics import pair_agreement as agreement

    m = fitted.metrics
    return {
        "method": method, "aggregator": agg, "train_frac": frac, "seed": seed,
        "fitted_aggregator": fitted.fitted_aggregator(),
        "n_train": m["split"]["train"], "n_test": m["split"]["test"],
        "usage": dict(m.get("usage") or {}),
        "agreement": {v: agreement(ho.human, pred, ab) for v, (pred, ab) in ho.predictions.items()},
    }


def _pair_settings(spec: BenchmarkSpec, runs: list[dict[str, Any]],
                   held: Mapping[tuple, PairHeldOut]) -> list[dict[str, Any]]:
    """Per (method, aggregator, train_frac): agreement mean/std over seeds and, per seed, the
    bootstrap over test documents (with the difference to dna-direct when it ran)."""
    out = []
    keys = list(dict.fromkeys((r["method"], r["aggregator"], r["train_frac"]) for r in runs))
    for method, agg, frac in keys:
        mine = [r for r in runs if (r["method"], r["aggregator"], r["train_frac"]) == (method, agg, frac)]
        variants = list(dict.fromkeys(v for r in mine for v in r["agreement"]))
        s: dict[str, Any] = {"method": method, "aggregator": agg, "train_frac": frac,
                             "method_options": dict(spec.method_options.get(method) or {}),
                             "seeds": [r["seed"] for r in mine]}
        s["agreement"] = {v: {k: mean_std([(r["agreement"].get(v) or {}).get(k) for r in mine])
                              for k in PAIR_STATISTICS} for v in variants}
        boot = []
        for r in mine:
            ho = held[(method, agg, frac, r["seed"])]
            y, p = pair_arrays(ho)
            entry: dict[str, Any] = {"seed": r["seed"], "agreement": {
                k: bootstrap_ci(y, p, ho.doc_ids, statistic=f, n_resamples=spec.resamples, seed=r["seed"])
                for k, f in PAIR_STATISTICS.items()}}
            base = held.get((PAIR_BASELINE, None, frac, r["seed"]))
            bp = None
            if base is not None and method != PAIR_BASELINE:
                if base.sample_ids != ho.sample_ids:  # same seed, same split: never expected
                    raise ConfigError(f"the {PAIR_BASELINE} and {method} runs of seed {r['seed']} have "
                                      "different test splits")
                _, bp = pair_arrays(base)
                entry[PAIR_VS] = {k: paired_bootstrap(y, p, bp, ho.doc_ids, statistic=f, n_resamples=spec.resamples,
                                                      seed=r["seed"]) for k, f in PAIR_STATISTICS.items()}
            if "learned" in ho.predictions:  # DnA's learned aggregation, on the same resamples
                _, lp = pair_arrays(ho, "learned")
                learned: dict[str, Any] = {"agreement": {
                    k: bootstrap_ci(y, lp, ho.doc_ids, statistic=f, n_resamples=spec.resamples, seed=r["seed"])
                    for k, f in PAIR_STATISTICS.items()}}
                if bp is not None:
                    learned[PAIR_VS] = {k: paired_bootstrap(y, lp, bp, ho.doc_ids, statistic=f,
                                                            n_resamples=spec.resamples, seed=r["seed"])
                                        for k, f in PAIR_STATISTICS.items()}
                entry["learned"] = learned
            boot.append(entry)
        s["bootstrap"] = boot
        s["usage"] = {k: sum(int(r["usage"].get(k, 0)) for r in mine)
                      for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")}
        out.append(s)
    return out


# --------------------------------------------------------------------------- output
def is_benchmark_output(path: Path) -> bool:
    """Whether ``path`` holds a results.json this command wrote (its format says so)."""
    f = path / RESULTS
    try:
        if f.is_symlink() or not f.is_file() or f.stat().st_size > MAX_RESULTS_BYTES:
            return False
        data = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


_ARTIFACT_ENTRY = re.compile(rf"{RUNS}/[A-Za-z0-9][A-Za-z0-9._+-]*")


def _previous_artifacts(path: Path) -> set[str]:
    """The run artifacts (``runs/<name>``, one level, nothing else) a previous benchmark's
    results.json lists as written by it (its ``artifacts``)."""
    if not is_benchmark_output(path):
        return set()
    try:
        data = json.loads((path / RESULTS).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return set()
    listed = data.get("artifacts")
    return {a for a in listed if isinstance(a, str) and _ARTIFACT_ENTRY.fullmatch(a)} \
        if isinstance(listed, list) else set()


def check_output_dir(out: str | Path, force: bool = False, artifacts: Sequence[str] = ()) -> None:
    """Raise unless the benchmark may write ``out``: a new or empty directory, or (with
    ``force``) a previous benchmark's output, whose three files are replaced and nothing else
    touched. Any other non-empty directory is refused, ``force`` or not. ``artifacts``
    (--keep-artifacts): the ``runs/<name>`` directories to write; one that exists is replaced
    only when the previous benchmark's results.json lists it as its own and it is an artifact."""
    from hdeval.artifact import check_destination, check_writable, is_artifact

    path = Path(out)
    if path.is_symlink():
        raise ConfigError(f"refusing to write the benchmark to {path}: it is a symbolic link; give the real path")
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"cannot write the benchmark to {path}: it exists and is not a directory")
        if is_benchmark_output(path):
            if not force:
                raise ConfigError(f"{path} already holds a benchmark ({RESULTS}): pass --force to replace "
                                  "its results, or choose another output directory")
        elif any(path.iterdir()):
            raise ConfigError(f"refusing to write the benchmark to {path}: it is a non-empty directory that is "
                              f"not a benchmark output (no {RESULTS} of format {FORMAT}); --force does not "
                              "change that: choose a new directory")
        for name in OUTPUTS:
            if (path / name).is_symlink() or (path / name).is_dir():
                raise ConfigError(f"refusing to replace {path / name}: it is not a file this command wrote")
        runs = path / RUNS
        if artifacts and (runs.is_symlink() or (runs.exists() and not runs.is_dir())):
            raise ConfigError(f"refusing to write run artifacts into {runs}: it is not a directory this "
                              "command wrote")
        if artifacts and runs.is_dir():
            ours = _previous_artifacts(path)
            for name in artifacts:
                target = runs / name
                if target.exists() or target.is_symlink():
                    if f"{RUNS}/{name}" not in ours or target.is_symlink() or not is_artifact(target):
                        raise ConfigError(f"refusing to replace {target}: the previous benchmark in {path} did "
                                          "not write it; move it away or choose another output directory")
                    check_destination(target, force=True)
    check_writable(path if path.is_dir() else Path(os.path.abspath(path)).parent)


def write_benchmark(results: Mapping[str, Any], out: str | Path, force: bool = False,
                    artifacts: Mapping[str, Any] | None = None) -> list[Path]:
    """Write results.json, results.md and report.html into ``out`` (each atomically: a temp
    file renamed into place; the page and table are rendered before anything is written).
    ``artifacts`` (from :func:`run_benchmark`): each run's evaluator saved to ``runs/<name>``
    first (each atomically, as ``train -o``), so results.json, written last, lists only
    artifacts that are complete."""
    names = list(artifacts or {})
    check_output_dir(out, force, names)
    path = Path(out)
    # the artifacts this directory holds from the benchmark: the new ones and any an earlier
    # sweep wrote and this one did not replace (so a later --force may replace them too)
    from hdeval.artifact import is_artifact

    kept = sorted({a for a in _previous_artifacts(path) if is_artifact(path / a)} | {f"{RUNS}/{n}" for n in names})
    if kept:
        results = {**results, "artifacts": kept}
    texts = {
        RESULTS: json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
        TABLE: render_markdown(results),
        HTML: render_html(results),
    }
    written = []
    # what this write creates, taken back if it fails, so a rerun is not refused a directory
    # that holds artifacts its results.json does not list (replaced ones cannot be put back)
    fresh = not path.exists() or not any(path.iterdir())  # (check_output_dir: a directory if it exists)
    created: list[tuple[str, Path]] = [] if path.exists() else [("dir", path)]
    if not (path / RUNS).exists():
        created.append(("dir", path / RUNS))
    new = {n for n in names if not (path / RUNS / n).exists()}
    try:
        path.mkdir(parents=True, exist_ok=True)
        for name in names:
            written.append(artifacts[name].save(path / RUNS / name, force=True))  # type: ignore[index]
            if name in new:
                created.append(("tree", path / RUNS / name))
        for name in (TABLE, HTML, RESULTS):  # results.json last: it marks the directory as ours
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path)
            try:
                os.fchmod(fd, 0o666 & ~_umask())  # as an ordinary new file, not mkstemp's 0600
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(texts[name])
                os.replace(tmp, path / name)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written.append(path / name)
            if fresh:
                created.append(("file", path / name))
    except BaseException as exc:
        _take_back(created)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write the benchmark to {path}: {exc.strerror or exc}") from None
        raise
    return written


def _take_back(created: Sequence[tuple[str, Path]]) -> None:
    """Remove what a failed :func:`write_benchmark` created, newest first (best effort): the
    artifacts it saved where there were none, its files in a directory it made, and the
    directories it made when they are empty again."""
    import shutil

    for kind, p in reversed(created):
        try:
            if kind == "tree":
                shutil.rmtree(p)
            elif kind == "file":
                p.unlink()
            else:
                p.rmdir()  # only when empty: nothing of anyone else's
        except OSError:
            pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _f(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ms(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    return f"{d['mean']:.3f} ± {d['std']:.3f}" if d.get("n", 0) > 1 else f"{d['mean']:.3f}"


def _name(s: Mapping[str, Any]) -> str:
    return s["method"] if s["aggregator"] is None else f"{s['method']}-{s['aggregator']}"


Table = tuple[str, list[str], list[list[str]]]  # (the sentence above it, header, rows)


def benchmark_tables(results: Mapping[str, Any]) -> tuple[str, list[Table]]:
    """The title and the tables both results.md and report.html show (mean ± std over seeds)."""
    if results.get("shape") == "pairwise":
        return _pairwise_tables(results)
    aspects = list(results["aspects"])
    seeds = results["spec"]["seeds"]
    title = f"Benchmark: {results['task']} ({', '.join(aspects)})"
    intro = (f"Held-out dataset-level Spearman, mean ± std over {seeds} seed(s); CI: 95% paired bootstrap "
             f"over documents ({results['spec']['resamples']} resamples) on seed 0's test split.")
    head = ["method", "train frac", *aspects, "average", "summary-level", "rank exact-match", "95% CI",
            "Δ vs direct [95% CI], p", "calls"]
    rows = []
    for s in results["settings"]:
        b = s["bootstrap"][0]
        ci = b["average_spearman"]
        rows.append([_name(s), f"{s['train_frac']:g}", *[_ms(s["dataset"][a]["spearman"]) for a in aspects],
                     _ms(s["dataset"]["average"]["spearman"]), _ms(s["summary_level"]["spearman"]["average"]),
                     _ms(s["ranking"]["exact_match"]["average"]), f"[{_f(ci['low'])}, {_f(ci['high'])}]",
                     _delta(b.get("vs_direct")), str(s["usage"]["calls"])])
    tables: list[Table] = [(intro, head, rows)]
    ablation = [s for s in results["settings"] if s.get("layers")]
    if ablation:
        layer_keys = sorted({k for s in ablation for k in s["layers"]}, key=int)
        base_keys = sorted({k for s in ablation for k in s["baselines"]})
        tables.append(("Layer ablation (held-out average Spearman; layers 1-k = without the later layers) and "
                       "'w/o aggregator' baselines:",
                       ["method", "train frac", *[f"layers 1-{k}" for k in layer_keys], *base_keys],
                       [[_name(s), f"{s['train_frac']:g}", *[_ms(s["layers"].get(k)) for k in layer_keys],
                         *[_ms(s["baselines"].get(k)) for k in base_keys]] for s in ablation]))
    if results.get("criteria_efficiency"):
        tables.append(("Criteria efficiency (held-out average Spearman against the number of criteria the "
                       "evaluator uses; HD-Eval: its layer-k proxy aggregator, direct: the aspects):",
                       ["method", "train frac", "layer", "criteria", "average Spearman"],
                       [[_name(line), f"{line['train_frac']:g}", "" if pt["layer"] is None else str(pt["layer"]),
                         _ms1(pt["criteria"]), _ms(pt["spearman"])]
                        for line in results["criteria_efficiency"] for pt in line["points"]]))
    return title, tables + [_cost_table(results)]


def render_markdown(results: Mapping[str, Any]) -> str:
    """``results.md``: tables a person pastes into a paper (mean ± std over seeds)."""
    title, tables = benchmark_tables(results)
    lines = [f"# {title}"]
    for intro, head, rows in tables:
        lines += ["", intro, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _ms1(d: Mapping[str, Any] | None) -> str:
    """A count's mean ± std over seeds (no std when every seed agrees)."""
    if not d or d.get("mean") is None:
        return "n/a"
    return f"{d['mean']:g}" if not d.get("std") else f"{d['mean']:.1f} ± {d['std']:.1f}"


def _cost_table(results: Mapping[str, Any]) -> Table:
    return ("Cost per method (all runs; cached calls are free):",
            ["method", "runs", "LLM calls", "cache hits", "prompt tokens", "completion tokens"],
            [[str(m), str(c["runs"]), str(c["calls"]), str(c["cache_hits"]), str(c["prompt_tokens"]),
              str(c["completion_tokens"])] for m, c in results["cost"].items()])


def _delta(vs: Mapping[str, Any] | None) -> str:
    return (f"{vs['difference']:+.3f} [{_f(vs['low'])}, {_f(vs['high'])}], p={_f(vs['p_value'])}"
            if vs and vs["difference"] is not None else "")


def _pairwise_tables(results: Mapping[str, Any]) -> tuple[str, list[Table]]:
    seeds = results["spec"]["seeds"]
    intro = (f"Held-out agreement with the human labels, mean ± std over {seeds} seed(s): w/o ties (the "
             "prediction forced to a or b, on pairs humans did not tie) and w/ ties (3-way); 'learned' is "
             "DnA's logistic regression on aspect-score differences next to its LLM weights. CI: 95% "
             f"bootstrap over documents ({results['spec']['resamples']} resamples) on seed 0's test split.")
    base = PAIR_VS
    head = ["method", "train frac", "w/o ties", "w/ ties", "learned w/o ties", "learned w/ ties",
            "95% CI w/o ties", f"Δ w/o ties vs {PAIR_BASELINE} [95% CI], p",
            f"learned Δ w/o ties vs {PAIR_BASELINE} [95% CI], p", "calls"]
    rows = []
    for s in results["settings"]:
        b = s["bootstrap"][0]
        ci = b["agreement"]["wo_ties"]
        vs = (b.get(base) or {}).get("wo_ties")
        lvs = ((b.get("learned") or {}).get(base) or {}).get("wo_ties")
        ev, learned = s["agreement"].get("evaluator") or {}, s["agreement"].get("learned") or {}
        rows.append([_name(s), f"{s['train_frac']:g}", _ms(ev.get("wo_ties")), _ms(ev.get("w_ties")),
                     _ms(learned.get("wo_ties")) if learned else "", _ms(learned.get("w_ties")) if learned else "",
                     f"[{_f(ci['low'])}, {_f(ci['high'])}]", _delta(vs), _delta(lvs), str(s["usage"]["calls"])])
    return f"Benchmark: {results['task']} (pairwise)", [(intro, head, rows), _cost_table(results)]


# --------------------------------------------------------------------------- report.html
# The page (tables, plots, banner) is drawn by the reports' package; results.json holds its numbers.
from hdeval.report.bench import pair_curves, render_html  # noqa: E402,F401
