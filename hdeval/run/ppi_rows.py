"""``hdeval estimate``: the human mean of a set of rows, per aspect (and group), from the
evaluator's scores on every row and the human labels on a few (:mod:`hdeval.learn.ppi`).

The rows are read from an ``apply`` output (no LLM needed) or scored first through the
artifact by :func:`hdeval.run.apply.apply_file` (cached: rows already scored cost nothing).

Which labels count: a row's human score (``scores`` in a sample row, ``human`` in an apply
output) on a row outside the artifact's training split. Labelled rows must be a uniform random
sample of the rows, or carry ``sampling_prob``, the probability with which each was picked for
labelling. A labelled row whose ``selection`` names a strategy other than ``random`` and that
carries no ``sampling_prob`` is refused: its label says little about the rows not picked.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hdeval.errors import ConfigError, DataError
from hdeval.learn.ppi import MeanEstimate, difference, pair_value, ppi_mean

__all__ = ["PROB_FIELD", "SELECTION_FIELD", "Estimates", "estimate_file"]

#: A labelled row's probability of having been picked for labelling, in (0, 1].
PROB_FIELD = "sampling_prob"
#: The strategy that picked a labelled row (``random``, ``uncertainty``, ...), as ``hdeval label`` records it.
SELECTION_FIELD = "selection"
#: The aspect name a pairwise task's estimate goes by.
WIN_RATE = "win_rate"
ALL = "all"


def _field(row: dict, name: str) -> Any:
    """A row's ``name``: in ``meta`` first, then at the top level (as a task's ``where``)."""
    meta = row.get("meta")
    if isinstance(meta, dict) and name in meta:
        return meta[name]
    return row.get(name)


@dataclass
class _Cell:
    """One aspect x group: the labelled rows' values and the unlabelled rows' evaluator values."""

    y: list[float] = field(default_factory=list)
    f: list[float] = field(default_factory=list)
    prob: list[float | None] = field(default_factory=list)
    rest: list[float] = field(default_factory=list)
    first_prob_line: int = 0
    first_plain_line: int = 0


@dataclass
class Estimates:
    """What ``estimate`` found: one record per aspect x group (``kind`` ``mean``) and per
    group against the baseline (``kind`` ``difference``), each a plain dict for ``--json``;
    ``notes``: lines a user should read (rows left out, and why)."""

    records: list[dict]
    notes: list[str]
    alpha: float
    rows: int


class _Side:
    """What estimate needs of the input rows beside the scores: group, sampling probability,
    selection, line, keyed by id (for rows scored through apply, whose output drops them)."""

    def __init__(self, path: str, by: str | None, inline: bool):
        self.path, self.by, self.inline = path, by, inline  # inline: the scored rows carry them
        self.of: dict[str, tuple[Any, Any, Any, int]] = {}

    def fields(self, row: dict, line: int) -> tuple[Any, Any, Any, int]:
        return (_field(row, self.by) if self.by else ALL, _field(row, PROB_FIELD), _field(row, SELECTION_FIELD), line)

    def add(self, row: dict, line: int) -> None:
        self.of[str(row.get("id"))] = self.fields(row, line)

    def lookup(self, row: dict, line: int) -> tuple[Any, Any, Any, int]:
        return self.fields(row, line) if self.inline else self.of.get(str(row.get("id")), (ALL, None, None, line))


def _rows(path: str) -> Iterator[tuple[int, dict]]:
    from hdeval.data import bounded_lines, parse_json_line

    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            offset = 0
            for lineno, line in enumerate(bounded_lines(fh, path), 1):
                start, offset = offset, offset + len(line.encode("utf-8", "surrogateescape"))
                if not line.strip():
                    continue
                problem, row = parse_json_line(line, start)
                if problem:
                    raise DataError(f"{path}: line {lineno}: {problem}")
                yield lineno, row  # type: ignore[misc]
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def is_apply_output(path: str) -> bool:
    """Whether ``path``'s first row was written by ``apply`` (every one carries ``in_training``)."""
    for _, row in _rows(path):
        return "in_training" in row and ("scores" in row or "prediction" in row)
    return False


def _group_name(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    return json.dumps(value, sort_keys=True)[:80]


def _prob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise DataError(f"{where}: field {PROB_FIELD!r} is {value!r}, not a probability in (0, 1]")
    return float(value)


def _collect(scored: str, side: _Side, aspects: list[str], pairwise: bool,
             notes: list[str]) -> tuple[dict[tuple[str, str], _Cell], int]:
    """Read apply's rows into cells; refuse labels that were picked by an active strategy
    without their probabilities, or a file mixing rows with and without probabilities."""
    cells: dict[tuple[str, str], _Cell] = {}
    training = rows = 0
    for lineno, row in _rows(scored):
        if "shard" in row and "id" not in row:
            continue  # a shard's closing record
        group, prob, selection, line = side.lookup(row, lineno)
        where = f"{side.path}: line {line}"
        if row.get("in_training"):
            training += 1
            continue
        rows += 1
        group = _group_name(group)
        if pairwise:
            f = pair_value(row.get("prediction"), row.get("probabilities") if isinstance(
                row.get("probabilities"), dict) else None)
            if f is None:
                raise DataError(f"{scored}: line {lineno}: no prediction 'a', 'b' or 'tie' (an apply output of "
                                "a pairwise artifact?)")
            human = row.get("human")
            values = {WIN_RATE: (f, pair_value(human) if human is not None else None)}
        else:
            pred, human = row.get("scores"), row.get("human") or {}
            if not isinstance(pred, dict) or not isinstance(human, dict):
                raise DataError(f"{scored}: line {lineno}: 'scores' and 'human' must be objects (an apply output "
                                "of a pointwise artifact?)")
            values = {}
            for a in aspects:
                p, h = pred.get(a), human.get(a)
                if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p):
                    raise DataError(f"{scored}: line {lineno}: scores.{a} is {p!r}, not a number (the artifact "
                                    "scores other aspects?)")
                if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h)):
                    raise DataError(f"{where}: human score {a} is {h!r}, not a finite number")
                values[a] = (float(p), None if h is None else float(h))
        for a, (f, h) in values.items():
            cell = cells.setdefault((a, group), _Cell())
            if h is None:
                cell.rest.append(f)
                continue
            if prob is None and selection not in (None, "random"):
                raise DataError(
                    f"{where}: this label was picked by the {selection!r} strategy and carries no {PROB_FIELD!r}: "
                    "actively selected labels are no random sample, so no valid interval follows from them; "
                    f"give each labelled row its {PROB_FIELD} or label a random sample")
            p = None if prob is None else _prob(prob, where)
            cell.y.append(h)
            cell.f.append(f)
            cell.prob.append(p)
            if p is None:
                cell.first_plain_line = cell.first_plain_line or line
            else:
                cell.first_prob_line = cell.first_prob_line or line
            if cell.first_plain_line and cell.first_prob_line:
                raise DataError(
                    f"{side.path}: line {max(cell.first_plain_line, cell.first_prob_line)}: labelled rows with and "
                    f"without {PROB_FIELD!r} (line {min(cell.first_plain_line, cell.first_prob_line)}): give every "
                    "labelled row its probability of being picked, or none (a uniform random sample)")
    if training:
        notes.append(f"{training} rows were in the artifact's training split: left out (their scores were "
                     "fitted to their labels)")
    return cells, rows


def _record(aspect: str, group: str, cell: _Cell, alpha: float, margin: float | None) -> tuple[dict, MeanEstimate | None]:
    import numpy as np

    base: dict[str, Any] = {"kind": "mean", "aspect": aspect, "group": group, "n_labelled": len(cell.y),
                            "n": len(cell.y) + len(cell.rest)}
    if len(cell.y) < 2:
        every = cell.f + cell.rest
        return {**base, "estimate": None, "low": None, "high": None, "classical_low": None,
                "classical_high": None, "evaluator_mean": float(np.mean(every)) if every else None,
                "reason": f"{len(cell.y)} labelled row(s): an interval needs at least 2"}, None
    probs = None if cell.prob[0] is None else np.array(cell.prob, float)
    e = ppi_mean(cell.y, cell.f, cell.rest, alpha=alpha, sampling_prob=probs)
    target = margin if margin is not None else float(f"{e.half_width / 2:.2g}")
    more = e.labels_for(target) if target > 0 else None
    return {**base, **e.as_dict(), "margin": target, "more_labels": more}, e


def estimate_file(artifact: str | Any, data: str, *, by: str | None = None, alpha: float = 0.1,
                  margin: float | None = None, baseline: str | None = None,
                  score: Callable[[Any, str, str], Any] | None = None) -> Estimates:
    """Per aspect (and per ``by`` group) the PPI++ estimate of the human mean of ``data``'s rows.

    ``data``: an apply output of ``artifact`` (read as is), or rows in the sample format, scored
    by ``score(evaluator, data, output_path)`` (the caller's apply, with its LLM options) into a
    temporary apply output. ``margin``: the half-width the "labels needed" figure aims at
    (default: half the current one). ``baseline``: the group each other group is compared
    with (default: the first group by name)."""
    from hdeval.methods.registry import load_artifact

    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {alpha}")
    if margin is not None and not margin > 0:
        raise ConfigError(f"--margin must be positive, got {margin}")
    ev = load_artifact(artifact) if isinstance(artifact, (str, os.PathLike)) else artifact
    task = ev.task
    pairwise = task.shape == "pairwise"
    aspects = [WIN_RATE] if pairwise else list(task.aspect_keys)
    notes: list[str] = []
    if is_apply_output(data):
        cells, rows = _collect(data, _Side(data, by, inline=True), aspects, pairwise, notes)
    else:
        if score is None:
            raise ConfigError(f"{data} holds samples, not an apply output: score them first (hdeval apply)")
        side = _Side(data, by, inline=False)
        for lineno, row in _rows(data):
            side.add(row, lineno)
        with tempfile.TemporaryDirectory(prefix=".hdeval-estimate-") as tmp:
            scored = os.path.join(tmp, "scored.jsonl")
            score(ev, data, scored)
            cells, rows = _collect(scored, side, aspects, pairwise, notes)
    if not rows:
        raise DataError(f"{data}: no rows to estimate on")
    records: list[dict] = []
    fitted: dict[tuple[str, str], MeanEstimate] = {}
    groups = sorted({g for _, g in cells})
    if baseline is not None and by is not None and baseline not in groups:
        raise ConfigError(f"--baseline {baseline!r} is no group of {by!r} in {data} (groups: "
                          f"{', '.join(groups[:10])}{', ...' if len(groups) > 10 else ''})")
    for a in aspects:
        for g in groups:
            if (a, g) in cells:
                rec, e = _record(a, g, cells[(a, g)], alpha, margin)
                records.append(rec)
                if e is not None:
                    fitted[(a, g)] = e
    if by is not None and len(groups) > 1:
        base = baseline or groups[0]
        for a in aspects:
            for g in groups:
                if g == base or (a, g) not in fitted or (a, base) not in fitted:
                    continue
                d = difference(fitted[(a, g)], fitted[(a, base)])
                records.append({"kind": "difference", "aspect": a, "group": g, "baseline": base, **d.as_dict()})
    if any(r.get("weighted") for r in records):
        notes.append(f"labels weighted by 1/{PROB_FIELD} (rows picked with unequal probabilities)")
    return Estimates(records, notes, alpha, rows)
