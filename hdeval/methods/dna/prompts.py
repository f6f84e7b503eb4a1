"""The requests DnA sends: each stage's prompt filled in, with the answer it accepts."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from hdeval.core.types import PairSample, Task
from hdeval.judge.prompts import Template, load_template, neutralise
from hdeval.llm.backends.base import CompletionRequest
from hdeval.llm.backends.constraints import Scale
from hdeval.methods.dna.replies import AspectSpec, json_object, structured_pair

# the answer of every scoring prompt but chain-of-thought: "<score A> <score B>"
TWO_SCORES = Scale(1, 10, count=2)
TOP_LOGPROBS = 10  # alternatives asked per reply token when aspect scores are logprob-weighted
# prompt role -> prompt file name (prompts/<name>.toml, also the request kind)
PROMPT_FILES = {
    "aspects": "dna_aspects",
    "weights": "dna_weights",
    "score": "dna_score",
    "direct": "dna_direct",
    "cot": "dna_cot",
    "prompt_agg": "dna_prompt_agg",
}


def question_block(task: Task, pair: PairSample) -> str:
    parts = [f"{f.label}:\n{neutralise(pair.text(f.key))}" for f in task.fields if f.key != "output"]
    return "\n\n".join(parts)


def shown_pair(task: Task, pair: PairSample, swapped: bool = False) -> dict[str, str]:
    """The question and the two responses in the order shown (a scoring request's data)."""
    first, second = (pair.output_b, pair.output_a) if swapped else (pair.output_a, pair.output_b)
    return {
        "question": question_block(task, pair),
        "response_a": neutralise(first),
        "response_b": neutralise(second),
    }


def pair_block(task: Task, pair: PairSample, swapped: bool = False) -> str:
    shown = shown_pair(task, pair, swapped)
    return f"{shown['question']}\n\nResponse A:\n{shown['response_a']}\n\nResponse B:\n{shown['response_b']}"


def load_dna_templates(roles: Sequence[str]) -> dict[str, Template]:
    return {r: load_template(PROMPT_FILES[r]) for r in roles}


def _req(
    template: Template,
    values: dict[str, str],
    max_tokens: int,
    json_schema: str | None = None,
    answer: Scale | None = None,
    data: dict[str, Any] | None = None,
) -> CompletionRequest:
    return CompletionRequest(
        template.render(values),
        temperature=0.0,
        max_tokens=max_tokens,
        json_mode=json_schema is not None,
        json_schema=json_schema,
        answer=answer,
        kind=template.name,
        data=data or {},
    )


def aspects_schema(k: int) -> str:
    """The reply of stage 1 (dynamic aspects): a local model's grammar enforces it, a server
    gets it as structured outputs. Lengths are bounded so a constrained model cannot loop."""
    item = json_object(
        {"name": {"type": "string", "maxLength": 100}, "definition": {"type": "string", "maxLength": 600}}
    )
    return json.dumps(
        json_object({"aspects": {"type": "array", "items": item, "minItems": k, "maxItems": k}}),
        sort_keys=True,
    )


def aspects_request(template: Template, task: Task, p: PairSample, k: int) -> CompletionRequest:
    """Stage 1 (dynamic aspects): ``k`` aspects proposed from the question alone."""
    return _req(
        template,
        {"task_description": task.description, "question": question_block(task, p), "k": str(k)},
        600,
        json_schema=aspects_schema(k),
        data={"question": question_block(task, p), "k": k},
    )


def weights_schema(keys: Sequence[str]) -> str:
    """The reply of stage 2: one number per aspect key (the validator checks the rest)."""
    return json.dumps(
        json_object({"weights": json_object({k: {"type": "number"} for k in keys})}),
        sort_keys=True,
        ensure_ascii=False,
    )


def weights_request(
    template: Template, task: Task, p: PairSample, specs: Sequence[AspectSpec]
) -> CompletionRequest:
    """Stage 2: a percentage weight per aspect from the question alone."""
    listing = "".join(
        f"- {s.key}: {s.definition}\n" if s.key == s.name else f"- {s.key}: {s.name}: {s.definition}\n"
        for s in specs
    )
    return _req(
        template,
        {
            "task_description": task.description,
            "question": question_block(task, p),
            "aspects": listing,
            "aspect_keys": json.dumps([s.key for s in specs], ensure_ascii=False),
        },
        400,
        json_schema=weights_schema([s.key for s in specs]),
        data={"question": question_block(task, p), "aspect_keys": [s.key for s in specs]},
    )


def score_request(
    template: Template, task: Task, p: PairSample, spec: AspectSpec, swapped: bool, logprobs: bool = False
) -> CompletionRequest:
    """Stage 3: both responses scored 1-10 on one aspect, in the given order (with ``logprobs``:
    the top alternatives of every reply token asked for too)."""
    req = structured_pair(
        _req(
            template,
            {
                "task_description": task.description,
                "pair": pair_block(task, p, swapped),
                "aspect_name": spec.name,
                "aspect_definition": spec.definition,
            },
            8,
            answer=TWO_SCORES,
            data={**shown_pair(task, p, swapped), "aspect": spec.name},
        )
    )
    return dataclasses.replace(req, top_logprobs=TOP_LOGPROBS) if logprobs else req


def overall_request(
    template: Template, task: Task, p: PairSample, swapped: bool, role: str
) -> CompletionRequest:
    """A baseline's overall scores of both responses (``cot`` reasons in free text first)."""
    if role == "cot":
        return _req(
            template,
            {"task_description": task.description, "pair": pair_block(task, p, swapped)},
            512,
            data=shown_pair(task, p, swapped),
        )
    return structured_pair(
        _req(
            template,
            {"task_description": task.description, "pair": pair_block(task, p, swapped)},
            8,
            answer=TWO_SCORES,
            data=shown_pair(task, p, swapped),
        )
    )
