"""``direct-yesno``: DIRECTEVAL, the PairEval paper's same-LLM baseline. P("Yes") that the
response is good (on an aspect), mapped linearly onto each aspect's range; nothing learned."""

from __future__ import annotations

from typing import Any, Sequence

from hdeval.backends.base import Completion, CompletionRequest
from hdeval.backends.constraints import Labels
import hdeval.methods.paireval.fake  # noqa: F401  (registers the fake LLM's yesno answers)
from hdeval.judge import Cell, fill_matrix, label_probability
from hdeval.methods.base import FitContext, SinglePromptFitted, fit_unlearned
from hdeval.methods.comparisons import MAX_TOKENS, TOP_LOGPROBS, Example, history_fields, response_label
from hdeval.methods.paireval.fitted import _Dialogue
from hdeval.prompts import Template, load_template
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


class YesNoEvaluator(SinglePromptFitted, _Dialogue):
    """DIRECTEVAL: P("Yes") per aspect, mapped onto the aspect's range; nothing learned."""

    method = "direct-yesno"
    prompt = "yesno"
    stage = "asking"

    def ask(self, backend: Any, samples: list[Sample], concurrency: int | None, progress: Any) -> Any:
        history_fields(self.task)
        cells = []
        for s in samples:
            target = Example.of(self.task, s)
            for a in self.task.aspects:
                cells.append(Cell(s.id, a.key, (yesno_request(self.template, self.task, a, target),)))
        return fill_matrix(backend, cells, _p_yes, concurrency, progress)


def fit_yesno(ctx: FitContext) -> YesNoEvaluator:
    history_fields(ctx.prep.task)
    ev = YesNoEvaluator(ctx.prep.task, load_template("yesno"), ctx.llm_config, ctx.llm.identity, {})
    fit_unlearned(ctx, ev, "yes/no answers")
    return ev
