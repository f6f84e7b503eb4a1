"""Hierarchy-aware criterion scoring (paper 2.1, App. G.2): requests in, ScoreMatrix out."""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from hdeval.backends.base import Backend, Completion, CompletionRequest
from hdeval.prompts import Template, scoring_messages
from hdeval.progress import Progress
from hdeval.runner import run_requests
from hdeval.types import CriteriaTree, Criterion, Failure, Sample, ScoreMatrix, Task

SCALE = (1, 5)
TOP_LOGPROBS = 10
SCORE_MAX_TOKENS = 8
_MIN_DIGIT_MASS = 0.05  # below this the digits are not what the model meant to say
_INT = re.compile(r"-?\d+")


def scoring_request(
    template: Template, task: Task, tree: CriteriaTree, criterion: Criterion, sample: Sample
) -> CompletionRequest:
    return CompletionRequest(
        messages=scoring_messages(template, task, tree, criterion, sample),
        temperature=0.0,
        max_tokens=SCORE_MAX_TOKENS,
        top_logprobs=TOP_LOGPROBS,
        kind="score",
    )


def parse_score(completion: Completion, scale: tuple[int, int] = SCALE) -> tuple[float, str | None]:
    """A score in ``scale`` or (NaN, reason).

    With logprobs: the probability-weighted mean over the digit tokens at the first generated
    position that offers digits (as G-Eval does). Without: the first integer in the reply.
    """
    low, high = scale
    if completion.top_logprobs:
        for position in completion.top_logprobs:
            mass = 0.0
            total = 0.0
            for alt in position:
                tok = alt.token.strip()
                if tok.isdigit() and low <= int(tok) <= high:
                    p = math.exp(alt.logprob)
                    mass += p
                    total += p * int(tok)
            if mass >= _MIN_DIGIT_MASS:
                return total / mass, None
            if any(alt.token.strip() for alt in position):
                break  # the first real token is not a digit: fall back to the text
    m = _INT.search(completion.text or "")
    if m is None:
        return math.nan, f"no score in reply: {_clip(completion.text)}"
    value = int(m.group())
    if not low <= value <= high:
        return math.nan, f"score {value} outside {low}-{high}: {_clip(completion.text)}"
    return float(value), None


def _clip(text: str, n: int = 60) -> str:
    t = " ".join((text or "").split())
    return repr(t if len(t) <= n else t[: n - 3] + "...")


def score_requests(
    template: Template,
    task: Task,
    tree: CriteriaTree,
    criteria: Sequence[Criterion],
    samples: Sequence[Sample],
) -> list[CompletionRequest]:
    """Sample-major order: every criterion of one sample back to back (prefix reuse)."""
    return [scoring_request(template, task, tree, c, s) for s in samples for c in criteria]


def score_criteria(
    backend: Backend,
    template: Template,
    task: Task,
    tree: CriteriaTree,
    criteria: Sequence[Criterion],
    samples: Sequence[Sample],
    concurrency: int = 8,
    progress: Progress | None = None,
) -> ScoreMatrix:
    """Score every sample on every criterion. Unusable replies become NaN + a Failure."""
    requests = score_requests(template, task, tree, criteria, samples)
    completions = run_requests(backend, requests, concurrency, progress)
    values = np.full((len(samples), len(criteria)), np.nan)
    failures: list[Failure] = []
    k = 0
    for i, s in enumerate(samples):
        for j, c in enumerate(criteria):
            value, reason = parse_score(completions[k])
            k += 1
            values[i, j] = value
            if reason is not None:
                failures.append(Failure(s.id, c.key, reason))
    return ScoreMatrix([s.id for s in samples], [c.key for c in criteria], values, failures)
