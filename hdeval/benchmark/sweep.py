"""``run_benchmark``: every run of a spec through the ordinary training code and one shared
LLM cache (a sweep pays only for calls no earlier run made), checked before the first call."""

from __future__ import annotations

from typing import Any

from hdeval.benchmark.heldout import check_held_out, held_out
from hdeval.benchmark.output import FORMAT, FORMAT_VERSION, RUNS
from hdeval.benchmark.settings import (
    DEFINITIONS,
    _run_record,
    _settings,
    compare_rows,
    criteria_efficiency,
    own_rows,
    pair_references,
    usage,
)
from hdeval.benchmark.spec import BenchmarkSpec, artifact_name, check_shapes, entries
from hdeval.benchmark.statistics import group
from hdeval.core.errors import BudgetExceeded
from hdeval.core.progress import Progress


class _Quiet(Progress):
    """Forwards a run's progress bars but not its per-layer summaries (the sweep reports runs)."""

    def __init__(self, inner: Progress):
        self.stage, self.advance, self.end_stage = inner.stage, inner.advance, inner.end_stage  # type: ignore


def _config(spec: BenchmarkSpec, method: str, agg: str | None, frac: float, seed: int, max_calls: int | None):
    from hdeval.methods.registry import all_options, get_method
    from hdeval.run.train import TrainConfig

    given = dict(spec.method_options.get(method) or {})
    entry = entries()[method]
    method, fixed = entry.method, dict(entry.fixed)
    # the sweep's options (--layers, ...) go to the methods that take them
    takes = get_method(method).options.specs()
    opts = {k: v for k, v in spec.options.items() if k in takes or k not in all_options()}
    if fixed or given:
        opts["method_options"] = {**given, **fixed}
    opts.update(task=spec.task, method=method, train_frac=frac, seed=seed, max_calls=max_calls)
    if agg is not None and "aggregator" in takes:
        opts["aggregator"] = agg
    return TrainConfig.from_options(**opts)


def run_benchmark(
    spec: BenchmarkSpec,
    progress: Progress | None = None,
    backend: Any = None,
    artifacts: dict[str, Any] | None = None,
    on_run: Any = None,
) -> dict[str, Any]:
    """Train every combination of ``spec`` (all checked before the first LLM call) and return
    ``results.json``'s content. ``artifacts`` (--keep-artifacts): a dict that receives each
    run's fitted evaluator under its :func:`artifact_name`, for :func:`write_benchmark`.
    ``on_run(key, fitted, doc_of)`` is called after each run (the learning curves read them)."""
    from hdeval.core.errors import HdevalError
    from hdeval.methods.base import FitContext
    from hdeval.methods.registry import get_method
    from hdeval.run.train import prepare, train

    spec.validate()
    shape = check_shapes(spec)
    for name in spec.methods:  # a method that cannot be compared, refused before any run pays
        check_held_out(get_method(entries()[name].method), shape == "pairwise")
    progress = progress or Progress()
    plan = spec.runs()
    budget = spec.options.get("max_calls")
    preps = {}
    for key in plan:  # every method's checks before any call: no run pays for a sweep that stops
        config = _config(spec, *key, budget)
        preps[key] = prepare(config)
        check = get_method(config.method).check_fit
        try:
            if check is not None:
                check(FitContext(config, preps[key], None, None, Progress()))
        except HdevalError as exc:
            raise type(exc)(f"{key[0]} run (train-frac {key[2]:g}, seed {key[3]}): {exc}") from None
    fits: list[Any] = []
    held: dict[tuple[str, str | None, float, int], Any] = {}
    for n, key in enumerate(plan, 1):
        method, agg, frac, seed = key
        spent = sum((f.metrics.get("usage") or {}).get("calls", 0) for f in fits)
        left = None if budget is None else max(0, budget - spent)
        config = _config(spec, *key, left)
        label = f"{method}{'' if agg is None else ' ' + agg}, train-frac {frac:g}, seed {seed}"
        progress.message(f"run {n}/{len(plan)}: {label}")
        try:
            fitted = train(config, progress=_Quiet(progress), backend=backend)
        except BudgetExceeded:
            # the run saw only what was left of the sweep's budget: name the budget the user gave
            raise BudgetExceeded(
                f"stopped at --max-calls {budget} (the whole sweep's budget) in run {n}/{len(plan)} ({label}): "
                "every finished call is cached; rerun with a larger --max-calls to continue"
            ) from None
        held[key] = held_out(fitted, {s.id: s.doc_id for s in preps[key].samples}, shape == "pairwise")
        if on_run is not None:  # learning curves: each run with its samples' documents
            on_run(key, fitted, {s.id: s.doc_id for s in preps[key].samples})
        fits.append(fitted)
        if artifacts is not None:
            artifacts[artifact_name(*key)] = fitted
    task = fits[-1].task
    # every method is scored on the rows every run of its split scored (failures left out alike)
    compared, rows = compare_rows(held)
    runs: list[dict[str, Any]] = []
    for fitted, key in zip(fits, plan):
        runs.append(_run_record(fitted, compared[key], *key, rows=rows[key], own=own_rows(held[key])))
        if artifacts is not None:
            runs[-1]["artifact"] = f"{RUNS}/{artifact_name(*key)}"
    settings = _settings(spec, runs, compared, shape == "pairwise")
    cost = {m: {"runs": len(mine), **usage(mine)} for m, mine in group(runs, lambda r: r["method"]).items()}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "shape": shape,
        "aspects": list(task.aspect_keys),
        "own_regressor": list(task.own_regressor),
        "spec": {
            "methods": list(spec.methods),
            "aggregators": list(spec.aggregators),
            "seeds": spec.seeds,
            "train_fracs": list(spec.train_fracs),
            "resamples": spec.resamples,
            "options": {k: v for k, v in spec.options.items() if k != "cache_dir"},
            "method_options": {m: dict(o) for m, o in spec.method_options.items()},
        },
        "definitions": DEFINITIONS,
        "runs": runs,
        "settings": settings,
        **({"reference": pair_references(spec, runs, compared)} if shape == "pairwise" else {}),
        "warnings": few_documents(runs),
        **({} if shape == "pairwise" else {"criteria_efficiency": criteria_efficiency(settings, runs)}),
        "cost": cost,
        "calls": sum(c["calls"] for c in cost.values()),
    }


MIN_DOCUMENTS = 30  # fewer test documents than this and an interval over documents is rough


def few_documents(runs: list[dict[str, Any]]) -> list[str]:
    """One warning when a split compares fewer than :data:`MIN_DOCUMENTS` test documents."""
    docs = [r["rows"]["documents_compared"] for r in runs]
    if not docs or min(docs) >= MIN_DOCUMENTS:
        return []
    return [
        f"only {min(docs)} test document(s) compared (fewer than {MIN_DOCUMENTS}): intervals, differences "
        "and p-values over so few documents are rough; use more data or a larger --test-frac"
    ]
