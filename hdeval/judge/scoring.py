"""Hierarchy-aware criterion scoring (paper 2.1, App. G.2): requests in, ScoreMatrix out."""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import numpy as np

from hdeval.core.progress import Progress
from hdeval.core.types import CriteriaTree, Criterion, Sample, ScoreMatrix, Task
from hdeval.judge.prompts import Template, sample_block, scoring_messages
from hdeval.llm.backends.base import Backend, Completion, CompletionRequest
from hdeval.llm.backends.constraints import Scale

SCALE = (1, 5)
TOP_LOGPROBS = 10
SCORE_MAX_TOKENS = 8
_MIN_DIGIT_MASS = 0.05  # below this the digits are not what the model meant to say
# ASCII digits only: ``\d`` would also match an Arabic-Indic "٤" or a superscript "²"
_INT = re.compile(r"-?[0-9]+")
_DIGITS = re.compile(r"[0-9]{1,3}")


def scoring_request(
    template: Template, task: Task, tree: CriteriaTree, criterion: Criterion, sample: Sample
) -> CompletionRequest:
    return CompletionRequest(
        messages=scoring_messages(template, task, tree, criterion, sample),
        temperature=0.0,
        max_tokens=SCORE_MAX_TOKENS,
        top_logprobs=TOP_LOGPROBS,
        answer=Scale(*SCALE),
        kind="score",
        data={
            "sample": sample_block(task, sample),
            "criterion": criterion.key,
            "criterion_name": criterion.name,
        },
    )


def parse_score(completion: Completion, scale: tuple[int, int] = SCALE) -> tuple[float, str | None]:
    """A score in ``scale`` or (NaN, reason): with logprobs, the probability-weighted mean over the
    digit tokens offered where the score's digit was generated (as G-Eval does), when that digit
    is the likeliest of them and the tokens up to it spell the text's start; else from the text
    (a server may report probabilities from before its constraint, or for tokens it stripped)."""
    low, high = scale
    text = completion.text if isinstance(completion.text, str) else ""
    spelled = ""
    for position in completion.top_logprobs or ():
        if not position or not isinstance(position[0].token, str):
            break
        generated = position[0].token
        spelled += generated
        if not generated.strip():
            continue  # a space before the score
        if (
            not text.startswith(spelled)
            or not _DIGITS.fullmatch(generated.strip())
            or not low <= int(generated.strip()) <= high
        ):
            break  # the score's token is not this one: the text says it
        mass = total = 0.0
        best = -math.inf
        for alt in position:
            tok = alt.token.strip() if isinstance(alt.token, str) else ""
            if not _DIGITS.fullmatch(tok) or not low <= int(tok) <= high:
                continue
            lp = alt.logprob
            if not isinstance(lp, (int, float)) or math.isnan(lp) or lp > 1e-6:
                return math.nan, f"unreadable logprob {lp!r} for token {tok!r} in reply: {_clip(text)}"
            p = math.exp(max(min(lp, 0.0), -1e4))
            best = max(best, lp)
            mass += p
            total += p * int(tok)
        # greedy decoding picks the likeliest allowed digit: another one likelier means these
        # probabilities are not the ones the digit was chosen from
        if mass >= _MIN_DIGIT_MASS and position[0].logprob >= best - 1e-6:
            return total / mass, None
        break
    return _text_score(text, low, high)


def digit_score(scale: tuple[int, int]) -> Callable[[Sequence[Completion]], tuple[float, str | None]]:
    """The :func:`hdeval.judge.fill.fill_matrix` parser of a 1-request cell: :func:`parse_score`."""
    return lambda completions: parse_score(completions[0], scale)


def _text_score(text: str, low: int, high: int) -> tuple[float, str | None]:
    """The one value every number in the text gives (bar "out of 5", "a 1-5 scale"), in the scale."""
    from hdeval.judge.fill import _numbers

    text = text[:10_000]  # bounded: a score reply is a few tokens
    values = set(_numbers(text))
    if not values:
        return math.nan, f"no score in reply: {_clip(text)}"
    if math.inf in values:
        digits = max((len(m.group().lstrip("-").lstrip("0")) for m in _INT.finditer(text)), default=0)
        return math.nan, f"score with {digits} digits outside {low}-{high}: {_clip(text)}"
    if len(values) > 1:
        shown = ", ".join(f"{v:g}" for v in sorted(values)[:5])
        return math.nan, f"ambiguous reply: several scores ({shown}): {_clip(text)}"
    value = values.pop()
    if not low <= value <= high:
        return math.nan, f"score {value:g} outside {low}-{high}: {_clip(text)}"
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
    concurrency: int | None = None,
    progress: Progress | None = None,
) -> ScoreMatrix:
    """Score every sample on every criterion (sample-major); unusable replies and requests the
    server rejected on their own account become NaN + a Failure."""
    from hdeval.judge.fill import STREAM_WINDOW, Cell, fill_matrix

    if not samples or not criteria:  # keep the columns of an empty matrix
        return ScoreMatrix(
            [s.id for s in samples], [c.key for c in criteria], np.zeros((len(samples), len(criteria)))
        )
    # built as the client consumes them: a prompt is ~3 KB, a stage may hold millions
    cells = (
        Cell(s.id, c.key, (scoring_request(template, task, tree, c, s),)) for s in samples for c in criteria
    )
    rows = list(dict.fromkeys(s.id for s in samples))
    cols = list(dict.fromkeys(c.key for c in criteria))
    return fill_matrix(backend, cells, digit_score(SCALE), concurrency, progress, rows, cols, STREAM_WINDOW)
