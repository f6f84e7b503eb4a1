"""PairEval's training: the comparison examples chosen and checked, every pair judged, the
aggregator fitted on the training split, the held-out figures."""

from __future__ import annotations

from typing import Any

import numpy as np

from hdeval.errors import ScoringError
from hdeval.methods.base import FitContext, run_record, score_table, usage_of
from hdeval.methods.comparisons import Example
from hdeval.methods.paireval.fitted import PairEvalEvaluator
from hdeval.methods.paireval.sources import (
    ALL_VS_ALL, choose_comparisons, comparison_text, overlap_text, overlap_with_test,
)
from hdeval.prompts import load_template
from hdeval.urls import shown_identity


def fit_paireval(ctx: FitContext) -> PairEvalEvaluator:
    pool, n, swap, source = choose_comparisons(ctx)  # every check before the first call
    return fit_with_pool(ctx, pool, n, swap, source)


def fit_with_pool(ctx: FitContext, pool: list[Example], n: int, swap: bool, source: str) -> PairEvalEvaluator:
    """PairEval's fit with the comparison examples given (the benchmark draws its own)."""
    from hdeval.aggregate import Aggregator, cross_val_predictions, select_kind
    from hdeval.intervals import fitted_intervals
    from hdeval.metrics import metric_table

    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    by_id = {s.id: s for s in samples}
    all_vs_all = source == ALL_VS_ALL
    if all_vs_all:
        compared: dict[str, Any] = {"all_vs_all": True, "swap": swap, "source": ALL_VS_ALL}
    else:
        compared = {"n": n, "swap": swap, "source": source if source in ("train", "test", "references") else "file",
                    "ids": [e.id for e in pool]}
    shown = {**compared, "file": source} if compared["source"] == "file" else compared
    ctx.progress.message(
        f"task {task.name}: {len(samples)} samples from {ctx.prep.data_path} ({len(split.train_ids)} train, "
        f"{len(split.test_ids)} test), {comparison_text(shown)}, LLM {shown_identity(ctx.llm.identity)}"
    )
    overlap = overlap_with_test(ctx, pool, source)
    if overlap is not None:
        compared["overlap_test"] = overlap
        ctx.progress.message(f"warning: {overlap_text(overlap)}")
    ev = PairEvalEvaluator(task, load_template("pair"), pool, n, swap, None, ctx.llm_config, ctx.llm.identity, {},
                       all_vs_all=all_vs_all)
    judged = ev.judge(samples, backend=ctx.llm, concurrency=config.concurrency, progress=ctx.progress)
    rate = judged.failure_rate
    if rate > config.max_failure_rate:
        ex = judged.failures[0]
        raise ScoringError(
            f"{rate:.0%} of pair judgments could not be read (threshold {config.max_failure_rate:.0%}), "
            f"e.g. sample {ex.sample_id} on {ex.criterion_key}: {ex.reason}; the replies are cached"
        )
    cols = judged.columns()
    ids = cols.sample_ids
    pos = {s: i for i, s in enumerate(ids)}
    tr = np.array([pos[s] for s in split.train_ids])
    te = np.array([pos[s] for s in split.test_ids])
    aspects = list(task.aspect_keys)
    Y = np.array([[by_id[s].scores[a] for a in aspects] for s in ids])
    X = cols.values
    groups = [by_id[ids[i]].doc_id for i in tr]
    kind, selection = config.options.aggregator, {}
    if kind == "auto":
        kind, selection = select_kind(Aggregator.for_task("lr", task, config.seed), X[tr], Y[tr], groups)
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
        "failure_rate": rate,
        "usage": usage_of(ctx.llm),
        "intervals": fitted_intervals(  # calibrated on out-of-fold training predictions
            Y, cross_val_predictions(Aggregator.for_task(kind, task, config.seed), X[tr], Y[tr], groups), tr,
            ev.agg.predict(X[te]), te, aspects, [a.range for a in task.aspects],
            "grouped cross-validation on the training split (by doc_id)"),
    }
    ev.score_table = score_table(ids, cols, split, Y, aspects)
    ev.extra = {**run_record(ctx), "comparison_source": source}
    return ev
