"""``direct-yesno``: DIRECTEVAL, the PairEval paper's same-LLM baseline. P("Yes") that the
response is good (on an aspect), mapped linearly onto each aspect's range; nothing learned."""

from __future__ import annotations

from typing import Any

from hdeval.core.types import Aspect, Sample, Task
from hdeval.judge.fill import Cell, fill_matrix, label_probability
from hdeval.judge.prompts import Template, load_template
from hdeval.llm.backends.base import CompletionRequest
from hdeval.methods.base import FitContext, SinglePromptFitted, fit_unlearned
from hdeval.methods.comparisons import MAX_TOKENS, Example, history_fields, label_request
from hdeval.methods.state_file import PromptsState

YES_NO = ("Yes", "No")


def yesno_question(aspect: Aspect) -> str:
    if aspect.key == "overall":
        return "Is the above response a good response to the given conversation?"
    return (
        f"Judge the response only on this criterion: {aspect.name}: {aspect.definition} "
        f"Is the above response good on {aspect.name.lower()}?"
    )


def yesno_request(template: Template, task: Task, aspect: Aspect, target: Example) -> CompletionRequest:
    return label_request(
        template,
        task,
        YES_NO,
        "yesno",
        history=target.history,
        response=target.response,
        question=yesno_question(aspect),
    )


class YesNoEvaluator(SinglePromptFitted):
    """DIRECTEVAL: P("Yes") per aspect, mapped onto the aspect's range; nothing learned."""

    method = "direct-yesno"
    row_names = ("columns", "column")
    prompt = "yesno"
    stage = "asking"
    State = PromptsState  # the prompt's digest, nothing learned

    def ask(self, backend: Any, samples: list[Sample], concurrency: int | None, progress: Any) -> Any:
        history_fields(self.task)
        cells = [
            Cell(s.id, a.key, (yesno_request(self.template, self.task, a, target),))
            for s in samples
            for target in [Example.of(self.task, s)]
            for a in self.task.aspects
        ]
        return fill_matrix(
            backend, cells, lambda cs: label_probability(cs[0], *YES_NO), concurrency, progress
        )


def plan_yesno(config: Any, prep: Any, backend: Any = None) -> list:
    """The dry run: one request per sample and aspect, all known before the run."""
    from hdeval.methods.run import plan_known

    task, template = prep.task, load_template("yesno")
    history_fields(task)
    reqs = [yesno_request(template, task, a, Example.of(task, s)) for s in prep.samples for a in task.aspects]
    return plan_known(config, backend, reqs, MAX_TOKENS)


def fit_yesno(ctx: FitContext) -> YesNoEvaluator:
    ev = YesNoEvaluator(ctx.prep.task, load_template("yesno"), ctx.llm_config, ctx.llm.identity, {})
    fit_unlearned(ctx, ev, "yes/no answers")
    return ev
