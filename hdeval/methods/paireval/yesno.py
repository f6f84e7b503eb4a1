"""``direct-yesno``: DIRECTEVAL, the PairEval paper's same-LLM baseline. P("Yes") that the
response is good (on an aspect), mapped linearly onto each aspect's range; nothing learned."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hdeval.artifact import ArtifactReader, ArtifactWriter
from hdeval.backends.base import Completion, CompletionRequest
from hdeval.backends.constraints import Labels
from hdeval.errors import ArtifactError, DataError, ScoringError
from hdeval.judge import Cell, fill_matrix, label_probability
from hdeval.methods.base import FitContext, ScoreResult, read_task_and_llm, run_record, score_table, usage_of
from hdeval.methods.comparisons import MAX_TOKENS, TOP_LOGPROBS, Example, history_fields, response_label
from hdeval.methods.paireval.fitted import METRICS, SCORES, YESNO_PROMPT, _Dialogue
from hdeval.progress import Progress
from hdeval.prompts import Template, load_template, parse_template
from hdeval.types import Aspect, Sample, Task

YES_NO = ("Yes", "No")


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
