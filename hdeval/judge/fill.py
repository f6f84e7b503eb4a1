"""Asking the LLM: :func:`fill_matrix`, the one place where prompt cells become requests and
replies become numbers (a samples x columns matrix every method fits to human judgments), the
reply parsers, and :func:`ask_json`, the one place a JSON reply is validated and re-asked."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Sequence, TypeVar

import numpy as np

from hdeval.core.errors import HdevalError, RequestRejected
from hdeval.core.progress import Progress
from hdeval.core.types import Failure, ScoreMatrix
from hdeval.llm.backends.base import Backend, Completion, CompletionRequest, Message
from hdeval.llm.cache.client import CachedBackend

T = TypeVar("T")

# A parser turns the completions of one cell into (value, None) or (NaN, reason).
Parser = Callable[[Sequence[Completion]], "tuple[float, str | None]"]


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: the sample (row), the column, and the request(s) that fill it, whose
    completions its parser sees in the same order (PairEval asks each pair in both orders)."""

    sample_id: str
    column: str
    requests: tuple[CompletionRequest, ...]


# Cells whose requests are built ahead of the calls when a stage is streamed: enough rounds of
# the concurrency window that the drain at each window's end costs little
STREAM_WINDOW = 1024
_STREAM_ROUNDS = 32


def fill_matrix(
    llm: Backend,
    cells: Iterable[Cell],
    parse: Parser,
    concurrency: int | None = None,
    progress: Progress | None = None,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    window: int | None = None,
    retry: Callable[[CompletionRequest, Completion], CompletionRequest | None] | None = None,
) -> ScoreMatrix:
    """Run every cell's requests (in cell order: put one sample's cells together so a local model
    reuses the prompt prefix) and parse them into a matrix, rows and columns in the order they
    first occur unless ``rows``/``cols`` name them. ``llm``'s client runs them (cache, Batch API,
    at most ``concurrency`` in flight, progress). An unusable reply, or a request the server
    rejected on its own account (named on ``progress``), becomes NaN plus a :class:`Failure`;
    errors about the whole run are raised. With ``window`` (and ``rows``/``cols``), cells are
    built as they are consumed, at most ``window`` at a time, so memory does not grow with the
    stage; one window when the client has a batch strategy (one job per stage) or no store.
    ``retry``: for a reply that asks for it (a JSON reply cut short), the request to ask once
    more instead (with more room); its reply is the one parsed.
    """
    if rows is None or cols is None:
        cells = list(cells)
        rows = list(dict.fromkeys(c.sample_id for c in cells))
        cols = list(dict.fromkeys(c.column for c in cells))
    row_of = {s: i for i, s in enumerate(rows)}
    col_of = {k: j for j, k in enumerate(cols)}
    values = np.full((len(rows), len(cols)), np.nan)
    failures: list[Failure] = []
    rejected: list[Failure] = []
    with _client(llm) as client:
        if window is None or client.batch is not None or client.store is None:
            windows: Iterable[list[Cell]] = [list(cells)]
        else:
            size = max(window, _STREAM_ROUNDS * client.concurrency)
            it = iter(cells)
            windows = iter(lambda: list(itertools.islice(it, size)), [])
        for chunk in windows:
            flat = [r for c in chunk for r in c.requests]
            got_all = client.complete_many(flat, progress, keep_rejected=True, concurrency=concurrency)
            if retry is not None:
                again = {
                    i: r
                    for i, (req, c) in enumerate(zip(flat, got_all))
                    if isinstance(c, Completion) and (r := retry(req, c)) is not None
                }
                if again:
                    redo = client.complete_many(
                        list(again.values()), keep_rejected=True, concurrency=concurrency
                    )
                    for i, c in zip(again, redo):
                        got_all[i] = c
            replies = iter(got_all)
            for c in chunk:
                got = list(itertools.islice(replies, len(c.requests)))
                refused = next((g for g in got if isinstance(g, RequestRejected)), None)
                if refused is not None:
                    value, reason = math.nan, " ".join(str(refused).split())[:300]  # one bounded line
                    rejected.append(Failure(c.sample_id, c.column, reason))
                else:
                    value, reason = parse(got)
                    if reason is None and not math.isfinite(value):
                        reason = f"the parser gave a non-finite value ({value!r})"
                if reason is not None:
                    value = math.nan
                    failures.append(Failure(c.sample_id, c.column, reason))
                values[row_of[c.sample_id], col_of[c.column]] = value
    if rejected and progress is not None:
        # name them: the user may want to shorten or drop these samples
        for f in rejected[:_NAMED_REJECTIONS]:
            progress.message(
                f"sample {f.sample_id} on {f.criterion_key}: {f.reason} (recorded as a failed score)"
            )
        if len(rejected) > _NAMED_REJECTIONS:
            progress.message(f"... and {len(rejected) - _NAMED_REJECTIONS} more requests the server rejected")
    return ScoreMatrix(rows, cols, values, failures)


_NAMED_REJECTIONS = 5


def _client(llm: Backend) -> ContextManager[CachedBackend]:
    """``llm``'s client; a bare backend (tests, the Python API) gets one without a cache."""
    if isinstance(llm, CachedBackend):
        return contextlib.nullcontext(llm)
    return contextlib.closing(CachedBackend(llm, None))


def label_probability(completion: Completion, target: str, other: str) -> tuple[float, str | None]:
    """P(``target``) normalised over the two label words, from the first generated token (" A" is
    "A"), when both are among its alternatives: one missing has a probability nobody reported
    (not 0), so the text decides, as it does without logprobs: 1.0 when it starts with (or only
    names) ``target``, 0.0 for ``other``; naming neither, or both with no way to tell, is a failure."""
    if completion.top_logprobs:
        mass = {target: 0.0, other: 0.0}
        for alt in completion.top_logprobs[0]:
            lp = alt.logprob
            if alt.token.strip() in mass and isinstance(lp, (int, float)) and not math.isnan(lp):
                mass[alt.token.strip()] += math.exp(min(0.0, lp))  # a logprob above 0 is a server error
        if mass[target] > 0 and mass[other] > 0:
            return mass[target] / (mass[target] + mass[other]), None
    text = (completion.text if isinstance(completion.text, str) else "").strip()[:2000]
    # "yes" is "Yes", but a lone "a" is an article, not the label "A"
    fold = (lambda w: w.lower()) if min(len(target), len(other)) > 1 else (lambda w: w)
    t, o = fold(target), fold(other)
    lead = _LEAD_LABEL.match(text)
    if lead and fold(lead.group(1)) in (t, o):
        return (1.0 if fold(lead.group(1)) == t else 0.0), None
    words = {fold(w) for w in re.findall(r"[A-Za-z]+", text)}
    if (t in words) != (o in words):
        return (1.0 if t in words else 0.0), None
    shown = " ".join(text.split())[:60]
    if t in words:
        return math.nan, f"ambiguous reply: it names both {target!r} and {other!r}: {shown!r}"
    return math.nan, f"the reply names neither {target!r} nor {other!r} alone: {shown!r}"


# A reply that opens with a label standing alone: "A", "B.", "(A)", "A:\nbecause ..."
_LEAD_LABEL = re.compile(r"\(?([A-Za-z]+)\)?\s*(?:[.:,;!\n]|$)")
_MAX_REPLY = 4000  # characters of a reply any parser reads: a longer one is not a score
_NUMBER = re.compile(r"(?:(?<![0-9A-Za-z])-)?(?<![0-9.])[0-9]+(?:\.[0-9]+)?(?![0-9])")
# "7/10", "8 out of 10": the denominator names the scale, it is not a score
_DENOMINATOR = re.compile(r"(?:/|\bout\s+of\b)\s*[0-9]+(?:\.0+)?(?![0-9.])", re.I)
# "(1-10)", "1 to 10", "on a 1-5 scale": the scale's bounds, not a score
_SCALE_MENTION = re.compile(r"(?<![0-9.])[0-9]+\s*(?:-|\u2013|to)\s*[0-9]+(?:\s*scale)?(?![0-9.])", re.I)
# one side's score named by its label: "R1: 8", "Assistant 2: 6", "Response A = 7", "score_b: 4"
_SIDE_SCORE = re.compile(
    r"\b(?:r|response|assistant|answer|output|candidate|score)[\s_-]*([12ab])\b"
    r"(?:'s)?(?:\s+score)?\s*[:=\-\u2013]?\s*([0-9]+(?:\.[0-9]+)?)(?![0-9])",
    re.I,
)
# a side named without a score ("Assistant 1 explains more"): a name, not a number
_SIDE_NAME = re.compile(r"\b(?:response|assistant|answer|output|candidate)[\s_-]*[12]\b|\bR[12]\b", re.I)
_SCORES_LABEL = re.compile(r"^\s*\**\s*scores?\s*\**\s*:", re.I)


def _numbers(text: str) -> list[float]:
    text = _SCALE_MENTION.sub(" ", _DENOMINATOR.sub(" ", _SIDE_NAME.sub(" ", text)))
    out = []
    for m in _NUMBER.finditer(text):
        digits = m.group().lstrip("-").split(".")[0].lstrip("0")
        out.append(math.inf if len(digits) > 6 else float(m.group()))  # int() of 5000 digits raises
    return out


def score_pair(
    completion: Completion, scale: tuple[float, float]
) -> tuple[tuple[float, float] | None, str | None]:
    """Two scores from one reply, or None and a reason when it does not say them plainly.

    Read in this order: a JSON object with one key per side (``{"a": 7, "b": 4}``); scores named
    by their side (``R1: 8; R2: 9``, ``Assistant 1: 8``, ``Response A: 7``); else exactly two
    numbers (``7 4``, ``7/10 4/10``; the scale's bounds and denominators are not scores). One side
    named twice with different scores, more numbers, or a score outside ``scale``: a failure.
    """
    low, high = scale
    text = (completion.text if isinstance(completion.text, str) else "")[:_MAX_REPLY]
    shown = " ".join(text.split())[:60]

    def checked(a: float, b: float) -> tuple[tuple[float, float] | None, str | None]:
        for v in (a, b):
            if not low <= v <= high:
                what = "a number too long to be a score," if math.isinf(v) else f"score {v:g}"
                return None, f"{what} outside {low:g}-{high:g}: {shown!r}"
        return (a, b), None

    if "{" in text:
        try:
            obj = extract_json(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):  # one key ending in a/1, one in b/2 (``score_a``, ``R1``)
            ends = [(re.sub(r"[^a-z0-9]", "", str(k).lower())[-1:], v) for k, v in list(obj.items())[:20]]
            a, b = [v for e, v in ends if e in ("a", "1")], [v for e, v in ends if e in ("b", "2")]
            if len(a) != 1 or len(b) != 1:
                return None, f"the JSON reply does not name one score per response: {shown!r}"
            if not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in a + b
            ):
                return None, f"the JSON reply's scores are not numbers: {shown!r}"
            return checked(float(a[0]), float(b[0]))
    sides: dict[str, set[float]] = {"1": set(), "2": set()}
    for m in _SIDE_SCORE.finditer(text):
        sides["1" if m.group(1).lower() in "1a" else "2"].add(float(m.group(2)))
    if sides["1"] or sides["2"]:
        if len(sides["1"]) == 1 and len(sides["2"]) == 1:
            return checked(sides["1"].pop(), sides["2"].pop())
        return None, f"the reply does not give exactly one score per response: {shown!r}"
    nums = _numbers(text)
    if len(nums) != 2:
        # a chain of reasoning may end in a labelled line: "Scores: 7 4"
        labelled = [ln for ln in text.splitlines() if _SCORES_LABEL.match(ln)]
        if len(labelled) == 1 and len(_numbers(labelled[0])) == 2:
            nums = _numbers(labelled[0])
        else:
            what = "no two scores" if len(nums) < 2 else f"{len(nums)} numbers, not two scores"
            return None, f"the reply holds {what} in {low:g}-{high:g}: {shown!r}"
    return checked(nums[0], nums[1])


class UnusableReply(HdevalError):
    """The LLM's structured replies stayed unusable after every attempt."""

    def __init__(self, attempts: int, problem: str):
        super().__init__(f"{attempts} replies were unusable (last: {problem})")
        self.attempts = attempts
        self.problem = problem


def extract_json(text: str) -> Any:
    """The JSON object in a reply (inside a ``` fence, or the outermost braces)."""
    body = (text or "").strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fence:
        body = fence.group(1).strip()
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("the reply holds no JSON object")
    try:
        return json.loads(body[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the reply is not valid JSON ({exc.msg})") from exc
    except RecursionError as exc:
        raise ValueError("the reply's JSON is nested too deeply") from exc


def ask_json(
    llm: Backend,
    request: CompletionRequest,
    validate: Callable[[Any], T],
    feedback: Callable[[str], str],
    attempts: int = 3,
    final: Callable[[ValueError], bool] | None = None,
) -> T:
    """One question of :func:`ask_json_many`; its :class:`UnusableReply` is raised."""
    got = ask_json_many(llm, [(request, validate, feedback)], attempts=attempts, final=final)[0]
    if isinstance(got, UnusableReply):
        raise got
    return got


_MAX_REASKS = 50  # a cache holding more invalid replies for one request than this is hostile


def ask_json_many(
    llm: Backend,
    asks: Sequence[tuple[CompletionRequest, Callable[[Any], Any], Callable[[str], str]]],
    concurrency: int | None = None,
    attempts: int = 3,
    final: Callable[[ValueError], bool] | None = None,
) -> list[Any]:
    """For each ``(request, validate, feedback)``, at most ``concurrency`` at a time: ask, parse the
    JSON object in the reply, validate it; on a problem, re-ask. Each result is the value or the
    :class:`UnusableReply` naming the last problem after ``attempts`` unusable replies.

    ``validate`` returns the value or raises ``ValueError`` saying what is wrong. A re-ask is a new
    request (the old reply plus ``feedback(problem)`` as the next user turn), cached like any
    other. Any other error (a request the server rejects, :class:`~hdeval.core.errors.RequestRejected`,
    included) starts no new chain, lets the running ones finish (what they paid is cached), and
    is raised; after Ctrl-C no chain asks anything more.

    When every attempt failed and some replies came from the cache (a rerun), the chain runs once
    more, asking anew (the next ``attempt`` number) wherever it meets a cached invalid reply, so a
    rerun after a fix can succeed while a recovered chain replays at no cost. ``final``: a last
    problem it accepts is an outcome: the cached replies are the last word, with no new call.
    """
    from hdeval.llm import aio

    halt: list[bool] = []
    errors: list[BaseException] = []

    async def chain(
        client: CachedBackend,
        request: CompletionRequest,
        validate: Callable[[Any], Any],
        feedback: Callable[[str], str],
    ) -> Any:
        def check(text: str) -> Any:
            return validate(extract_json(text))

        def ask(req: CompletionRequest) -> Any:
            if halt:
                raise KeyboardInterrupt
            return client.acomplete(req)

        async def reply(req: CompletionRequest, reask: bool) -> Completion:
            """With ``reask``: the first reply, by ``attempt``, fresh or valid or ``final`` (paid once)."""
            completion = await ask(req)
            for n in range(1, _MAX_REASKS + 1):
                if not reask or not completion.cached:
                    return completion
                try:
                    check(completion.text)
                    return completion
                except ValueError as exc:
                    if final is not None and final(exc):
                        return completion
                    completion = await ask(dataclasses.replace(req, attempt=n))
            return completion

        problem = ""
        for reask in (False, True):
            req = request
            from_cache = False
            last: ValueError | None = None
            for _ in range(attempts):
                completion = await reply(req, reask)
                from_cache = from_cache or completion.cached
                try:
                    return check(completion.text)
                except ValueError as exc:
                    problem, last = str(exc), exc
                    req = dataclasses.replace(
                        req,
                        messages=req.messages
                        + (Message("assistant", completion.text), Message("user", feedback(problem))),
                    )
            if not from_cache or (final is not None and last is not None and final(last)):
                break
        return UnusableReply(attempts, problem)

    async def run_all(client: CachedBackend) -> list[Any]:
        gate = asyncio.Semaphore(min(concurrency or client.concurrency, client.concurrency))

        async def one(ask: tuple) -> Any:
            async with gate:
                if errors or halt:
                    return None
                try:
                    return await chain(client, *ask)
                except BaseException as exc:  # noqa: BLE001 - raised once the others ended
                    errors.append(exc)
                    return None

        got = await asyncio.gather(*(one(a) for a in asks))
        if errors:
            raise errors[0]
        if halt:
            raise KeyboardInterrupt
        return list(got)

    with _client(llm) as client:
        return aio.run(run_all(client), on_interrupt=lambda: halt.append(True))
