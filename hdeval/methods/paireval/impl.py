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
from hdeval.progress import Progress
from hdeval.prompts import Template, _neutralise, load_template, parse_template, sample_block
from hdeval.types import Aspect, Failure, Sample, ScoreMatrix, Task

RESPONSE_FIELD = "output"
PAIR_PROMPT = "prompts/pair.toml"
YESNO_PROMPT = "prompts/yesno.toml"
COMPARISONS = "comparisons.json"
METRICS = "metrics.json"
SCORES = "scores.csv"
MODEL = "aggregator.skops"
LABELS = ("A", "B")
YES_NO = ("Yes", "No")
MAX_TOKENS = 2  # one label word; the probability is read from the first token
TOP_LOGPROBS = 10
MAX_EXAMPLE_CHARS = 200_000  # a recorded comparison example longer than this is not ours


# ---------------------------------------------------------------------- shown text
def history_fields(task: Task) -> Task:
    """The task with only the fields shown as the conversation (all but the response)."""
    if not any(f.key == RESPONSE_FIELD for f in task.fields):
        raise ConfigError(
            f"task {task.name} has no field {RESPONSE_FIELD!r}: PairEval needs the response as the "
            f"task's {RESPONSE_FIELD!r} field"
        )
    hist = tuple(f for f in task.fields if f.key != RESPONSE_FIELD)
    if not hist:
        raise ConfigError(f"task {task.name} shows no conversation history besides the response")
    return dataclasses.replace(task, fields=hist)


def response_label(task: Task) -> str:
    return next((f.label for f in task.fields if f.key == RESPONSE_FIELD), "Response")


@dataclass(frozen=True)
class Example:
    """A conversation as the prompt shows it: its history and its response (exact text)."""

    id: str
    doc_id: str
    history: str
    response: str

    @classmethod
    def of(cls, task: Task, sample: Sample) -> "Example":
        return cls(sample.id, sample.doc_id, sample_block(history_fields(task), sample),
                   _neutralise(sample.text(RESPONSE_FIELD)))

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def pair_question(aspect: Aspect) -> str:
    if aspect.key == "overall":
        return "Which response is the better follow-up to its conversation?"
    return (f"Judge the two responses only on this criterion: {aspect.name}: {aspect.definition} "
            f"Which response is better on {aspect.name.lower()}?")


def yesno_question(aspect: Aspect) -> str:
    if aspect.key == "overall":
        return "Is the above response a good response to the given conversation?"
    return (f"Judge the response only on this criterion: {aspect.name}: {aspect.definition} "
            f"Is the above response good on {aspect.name.lower()}?")


def pair_request(template: Template, task: Task, question: str, a: Example, b: Example) -> CompletionRequest:
    messages = template.render({
        "task_description": task.description,
        "response_label": response_label(task),
        "history_a": a.history, "response_a": a.response,
        "history_b": b.history, "response_b": b.response,
        "question": question,
    })
    return CompletionRequest(messages, temperature=0.0, max_tokens=MAX_TOKENS, top_logprobs=TOP_LOGPROBS,
                             answer=Labels(LABELS), kind="pair")


def yesno_request(template: Template, task: Task, aspect: Aspect, target: Example) -> CompletionRequest:
    messages = template.render({
        "task_description": task.description,
        "response_label": response_label(task),
        "history": target.history, "response": target.response,
        "question": yesno_question(aspect),
    })
    return CompletionRequest(messages, temperature=0.0, max_tokens=MAX_TOKENS, top_logprobs=TOP_LOGPROBS,
                             answer=Labels(YES_NO), kind="yesno")


# ---------------------------------------------------------------------- comparison examples
def check_comparisons(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"--comparisons must be a whole number of at least 1, got {n!r}")
    return n


def draw_comparisons(pool: Sequence[Sample], n: int, seed: int, task: Task, where: str,
                     own_docs: bool) -> list[Example]:
    """One response from each of ``n + 1`` (or, from an outside pool whose conversations the
    targets do not share, ``n``) distinct conversations, seeded.

    ``own_docs``: the targets come from the same pool's conversations, so each needs ``n`` from
    conversations other than its own: ``n + 1`` are drawn and a target skips its own.
    """
    docs: dict[str, list[Sample]] = {}
    for s in pool:
        docs.setdefault(s.doc_id, []).append(s)
    available = len(docs) - 1 if own_docs else len(docs)
    if n > available:
        raise ConfigError(
            f"--comparisons {n} is more than the {available} available: each target is compared with "
            f"examples from {n} other conversations, and {where} holds {len(docs)} conversation(s)"
        )
    rng = np.random.default_rng(seed)
    order = sorted(docs)
    take = min(n + 1, len(docs))
    picked = [order[i] for i in rng.permutation(len(order))[:take]]
    return [Example.of(task, docs[d][int(rng.integers(len(docs[d])))]) for d in picked]


def comparisons_for(target: Example, pool: Sequence[Example], n: int) -> list[int]:
    """Indices of the pool examples a target is compared with: the first ``n`` from other
    conversations."""
    return [i for i, c in enumerate(pool) if c.doc_id != target.doc_id][:n]


def read_comparison_file(path: str, task: Task) -> list[Sample]:
    from hdeval.data import read_samples

    if not Path(path).is_file():
        raise DataError(f"comparison file {path} does not exist")
    try:
        return read_samples(path, task, require_scores=False)
    except DataError as exc:
        raise DataError(f"comparison file (--comparison-data) {exc}") from None


def _parse_examples(raw: Any, where: str) -> list[Example]:
    if not isinstance(raw, list) or not raw or len(raw) > 10_000:
        raise ArtifactError(f"{where}: not a non-empty list of comparison examples")
    out = []
    for i, item in enumerate(raw):
        keys = ("id", "doc_id", "history", "response")
        if not isinstance(item, dict) or not all(
                isinstance(item.get(k), str) and len(item[k]) <= MAX_EXAMPLE_CHARS for k in keys):
            raise ArtifactError(f"{where}: example {i} is not an object of id, doc_id, history, response strings")
        out.append(Example(*(item[k] for k in keys)))
    return out


# ---------------------------------------------------------------------- asking
def _p_first_label(completions: Sequence[Completion]) -> tuple[float, str | None]:
    # P("A") normalised over A/B; the target's probability is this (shown first) or 1 - this.
    return label_probability(completions[0], *LABELS)


def _p_yes(completions: Sequence[Completion]) -> tuple[float, str | None]:
    return label_probability(completions[0], *YES_NO)


@dataclass
class PairScores:
    """Every pair judgment: P(target wins) per sample x aspect x pool example, per order."""

    sample_ids: list[str]
    aspects: list[str]
    first: np.ndarray  # target shown first (label A)
    second: np.ndarray  # target shown second (label B); all NaN without swap
    failures: list[Failure]
    requests: int
    swap: bool

    def columns(self) -> ScoreMatrix:
        """Per sample and aspect: the mean over comparisons of the mean over both orders."""
        per = (self.first + self.second) / 2 if self.swap else self.first.copy()
        with np.errstate(all="ignore"), _quiet():
            values = np.nanmean(per, axis=2) if per.shape[2] else np.full(per.shape[:2], np.nan)
        fails: list[Failure] = []
        first_reason: dict[tuple[str, str], str] = {}
        for f in self.failures:
            first_reason.setdefault((f.sample_id, f.criterion_key.rsplit("|", 2)[0]), f.reason)
        for i, s in enumerate(self.sample_ids):
            for j, a in enumerate(self.aspects):
                if math.isnan(values[i, j]):
                    fails.append(Failure(s, a, first_reason.get((s, a), "no comparison could be read")))
        return ScoreMatrix(list(self.sample_ids), list(self.aspects), values, fails)

    @property
    def failure_rate(self) -> float:
        return len(self.failures) / self.requests if self.requests else 0.0

    def position(self) -> dict[str, float | int | None]:
        """Position consistency (share of comparisons whose preferred response is the same in
        both orders) and bias (mean |P(target wins | first) - P(target wins | second)|)."""
        if not self.swap:
            return {"consistency": None, "bias": None, "comparisons": 0}
        ok = np.isfinite(self.first) & np.isfinite(self.second)
        p1, p2 = self.first[ok], self.second[ok]
        if not p1.size:
            return {"consistency": None, "bias": None, "comparisons": 0}
        return {"consistency": round(float(np.mean((p1 > 0.5) == (p2 > 0.5))), 6),
                "bias": round(float(np.mean(np.abs(p1 - p2))), 6), "comparisons": int(p1.size)}


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def pair_cells(template: Template, task: Task, samples: Sequence[Sample], pool: Sequence[Example], n: int,
               swap: bool, cols: Sequence[tuple[str, str]]) -> list[Cell]:
    """One cell per target x column x comparison x order, sample-major."""
    cells: list[Cell] = []
    for s in samples:
        target = Example.of(task, s)
        mine = comparisons_for(target, pool, n)
        for key, question in cols:
            for ci in mine:
                cells.append(Cell(s.id, f"{key}|{ci}|first",
                                  (pair_request(template, task, question, target, pool[ci]),)))
                if swap:
                    cells.append(Cell(s.id, f"{key}|{ci}|second",
                                      (pair_request(template, task, question, pool[ci], target),)))
    return cells


def pair_scores(llm: Any, template: Template, task: Task, samples: Sequence[Sample], pool: Sequence[Example],
                n: int, swap: bool, concurrency: int = 8, progress: Progress | None = None,
                columns: Sequence[tuple[str, str]] | None = None, stage: bool = True) -> PairScores:
    """Ask every pair (sample-major: all columns and comparisons of one target together).

    ``columns``: (key, question) pairs; default: one per task aspect. ``stage``: open a progress
    stage of its own (False when the caller has one open)."""
    cols = list(columns) if columns is not None else [(a.key, pair_question(a)) for a in task.aspects]
    cells = pair_cells(template, task, samples, pool, n, swap, cols)
    if progress is not None and stage:
        progress.stage(f"comparing {len(samples)} samples x {len(cols)} columns x {n} examples"
                       f"{' x 2 orders' if swap else ''}", len(cells))
    m = fill_matrix(llm, cells, _p_first_label, concurrency, progress)
    if progress is not None and stage:
        progress.end_stage()
    shape = (len(samples), len(cols), len(pool))
    first, second = np.full(shape, np.nan), np.full(shape, np.nan)
    row = {sid: i for i, sid in enumerate(m.sample_ids)}
    ak = {key: j for j, (key, _) in enumerate(cols)}
    for c, key in enumerate(m.criterion_keys):
        aspect, ci, order = key.rsplit("|", 2)
        if order == "first":
            first[:, ak[aspect], int(ci)] = m.values[:, c]
        else:
            second[:, ak[aspect], int(ci)] = 1.0 - m.values[:, c]  # P(target's label "B")
    ordered = [row[s.id] for s in samples]
    return PairScores([s.id for s in samples], [key for key, _ in cols], first[ordered], second[ordered],
                      list(m.failures), len(cells), swap)


# ---------------------------------------------------------------------- inside HD-Eval
def criterion_question(tree: Any, criterion: Any) -> str:
    from hdeval.prompts import hierarchy_text

    return (f"{hierarchy_text(tree, criterion)}\nJudge the two responses only on the criterion "
            f"\"{criterion.name}\". Which response is better on it?")


class _EveryK(Progress):
    """Forwards one step to ``inner`` per ``k`` requests (HD-Eval counts cells, not pairs)."""

    def __init__(self, inner: Progress, k: int):
        self.inner, self.k, self.seen = inner, max(1, k), 0

    def advance(self, n: int = 1, cached: bool = False) -> None:
        before = self.seen // self.k
        self.seen += n
        if self.seen // self.k > before:
            self.inner.advance(self.seen // self.k - before, cached=cached)


class PairwiseScorer:
    """HD-Eval's criterion scorer replaced by PairEval (``--scorer pairwise``): a criterion's
    column is the target's win probability against the comparison examples on that criterion,
    both orders averaged. Same call signature as :func:`hdeval.scoring.score_criteria`."""

    kind = "pairwise"

    def __init__(self, template: Template, pool: list[Example], n: int, swap: bool):
        self.template, self.pool, self.n, self.swap = template, list(pool), n, swap
        self.judged: list[PairScores] = []  # every call's judgments (position statistics)

    def __call__(self, llm: Any, _score_template: Any, task: Task, tree: Any, criteria: Sequence[Any],
                 samples: Sequence[Sample], concurrency: int = 8, progress: Progress | None = None) -> ScoreMatrix:
        history_fields(task)
        cols = [(c.key, criterion_question(tree, c)) for c in criteria]
        step = None if progress is None else _EveryK(progress, self.n * (2 if self.swap else 1))
        judged = pair_scores(llm, self.template, task, samples, self.pool, self.n, self.swap, concurrency,
                             step, columns=cols, stage=False)
        self.judged.append(judged)
        return judged.columns()

    def position(self) -> dict[str, Any]:
        if not self.judged:
            return {"consistency": None, "bias": None, "comparisons": 0}
        first = np.concatenate([j.first.reshape(-1) for j in self.judged])
        second = np.concatenate([j.second.reshape(-1) for j in self.judged])
        both = PairScores([], [], first[None, None, :], second[None, None, :], [], 0, self.swap)
        return both.position()

    def manifest(self) -> dict[str, Any]:
        return {"kind": self.kind, "comparisons": self.n, "swap": self.swap}

    def write(self, out: ArtifactWriter) -> None:
        out.json(COMPARISONS, [e.to_dict() for e in self.pool])

    @classmethod
    def from_artifact(cls, art: ArtifactReader, spec: Any, templates: dict[str, Template]) -> "PairwiseScorer":
        if not isinstance(spec, dict) or spec.get("kind") != cls.kind:
            raise ArtifactError(f"{art.path}: unknown scorer {spec!r}")
        if "pair" not in templates or COMPARISONS not in art.manifest.get("files", {}):
            raise ArtifactError(f"{art.path}: a pairwise scorer needs prompts/pair.toml and {COMPARISONS}")
        pool = _parse_examples(art.json(COMPARISONS), str(art.path / COMPARISONS))
        n, swap = spec.get("comparisons"), spec.get("swap")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(pool) or not isinstance(swap, bool):
            raise ArtifactError(f"{art.path}: the scorer's 'comparisons' / 'swap' do not fit the recorded examples")
        return cls(templates["pair"], pool, n, swap)


def hdeval_scorer(ctx: FitContext) -> PairwiseScorer | None:
    """The criterion scorer ``--method hdeval --scorer ...`` asks for (None: the digit scorer)."""
    if ctx.option("scorer") != "pairwise":
        return None
    task, split = ctx.prep.task, ctx.prep.split
    history_fields(task)
    n = check_comparisons(ctx.option("comparisons"))
    by_id = {s.id: s for s in ctx.prep.samples}
    pool = draw_comparisons([by_id[i] for i in split.train_ids], n, ctx.config.seed, task,
                            "the training split", own_docs=True)
    return PairwiseScorer(load_template("pair"), pool, n, bool(ctx.option("swap")))


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
        from hdeval.methods.hdeval.evaluator import TRUSTED_TYPES, _check_models

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
            _check_models(models, template.kind, template.groups, len(task.aspects), art.path / MODEL)
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


def fit_with_pool(ctx: FitContext, pool: list[Example], n: int, swap: bool, source: str) -> PairEvaluator:
    """PairEval's fit with the comparison examples given (the benchmark draws its own)."""
    from hdeval.aggregate import Aggregator, select_kind
    from hdeval.metrics import metric_table

    task, samples, split, config = ctx.prep.task, ctx.prep.samples, ctx.prep.split, ctx.config
    by_id = {s.id: s for s in samples}
    ctx.progress.message(
        f"task {task.name}: {len(samples)} samples from {ctx.prep.data_path} ({len(split.train_ids)} train, "
        f"{len(split.test_ids)} test), {n} comparison examples from {source}, LLM {ctx.llm.identity}"
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


# ---------------------------------------------------------------------- fake LLM answers
_BLOCK = re.compile(r"<sample>\n?(.*?)\n?</sample>", re.S)
_WORD = re.compile(r"\w+")


def fake_quality(history: str, response: str, question: str) -> float:
    """A deterministic stand-in for response quality in [0, 1]: longer, more varied responses
    that pick up words of their own conversation do better; the weights depend on the question."""
    words = _WORD.findall(response.lower())
    if not words:
        return 0.0
    hist = set(_WORD.findall(history.lower()))
    uniq = len(set(words)) / len(words)
    length = math.tanh(len(words) / 20)
    overlap = len(set(words) & hist) / len(set(words))
    w = _unit("paireval-w", question)
    return 0.45 * length + 0.35 * (w * uniq + (1 - w) * overlap) + 0.2 * _unit("paireval-noise", response, question)


def _label_completion(request: CompletionRequest, fake: FakeBackend, labels: tuple[str, str], p: float) -> Completion:
    n_prompt = max(1, sum(len(m.content) for m in request.messages) // 4)
    prompt = request.messages[-1].content
    if fake.garbage and _unit("garbage", prompt) < fake.garbage:
        return Completion("I cannot decide.", None, n_prompt, 4)
    p = min(1 - 1e-6, max(1e-6, p))
    top = None
    if fake.logprobs and request.top_logprobs:
        alts = sorted([TokenLogprob(labels[0], math.log(p)), TokenLogprob(labels[1], math.log(1 - p))],
                      key=lambda t: -t.logprob)
        top = (tuple(alts),)
    return Completion(labels[0] if p >= 0.5 else labels[1], top, n_prompt, 1)


FAKE_FIRST_BIAS = 0.4


@responder("pair")
def _fake_pair(request: CompletionRequest, fake: FakeBackend) -> Completion:
    user = request.messages[-1].content
    blocks = _BLOCK.findall(user)
    question = user[user.rfind("</sample>"):]
    if len(blocks) < 4:
        return Completion("?", None, 1, 1)
    qa = fake_quality(blocks[0], blocks[1], question)
    qb = fake_quality(blocks[2], blocks[3], question)
    # a mild preference for what is shown first, as real LLMs have: the swap has something to
    # undo; and a pair-specific whim, so judgments are not perfectly transitive and the choice of
    # comparison examples matters (as it does with a real LLM)
    whim = 0.15 * (_unit("paireval-pair", *sorted((blocks[1], blocks[3]))) - 0.5)
    return _label_completion(request, fake, LABELS,
                             1 / (1 + math.exp(-8 * (qa - qb + whim) - FAKE_FIRST_BIAS)))


@responder("yesno")
def _fake_yesno(request: CompletionRequest, fake: FakeBackend) -> Completion:
    user = request.messages[-1].content
    blocks = _BLOCK.findall(user)
    question = user[user.rfind("</sample>"):]
    if len(blocks) < 2:
        return Completion("?", None, 1, 1)
    q = fake_quality(blocks[0], blocks[1], question)
    return _label_completion(request, fake, YES_NO, 1 / (1 + math.exp(-6 * (q - 0.5))))
