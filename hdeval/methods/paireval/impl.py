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
class PairEvaluator(_Dialogue):
    """Win probabilities against recorded comparison examples, one column per aspect, mapped to
    the human aspects by a fitted aggregator."""

    method = "paireval"

    def __init__(self, task: Task, template: Template, pool: list[Example], n: int, swap: bool,
                 agg: Any, llm: LLMConfig, llm_identity: str, metrics: dict[str, Any],
                 extra: dict[str, Any] | None = None, score_table=None):
        super().__init__(task, template, llm, llm_identity, metrics, extra, score_table)
        self.pool = list(pool)
        self.n = n
        self.swap = swap
        self.agg = agg

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        cols = [c for c in table.columns[2:] if not str(c).startswith("human:")]  # between split and human:
        return self.agg.predict(test[cols].to_numpy(float))

    def fitted_aggregator(self) -> str | None:
        return self.agg.kind

    def method_args(self) -> dict[str, Any]:
        return {"comparisons": self.n, "swap": self.swap}

    def judge(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int = 8,
              progress: Progress | None = None) -> PairScores:
        """Every pair judgment behind the columns (what ``score`` averages)."""
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        backend, own = self.open_backend(backend, cache_dir)
        try:
            return pair_scores(backend, self.template, self.task, samples, self.pool, self.n, self.swap,
                               concurrency, progress)
        finally:
            if own:
                backend.close()

    def score(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int = 8,
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
        out.json(COMPARISONS, [e.to_dict() for e in self.pool])
        out.json(METRICS, self.metrics)
        out.skops(MODEL, self.agg.models_)
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        return {"prompts": {"pair": self.template.digest},
                "aggregator": {"kind": self.agg.kind, "random_state": self.agg.random_state},
                **self.extra}

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "PairEvaluator":
        from hdeval.aggregate import Aggregator
        from hdeval.methods.aggregator_file import TRUSTED_TYPES, check_models

        m = art.manifest
        try:
            task, llm, identity = read_task_and_llm(art, (PAIR_PROMPT, COMPARISONS, METRICS, MODEL))
            pool = _parse_examples(art.json(COMPARISONS), str(art.path / COMPARISONS))
            args = m.get("method_args") or {}
            n, swap = args["comparisons"], args["swap"]
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(pool) or not isinstance(swap, bool):
                raise ValueError("method_args 'comparisons' / 'swap' do not fit the recorded examples")
            spec = m["aggregator"]
            template = Aggregator.for_task(spec["kind"], task, int(spec["random_state"]))
            models = art.skops(MODEL, TRUSTED_TYPES)
            check_models(models, template.kind, template.groups, len(task.aspects), art.path / MODEL)
            agg = Aggregator.from_fitted(template.kind, template.aspects, template.ranges, template.groups,
                                         template.random_state, models, len(task.aspects))
            ev = cls(task, parse_template("pair", art.text(PAIR_PROMPT), str(art.path / PAIR_PROMPT)), pool,
                     n, swap, agg, llm, identity, art.json(METRICS),
                     {k: m[k] for k in ("seed", "split", "config") if k in m})
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise ArtifactError(f"{art.path}: malformed artifact ({exc})") from exc
        ev.warnings = list(art.warnings)
        ev.path = art.path
        return ev


def fit_paireval(ctx: FitContext) -> PairEvaluator:
    pool, n, swap, source = choose_comparisons(ctx)  # every check before the first call
    return fit_with_pool(ctx, pool, n, swap, source)


def choose_comparisons(ctx: FitContext) -> tuple[list[Example], int, bool, str]:
    """The run's comparison examples, N, swap and where the examples come from."""
    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    history_fields(task)
    n = check_comparisons(ctx.option("comparisons"))
    swap = bool(ctx.option("swap"))
    source = ctx.option("comparison_data") or ""
    by_id = {s.id: s for s in samples}
    if source:
        pool = draw_comparisons(read_comparison_file(source, task), n, config.seed, task,
                                f"the comparison file {source}", own_docs=False)
    else:
        train = [by_id[i] for i in split.train_ids]
        pool = draw_comparisons(train, n, config.seed, task, "the training split", own_docs=True)
    return pool, n, swap, source or "train"


def planned_requests(config: Any, prep: Any) -> list[CompletionRequest]:
    """Every request a ``paireval`` / ``direct-yesno`` training run makes (for ``--dry-run``)."""
    task, samples = prep.task, prep.samples
    if config.method == "direct-yesno":
        history_fields(task)
        t = load_template("yesno")
        return [yesno_request(t, task, a, Example.of(task, s)) for s in samples for a in task.aspects]
    pool, n, swap, _ = choose_comparisons(FitContext(config, prep, None, None, Progress()))
    cols = [(a.key, pair_question(a)) for a in task.aspects]
    return [r for c in pair_cells(load_template("pair"), task, samples, pool, n, swap, cols) for r in c.requests]


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


def fit_with_pool(ctx: FitContext, pool: list[Example], n: int, swap: bool, source: str) -> PairEvaluator:
    """PairEval's fit with the comparison examples given (the benchmark draws its own)."""
    from hdeval.aggregate import Aggregator, cross_val_predictions, select_kind
    from hdeval.intervals import fitted_intervals
    from hdeval.metrics import metric_table

    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    by_id = {s.id: s for s in samples}
    ctx.progress.message(
        f"task {task.name}: {len(samples)} samples from {ctx.prep.data_path} ({len(split.train_ids)} train, "
        f"{len(split.test_ids)} test), {n} comparison examples from {source}, LLM {shown_identity(ctx.llm.identity)}"
    )
    ev = PairEvaluator(task, load_template("pair"), pool, n, swap, None, ctx.llm_config, ctx.llm.identity, {})
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
    kind, selection = config.aggregator, {}
    if kind == "auto":
        kind, selection = select_kind(Aggregator.for_task("lr", task, config.seed), X[tr], Y[tr], groups)
    ev.agg = Aggregator.for_task(kind, task, config.seed).fit(X[tr], Y[tr])
    ev.metrics = {
        "split": {"train": len(tr), "test": len(te)},
        "final": metric_table(Y[te], ev.agg.predict(X[te]), aspects),
        "direct": metric_table(Y[te], X[te], aspects),
        "aggregator": kind,
        "selection_scores": selection,
        "comparisons": {"n": n, "swap": swap, "source": source if source in ("train", "test") else "file",
                        "ids": [e.id for e in pool]},
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

    def score(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int = 8,
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
