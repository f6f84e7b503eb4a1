"""PairEval's and DIRECTEVAL's dry run: every request is known before the run, so the counts
are exact."""

from __future__ import annotations

from contextlib import closing
from typing import Any

from hdeval.methods.base import FitContext
from hdeval.methods.comparisons import MAX_TOKENS, Example, history_fields, pair_cells, pair_question
from hdeval.methods.paireval.all_vs_all import same_doc_cells
from hdeval.methods.paireval.sources import ALL_VS_ALL, choose_comparisons
from hdeval.methods.paireval.yesno import yesno_request
from hdeval.progress import Progress
from hdeval.prompts import load_template


def _plan(config: Any, backend: Any, reqs: list) -> list:
    from hdeval.methods.run import exact_plan, open_backend

    with closing(open_backend(config, backend, offline=True)) as llm:
        return [exact_plan(llm, reqs, MAX_TOKENS)]


def plan_paireval(config: Any, prep: Any, backend: Any = None) -> list:
    task, samples = prep.task, prep.samples
    pool, n, swap, source = choose_comparisons(FitContext(config, prep, None, None, Progress()))
    cols = [(a.key, pair_question(a)) for a in task.aspects]
    if source == ALL_VS_ALL:
        cells = same_doc_cells(load_template("pair"), task, samples, swap, cols)
    else:
        cells = pair_cells(load_template("pair"), task, samples, pool, n, swap, cols)
    return _plan(config, backend, [r for c in cells for r in c.requests])


def plan_yesno(config: Any, prep: Any, backend: Any = None) -> list:
    task, template = prep.task, load_template("yesno")
    history_fields(task)
    return _plan(config, backend, [yesno_request(template, task, a, Example.of(task, s))
                                   for s in prep.samples for a in task.aspects])
