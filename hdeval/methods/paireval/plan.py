"""PairEval's and DIRECTEVAL's dry run: every request is known before the run, so the counts
are exact."""

from __future__ import annotations

from typing import Any

from hdeval.backends.base import CompletionRequest
from hdeval.methods.base import FitContext
from hdeval.methods.comparisons import MAX_TOKENS, Example, history_fields, pair_cells, pair_question
from hdeval.methods.paireval.all_vs_all import same_doc_cells
from hdeval.methods.paireval.sources import ALL_VS_ALL, choose_comparisons
from hdeval.methods.paireval.yesno import yesno_request
from hdeval.progress import Progress
from hdeval.prompts import load_template


def planned_requests(config: Any, prep: Any) -> list[CompletionRequest]:
    """Every request a ``paireval`` / ``direct-yesno`` training run makes (for ``--dry-run``)."""
    task, samples = prep.task, prep.samples
    if config.method == "direct-yesno":
        history_fields(task)
        t = load_template("yesno")
        return [yesno_request(t, task, a, Example.of(task, s)) for s in samples for a in task.aspects]
    pool, n, swap, source = choose_comparisons(FitContext(config, prep, None, None, Progress()))
    cols = [(a.key, pair_question(a)) for a in task.aspects]
    if source == ALL_VS_ALL:
        cells = same_doc_cells(load_template("pair"), task, samples, swap, cols)
    else:
        cells = pair_cells(load_template("pair"), task, samples, pool, n, swap, cols)
    return [r for c in cells for r in c.requests]


def plan_requests(config: Any, prep: Any, backend: Any = None) -> list:
    """A method whose every request is known before the run (PairEval, DIRECTEVAL): exact counts."""
    from hdeval.methods.run import LayerPlan, open_backend, prompt_chars

    reqs = planned_requests(config, prep)
    llm = open_backend(config, backend, offline=True)
    try:
        distinct = {llm.key(r): r for r in reqs}  # identical pairs cost one call
        cached = sum(llm.is_cached(r) for r in distinct.values())
        return [LayerPlan(1, 0, len(distinct), cached, False, sum(prompt_chars(r) for r in distinct.values()) // 4,
                          len(distinct) * MAX_TOKENS)]
    finally:
        llm.close()
