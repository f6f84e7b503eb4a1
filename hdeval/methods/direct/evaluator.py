"""``direct``: each human aspect scored directly by the LLM (the G-Eval-style baseline), nothing
learned: the LLM's probability-weighted 1-5 score, mapped linearly onto the aspect's range (a
monotone map: correlations are the raw score's). HD-Eval's ``direct_layer1`` figure as a method of
its own, so it can be applied, compared and benchmarked like the others."""

from __future__ import annotations

from typing import Any

from hdeval.core.types import CriteriaTree, Sample
from hdeval.judge.prompts import load_templates
from hdeval.judge.scoring import SCALE, score_criteria
from hdeval.learn.intervals import fitted_intervals
from hdeval.methods.base import FitContext, SinglePromptFitted, fit_message, fit_unlearned
from hdeval.methods.state_file import PromptsState


class DirectEvaluator(SinglePromptFitted):
    """The task's aspects scored directly; nothing learned."""

    method = "direct"
    prompt = "score"
    stage = "scoring"
    scale = SCALE
    State = PromptsState  # the prompt's digest, nothing learned

    def benchmark_record(self) -> dict[str, Any]:
        return {"criteria": len(self.task.aspects)}  # one question per aspect

    @property
    def tree(self) -> CriteriaTree:
        return CriteriaTree.from_aspects(self.task.aspects)

    def ask(self, backend: Any, samples: list[Sample], concurrency: int | None, progress: Any) -> Any:
        tree = self.tree
        return score_criteria(
            backend, self.template, self.task, tree, tree.layer(1), samples, concurrency, progress
        )


def fit(ctx: FitContext) -> DirectEvaluator:
    task = ctx.prep.task
    fit_message(ctx, "samples")
    ev = DirectEvaluator(task, load_templates()["score"], ctx.llm_config, ctx.llm.identity, {})
    res, Y, tr, te = fit_unlearned(ctx, ev, "aspect scores")
    # nothing is fitted, so the training rows' residuals are as honest as held-out ones
    ev.metrics["intervals"] = fitted_intervals(
        Y,
        res.predictions[tr],
        tr,
        res.predictions[te],
        te,
        list(task.aspect_keys),
        [a.range for a in task.aspects],
        "the training split (nothing is fitted)",
    )
    return ev


def plan(config: Any, prep: Any, backend: Any = None) -> list:
    """The dry run: one request per sample and aspect (identical prompts cost one call)."""
    from hdeval.judge.scoring import score_requests
    from hdeval.methods.run import plan_known

    tree = CriteriaTree.from_aspects(prep.task.aspects)
    reqs = score_requests(load_templates()["score"], prep.task, tree, tree.layer(1), prep.samples)
    return plan_known(config, backend, reqs, 2, requests=len(reqs))
