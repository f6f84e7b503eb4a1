"""Judging a response by comparison with examples from other conversations (PairEval's
scorer): the prompts, the comparison examples, the pair judgments and the criterion scorer
HD-Eval's ``--scorer pairwise`` uses. Shared by the methods that compare, so no method imports
another."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hdeval.artifact.directory import ArtifactReader, ArtifactWriter
from hdeval.core.errors import ArtifactError, ConfigError, DataError
from hdeval.core.progress import Progress
from hdeval.core.types import Aspect, Failure, Sample, ScoreMatrix, Task
from hdeval.judge.fill import Cell, fill_matrix, label_probability
from hdeval.judge.prompts import Template, neutralise, sample_block
from hdeval.llm.backends.base import CompletionRequest
from hdeval.llm.backends.constraints import Labels
from hdeval.methods.base import progress_stage

RESPONSE_FIELD = "output"
COMPARISONS = "comparisons.json"
LABELS = ("A", "B")
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


@dataclass(frozen=True)
class Example:
    """A conversation as the prompt shows it: its history and its response (exact text)."""

    id: str
    doc_id: str
    history: str
    response: str

    @classmethod
    def of(cls, task: Task, sample: Sample) -> "Example":
        return cls(
            sample.id,
            sample.doc_id,
            sample_block(history_fields(task), sample),
            neutralise(sample.text(RESPONSE_FIELD)),
        )


def pair_question(aspect: Aspect) -> str:
    if aspect.key == "overall":
        return "Which response is the better follow-up to its conversation?"
    return (
        f"Judge the two responses only on this criterion: {aspect.name}: {aspect.definition} "
        f"Which response is better on {aspect.name.lower()}?"
    )


def label_request(
    template: Template, task: Task, labels: tuple[str, str], kind: str, **values: str
) -> CompletionRequest:
    """A question about a conversation answered by one of two label words (read from the first token);
    ``values`` fill the template and are the request's declared data."""
    shown = next((f.label for f in task.fields if f.key == RESPONSE_FIELD), "Response")
    messages = template.render({"task_description": task.description, "response_label": shown, **values})
    return CompletionRequest(
        messages,
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        top_logprobs=TOP_LOGPROBS,
        answer=Labels(labels),
        kind=kind,
        data=values,
    )


def pair_request(template: Template, task: Task, question: str, a: Example, b: Example) -> CompletionRequest:
    return label_request(
        template,
        task,
        LABELS,
        "pair",
        history_a=a.history,
        response_a=a.response,
        history_b=b.history,
        response_b=b.response,
        question=question,
    )


# ---------------------------------------------------------------------- comparison examples
def check_comparisons(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"--comparisons must be a whole number of at least 1, got {n!r}")
    return n


def draw_comparisons(
    pool: Sequence[Sample], n: int, seed: int, task: Task, where: str, own_docs: bool
) -> list[Example]:
    """One response from each of ``n + 1`` distinct conversations, seeded: with ``own_docs`` the
    targets share the pool's conversations and each skips its own (at most n + 1 are drawn)."""
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


def read_comparison_file(path: str, task: Task) -> list[Sample]:
    from hdeval.data.samples import read_samples

    if not Path(path).is_file():
        raise DataError(f"comparison file {path} does not exist")
    try:
        return read_samples(path, task, require_scores=False)
    except DataError as exc:
        raise DataError(f"comparison file (--comparison-data) {exc}") from None


def fits_examples(n: Any, swap: Any, pool: Sequence[Example]) -> bool:
    """A recorded N and swap fit the recorded examples."""
    return not isinstance(n, bool) and isinstance(n, int) and 1 <= n <= len(pool) and isinstance(swap, bool)


def parse_examples(raw: Any, where: str) -> list[Example]:
    if not isinstance(raw, list) or not raw or len(raw) > 10_000:
        raise ArtifactError(f"{where}: not a non-empty list of comparison examples")
    out = []
    for i, item in enumerate(raw):
        keys = ("id", "doc_id", "history", "response")
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) and len(item[k]) <= MAX_EXAMPLE_CHARS for k in keys
        ):
            raise ArtifactError(
                f"{where}: example {i} is not an object of id, doc_id, history, response strings"
            )
        out.append(Example(*(item[k] for k in keys)))
    return out


# ---------------------------------------------------------------------- asking
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
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "mean of empty slice": nothing answered
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
        ok = np.isfinite(self.first) & np.isfinite(self.second)  # none without swap
        p1, p2 = self.first[ok], self.second[ok]
        if not p1.size:
            return {"consistency": None, "bias": None, "comparisons": 0}
        return {
            "consistency": round(float(np.mean((p1 > 0.5) == (p2 > 0.5))), 6),
            "bias": round(float(np.mean(np.abs(p1 - p2))), 6),
            "comparisons": int(p1.size),
        }


def pair_cells(
    template: Template,
    task: Task,
    samples: Sequence[Sample],
    swap: bool,
    cols: Sequence[tuple[str, str]],
    pool: Sequence[Example] | None,
    n: int = 0,
) -> list[Cell]:
    """One cell per target x column x comparison x order, sample-major: a target is compared with
    the first ``n`` pool examples from other conversations or, without a pool (the paper's
    exhaustive all-vs-all), with every other response of its own document. Column keys
    ``key|i|first`` (the target shown first) and, with ``swap``, ``key|i|second``; ``i`` is the
    example's place in the pool, or among the document's other responses."""
    shown = {s.id: Example.of(task, s) for s in samples}
    docs: dict[str, list[Example]] = {}
    for e in shown.values():
        docs.setdefault(e.doc_id, []).append(e)
    cells: list[Cell] = []
    for s in samples:
        target = shown[s.id]
        if pool is None:
            others = list(enumerate(e for e in docs[s.doc_id] if e.id != s.id))
        else:
            others = [(i, c) for i, c in enumerate(pool) if c.doc_id != target.doc_id][:n]
        for key, question in cols:
            for ci, other in others:
                cells.append(
                    Cell(s.id, f"{key}|{ci}|first", (pair_request(template, task, question, target, other),))
                )
                if swap:
                    cells.append(
                        Cell(
                            s.id,
                            f"{key}|{ci}|second",
                            (pair_request(template, task, question, other, target),),
                        )
                    )
    return cells


def pair_scores(
    llm: Any,
    template: Template,
    task: Task,
    samples: Sequence[Sample],
    pool: Sequence[Example] | None,
    n: int,
    swap: bool,
    concurrency: int | None = None,
    progress: Progress | None = None,
    columns: Sequence[tuple[str, str]] | None = None,
    stage: bool = True,
) -> PairScores:
    """Ask every pair, sample-major (:func:`pair_cells`; no pool: all-vs-all, where a response
    alone in its document gets no column and a failure saying why). ``columns``: (key, question)
    pairs (default: one per aspect); ``stage``: open a progress stage of its own (False when the
    caller has one open)."""
    samples = list(samples)
    cols = list(columns) if columns is not None else [(a.key, pair_question(a)) for a in task.aspects]
    cells = pair_cells(template, task, samples, swap, cols, pool, n)
    if pool is None:
        label = (
            f"comparing {len(samples)} samples x {len(cols)} columns with every other "
            f"response of their document{' x 2 orders' if swap else ''}"
        )
        width = max((int(c.column.split("|")[1]) + 1 for c in cells), default=0)
    else:
        label = (
            f"comparing {len(samples)} samples x {len(cols)} columns x {n} examples" + " x 2 orders" * swap
        )
        width = len(pool)
    # P(target wins) per sample x column x comparison, as shown first and as shown second; NaN
    # where nothing was asked or read
    shape = (len(samples), len(cols), width)
    first, second = np.full(shape, np.nan), np.full(shape, np.nan)
    judged = PairScores(
        [s.id for s in samples], [key for key, _ in cols], first, second, [], len(cells), swap
    )
    with progress_stage(progress if stage else None, label, len(cells)):
        # P("A") normalised over A/B: the target's, shown first, or 1 - the target's
        m = (
            fill_matrix(llm, cells, lambda cs: label_probability(cs[0], *LABELS), concurrency, progress)
            if cells
            else None
        )
    if m is not None:
        judged.failures = list(m.failures)
        row = {sid: i for i, sid in enumerate(m.sample_ids)}
        rows = np.array([row.get(s.id, -1) for s in samples], dtype=int)
        values = np.where((rows >= 0)[:, None], m.values[rows], np.nan)  # a target with no cell: NaN
        ak = {key: j for j, (key, _) in enumerate(cols)}
        for c, key in enumerate(m.criterion_keys):
            aspect, ci, order = key.rsplit("|", 2)
            if order == "first":
                first[:, ak[aspect], int(ci)] = values[:, c]
            else:
                second[:, ak[aspect], int(ci)] = 1.0 - values[:, c]
    compared = {c.sample_id for c in cells}
    for s in samples if pool is None else ():
        if s.id not in compared:
            judged.failures += [
                Failure(
                    s.id,
                    f"{key}|-|first",
                    f"all-vs-all: no other response of document {s.doc_id!r} in the input to compare with",
                )
                for key, _ in cols
            ]
    return judged


# ---------------------------------------------------------------------- inside HD-Eval
def criterion_question(tree: Any, criterion: Any) -> str:
    from hdeval.judge.prompts import hierarchy_text

    return (
        f"{hierarchy_text(tree, criterion)}\nJudge the two responses only on the criterion "
        f'"{criterion.name}". Which response is better on it?'
    )


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
    both orders averaged. Same call signature as :func:`hdeval.judge.scoring.score_criteria`."""

    kind = "pairwise"

    def __init__(self, template: Template, pool: list[Example], n: int, swap: bool):
        self.template, self.pool, self.n, self.swap = template, list(pool), n, swap
        self.judged: list[PairScores] = []  # every call's judgments (position statistics)

    def __call__(
        self,
        llm: Any,
        _score_template: Any,
        task: Task,
        tree: Any,
        criteria: Sequence[Any],
        samples: Sequence[Sample],
        concurrency: int | None = None,
        progress: Progress | None = None,
    ) -> ScoreMatrix:
        history_fields(task)
        cols = [(c.key, criterion_question(tree, c)) for c in criteria]
        step = None if progress is None else _EveryK(progress, self.n * (2 if self.swap else 1))
        judged = pair_scores(
            llm,
            self.template,
            task,
            samples,
            self.pool,
            self.n,
            self.swap,
            concurrency,
            step,
            columns=cols,
            stage=False,
        )
        self.judged.append(judged)
        return judged.columns()

    def position(self) -> dict[str, Any]:
        flat = [
            np.concatenate([getattr(j, side).reshape(-1) for j in self.judged] + [np.empty(0)])
            for side in ("first", "second")
        ]
        return PairScores([], [], *flat, [], 0, self.swap).position()

    def manifest(self) -> dict[str, Any]:
        return {"kind": self.kind, "comparisons": self.n, "swap": self.swap}

    def write(self, out: ArtifactWriter) -> None:
        out.json(COMPARISONS, [dataclasses.asdict(e) for e in self.pool])

    @classmethod
    def from_artifact(
        cls, art: ArtifactReader, spec: Any, templates: dict[str, Template]
    ) -> "PairwiseScorer":
        if not isinstance(spec, dict) or spec.get("kind") != cls.kind:
            raise ArtifactError(f"{art.path}: unknown scorer {spec!r}")
        if "pair" not in templates or COMPARISONS not in art.manifest.get("files", {}):
            raise ArtifactError(f"{art.path}: a pairwise scorer needs prompts/pair.toml and {COMPARISONS}")
        pool = parse_examples(art.json(COMPARISONS), str(art.path / COMPARISONS))
        n, swap = spec.get("comparisons"), spec.get("swap")
        if not fits_examples(n, swap, pool):
            raise ArtifactError(
                f"{art.path}: the scorer's 'comparisons' / 'swap' do not fit the recorded examples"
            )
        return cls(templates["pair"], pool, n, swap)


# The fake LLM's answers to these prompts (registered on import).
from hdeval.methods import comparisons_fake  # noqa: E402,F401
