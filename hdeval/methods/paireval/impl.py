"""``paireval``: a response scored by pairwise comparison against comparison examples, and
``direct-yesno``, the PairEval paper's DIRECTEVAL baseline.

PairEval (Park et al., 2024, Sec. 3.2): a target (history h_i, response r_i) is compared with
each of N comparison examples (h_j, r_j) from *other* conversations. One prompt shows both
conversations and asks which response is the better follow-up; the score of a comparison is the
probability of the target's label word ("A" or "B"), normalised over the two, read from the first
generated token. Every pair is asked in both orders (target first = "A", target second = "B") and
the two probabilities are averaged, which removes the LLM's position bias; the column is the mean
over the N comparisons.

Where this deviates from (or adds to) the paper:

- One column per task aspect: the "overall" aspect asks the paper's question ("the better
  follow-up"), every other aspect asks which response is better on that aspect (its definition
  in the prompt). The paper's prediction for an aspect is its own column (``metrics["direct"]``);
  a learned white-box aggregator (the method seam's, fit on the training split) maps all columns
  to the human aspects (``metrics["final"]``), which the paper does not have.
- The comparison examples are one response from each of N + 1 distinct training conversations
  (seeded); a target is compared with the first N of them that come from a conversation other
  than its own, so every training target gets exactly N, and ``apply`` reuses exactly these
  examples (recorded in ``comparisons.json``), so a rerun costs no new calls.
- A comparison counts only when both orders were read; a failed reply drops that comparison.

DIRECTEVAL asks "Is the above response a good response to the given conversation?" (or whether
it is good on an aspect) and reads P("Yes") over "Yes"/"No"; mapped linearly onto each aspect's
range, nothing learned.
"""

from __future__ import annotations

from hdeval.urls import shown_identity

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hdeval.artifact import ArtifactReader, ArtifactWriter
from hdeval.backends.base import Completion, CompletionRequest, TokenLogprob
from hdeval.backends.constraints import Labels
from hdeval.backends.fake import FakeBackend, _unit, responder
from hdeval.config import LLMConfig
from hdeval.errors import ArtifactError, ConfigError, DataError, ScoringError
from hdeval.judge import Cell, fill_matrix, label_probability
from hdeval.methods.base import (
    FitContext, ScoreResult, SimpleFitted, read_task_and_llm, run_record, score_rows, score_table, usage_of,
)
from hdeval.methods.comparisons import (  # noqa: F401  (PairEval's names, reachable from the package)
    COMPARISONS, Example, LABELS, MAX_EXAMPLE_CHARS, MAX_TOKENS, PairScores, PairwiseScorer, RESPONSE_FIELD,
    TOP_LOGPROBS, _EveryK, _p_first_label, _parse_examples, _quiet, check_comparisons, comparisons_for,
    criterion_question, draw_comparisons, hdeval_scorer, history_fields, pair_cells, pair_question,
    pair_request, pair_scores, read_comparison_file, response_label,
)
from hdeval.progress import Progress
from hdeval.prompts import Template, _neutralise, load_template, parse_template, sample_block
from hdeval.types import Aspect, Failure, Sample, ScoreMatrix, Task

PAIR_PROMPT = "prompts/pair.toml"
YESNO_PROMPT = "prompts/yesno.toml"
METRICS = "metrics.json"
SCORES = "scores.csv"
MODEL = "aggregator.skops"
YES_NO = ("Yes", "No")


# ---------------------------------------------------------------------- DIRECTEVAL
def yesno_question(aspect: Aspect) -> str:
    if aspect.key == "overall":
        return "Is the above response a good response to the given conversation?"
    return (f"Judge the response only on this criterion: {aspect.name}: {aspect.definition} "
            f"Is the above response good on {aspect.name.lower()}?")


def yesno_request(template: Template, task: Task, aspect: Aspect, target: Example) -> CompletionRequest:
    messages = template.render({
        "task_description": task.description,
        "response_label": response_label(task),
        "history": target.history, "response": target.response,
        "question": yesno_question(aspect),
    })
    return CompletionRequest(messages, temperature=0.0, max_tokens=MAX_TOKENS, top_logprobs=TOP_LOGPROBS,
                             answer=Labels(YES_NO), kind="yesno")


def _p_yes(completions: Sequence[Completion]) -> tuple[float, str | None]:
    return label_probability(completions[0], *YES_NO)


# ---------------------------------------------------------------------- shared evaluator parts
class _Dialogue(SimpleFitted):
    def output_rows(self, samples: Sequence[Sample], result: ScoreResult) -> list[dict[str, Any]]:
        """The JSON lines ``apply`` writes: predictions, the LLM-filled columns, failures, humans."""
        return score_rows(samples, result, names=("columns", "column"))


# ---------------------------------------------------------------------- paireval
class PairEvalEvaluator(_Dialogue):
    """Win probabilities against recorded comparison examples, one column per aspect, mapped to
    the human aspects by a fitted aggregator."""

    method = "paireval"

    def __init__(self, task: Task, template: Template, pool: list[Example], n: int, swap: bool,
                 agg: Any, llm: LLMConfig, llm_identity: str, metrics: dict[str, Any],
                 extra: dict[str, Any] | None = None, score_table=None, all_vs_all: bool = False):
        super().__init__(task, template, llm, llm_identity, metrics, extra, score_table)
        self.pool = list(pool)
        self.n = n
        self.swap = swap
        self.agg = agg
        self.all_vs_all = all_vs_all  # compared within each document, no recorded examples
        # apply streams chunks and shards: a document split across them would compare fewer rows
        self.whole_input = ("this all-vs-all PairEval artifact compares each response with the other "
                            "responses of its document in the input") if all_vs_all else None

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        cols = [c for c in table.columns[2:] if not str(c).startswith("human:")]  # between split and human:
        return self.agg.predict(test[cols].to_numpy(float))

    def fitted_aggregator(self) -> str | None:
        return self.agg.kind

    def method_args(self) -> dict[str, Any]:
        if self.all_vs_all:
            return {"all_vs_all": True, "swap": self.swap}
        return {"comparisons": self.n, "swap": self.swap}

    def summary_lines(self, path: Any) -> list[tuple[str, bool]]:
        lines = super().summary_lines(path)
        c = self.metrics.get("comparisons") or {}
        lines.insert(1, (f"comparisons: {comparison_text(c)}", False))
        overlap = c.get("overlap_test")
        if isinstance(overlap, dict):
            lines.insert(2, (f"warning: {overlap_text(overlap)}", True))
        return lines

    def judge(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int | None = None,
              progress: Progress | None = None) -> PairScores:
        """Every pair judgment behind the columns (what ``score`` averages)."""
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        backend, own = self.open_backend(backend, cache_dir)
        try:
            if self.all_vs_all:
                return same_doc_scores(backend, self.template, self.task, samples, self.swap, concurrency,
                                       progress)
            return pair_scores(backend, self.template, self.task, samples, self.pool, self.n, self.swap,
                               concurrency, progress)
        finally:
            if own:
                backend.close()

    def score(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int | None = None,
              progress: Progress | None = None) -> ScoreResult:
        backend, own = self.open_backend(backend, cache_dir)
        try:
            cols = self.judge(samples, backend, concurrency=concurrency, progress=progress).columns()
            return ScoreResult(cols.sample_ids, list(self.task.aspect_keys), self.agg.predict(cols.values),
                               cols, usage_of(backend))
        finally:
            if own:
                backend.close()

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        out.text(PAIR_PROMPT, self.template.source)
        if not self.all_vs_all:
            out.json(COMPARISONS, [e.to_dict() for e in self.pool])
        out.json(METRICS, self.metrics)
        out.skops(MODEL, self.agg.models_)
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        return {"prompts": {"pair": self.template.digest},
                "aggregator": {"kind": self.agg.kind, "random_state": self.agg.random_state},
                **self.extra}

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "PairEvalEvaluator":
        from hdeval.aggregate import Aggregator
        from hdeval.methods.aggregator_file import TRUSTED_TYPES, check_models

        m = art.manifest
        try:
            args = m.get("method_args") or {}
            all_vs_all = args.get("all_vs_all", False) is True
            if all_vs_all:  # compared within each document: no recorded examples
                task, llm, identity = read_task_and_llm(art, (PAIR_PROMPT, METRICS, MODEL))
                pool, n, swap = [], 0, args["swap"]
                if set(args) != {"all_vs_all", "swap"} or not isinstance(swap, bool):
                    raise ValueError("method_args of an all-vs-all artifact are 'all_vs_all' and 'swap' only")
            else:
                task, llm, identity = read_task_and_llm(art, (PAIR_PROMPT, COMPARISONS, METRICS, MODEL))
                pool = _parse_examples(art.json(COMPARISONS), str(art.path / COMPARISONS))
                n, swap = args["comparisons"], args["swap"]
            if not all_vs_all and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(pool)
                                   or not isinstance(swap, bool)):
                raise ValueError("method_args 'comparisons' / 'swap' do not fit the recorded examples")
            spec = m["aggregator"]
            template = Aggregator.for_task(spec["kind"], task, int(spec["random_state"]))
            models = art.skops(MODEL, TRUSTED_TYPES)
            check_models(models, template.kind, template.groups, len(task.aspects), art.path / MODEL)
            agg = Aggregator.from_fitted(template.kind, template.aspects, template.ranges, template.groups,
                                         template.random_state, models, len(task.aspects))
            ev = cls(task, parse_template("pair", art.text(PAIR_PROMPT), str(art.path / PAIR_PROMPT)), pool,
                     n, swap, agg, llm, identity, art.json(METRICS),
                     {k: m[k] for k in ("seed", "split", "config") if k in m}, all_vs_all=all_vs_all)
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise ArtifactError(f"{art.path}: malformed artifact ({exc})") from exc
        ev.warnings = list(art.warnings)
        ev.path = art.path
        return ev


def fit_paireval(ctx: FitContext) -> PairEvalEvaluator:
    pool, n, swap, source = choose_comparisons(ctx)  # every check before the first call
    return fit_with_pool(ctx, pool, n, swap, source)


REFERENCE_FIELD = "reference"
ALL_VS_ALL = "all-vs-all"  # the source of an exhaustive run: every other response of the document


def comparison_source(ctx: FitContext) -> str:
    """``train``, ``file`` or ``references``: given, else ``file`` with --comparison-data."""
    from hdeval.methods.paireval import SOURCES

    given = ctx.options.given()
    data = ctx.options.comparison_data or ""
    source = given.get("comparison_source") or ("file" if data else "train")
    if source not in SOURCES:
        raise ConfigError(f"--comparison-source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "file" and not data:
        raise ConfigError("--comparison-source file needs --comparison-data FILE (a JSONL corpus in the task's schema)")
    if data and source != "file":
        raise ConfigError(f"--comparison-data {data} is read only with --comparison-source file, not {source}")
    if ctx.options.all_vs_all:
        clash = [f"--{k.replace('_', '-')}" for k in ("comparison_source", "comparison_data", "comparisons")
                 if given.get(k) not in (None, "")]
        if clash:
            raise ConfigError(f"--all-vs-all compares each response with the other responses of its own document: "
                              f"{', '.join(clash)} do not apply")
        return ALL_VS_ALL
    return source


def reference_examples(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per document whose response is the document's human-written reference."""
    out: dict[str, Sample] = {}
    for s in samples:
        ref = s.fields.get(REFERENCE_FIELD)
        if s.doc_id not in out and isinstance(ref, str) and ref.strip():
            out[s.doc_id] = dataclasses.replace(s, id=f"{s.doc_id}:reference",
                                                fields={**s.fields, RESPONSE_FIELD: ref}, scores={})
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
    if source == "file":
        path = ctx.options.comparison_data
        pool = draw_comparisons(read_comparison_file(path, task), n, config.seed, task,
                                f"the comparison file {path}", own_docs=False)
        return pool, n, swap, path
    if source == "references":
        refs = reference_examples(train)
        if not refs:
            raise ConfigError(f"--comparison-source references: no row of the training split has a "
                              f"{REFERENCE_FIELD!r} text (task {task.name}); use --comparison-source train or "
                              "--comparison-data FILE")
        pool = draw_comparisons(refs, n, config.seed, task, "the training split's references", own_docs=True)
        return pool, n, swap, source
    pool = draw_comparisons(train, n, config.seed, task, "the training split", own_docs=True)
    return pool, n, swap, "train"


def check_documents(samples: Sequence[Sample]) -> None:
    """All-vs-all needs at least two responses in every document."""
    count: dict[str, int] = {}
    for s in samples:
        count[s.doc_id] = count.get(s.doc_id, 0) + 1
    lone = [d for d, k in count.items() if k < 2]
    if lone:
        raise ConfigError(f"--all-vs-all compares responses of the same document: {len(lone)} of {len(count)} "
                          f"documents have a single response (e.g. {lone[0]!r}); drop them or compare with "
                          "comparison examples instead")


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
    return (f"{o['rows']} of the {o['of']} comparison rows ({o['examples']} of the {o['drawn']} examples drawn) "
            "match test rows by id or response text: held-out scores may compare test responses with themselves")


def comparison_text(c: dict[str, Any]) -> str:
    """Where the comparison examples came from, for the summary and the progress line."""
    if c.get("all_vs_all"):
        return "every other response of the same document (all-vs-all)"
    where = {"train": "responses of the training split", "references": "the training documents' references",
             "file": f"the corpus {c.get('file', '')}".rstrip()}.get(c.get("source"), str(c.get("source")))
    return f"{c.get('n')} comparison examples from {where}"


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




# ---------------------------------------------------------------------- all-vs-all
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
        target = shown[s.id]
        others = [shown[o] for o in docs[s.doc_id] if o != s.id]
        for key, question in cols:
            for ci, other in enumerate(others):
                cells.append(Cell(s.id, f"{key}|{ci}|first", (pair_request(template, task, question, target, other),)))
                if swap:
                    cells.append(Cell(s.id, f"{key}|{ci}|second",
                                      (pair_request(template, task, question, other, target),)))
    return cells


def same_doc_scores(llm: Any, template: Template, task: Task, samples: Sequence[Sample], swap: bool,
                    concurrency: int | None = None, progress: Progress | None = None) -> PairScores:
    """Every target against every other response of its document (both orders with ``swap``); a
    response alone in its document gets no column and a failure saying why."""
    samples = list(samples)
    cols = [(a.key, pair_question(a)) for a in task.aspects]
    cells = same_doc_cells(template, task, samples, swap, cols)
    if progress is not None:
        progress.stage(f"comparing {len(samples)} samples x {len(cols)} columns with every other response of "
                       f"their document{' x 2 orders' if swap else ''}", len(cells))
    m = fill_matrix(llm, cells, _p_first_label, concurrency, progress) if cells else None
    if progress is not None:
        progress.end_stage()
    width = max((int(c.column.split("|")[1]) + 1 for c in cells), default=0)
    shape = (len(samples), len(cols), width)
    first, second = np.full(shape, np.nan), np.full(shape, np.nan)
    failures: list[Failure] = list(m.failures) if m is not None else []
    if m is not None:
        row = {sid: i for i, sid in enumerate(m.sample_ids)}
        ak = {key: j for j, (key, _) in enumerate(cols)}
        ordered = [row.get(s.id) for s in samples]
        for c, key in enumerate(m.criterion_keys):
            aspect, ci, order = key.rsplit("|", 2)
            values = np.array([m.values[r, c] if r is not None else np.nan for r in ordered])
            if order == "first":
                first[:, ak[aspect], int(ci)] = values
            else:
                second[:, ak[aspect], int(ci)] = 1.0 - values  # P(target's label "B")
    compared = {c.sample_id for c in cells}
    for s in samples:
        if s.id not in compared:
            failures += [Failure(s.id, f"{key}|-|first", f"all-vs-all: no other response of document {s.doc_id!r} "
                                 "in the input to compare with") for key, _ in cols]
    return PairScores([s.id for s in samples], [key for key, _ in cols], first, second, failures, len(cells), swap)


# ---------------------------------------------------------------------- direct-yesno
class YesNoEvaluator(_Dialogue):
    """DIRECTEVAL: P("Yes") per aspect, mapped onto the aspect's range; nothing learned."""

    method = "direct-yesno"

    def method_args(self) -> dict[str, Any]:
        return {}

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        return self.to_range(test[list(self.task.aspect_keys)].to_numpy(float))

    def to_range(self, p: np.ndarray) -> np.ndarray:
        lo = np.array([a.low for a in self.task.aspects])
        hi = np.array([a.high for a in self.task.aspects])
        return lo + np.asarray(p, float) * (hi - lo)

    def score(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int | None = None,
              progress: Progress | None = None) -> ScoreResult:
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        history_fields(self.task)
        backend, own = self.open_backend(backend, cache_dir)
        try:
            cells = []
            for s in samples:
                target = Example.of(self.task, s)
                for a in self.task.aspects:
                    cells.append(Cell(s.id, a.key, (yesno_request(self.template, self.task, a, target),)))
            if progress is not None:
                progress.stage(f"asking {len(samples)} samples x {len(self.task.aspects)} aspects", len(cells))
            m = fill_matrix(backend, cells, _p_yes, concurrency, progress)
            if progress is not None:
                progress.end_stage()
            return ScoreResult(m.sample_ids, list(self.task.aspect_keys), self.to_range(m.values), m,
                               usage_of(backend))
        finally:
            if own:
                backend.close()

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        out.text(YESNO_PROMPT, self.template.source)
        out.json(METRICS, self.metrics)
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        return {"prompts": {"yesno": self.template.digest}, **self.extra}

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "YesNoEvaluator":
        m = art.manifest
        try:
            task, llm, identity = read_task_and_llm(art, (YESNO_PROMPT, METRICS))
            ev = cls(task, parse_template("yesno", art.text(YESNO_PROMPT), str(art.path / YESNO_PROMPT)),
                     llm, identity, art.json(METRICS), {k: m[k] for k in ("seed", "split", "config") if k in m})
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{art.path}: malformed artifact ({exc})") from exc
        ev.warnings = list(art.warnings)
        ev.path = art.path
        return ev


def fit_yesno(ctx: FitContext) -> YesNoEvaluator:
    from hdeval.metrics import metric_table

    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    history_fields(task)
    ev = YesNoEvaluator(task, load_template("yesno"), ctx.llm_config, ctx.llm.identity, {})
    res = ev.score(samples, backend=ctx.llm, concurrency=config.concurrency, progress=ctx.progress)
    rate = res.criteria.failure_rate
    if rate > config.max_failure_rate:
        ex = res.criteria.failures[0]
        raise ScoringError(
            f"{rate:.0%} of yes/no answers could not be read (threshold {config.max_failure_rate:.0%}), "
            f"e.g. sample {ex.sample_id} on {ex.criterion_key}: {ex.reason}; the replies are cached"
        )
    by_id = {s.id: s for s in samples}
    ids = res.sample_ids
    pos = {s: i for i, s in enumerate(ids)}
    te = np.array([pos[s] for s in split.test_ids])
    aspects = list(task.aspect_keys)
    Y = np.array([[by_id[s].scores[a] for a in aspects] for s in ids])
    ev.metrics = {
        "split": {"train": len(split.train_ids), "test": len(te)},
        "final": metric_table(Y[te], res.predictions[te], aspects),
        "failure_rate": rate,
        "usage": usage_of(ctx.llm),
    }
    ev.score_table = score_table(ids, res.criteria, split, Y, aspects)
    ev.extra = run_record(ctx)
    return ev




# ---------------------------------------------------------------------- fine-tuning data
def export_training(samples: Sequence[Sample], task: Task, seed: int = 0,
                    template: Template | None = None) -> list[dict[str, Any]]:
    """Chat-format fine-tuning pairs (paper Sec. 3.3), one per sample: the sample's conversation
    with its real follow-up (positive) against another conversation's history followed by a
    response taken from a third conversation (negative), positions randomised, the positive's
    label word as the assistant's reply. Seeded."""
    template = template or load_template("pair")
    docs = sorted({s.doc_id for s in samples})
    if len(docs) < 3:
        raise DataError(f"export-training needs samples from at least 3 conversations, got {len(docs)}")
    overall = next((a for a in task.aspects if a.key == "overall"), None) or Aspect(
        "overall", "Overall quality", "The overall quality of the response.", 0, 1)
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
        req = pair_request(template, task, q, pos, neg) if first else pair_request(template, task, q, neg, pos)
        label = "A" if first else "B"
        rows.append({
            "messages": [{"role": m.role, "content": m.content} for m in req.messages]
            + [{"role": "assistant", "content": label}],
            "positive": s.id, "negative": {"history": h.id, "response": r.id}, "label": label,
        })
    return rows


# The fake LLM's answers to DIRECTEVAL prompts (registered on import).
from hdeval.methods.paireval import fake  # noqa: E402,F401
