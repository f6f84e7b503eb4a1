"""Where PairEval's comparison examples come from (the training split, a corpus file, the
training documents' references, or all-vs-all within each document), checked before any call, and
how the run describes them (their overlap with the test rows included)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Sequence

from hdeval.core.errors import ConfigError
from hdeval.core.types import Sample
from hdeval.methods.base import FitContext
from hdeval.methods.comparisons import (
    RESPONSE_FIELD,
    Example,
    check_comparisons,
    draw_comparisons,
    history_fields,
    read_comparison_file,
)

REFERENCE_FIELD = "reference"
ALL_VS_ALL = "all-vs-all"  # the source of an exhaustive run: every other response of the document


def comparison_source(ctx: FitContext) -> str:
    """``train``, ``file`` or ``references``: given, else ``file`` with --comparison-data."""
    given = ctx.options.given()
    data = ctx.options.comparison_data or ""
    source = given.get("comparison_source") or ("file" if data else "train")  # a choice: checked by build
    if source == "file" and not data:
        raise ConfigError(
            "--comparison-source file needs --comparison-data FILE (a JSONL corpus in the task's schema)"
        )
    if data and source != "file":
        raise ConfigError(
            f"--comparison-data {data} is read only with --comparison-source file, not {source}"
        )
    if ctx.options.all_vs_all:
        clash = [
            f"--{k.replace('_', '-')}"
            for k in ("comparison_source", "comparison_data", "comparisons")
            if given.get(k) not in (None, "")
        ]
        if clash:
            raise ConfigError(
                f"--all-vs-all compares each response with the other responses of its own document: "
                f"{', '.join(clash)} do not apply"
            )
        return ALL_VS_ALL
    return source


def reference_examples(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per document whose response is the document's human-written reference."""
    out: dict[str, Sample] = {}
    for s in samples:
        ref = s.fields.get(REFERENCE_FIELD)
        if s.doc_id not in out and isinstance(ref, str) and ref.strip():
            out[s.doc_id] = dataclasses.replace(
                s, id=f"{s.doc_id}:reference", fields={**s.fields, RESPONSE_FIELD: ref}, scores={}
            )
    return list(out.values())


def choose_comparisons(ctx: FitContext) -> tuple[list[Example], int, bool, str]:
    """The run's comparison examples, N, swap and where the examples come from (``train``, the
    file's path, ``references`` or ``all-vs-all``, whose pool is empty)."""
    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    history_fields(task)
    swap = bool(ctx.options.swap)
    source = comparison_source(ctx)
    if source == ALL_VS_ALL:
        check_documents(samples)
        return [], 0, swap, source
    n = check_comparisons(ctx.options.comparisons)
    by_id = {s.id: s for s in samples}
    train = [by_id[i] for i in split.train_ids]
    rows, where = train, "the training split"
    if source == "file":
        path = ctx.options.comparison_data
        rows, where = read_comparison_file(path, task), f"the comparison file {path}"
    elif source == "references":
        rows, where = reference_examples(train), "the training split's references"
        if not rows:
            raise ConfigError(
                f"--comparison-source references: no row of the training split has a "
                f"{REFERENCE_FIELD!r} text (task {task.name}); use --comparison-source train or "
                "--comparison-data FILE"
            )
    pool = draw_comparisons(rows, n, config.seed, task, where, own_docs=source != "file")
    return pool, n, swap, path if source == "file" else source


def check_documents(samples: Sequence[Sample]) -> None:
    """All-vs-all needs at least two responses in every document."""
    count = Counter(s.doc_id for s in samples)
    lone = [d for d, k in count.items() if k < 2]
    if lone:
        raise ConfigError(
            f"--all-vs-all compares responses of the same document: {len(lone)} of {len(count)} "
            f"documents have a single response (e.g. {lone[0]!r}); drop them or compare with "
            "comparison examples instead"
        )


def overlap_with_test(ctx: FitContext, pool: Sequence[Example], source: str) -> dict[str, Any] | None:
    """How many comparison rows (and drawn examples) are test rows: same id or same response text."""
    if source == ALL_VS_ALL:
        return None
    task, split = ctx.prep.task, ctx.prep.split
    by_id = {s.id: s for s in ctx.prep.samples}
    test_ids = set(split.test_ids)
    test_texts = {Example.of(task, by_id[i]).response.strip() for i in split.test_ids}

    def hit(e: Example) -> bool:
        return e.id in test_ids or e.response.strip() in test_texts

    if source in ("train", "references"):
        rows = list(pool)
    else:
        rows = [Example.of(task, s) for s in read_comparison_file(source, task)]
    found = sum(hit(e) for e in rows)
    if not found:
        return None
    return {"rows": found, "of": len(rows), "examples": sum(hit(e) for e in pool), "drawn": len(pool)}


def overlap_text(o: dict[str, Any]) -> str:
    return (
        f"{o['rows']} of the {o['of']} comparison rows ({o['examples']} of the {o['drawn']} examples drawn) "
        "match test rows by id or response text: held-out scores may compare test responses with themselves"
    )


def comparison_text(c: dict[str, Any]) -> str:
    """Where the comparison examples came from, for the summary and the progress line."""
    if c.get("all_vs_all"):
        return "every other response of the same document (all-vs-all)"
    where = {
        "train": "responses of the training split",
        "references": "the training documents' references",
        "file": f"the corpus {c.get('file', '')}".rstrip(),
    }.get(c.get("source"), str(c.get("source")))
    return f"{c.get('n')} comparison examples from {where}"
