"""``dna``: Decompose and Aggregate (Li et al., 2024) on pairwise preference data.

The paper's stages (Sec. 3), each its own prompt in ``prompts/``:

1. **Aspects**: the task's aspects (``--aspect-source predefined``), or ``k`` aspects the LLM
   proposes per instance from the question alone (``dynamic``; ``dna_aspects``, validated JSON).
2. **Weights**: a percentage weight per aspect from the question alone (``dna_weights``, validated
   JSON: one non-negative number per aspect), normalised to sum to 1.
3. **Pairwise scoring by aspect**: one prompt shows the question and both responses and asks for
   a 1-10 score per response on one aspect (``dna_score``); both sides of that one reply fill the
   ``<aspect>:a`` and ``<aspect>:b`` columns (the cache makes it one call).
4. **Aggregation**: an external weighted sum per response; the higher total wins, totals within
   ``--tie-margin`` are a tie.

Deviations from the paper: each aspect score is the probability-weighted mean over the score
tokens offered at its number's position where the server returns top logprobs and they line up
with the reply (``--logprob-scores``, on by default; the paper reads the reply text, which is the
fallback); a pair whose aspects, weights or any aspect score
stays unusable is a recorded failure (no prediction) rather than guessed. ``--swap`` asks every
pairwise prompt in both orders, averages the scores and reports position consistency.

Baselines with the same LLM (``--dna-mode``): ``direct`` (overall scores, no aspects), ``cot``
(overall scores after step-by-step reasoning, read from the last line) and ``prompt-agg`` (the
paper's ablation: the aspect scores and weights are handed back to the LLM, which states the
overall scores). Beyond the paper, with predefined aspects a logistic regression on the
per-aspect score differences is fitted to the human labels of the training split (``learned``)
and reported next to the LLM's own weights.
"""

from __future__ import annotations

from hdeval.urls import shown_identity

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hdeval.artifact import ArtifactReader, ArtifactWriter
from hdeval.backends.base import Completion, CompletionRequest
from hdeval.backends.constraints import Scale
from hdeval.backends.fake import _unit, responder
from hdeval.config import LLMConfig
from hdeval.errors import ArtifactError, ConfigError, DataError, ScoringError
from hdeval.judge import Cell, UnusableReply, ask_json_many, fill_matrix, score_pair
from hdeval.metrics import pair_agreement as agreement
from hdeval.methods.base import FitContext, Saving, ScoreResult, run_record, usage_of
from hdeval.methods.dna.replies import (SCALE10, AspectSpec, _feedback, _one_line, _read_cot, _read_pair,
                                       _read_pair_weighted, _side, structured_pair, validate_aspects,
                                       validate_weights)
from hdeval.progress import Progress
from hdeval.prompts import Template, _neutralise, load_template, parse_template
from hdeval.tasks import task_from_dict
from hdeval.types import PAIR_LABELS, PairSample, ScoreMatrix, Task

# the answer of every scoring prompt but chain-of-thought: "<score A> <score B>"
TWO_SCORES = Scale(1, 10, count=2)
TOP_LOGPROBS = 10  # alternatives asked per reply token when aspect scores are logprob-weighted
from hdeval.methods.dna import MODES, SOURCES  # noqa: E402  (the package holds the option choices)
METRICS = "metrics.json"
SCORES = "scores.csv"
LEARNED = "learned.json"
MAX_K = 10
# prompt role -> prompt file name (prompts/<name>.toml, also the request kind)
PROMPT_FILES = {"aspects": "dna_aspects", "weights": "dna_weights", "score": "dna_score",
                "direct": "dna_direct", "cot": "dna_cot", "prompt_agg": "dna_prompt_agg"}
SWAP = "~swap"


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    mode: str = "dna"
    aspect_source: str = "predefined"
    k: int = 4
    tie_margin: float = 0.0
    swap: bool = False
    # aspect scores weighted by their tokens' top logprobs (False: the reply text, as artifacts
    # written before this option record nothing and were scored that way)
    logprobs: bool = False

    def check(self, where: str = "option") -> "Settings":
        problems = [
            (self.mode in MODES, f"--dna-mode must be one of {', '.join(MODES)}, got {self.mode!r}"),
            (self.aspect_source in SOURCES,
             f"--aspect-source must be one of {', '.join(SOURCES)}, got {self.aspect_source!r}"),
            (isinstance(self.k, int) and not isinstance(self.k, bool) and 1 <= self.k <= MAX_K,
             f"--k must be a whole number from 1 to {MAX_K}, got {self.k!r}"),
            (isinstance(self.tie_margin, (int, float)) and not isinstance(self.tie_margin, bool)
             and math.isfinite(self.tie_margin) and self.tie_margin >= 0,
             f"--tie-margin must be 0 or more, got {self.tie_margin!r}"),
            (isinstance(self.swap, bool), f"--swap must be true or false, got {self.swap!r}"),
            (isinstance(self.logprobs, bool), f"--logprob-scores must be true or false, got {self.logprobs!r}"),
        ]
        for ok, msg in problems:
            if not ok:
                raise ConfigError(msg if where == "option" else f"{where}: {msg}")
        return self

    @property
    def uses_aspects(self) -> bool:
        return self.mode in ("dna", "prompt-agg")

    @property
    def dynamic(self) -> bool:
        return self.uses_aspects and self.aspect_source == "dynamic"

    @property
    def prompt_roles(self) -> list[str]:
        if self.mode == "direct":
            return ["direct"]
        if self.mode == "cot":
            return ["cot"]
        roles = (["aspects"] if self.dynamic else []) + ["weights", "score"]
        return roles + (["prompt_agg"] if self.mode == "prompt-agg" else [])

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "aspect_source": self.aspect_source, "k": self.k,
                "tie_margin": self.tie_margin, "swap": self.swap, "logprobs": self.logprobs}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Settings":
        if not isinstance(d, dict):
            raise ArtifactError(f"{where}: method_args is not an object")
        try:
            s = cls(**{k: d[k] for k in ("mode", "aspect_source", "k", "tie_margin", "swap")},
                    logprobs=d.get("logprobs", False))
        except KeyError as exc:
            raise ArtifactError(f"{where}: method_args lacks {exc}") from None
        try:
            return s.check(where)
        except ConfigError as exc:
            raise ArtifactError(str(exc)) from None


def settings_of(ctx: FitContext) -> Settings:
    return Settings(mode=ctx.option("dna_mode"), aspect_source=ctx.option("aspect_source"),
                    k=ctx.option("k"), tie_margin=ctx.option("tie_margin"),
                    swap=ctx.option("swap"), logprobs=ctx.option("logprob_scores")).check()


# ----------------------------------------------------------------------------- aggregation
def decide(total_a: float, total_b: float, tie_margin: float = 0.0) -> str:
    """The higher total wins; totals within ``tie_margin`` of each other are a tie."""
    diff = total_a - total_b
    if abs(diff) <= tie_margin:
        return "tie"
    return "a" if diff > 0 else "b"


def weighted_totals(scores_a: Sequence[float], scores_b: Sequence[float],
                    weights: Sequence[float]) -> tuple[float, float]:
    """The external weighted sum of each response's aspect scores (weights sum to 1)."""
    w = np.asarray(weights, float)
    return float(np.dot(w, np.asarray(scores_a, float))), float(np.dot(w, np.asarray(scores_b, float)))


# ----------------------------------------------------------------------------- learned
@dataclass
class Learned:
    """A linear classifier on per-aspect score differences (A minus B), stored as numbers."""

    aspects: list[str]
    classes: list[str]
    coef: np.ndarray  # classes x aspects (one row for two classes: positive = classes[1])
    intercept: np.ndarray

    def decision(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, float) @ self.coef.T + self.intercept

    def predict(self, X: np.ndarray) -> list[str]:
        d = self.decision(X)
        if len(self.classes) == 2:
            return [self.classes[int(v > 0)] for v in d[:, 0]]
        return [self.classes[int(i)] for i in np.argmax(d, axis=1)]

    def predict_ab(self, X: np.ndarray) -> list[str]:
        """Forced to a or b (for the "without ties" figure)."""
        if "tie" not in self.classes:
            return self.predict(X)
        sides = [c for c in ("a", "b") if c in self.classes]
        if len(sides) == 1:  # a cross-validation fold that saw ties and one side only
            return [sides[0]] * len(np.asarray(X))
        d = self.decision(X)
        ia, ib = self.classes.index("a"), self.classes.index("b")
        return ["a" if row[ia] >= row[ib] else "b" for row in d]

    def to_dict(self) -> dict[str, Any]:
        return {"aspects": self.aspects, "classes": self.classes,
                "coef": self.coef.round(8).tolist(), "intercept": self.intercept.round(8).tolist()}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Learned":
        try:
            aspects = [str(a) for a in d["aspects"]]
            classes = [str(c) for c in d["classes"]]
            coef = np.array(d["coef"], dtype=float)
            intercept = np.array(d["intercept"], dtype=float)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed learned aggregator ({exc})") from None
        rows = 1 if len(classes) == 2 else len(classes)
        if (not set(classes) <= set(PAIR_LABELS) or not {"a", "b"} <= set(classes)
                or coef.shape != (rows, len(aspects))
                or intercept.shape != (rows,) or not np.all(np.isfinite(coef))
                or not np.all(np.isfinite(intercept))):
            raise ArtifactError(f"{where}: malformed learned aggregator (shapes or labels do not fit)")
        return cls(aspects, classes, coef, intercept)


def fit_learned(X: np.ndarray, y: Sequence[str], seed: int) -> Learned:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=2000, random_state=seed).fit(X, list(y))
    return Learned([], [str(c) for c in model.classes_], np.array(model.coef_, float),
                   np.array(model.intercept_, float))


# ----------------------------------------------------------------------------- prompts
def question_block(task: Task, pair: PairSample) -> str:
    parts = [f"{f.label}:\n{_neutralise(pair.text(f.key))}" for f in task.fields if f.key != "output"]
    return "\n\n".join(parts)


def pair_block(task: Task, pair: PairSample, swapped: bool = False) -> str:
    first, second = (pair.output_b, pair.output_a) if swapped else (pair.output_a, pair.output_b)
    return (f"{question_block(task, pair)}\n\nResponse A:\n{_neutralise(first)}"
            f"\n\nResponse B:\n{_neutralise(second)}")


def load_dna_templates(roles: Sequence[str]) -> dict[str, Template]:
    return {r: load_template(PROMPT_FILES[r]) for r in roles}


def _req(template: Template, values: dict[str, str], max_tokens: int, json_schema: str | None = None,
         answer: Scale | None = None) -> CompletionRequest:
    return CompletionRequest(template.render(values), temperature=0.0, max_tokens=max_tokens,
                             json_mode=json_schema is not None, json_schema=json_schema, answer=answer,
                             kind=template.name)


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}


def aspects_schema(k: int) -> str:
    """The reply of stage 1 (dynamic aspects): a local model's grammar enforces it, a server
    gets it as structured outputs. Lengths are bounded so a constrained model cannot loop."""
    item = _object({"name": {"type": "string", "maxLength": 100},
                    "definition": {"type": "string", "maxLength": 600}})
    return json.dumps(_object({"aspects": {"type": "array", "items": item, "minItems": k, "maxItems": k}}),
                      sort_keys=True)


def weights_schema(keys: Sequence[str]) -> str:
    """The reply of stage 2: one number per aspect key (the validator checks the rest)."""
    return json.dumps(_object({"weights": _object({k: {"type": "number"} for k in keys})}), sort_keys=True,
                      ensure_ascii=False)


# ----------------------------------------------------------------------------- one run
@dataclass
class PairScoreResult(ScoreResult):
    """Scores of pairs: ``predictions`` holds each response's total (columns total_a, total_b)."""

    labels: list[str | None] = field(default_factory=list)  # a / b / tie, None = failed
    labels_ab: list[str | None] = field(default_factory=list)  # forced to a or b
    learned_labels: list[str | None] | None = None
    learned_ab: list[str | None] | None = None
    pair_aspects: dict[str, list[AspectSpec]] = field(default_factory=dict)
    weights: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    consistent: dict[str, bool] = field(default_factory=dict)  # with swap: same winner both orders
    diffs: np.ndarray | None = None  # predefined aspects: per-aspect A minus B (NaN = failed)

    def correlations(self, samples):  # pairs have labels, not scores: see agreement()
        return None

    def agreement(self, samples: Sequence[PairSample]) -> dict[str, Any] | None:
        human = [s.label for s in samples]
        if all(h is None for h in human):  # unlabelled input (apply): nothing to agree with
            return None
        out = {"llm": agreement(human, self.labels, self.labels_ab)}
        if self.learned_labels is not None:
            out["learned"] = agreement(human, self.learned_labels, self.learned_ab)
        return out

    @property
    def failure_rate(self) -> float:
        return sum(1 for lab in self.labels if lab is None) / len(self.labels) if self.labels else 0.0


def _col(spec: AspectSpec, i: int, dynamic: bool) -> str:
    return f"aspect{i + 1}" if dynamic else spec.key


def weights_request(template: Template, task: Task, p: PairSample, specs: Sequence[AspectSpec]) -> CompletionRequest:
    """Stage 2: a percentage weight per aspect from the question alone."""
    listing = "".join(f"- {s.key}: {s.definition}\n" if s.key == s.name
                      else f"- {s.key}: {s.name}: {s.definition}\n" for s in specs)
    return _req(template, {"task_description": task.description, "question": question_block(task, p),
                           "aspects": listing, "aspect_keys": json.dumps([s.key for s in specs], ensure_ascii=False)},
                400, json_schema=weights_schema([s.key for s in specs]))


def score_request(template: Template, task: Task, p: PairSample, spec: AspectSpec, swapped: bool,
                  logprobs: bool = False) -> CompletionRequest:
    """Stage 3: both responses scored 1-10 on one aspect, in the given order (with ``logprobs``:
    the top alternatives of every reply token asked for too)."""
    req = structured_pair(_req(template, {"task_description": task.description, "pair": pair_block(task, p, swapped),
                                          "aspect_name": spec.name, "aspect_definition": spec.definition}, 8,
                                          answer=TWO_SCORES))
    return dataclasses.replace(req, top_logprobs=TOP_LOGPROBS) if logprobs else req


def overall_request(template: Template, task: Task, p: PairSample, swapped: bool, role: str) -> CompletionRequest:
    """A baseline's overall scores of both responses (``cot`` reasons in free text first)."""
    if role == "cot":
        return _req(template, {"task_description": task.description, "pair": pair_block(task, p, swapped)}, 512)
    return structured_pair(_req(template, {"task_description": task.description,
                                           "pair": pair_block(task, p, swapped)}, 8, answer=TWO_SCORES))


def run_pairs(llm, task: Task, templates: dict[str, Template], settings: Settings,
              pairs: Sequence[PairSample], concurrency: int = 8,
              progress: Progress | None = None) -> PairScoreResult:
    """Every stage of the chosen mode on ``pairs``; unusable replies become recorded failures."""
    ids = [p.id for p in pairs]
    failures: dict[str, list[str]] = {}

    def fail(pid: str, reason: str) -> None:
        failures.setdefault(pid, []).append(reason)

    aspects: dict[str, list[AspectSpec]] = {}
    weights: dict[str, np.ndarray] = {}
    if settings.uses_aspects:
        if settings.dynamic:
            tpl = templates["aspects"]

            def propose(p: PairSample):
                req = _req(tpl, {"task_description": task.description, "question": question_block(task, p),
                                 "k": str(settings.k)}, 600, json_schema=aspects_schema(settings.k))
                return req, validate_aspects(settings.k), _feedback

            if progress is not None:
                progress.message(f"asking for {settings.k} aspects per pair ({len(pairs)} pairs)")
            for p, got in zip(pairs, ask_json_many(llm, [propose(p) for p in pairs], concurrency)):
                if isinstance(got, UnusableReply):
                    fail(p.id, f"aspects: {got}")
                else:
                    aspects[p.id] = got
        else:
            fixed = [AspectSpec(a.key, a.name, a.definition) for a in task.aspects]
            aspects = {p.id: fixed for p in pairs}
        tpl_w = templates["weights"]

        def weigh(p: PairSample):
            specs = aspects[p.id]
            return weights_request(tpl_w, task, p, specs), validate_weights([s.key for s in specs]), _feedback

        with_aspects = [p for p in pairs if p.id in aspects]
        if progress is not None:
            progress.message(f"asking for aspect weights ({len(with_aspects)} pairs)")
        for p, got in zip(with_aspects, ask_json_many(llm, [weigh(p) for p in with_aspects], concurrency)):
            if isinstance(got, UnusableReply):
                fail(p.id, f"weights: {got}")
            else:
                weights[p.id] = got

    # -- the pairwise prompts: (column base, pair, swapped) -> request
    orders = (False, True) if settings.swap else (False,)
    cells_first: list[Cell] = []  # cells read from the first number of the reply
    cells_second: list[Cell] = []
    base_cols: dict[str, list[str]] = {}

    def add(pid: str, base: str, req_of) -> None:
        for swapped in orders:
            req = req_of(swapped)
            sfx = SWAP if swapped else ""
            # shown first is A (or B when swapped)
            (cells_second if swapped else cells_first).append(Cell(pid, f"{base}:a{sfx}", (req,)))
            (cells_first if swapped else cells_second).append(Cell(pid, f"{base}:b{sfx}", (req,)))

    scorable = [p for p in pairs if p.id not in failures]
    if settings.uses_aspects:
        tpl_s = templates["score"]
        for p in scorable:
            cols = []
            for i, spec in enumerate(aspects[p.id]):
                base = _col(spec, i, settings.dynamic)
                cols.append(base)
                add(p.id, base, lambda sw, p=p, spec=spec: score_request(tpl_s, task, p, spec, sw,
                                                                          settings.logprobs))
            base_cols[p.id] = cols
    else:
        role = settings.mode
        tpl_o = templates[role]
        for p in scorable:
            add(p.id, "overall", lambda sw, p=p: overall_request(tpl_o, task, p, sw, role))
            base_cols[p.id] = ["overall"]
    reader = (_read_cot if settings.mode == "cot"
              else _read_pair_weighted if settings.uses_aspects and settings.logprobs else _read_pair)
    n_req = len(cells_first)
    if progress is not None:
        progress.stage(f"pairwise scoring: {len(scorable)} pairs, {n_req} prompts", 2 * n_req)
    m1 = fill_matrix(llm, cells_first, lambda cs: _side(reader(cs[0]), 0), concurrency, progress)
    m2 = fill_matrix(llm, cells_second, lambda cs: _side(reader(cs[0]), 1), concurrency, progress)
    if progress is not None:
        progress.end_stage()
    matrix = _merge(ids, [m1, m2])
    for f in matrix.failures:
        fail(f.sample_id, f"{f.criterion_key}: {f.reason}")

    # -- prompt aggregation: the aspect scores go back to the LLM
    if settings.mode == "prompt-agg":
        tpl_p = templates["prompt_agg"]
        agg_a: list[Cell] = []
        agg_b: list[Cell] = []
        for p in scorable:
            if p.id in failures:
                continue
            sa, sb = _mean_scores(matrix, p.id, base_cols[p.id], settings.swap)
            specs, w = aspects[p.id], weights[p.id]
            for swapped in orders:
                first, second = (sb, sa) if swapped else (sa, sb)
                lines = "".join(f"- {s.name} ({w[j] * 100:.0f}%): Response A {first[j]:g}; "
                                f"Response B {second[j]:g}\n" for j, s in enumerate(specs))
                req = structured_pair(_req(tpl_p, {"task_description": task.description,
                                                   "pair": pair_block(task, p, swapped), "aspect_scores": lines}, 8,
                                                   answer=TWO_SCORES))
                sfx = SWAP if swapped else ""
                (agg_b if swapped else agg_a).append(Cell(p.id, f"overall:a{sfx}", (req,)))
                (agg_a if swapped else agg_b).append(Cell(p.id, f"overall:b{sfx}", (req,)))
        m3 = fill_matrix(llm, agg_a, lambda cs: _side(_read_pair(cs[0]), 0), concurrency, progress)
        m4 = fill_matrix(llm, agg_b, lambda cs: _side(_read_pair(cs[0]), 1), concurrency, progress)
        extra = _merge(ids, [m3, m4])
        for f in extra.failures:
            fail(f.sample_id, f"{f.criterion_key}: {f.reason}")
        matrix = _merge(ids, [matrix, extra])

    # -- aggregation
    totals = np.full((len(ids), 2), np.nan)
    labels: list[str | None] = []
    labels_ab: list[str | None] = []
    consistent: dict[str, bool] = {}
    for i, p in enumerate(pairs):
        if p.id in failures:
            labels.append(None)
            labels_ab.append(None)
            continue
        if settings.mode == "dna":
            cols, w = base_cols[p.id], weights[p.id]
        else:
            cols, w = ["overall"], np.ones(1)
        sa, sb = _mean_scores(matrix, p.id, cols, settings.swap)
        ta, tb = weighted_totals(sa, sb, w)
        totals[i] = (ta, tb)
        labels.append(decide(ta, tb, settings.tie_margin))
        labels_ab.append(None if ta == tb else ("a" if ta > tb else "b"))
        if settings.swap:
            fa, fb = _order_scores(matrix, p.id, cols, "")
            ra, rb = _order_scores(matrix, p.id, cols, SWAP)
            consistent[p.id] = (decide(*weighted_totals(fa, fb, w), settings.tie_margin)
                                == decide(*weighted_totals(ra, rb, w), settings.tie_margin))
    diffs = None
    if settings.uses_aspects and not settings.dynamic:
        keys = list(task.aspect_keys)
        diffs = np.full((len(ids), len(keys)), np.nan)
        for i, p in enumerate(pairs):
            if p.id not in failures:
                sa, sb = _mean_scores(matrix, p.id, keys, settings.swap)
                diffs[i] = sa - sb
    return PairScoreResult(
        ids, ["total_a", "total_b"], totals, matrix, usage_of(llm), labels=labels, labels_ab=labels_ab,
        pair_aspects=aspects, weights={k: [float(x) for x in v] for k, v in weights.items()},
        failures=failures, consistent=consistent, diffs=diffs)


def _merge(ids: list[str], parts: Sequence[ScoreMatrix]) -> ScoreMatrix:
    cols = list(dict.fromkeys(c for m in parts for c in m.criterion_keys))
    values = np.full((len(ids), len(cols)), np.nan)
    row = {s: i for i, s in enumerate(ids)}
    col = {c: j for j, c in enumerate(cols)}
    failures = []
    for m in parts:
        for r, sid in enumerate(m.sample_ids):
            for c, key in enumerate(m.criterion_keys):
                if not math.isnan(m.values[r, c]):
                    values[row[sid], col[key]] = m.values[r, c]
        failures += m.failures
    return ScoreMatrix(ids, cols, values, failures)


def _cell(m: ScoreMatrix, sid: str, key: str) -> float:
    index = m.__dict__.get("_dna_index")  # row / column positions, built once per matrix
    if index is None:
        index = ({s: i for i, s in enumerate(m.sample_ids)}, {k: j for j, k in enumerate(m.criterion_keys)})
        m.__dict__["_dna_index"] = index
    return float(m.values[index[0][sid], index[1][key]])


def _order_scores(m: ScoreMatrix, sid: str, cols: Sequence[str], sfx: str) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([_cell(m, sid, f"{c}:a{sfx}") for c in cols]),
            np.array([_cell(m, sid, f"{c}:b{sfx}") for c in cols]))


def _mean_scores(m: ScoreMatrix, sid: str, cols: Sequence[str], swap: bool) -> tuple[np.ndarray, np.ndarray]:
    a, b = _order_scores(m, sid, cols, "")
    if swap:
        ra, rb = _order_scores(m, sid, cols, SWAP)
        a, b = (a + ra) / 2, (b + rb) / 2
    return a, b


# ----------------------------------------------------------------------------- fitted
class DnaEvaluator(Saving):
    """A Decompose-and-Aggregate judge of pairs (optionally with a learned aggregator)."""

    method = "dna"

    def __init__(self, task: Task, templates: dict[str, Template], settings: Settings, llm: LLMConfig,
                 llm_identity: str, metrics: dict[str, Any], learned: Learned | None = None,
                 extra: dict[str, Any] | None = None, score_table=None):
        self.task = task
        self.templates = templates
        self.settings = settings
        self.llm = llm
        self.llm_identity = llm_identity
        self.metrics = metrics
        self.learned = learned
        self.extra = dict(extra or {})
        self.score_table = score_table
        self.warnings: list[str] = []
        self.path: Path | None = None

    def method_args(self) -> dict[str, Any]:
        return self.settings.to_dict()

    def columns_needed(self) -> list[str]:
        s = self.settings
        if not s.uses_aspects:
            bases = ["overall"]
        elif s.dynamic:
            bases = [f"aspect{i + 1}" for i in range(s.k)]
        else:
            bases = list(self.task.aspect_keys)
        if s.mode == "prompt-agg":
            bases = bases + ["overall"]
        sfx = ["", SWAP] if s.swap else [""]
        return [f"{b}:{side}{x}" for b in bases for x in sfx for side in "ab"]

    def score(self, samples: Sequence[PairSample], backend=None, cache_dir=None, concurrency: int = 8,
              progress: Progress | None = None) -> PairScoreResult:
        samples = list(samples)
        if not samples:
            raise DataError("no pairs to score")
        if not all(isinstance(s, PairSample) for s in samples):
            raise DataError("the dna method scores pairs (output_a / output_b), not single outputs")
        own = backend is None
        if own:
            from hdeval.llm import open_llm

            backend = open_llm(self.llm.replace(cache_dir=str(cache_dir) if cache_dir else None))
        try:
            res = run_pairs(backend, self.task, self.templates, self.settings, samples, concurrency, progress)
            res.usage = usage_of(backend)
        finally:
            if own:
                backend.close()
        if self.learned is not None and res.diffs is not None:
            ok = ~np.isnan(res.diffs).any(axis=1)
            lab: list[str | None] = [None] * len(samples)
            lab_ab: list[str | None] = [None] * len(samples)
            if ok.any():
                for i, a, b in zip(np.flatnonzero(ok), self.learned.predict(res.diffs[ok]),
                                   self.learned.predict_ab(res.diffs[ok])):
                    lab[i], lab_ab[i] = a, b
            res.learned_labels, res.learned_ab = lab, lab_ab
        return res

    def output_rows(self, samples: Sequence[PairSample], result: PairScoreResult) -> list[dict[str, Any]]:
        """The JSON lines ``apply`` writes: one per pair."""
        s = self.settings
        rows = []
        for i, p in enumerate(samples):
            ta, tb = result.predictions[i]
            row: dict[str, Any] = {"id": p.id, "doc_id": p.doc_id, "prediction": result.labels[i],
                                   "totals": None if math.isnan(ta) else {"a": round(float(ta), 6),
                                                                          "b": round(float(tb), 6)}}
            if result.learned_labels is not None:
                row["learned_prediction"] = result.learned_labels[i]
            if s.uses_aspects and p.id in result.pair_aspects:
                w = result.weights.get(p.id)
                items = []
                for j, spec in enumerate(result.pair_aspects[p.id]):
                    base = _col(spec, j, s.dynamic)
                    sa, sb = (_mean_scores(result.criteria, p.id, [base], s.swap)
                              if base + ":a" in result.criteria.criterion_keys else ([math.nan], [math.nan]))
                    items.append({"aspect": spec.name, "weight": None if w is None else round(w[j], 6),
                                  "a": _num(sa[0]), "b": _num(sb[0])})
                row["aspects"] = items
            if p.id in result.consistent:
                row["position_consistent"] = result.consistent[p.id]
            if p.id in result.failures:
                row["failures"] = result.failures[p.id]
            if p.label is not None:
                row["human"] = p.label
            rows.append(row)
        return rows

    reports = True

    def export_refusal(self) -> str | None:
        # weights and dynamic aspects are asked per pair as JSON with re-asks on a bad reply: a
        # conversation an offline batch engine cannot hold
        s = self.settings
        if s.mode == "dna" or s.aspect_source == "dynamic":
            return (f"--export-requests cannot serve DnA with mode {s.mode!r} and aspects {s.aspect_source!r} "
                    "yet: its weights or aspects are asked per pair as JSON with re-asks; use --batch "
                    "or an OpenAI-compatible server")
        return None

    def held_out_labels(self, test: Any) -> dict[str, tuple[list, list]]:
        """The ``prediction`` column, forced to a or b by ``total_a`` / ``total_b`` (equal totals
        give no side, as DnA does), and ``learned_prediction`` / ``learned_prediction_ab``."""
        def label(x: Any) -> str | None:  # NaN / None / empty: failed
            return x if isinstance(x, str) and x in ("a", "b", "tie") else None

        pred = [label(x) for x in test["prediction"]]
        ta, tb = test["total_a"].to_numpy(float), test["total_b"].to_numpy(float)
        out = {"evaluator": (pred, [None if p is None or a == b else ("a" if a > b else "b")
                                    for p, a, b in zip(pred, ta, tb)])}
        if "learned_prediction" in test and "learned_prediction_ab" in test:
            out["learned"] = ([label(x) for x in test["learned_prediction"]],
                              [label(x) for x in test["learned_prediction_ab"]])
        return out

    def write_report(self, out: Any, progress: Any = None, **options: Any) -> tuple[Any, str, list[str]]:
        from hdeval.methods.pair_report import write_pair_report

        page, lines = write_pair_report(self, out, data=options.get("data"), cache_dir=options.get("cache_dir"))
        return page, "report.json", lines

    def summary_line(self) -> str:
        """One line for the CLI: the held-out agreement with the human labels."""
        t = self.metrics.get("test", {})
        parts = []
        for key in (self.metrics.get("primary"), "learned"):
            a = t.get(key)
            if a:
                parts.append(f"{key} w/o ties {a['wo_ties']}, w/ ties {a['w_ties']}")
        pc = self.metrics.get("position_consistency")
        if pc is not None:
            parts.append(f"position consistency {pc}")
        return "held-out agreement with human labels: " + "; ".join(parts)

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        for role, t in self.templates.items():
            out.text(f"prompts/{PROMPT_FILES[role]}.toml", t.source)
        out.json(METRICS, self.metrics)
        if self.learned is not None:
            out.json(LEARNED, self.learned.to_dict())
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        return {"prompts": {PROMPT_FILES[r]: t.digest for r, t in self.templates.items()}, **self.extra}

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "DnaEvaluator":
        m = art.manifest
        where = str(art.path / "manifest.json")
        settings = Settings.from_dict(m.get("method_args"), where)
        files = m.get("files") or {}
        needed = [f"prompts/{PROMPT_FILES[r]}.toml" for r in settings.prompt_roles] + [METRICS]
        for name in needed:
            if name not in files:
                raise ArtifactError(f"{where}: no checksum recorded for {name}")
        try:
            task = task_from_dict(m["task"], where=where)
            templates = {r: parse_template(PROMPT_FILES[r], art.text(f"prompts/{PROMPT_FILES[r]}.toml"),
                                           str(art.path / f"prompts/{PROMPT_FILES[r]}.toml"))
                         for r in settings.prompt_roles}
            learned = None
            if LEARNED in files:
                learned = Learned.from_dict(art.json(LEARNED), str(art.path / LEARNED))
                if learned.aspects != list(task.aspect_keys):
                    raise ArtifactError(f"{art.path / LEARNED}: its aspects do not match the task's")
            llm = m.get("llm") or {}
            ev = cls(task, templates, settings,
                     LLMConfig(model=llm.get("model") or "", base_url=llm.get("base_url")),
                     str(llm.get("identity", "")), art.json(METRICS), learned,
                     {k: m[k] for k in ("seed", "split", "config") if k in m})
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{art.path}: malformed artifact ({exc})") from exc
        if task.shape != "pairwise":
            raise ArtifactError(f"{where}: a dna artifact needs a pairwise task")
        ev.warnings = list(art.warnings)
        ev.path = art.path
        return ev


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 6)


# ----------------------------------------------------------------------------- fit
def _split_metrics(res: PairScoreResult, pairs: Sequence[PairSample], idx: np.ndarray,
                   primary: str) -> dict[str, Any]:
    human = [pairs[i].label for i in idx]
    out = {primary: agreement(human, [res.labels[i] for i in idx], [res.labels_ab[i] for i in idx])}
    if res.learned_labels is not None:
        out["learned"] = agreement(human, [res.learned_labels[i] for i in idx],
                                   [res.learned_ab[i] for i in idx])
    if res.consistent:
        got = [res.consistent[pairs[i].id] for i in idx if pairs[i].id in res.consistent]
        out["position_consistency"] = round(sum(got) / len(got), 6) if got else None
    return out


def _mean_weights(res: PairScoreResult, dynamic: bool, limit: int = 50) -> dict[str, Any]:
    sums: dict[str, list[float]] = {}
    for pid, w in res.weights.items():
        for spec, x in zip(res.pair_aspects[pid], w):
            sums.setdefault(spec.name.lower() if dynamic else spec.key, []).append(x)
    ranked = sorted(sums.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    if dynamic:
        return {k: {"mean": round(float(np.mean(v)), 6), "instances": len(v)} for k, v in ranked}
    return {k: round(float(np.mean(v)), 6) for k, v in ranked}


def fit(ctx: FitContext) -> DnaEvaluator:
    import pandas as pd

    from hdeval.aggregate import cv_folds

    settings = settings_of(ctx)
    task, pairs, split = ctx.prep.task, list(ctx.prep.samples), ctx.prep.split
    templates = load_dna_templates(settings.prompt_roles)
    ctx.progress.message(
        f"task {task.name}: {len(pairs)} pairs from {ctx.prep.data_path} ({len(split.train_ids)} train, "
        f"{len(split.test_ids)} test), dna mode {settings.mode}, LLM {shown_identity(ctx.llm.identity)}")
    ev = DnaEvaluator(task, templates, settings, ctx.llm_config, ctx.llm.identity, {})
    res = ev.score(pairs, backend=ctx.llm, concurrency=ctx.config.concurrency, progress=ctx.progress)
    rate = res.failure_rate
    if rate > ctx.config.max_failure_rate:
        pid = next(p.id for p, lab in zip(pairs, res.labels) if lab is None)
        raise ScoringError(
            f"{rate:.0%} of pairs could not be judged (threshold {ctx.config.max_failure_rate:.0%}), "
            f"e.g. pair {pid}: {res.failures[pid][0]}; the replies are cached")
    pos = {p.id: i for i, p in enumerate(pairs)}
    tr = np.array([pos[s] for s in split.train_ids])
    te = np.array([pos[s] for s in split.test_ids])
    primary = "llm_weights" if settings.mode == "dna" else settings.mode.replace("-", "_")

    # -- learned aggregation on the training split (predefined aspects only)
    learned_info: dict[str, Any]
    if res.diffs is None:
        why = ("dynamic aspects differ per instance, so there is no fixed feature per aspect"
               if settings.dynamic else f"mode {settings.mode} has no aspect scores")
        learned_info = {"skipped": f"learned aggregation is not defined here: {why}"}
    else:
        ok = ~np.isnan(res.diffs[tr]).any(axis=1)
        rows = tr[ok]
        y = [pairs[i].label for i in rows]
        if not {"a", "b"} <= set(y):
            learned_info = {"skipped": "the training split's usable pairs lack an a or a b label"}
        else:
            X = res.diffs[rows]
            model = fit_learned(X, y, ctx.config.seed)
            model.aspects = list(task.aspect_keys)
            ev.learned = model
            groups = [pairs[i].doc_id for i in rows]
            cv_pred: list[str | None] = [None] * len(rows)
            cv_ab: list[str | None] = [None] * len(rows)
            for a, b in cv_folds(groups, ctx.config.seed):
                if len(set(y[j] for j in a)) < 2:
                    continue
                fold = fit_learned(X[a], [y[j] for j in a], ctx.config.seed)
                for j, lab, lab_ab in zip(b, fold.predict(X[b]), fold.predict_ab(X[b])):
                    cv_pred[j], cv_ab[j] = lab, lab_ab
            coef = {c: dict(zip(model.aspects, row.round(6).tolist()))
                    for c, row in zip(model.classes[1:] if len(model.classes) == 2 else model.classes,
                                      model.coef)}
            learned_info = {
                "model": "logistic regression on per-aspect score differences (A - B)",
                "classes": model.classes, "coefficients": coef,
                "intercept": model.intercept.round(6).tolist(),
                "trained_on": len(rows), "cv_train": agreement(y, cv_pred, cv_ab),
                "other_kinds": "only logistic regression is fitted (the other aggregator kinds are not)",
            }
            if len(model.classes) == 2:
                learned_info["note"] = f"coefficients push towards {model.classes[1]!r} when positive"
            ok_all = ~np.isnan(res.diffs).any(axis=1)
            res.learned_labels = [None] * len(pairs)
            res.learned_ab = [None] * len(pairs)
            for i, a, b in zip(np.flatnonzero(ok_all), model.predict(res.diffs[ok_all]),
                               model.predict_ab(res.diffs[ok_all])):
                res.learned_labels[i], res.learned_ab[i] = a, b

    ev.metrics = {
        "method": "dna", "mode": settings.mode, "aspect_source": settings.aspect_source if settings.uses_aspects else None,
        "primary": primary,
        "split": {"train": len(split.train_ids), "test": len(split.test_ids)},
        "test": _split_metrics(res, pairs, te, primary),
        "train": _split_metrics(res, pairs, tr, primary),
        "learned": learned_info,
        "failure_rate": round(rate, 6),
        "failed_pairs": sum(1 for lab in res.labels if lab is None),
        "score_failures": len(res.criteria.failures),
        "usage": usage_of(ctx.llm),
        "notes": ("agreement is over pairs with a prediction (failed pairs are counted in 'failed'); "
                  "'wo_ties' forces a or b and counts equal totals as a miss"),
    }
    if settings.uses_aspects:
        ev.metrics["mean_weights"] = _mean_weights(res, settings.dynamic)
    if settings.swap:
        got = list(res.consistent.values())
        ev.metrics["position_consistency"] = round(sum(got) / len(got), 6) if got else None

    split_of = {s: "train" for s in split.train_ids} | {s: "test" for s in split.test_ids}
    table = pd.DataFrame(res.criteria.values, columns=res.criteria.criterion_keys)
    table.insert(0, "split", [split_of[s] for s in res.sample_ids])
    table.insert(0, "pair_id", res.sample_ids)
    table["total_a"] = res.predictions[:, 0]
    table["total_b"] = res.predictions[:, 1]
    table["prediction"] = res.labels
    if res.learned_labels is not None:
        table["learned_prediction"] = res.learned_labels
        table["learned_prediction_ab"] = res.learned_ab  # forced to a or b: the w/o-ties figure
    table["human"] = [p.label for p in pairs]
    ev.score_table = table
    ev.extra = run_record(ctx)
    return ev






# ----------------------------------------------------------------------------- dry run
# Completion tokens a stage's reply is estimated to take (its max_tokens bounds the real figure).
_PLAN_COMPLETION = {"aspects": 40, "weights": 8, "score": 2, "direct": 2, "cot": 300, "prompt_agg": 2}


def plan_dna(config, prep, backend=None) -> list:
    """DnA's calls per stage without calling the LLM (``hdeval train --method dna --dry-run``).

    Stages whose requests are known before the run (predefined aspects' weights and scores, the
    direct and chain-of-thought baselines, dynamic aspects) are counted exactly, identical
    requests once, with how many are cached. With dynamic aspects the weights and scores depend on
    the proposed aspects: k per pair is counted and their cache state is unknown. Re-asks of
    unusable JSON replies are not counted.
    """
    from hdeval.methods.dna import METHOD
    from hdeval.methods.run import LayerPlan, open_backend, prompt_chars

    opts = {**{k: o.default for k, o in METHOD.options.items()}, **(config.method_options or {})}
    settings = Settings(mode=opts["dna_mode"], aspect_source=opts["aspect_source"], k=opts["k"],
                        tie_margin=opts["tie_margin"], swap=opts["swap"],
                        logprobs=opts["logprob_scores"]).check()
    task, pairs = prep.task, list(prep.samples)
    templates = load_dna_templates(settings.prompt_roles)
    orders = (False, True) if settings.swap else (False,)
    llm = open_backend(config, backend, offline=True)
    plans: list = []

    def exact(n: int, stage: str, role: str, reqs: list) -> None:
        distinct = {llm.key(r): r for r in reqs}
        plans.append(LayerPlan(n, 0, len(distinct), sum(llm.is_cached(r) for r in distinct.values()), False,
                               sum(prompt_chars(r) for r in distinct.values()) // 4,
                               len(distinct) * _PLAN_COMPLETION[role], stage=stage))

    def estimated(n: int, stage: str, role: str, calls: int, chars_per_call: float) -> None:
        plans.append(LayerPlan(n, 0, calls, None, False, int(calls * chars_per_call / 4),
                               calls * _PLAN_COMPLETION[role], stage=stage))

    try:
        if not settings.uses_aspects:
            role = settings.mode
            exact(1, f"{role} x {len(orders)} order(s)", role, [
                overall_request(templates[role], task, p, sw, role)  # as run_pairs asks
                for p in pairs for sw in orders])
            return plans
        fixed = [AspectSpec(a.key, a.name, a.definition) for a in task.aspects]

        def weights_req(p: PairSample, specs: list[AspectSpec]) -> CompletionRequest:
            return weights_request(templates["weights"], task, p, specs)

        def score_req(p: PairSample, spec: AspectSpec, sw: bool) -> CompletionRequest:
            return score_request(templates["score"], task, p, spec, sw, settings.logprobs)

        n_orders = len(orders)
        if settings.dynamic:
            exact(1, "aspects", "aspects", [
                _req(templates["aspects"], {"task_description": task.description,
                                            "question": question_block(task, p), "k": str(settings.k)},
                     600, json_schema=aspects_schema(settings.k)) for p in pairs])
            # the proposed aspects are not known yet: size a weights / score prompt with generic ones
            generic = [AspectSpec(f"aspect {i + 1:<5}", f"aspect {i + 1:<5}", "y" * 80) for i in range(settings.k)]
            w_chars = np.mean([prompt_chars(weights_req(p, generic)) for p in pairs])
            s_chars = np.mean([prompt_chars(score_req(p, generic[0], False)) for p in pairs])
            estimated(2, "weights", "weights", len(pairs), w_chars)
            estimated(3, f"aspect scores ({settings.k} per pair x {n_orders} order(s))", "score",
                      len(pairs) * settings.k * n_orders, s_chars)
        else:
            exact(1, "weights", "weights", [weights_req(p, fixed) for p in pairs])
            exact(2, f"aspect scores ({len(fixed)} per pair x {n_orders} order(s))", "score",
                  [score_req(p, spec, sw) for p in pairs for spec in fixed for sw in orders])
        if settings.mode == "prompt-agg":
            chars = np.mean([prompt_chars(score_req(p, fixed[0], False)) for p in pairs]) + 60 * (
                settings.k if settings.dynamic else len(fixed))
            estimated(len(plans) + 1, f"prompt aggregation x {n_orders} order(s)", "prompt_agg",
                      len(pairs) * n_orders, chars)
        return plans
    finally:
        llm.close()


# ----------------------------------------------------------------------------- the fake LLM
_FAKE_SAMPLE = re.compile(r"<sample>\n(.*?)\n</sample>", re.S)
_FAKE_K = re.compile(r"exactly (\d+) aspects")
_FAKE_KEYS = re.compile(r"^Aspect keys: (.*)$", re.M)
_FAKE_ASPECT = re.compile(r"^Aspect: (.+?):", re.M)
_FAKE_FACETS = ["clarity", "correctness", "completeness", "relevance", "conciseness", "depth",
                "safety", "creativity", "structure", "tone"]


def _fake_prompt(request: CompletionRequest) -> tuple[str, int]:
    prompt = "\n".join(m.content for m in request.messages)
    return prompt, max(1, len(prompt) // 4)


def _fake_sample(request: CompletionRequest) -> str:
    user = next((m.content for m in request.messages if m.role == "user"), "")
    m = _FAKE_SAMPLE.search(user)
    return m.group(1) if m else user


def _fake_split(block: str) -> tuple[str, str, str]:
    q, _, rest = block.partition("\n\nResponse A:\n")
    a, _, b = rest.partition("\n\nResponse B:\n")
    return q, a, b


def fake_quality(text: str, aspect: str) -> float:
    """A deterministic 1-10 quality: longer and less repetitive is better, per aspect in varying
    measure, plus noise (so a weighted sum and a learned aggregator have something to find)."""
    words = re.findall(r"\w+", text.lower())
    uniq = len(set(words)) / max(1, len(words))
    length = math.tanh(len(words) / 120)
    w = _unit("dna-w", aspect)
    x = 0.55 * (w * length + (1 - w) * uniq) + 0.25 * length + 0.2 * _unit("dna-noise", aspect, text)
    return 1.0 + 9.0 * min(1.0, max(0.0, x))


def _fake_pair_scores(request: CompletionRequest, aspect: str) -> tuple[int, int]:
    _, first, second = _fake_split(_fake_sample(request))
    bias = 1.0 if _unit("dna-bias", aspect) < 0.4 else 0.0  # some aspects favour the first shown
    sa = min(10, max(1, round(fake_quality(first, aspect) + bias)))
    sb = min(10, max(1, round(fake_quality(second, aspect))))
    return sa, sb


@responder("dna_aspects")
def _fake_aspects(request: CompletionRequest, fake) -> Completion:
    prompt, n = _fake_prompt(request)
    m = _FAKE_K.search(prompt)
    k = int(m.group(1)) if m else 4
    q = _fake_sample(request)
    start = int(_unit("dna-aspects", q) * len(_FAKE_FACETS))
    names = [_FAKE_FACETS[(start + i) % len(_FAKE_FACETS)] for i in range(k)]
    text = json.dumps({"aspects": [{"name": x, "definition": f"How well the response shows {x}."} for x in names]})
    return Completion(text, None, n, max(1, len(text) // 4))


@responder("dna_weights")
def _fake_weights(request: CompletionRequest, fake) -> Completion:
    prompt, n = _fake_prompt(request)
    m = _FAKE_KEYS.search(prompt)
    try:
        keys = json.loads(m.group(1)) if m else []
    except json.JSONDecodeError:
        keys = []
    q = _fake_sample(request)
    text = json.dumps({"weights": {k: 5 + round(40 * _unit("dna-weight", q, str(k))) for k in keys}})
    return Completion(text, None, n, max(1, len(text) // 4))


def _fake_two(request: CompletionRequest, sa: int, sb: int) -> str:
    """The two scores as the request asks for them: by schema when it has one, else "7 4"."""
    return json.dumps({"score_a": sa, "score_b": sb}) if request.json_schema else f"{sa} {sb}"


@responder("dna_score")
def _fake_score(request: CompletionRequest, fake) -> Completion:
    prompt, n = _fake_prompt(request)
    m = _FAKE_ASPECT.search(prompt)
    sa, sb = _fake_pair_scores(request, m.group(1) if m else "aspect")
    return Completion(_fake_two(request, sa, sb), None, n, 2)


@responder("dna_direct")
def _fake_direct(request: CompletionRequest, fake) -> Completion:
    _, n = _fake_prompt(request)
    sa, sb = _fake_pair_scores(request, "overall")
    return Completion(_fake_two(request, sa, sb), None, n, 2)


@responder("dna_cot")
def _fake_cot(request: CompletionRequest, fake) -> Completion:
    _, n = _fake_prompt(request)
    sa, sb = _fake_pair_scores(request, "overall-cot")
    text = (f"Response A covers the question with {sa} of 10 in quality; 8 points matter here.\n"
            f"Response B is weaker or stronger in places.\nScores: {sa} {sb}")
    return Completion(text, None, n, len(text) // 4)


_FAKE_AGG_LINE = re.compile(r"^- .+? \((\d+)%\): Response A ([\d.]+); Response B ([\d.]+)$", re.M)


@responder("dna_prompt_agg")
def _fake_prompt_agg(request: CompletionRequest, fake) -> Completion:
    prompt, n = _fake_prompt(request)
    rows = [(float(w), float(a), float(b)) for w, a, b in _FAKE_AGG_LINE.findall(prompt)]
    total = sum(w for w, _, _ in rows) or 1.0
    sa = sum(w * a for w, a, _ in rows) / total
    sb = sum(w * b for w, _, b in rows) / total
    return Completion(_fake_two(request, min(10, max(1, round(sa))), min(10, max(1, round(sb)))), None, n, 2)
