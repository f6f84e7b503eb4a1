"""PairEval's fine-tuning data (paper Sec. 3.3): chat-format pairs of a real follow-up against
a mismatched one (``hdeval paireval export-training``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hdeval.core.errors import DataError
from hdeval.core.types import Aspect, Sample, Task
from hdeval.judge.prompts import Template, load_template
from hdeval.methods.comparisons import Example, pair_question, pair_request


def export_training(
    samples: Sequence[Sample], task: Task, seed: int = 0, template: Template | None = None
) -> list[dict[str, Any]]:
    """Chat-format fine-tuning pairs (paper Sec. 3.3), one per sample: the sample's conversation
    with its real follow-up (positive) against another conversation's history followed by a
    response taken from a third conversation (negative), positions randomised, the positive's
    label word as the assistant's reply. Seeded."""
    template = template or load_template("pair")
    docs = sorted({s.doc_id for s in samples})
    if len(docs) < 3:
        raise DataError(f"export-training needs samples from at least 3 conversations, got {len(docs)}")
    overall = next((a for a in task.aspects if a.key == "overall"), None) or Aspect(
        "overall", "Overall quality", "The overall quality of the response.", 0, 1
    )
    rng = np.random.default_rng(seed)
    pool = list(samples)
    rows = []
    for s in samples:

        def other(*not_docs: str) -> Sample:
            while True:
                c = pool[int(rng.integers(len(pool)))]
                if c.doc_id not in not_docs:
                    return c

        pos = Example.of(task, s)
        h = other(s.doc_id)
        r = other(s.doc_id, h.doc_id)
        neg = Example(f"{h.id}+{r.id}", h.doc_id, Example.of(task, h).history, Example.of(task, r).response)
        first = bool(rng.integers(2))
        q = pair_question(overall)
        req = (
            pair_request(template, task, q, pos, neg) if first else pair_request(template, task, q, neg, pos)
        )
        label = "A" if first else "B"
        rows.append(
            {
                "messages": [{"role": m.role, "content": m.content} for m in req.messages]
                + [{"role": "assistant", "content": label}],
                "positive": s.id,
                "negative": {"history": h.id, "response": r.id},
                "label": label,
            }
        )
    return rows
