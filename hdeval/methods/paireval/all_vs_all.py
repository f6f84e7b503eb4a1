"""The paper's exhaustive comparison: every response against every other response of its own
document, both orders with ``swap``."""

from __future__ import annotations

from typing import Any, Sequence

from hdeval.judge import Cell
from hdeval.methods.comparisons import Example, PairScores, judge_cells, pair_question, versus_cells
from hdeval.progress import Progress
from hdeval.prompts import Template
from hdeval.types import Failure, Sample, Task


def same_doc_cells(template: Template, task: Task, samples: Sequence[Sample], swap: bool,
                   cols: Sequence[tuple[str, str]]) -> list[Cell]:
    """The paper's exhaustive comparison: one cell per target x column x other response of the
    target's document x order, sample-major. Column keys as :func:`pair_cells`' (``key|i|order``,
    ``i`` the other response's place among the document's others)."""
    shown = {s.id: Example.of(task, s) for s in samples}
    docs: dict[str, list[str]] = {}
    for s in samples:
        docs.setdefault(s.doc_id, []).append(s.id)
    cells: list[Cell] = []
    for s in samples:
        others = list(enumerate(shown[o] for o in docs[s.doc_id] if o != s.id))
        cells += versus_cells(template, task, s.id, shown[s.id], others, swap, cols)
    return cells


def same_doc_scores(llm: Any, template: Template, task: Task, samples: Sequence[Sample], swap: bool,
                    concurrency: int | None = None, progress: Progress | None = None) -> PairScores:
    """Every target against every other response of its document (both orders with ``swap``); a
    response alone in its document gets no column and a failure saying why."""
    samples = list(samples)
    cols = [(a.key, pair_question(a)) for a in task.aspects]
    cells = same_doc_cells(template, task, samples, swap, cols)
    width = max((int(c.column.split("|")[1]) + 1 for c in cells), default=0)
    judged = judge_cells(llm, cells, samples, cols, width, swap, concurrency, progress,
                         f"comparing {len(samples)} samples x {len(cols)} columns with every other "
                         f"response of their document{' x 2 orders' if swap else ''}")
    compared = {c.sample_id for c in cells}
    for s in samples:
        if s.id not in compared:
            judged.failures += [Failure(s.id, f"{key}|-|first", f"all-vs-all: no other response of document "
                                        f"{s.doc_id!r} in the input to compare with") for key, _ in cols]
    return judged
