"""PairEval's training: the comparison examples chosen and checked, every pair judged, the
aggregator fitted on the training split, the held-out figures; and its dry run."""

from __future__ import annotations

from typing import Any

from hdeval.core.progress import Progress
from hdeval.judge.prompts import load_template
from hdeval.methods.base import (
    FitContext,
    check_failure_rate,
    fit_message,
    run_record,
    score_table,
    split_rows,
    usage_of,
)
from hdeval.methods.comparisons import MAX_TOKENS, Example, pair_cells, pair_question
from hdeval.methods.paireval.fitted import PairEvalEvaluator
from hdeval.methods.paireval.sources import (
    ALL_VS_ALL,
    choose_comparisons,
    comparison_text,
    overlap_text,
    overlap_with_test,
)


def fit_paireval(ctx: FitContext) -> PairEvalEvaluator:
    pool, n, swap, source = choose_comparisons(ctx)  # every check before the first call
    return fit_with_pool(ctx, pool, n, swap, source)


def plan_paireval(config: Any, prep: Any, backend: Any = None) -> list:
    """The dry run: every request is known before the run, so the counts are exact."""
    from hdeval.methods.run import plan_known

    task, samples = prep.task, prep.samples
    pool, n, swap, source = choose_comparisons(FitContext(config, prep, None, None, Progress()))
    cols = [(a.key, pair_question(a)) for a in task.aspects]
    cells = pair_cells(
        load_template("pair"), task, samples, swap, cols, None if source == ALL_VS_ALL else pool, n
    )
    return plan_known(config, backend, [r for c in cells for r in c.requests], MAX_TOKENS)


def fit_with_pool(ctx: FitContext, pool: list[Example], n: int, swap: bool, source: str) -> PairEvalEvaluator:
    """PairEval's fit with the comparison examples given (the benchmark draws its own)."""
    from hdeval.core.metrics import metric_table
    from hdeval.learn.aggregate import Aggregator, cross_val_predictions, select_cv
    from hdeval.learn.intervals import fitted_intervals

    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    by_id = {s.id: s for s in samples}
    all_vs_all = source == ALL_VS_ALL
    if all_vs_all:
        compared: dict[str, Any] = {"all_vs_all": True, "swap": swap, "source": ALL_VS_ALL}
    else:
        compared = {
            "n": n,
            "swap": swap,
            "source": source if source in ("train", "test", "references") else "file",
            "ids": [e.id for e in pool],
        }
    shown = {**compared, "file": source} if compared["source"] == "file" else compared
    fit_message(ctx, "samples", f"{comparison_text(shown)}, ")
    overlap = overlap_with_test(ctx, pool, source)
    if overlap is not None:
        compared["overlap_test"] = overlap
        ctx.progress.message(f"warning: {overlap_text(overlap)}")
    ev = PairEvalEvaluator(
        task,
        load_template("pair"),
        pool,
        n,
        swap,
        None,
        ctx.llm_config,
        ctx.llm.identity,
        {},
        all_vs_all=all_vs_all,
    )
    judged = ev.judge(samples, backend=ctx.llm, concurrency=config.concurrency, progress=ctx.progress)
    check_failure_rate(ctx, judged.failure_rate, "pair judgments", judged.failures)
    cols = judged.columns()
    ids, X, aspects = cols.sample_ids, cols.values, list(task.aspect_keys)
    tr, te, Y = split_rows(ctx, ids, aspects)
    groups = [by_id[ids[i]].doc_id for i in tr]
    kind, selection = config.options.aggregator, {}
    if kind == "auto":
        best, selection, _, _ = select_cv(Aggregator.for_task("lr", task, config.seed), X[tr], Y[tr], groups)
        kind = best.kind
    ev.agg = Aggregator.for_task(kind, task, config.seed).fit(X[tr], Y[tr])
    ev.metrics = {
        "split": {"train": len(tr), "test": len(te)},
        "final": metric_table(Y[te], ev.agg.predict(X[te]), aspects),
        "direct": metric_table(Y[te], X[te], aspects),
        "aggregator": kind,
        "selection_scores": selection,
        "comparisons": compared,
        "position_consistency": judged.position()["consistency"],
        "position_bias": judged.position()["bias"],
        "pair_judgments": judged.requests,
        "failure_rate": judged.failure_rate,
        "usage": usage_of(ctx.llm),
        "intervals": fitted_intervals(  # calibrated on out-of-fold training predictions
            Y,
            cross_val_predictions(Aggregator.for_task(kind, task, config.seed), X[tr], Y[tr], groups),
            tr,
            ev.agg.predict(X[te]),
            te,
            aspects,
            [a.range for a in task.aspects],
            "grouped cross-validation on the training split (by doc_id)",
        ),
    }
    ev.score_table = score_table(ids, cols, split, Y, aspects)
    ev.extra = {"comparison_source": source}
    ev.run = run_record(ctx)
    return ev
