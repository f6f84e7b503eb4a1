"""``direct``: each human aspect scored directly by the LLM (the G-Eval-style baseline).

No decomposition and no learned aggregator: the LLM's 1-5 score for an aspect (probability-
weighted over the digit tokens) is the prediction, mapped linearly onto the aspect's range so the
output reads on the human scale (a monotone map: correlations are those of the raw score). It is
what HD-Eval's ``direct_layer1`` figure reports, as a method of its own, so it can be applied,
compared and benchmarked like the others with the same LLM and the same prompts.
"""

from __future__ import annotations

from hdeval.urls import shown_identity

from typing import Any, Sequence

import numpy as np

from hdeval.artifact import ArtifactReader, ArtifactWriter
from hdeval.errors import ArtifactError, DataError
from hdeval.methods.base import (
    FitContext, ScoreResult, SimpleFitted, read_task_and_llm, run_record, score_rows, score_table, usage_of,
)
from hdeval.progress import Progress
from hdeval.prompts import load_templates, parse_template
from hdeval.scoring import SCALE, score_criteria
from hdeval.types import CriteriaTree, Sample, Task

METRICS = "metrics.json"
SCORES = "scores.csv"
PROMPT = "prompts/score.toml"


def to_range(values: np.ndarray, task: Task) -> np.ndarray:
    """Map 1-5 LLM scores (samples x aspects) linearly onto each aspect's range."""
    low, high = SCALE
    lo = np.array([a.range[0] for a in task.aspects])
    hi = np.array([a.range[1] for a in task.aspects])
    return lo + (np.asarray(values, float) - low) / (high - low) * (hi - lo)


class DirectEvaluator(SimpleFitted):
    """The task's aspects scored directly; nothing learned."""

    method = "direct"

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        return to_range(test[list(self.task.aspect_keys)].to_numpy(float), self.task)

    def benchmark_record(self) -> dict[str, Any]:
        return {"criteria": len(self.task.aspects)}  # one question per aspect

    @property
    def tree(self) -> CriteriaTree:
        return CriteriaTree.from_aspects(self.task.aspects)

    def method_args(self) -> dict[str, Any]:
        return {}

    def score(self, samples: Sequence[Sample], backend=None, cache_dir=None, concurrency: int | None = None,
              progress: Progress | None = None) -> ScoreResult:
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        backend, own = self.open_backend(backend, cache_dir)
        try:
            tree = self.tree
            if progress is not None:
                progress.stage(f"scoring {len(samples)} samples x {len(tree)} aspects", len(samples) * len(tree))
            m = score_criteria(backend, self.template, self.task, tree, tree.layer(1), samples,
                               concurrency, progress)
            if progress is not None:
                progress.end_stage()
            pred = to_range(m.values, self.task)
            return ScoreResult(m.sample_ids, list(self.task.aspect_keys), pred, m, usage_of(backend))
        finally:
            if own:
                backend.close()

    def output_rows(self, samples: Sequence[Sample], result: ScoreResult) -> list[dict[str, Any]]:
        """The JSON lines ``apply`` writes (the aspect scores are the columns)."""
        return score_rows(samples, result)

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        out.text(PROMPT, self.template.source)
        out.json(METRICS, self.metrics)
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        return {"prompts": {"score": self.template.digest}, **self.extra}

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "DirectEvaluator":
        m = art.manifest
        try:
            task, llm, identity = read_task_and_llm(art, (PROMPT, METRICS))
            ev = cls(task, parse_template("score", art.text(PROMPT), str(art.path / PROMPT)), llm, identity,
                     art.json(METRICS), {k: m[k] for k in ("seed", "split", "config") if k in m})
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{art.path}: malformed artifact ({exc})") from exc
        ev.warnings = list(art.warnings)
        ev.path = art.path
        return ev


def fit(ctx: FitContext) -> DirectEvaluator:
    from hdeval.metrics import metric_table

    task, samples, split = ctx.prep.task, ctx.prep.samples, ctx.prep.split
    template = load_templates()["score"]
    ctx.progress.message(
        f"task {task.name}: {len(samples)} samples from {ctx.prep.data_path} "
        f"({len(split.train_ids)} train, {len(split.test_ids)} test), LLM {shown_identity(ctx.llm.identity)}"
    )
    ev = DirectEvaluator(task, template, ctx.llm_config, ctx.llm.identity, {})
    res = ev.score(samples, backend=ctx.llm, concurrency=ctx.config.concurrency, progress=ctx.progress)
    rate = res.criteria.failure_rate
    if rate > ctx.config.max_failure_rate:
        from hdeval.errors import ScoringError

        ex = res.criteria.failures[0]
        raise ScoringError(
            f"{rate:.0%} of aspect scores could not be read (threshold {ctx.config.max_failure_rate:.0%}), "
            f"e.g. sample {ex.sample_id} on {ex.criterion_key}: {ex.reason}; the replies are cached"
        )
    pos = {s: i for i, s in enumerate(res.sample_ids)}
    te = np.array([pos[s] for s in split.test_ids])
    aspects = list(task.aspect_keys)
    Y = np.array([[s.scores[a] for a in aspects] for s in samples])
    usage = usage_of(ctx.llm)
    ev.metrics = {
        "split": {"train": len(split.train_ids), "test": len(split.test_ids)},
        "final": metric_table(Y[te], res.predictions[te], aspects),
        "failure_rate": rate,
        "usage": usage,
    }
    ev.score_table = score_table(res.sample_ids, res.criteria, split, Y, aspects)
    ev.extra = run_record(ctx)
    return ev


def plan(config: Any, prep: Any, backend: Any = None) -> list:
    """The dry run: one request per sample and aspect (identical prompts cost one call)."""
    from hdeval.methods.run import LayerPlan, open_backend, prompt_chars
    from hdeval.scoring import score_requests

    task = prep.task
    tree = CriteriaTree.from_aspects(task.aspects)
    reqs = score_requests(load_templates()["score"], task, tree, tree.layer(1), prep.samples)
    llm = open_backend(config, backend, offline=True)
    try:
        distinct = {llm.key(r): r for r in reqs}
        chars = sum(prompt_chars(r) for r in distinct.values())
        per_prompt = chars / len(distinct) / 4 if distinct else 0.0
        cached = sum(llm.is_cached(r) for r in distinct.values()) if distinct else None
        return [LayerPlan(1, 0, len(distinct), cached, False, int(per_prompt * len(distinct)), len(distinct) * 2,
                          requests=len(reqs))]
    finally:
        llm.close()
