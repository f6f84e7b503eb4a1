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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hdeval.core.errors import ConfigError, DataError
from hdeval.core.types import PairSample
from hdeval.data.labels_db import is_labels_file
from hdeval.learn.ppi import MeanEstimate, Moments, difference, pair_value, ppi_mean

__all__ = ["PROB_FIELD", "SELECTION_FIELD", "Estimates", "estimate_file"]

#: A labelled row's probability of having been picked for labelling, in (0, 1].
PROB_FIELD = "sampling_prob"
#: The strategy that picked a labelled row (``random``, ``uncertainty``, ...), as ``hdeval label`` records it.
SELECTION_FIELD = "selection"
#: The aspect name a pairwise task's estimate goes by.
WIN_RATE = "win_rate"
ALL = "all"
#: A difference record's figures: None in one whose baseline has no estimate.
_DIFFERENCE_FIGURES = ("estimate", "low", "high", "se", "classical", "classical_low", "classical_high")
_ABSENT = object()  # an aspect missing from a row's scores (not the artifact's rows?)


def _field(row: dict, name: str) -> Any:
    """A row's ``name``: in ``meta`` first, then at the top level (as a task's ``where``)."""
    meta = row.get("meta")
    if isinstance(meta, dict) and name in meta:
        return meta[name]
    return row.get(name)


@dataclass
class _Cell:
    """One aspect x group: the labelled rows' human and evaluator values (and sampling
    probabilities, when given), and the evaluator's values on the unlabelled rows."""

    y: Any
    f: Any
    prob: Any
    rest: Any


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
        meta = row.get("meta")
        if not isinstance(meta, dict) or not meta:  # the usual case, read without a lookup per field
            got = (
                row.get(self.by, None) if self.by else ALL,
                row.get(PROB_FIELD),
                row.get(SELECTION_FIELD),
                line,
            )
        else:
            got = (
                _field(row, self.by) if self.by else ALL,
                _field(row, PROB_FIELD),
                _field(row, SELECTION_FIELD),
                line,
            )
        if isinstance(got[0], (dict, list)):  # a group per distinct object would mean nothing
            raise DataError(
                f"{self.path}: line {line}: --by {self.by}: the field holds "
                f"{'an object' if isinstance(got[0], dict) else 'a list'}; group by a field of text or numbers"
            )
        return got

    def add(self, row: dict, line: int) -> None:
        self.of[str(row.get("id"))] = self.fields(row, line)

    def lookup(self, row: dict, line: int) -> tuple[Any, Any, Any, int]:
        return (
            self.fields(row, line)
            if self.inline
            else self.of.get(str(row.get("id")), (ALL, None, None, line))
        )


def _rows(path: str) -> Iterator[tuple[int, dict]]:
    from hdeval.data.samples import bounded_lines, parse_json_line

    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            for lineno, line in enumerate(bounded_lines(fh, path), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    row = None
                if not isinstance(row, dict):  # the reader's one-line account of what is wrong
                    raise DataError(
                        f"{path}: line {lineno}: {parse_json_line(line, 0)[0] or 'not a JSON object'}"
                    )
                yield lineno, row
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _sample_rows(path: str, task: Any) -> Iterator[tuple[int, dict]]:
    """The rows of a samples file in any format apply reads, mapped through the task's
    ``[columns]`` as apply maps them, so each row's id is the one apply's output gives it."""
    from hdeval.data.samples import data_rows, map_columns, table_format

    if table_format(path) is None and not task.columns:
        yield from _rows(path)
        return
    derived: dict[str, int] = {}
    for lineno, values in data_rows(path):
        yield lineno, map_columns(values, task, derived)


def is_apply_output(path: str) -> bool:
    """Whether ``path``'s first row was written by ``apply`` (every one carries ``in_training``)."""
    from hdeval.data.samples import data_rows, table_format

    if table_format(path) is not None:  # a table holds samples; apply's table output is refused
        for _, row in data_rows(path):
            if "in_training" in row:
                raise ConfigError(
                    f"{path}: an apply output written as a table: estimate reads apply's JSONL "
                    "output (hdeval apply ... -o scored.jsonl)"
                )
            return False
        return False
    for _, row in _rows(path):
        return "in_training" in row and ("scores" in row or "prediction" in row)
    return False


def _group_name(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    return json.dumps(value, sort_keys=True)[:80]


def _shown(name: str) -> str:
    """A group name as the terminal may show it: control characters escaped (one name, one
    shown name: repr is one-to-one)."""
    return name if name.isprintable() else repr(name)[1:-1]


def _prob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise DataError(f"{where}: field {PROB_FIELD!r} is {value!r}, not a probability in (0, 1]")
    return float(value)


def _number(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


class _Picked:
    """How the labelled rows were picked, checked one labelled row at a time: labels an active
    strategy picked without their probabilities are refused, and so is a file mixing labelled
    rows with and without them."""

    def __init__(self, path: str):
        self.path = path
        self.first: dict[bool, int] = {}  # whether a labelled row has a probability -> its first line

    def prob(self, prob: Any, selection: Any, line: int) -> float:
        """The row's sampling probability (NaN: none given), once its row passes."""
        where = f"{self.path}: line {line}"
        if prob is None and selection not in (None, "random"):
            raise DataError(
                f"{where}: this label was picked by the {selection!r} strategy and carries no {PROB_FIELD!r}: "
                "actively selected labels are no random sample, so no valid interval follows from them; "
                f"give each labelled row its {PROB_FIELD} or label a random sample"
            )
        value = math.nan if prob is None else _prob(prob, where)
        self.first.setdefault(prob is not None, line)
        if len(self.first) == 2:
            raise DataError(
                f"{self.path}: line {max(self.first.values())}: labelled rows with and without {PROB_FIELD!r} "
                f"(line {min(self.first.values())}): give every labelled row its probability of being picked, "
                "or none (a uniform random sample)"
            )
        return value


def _check_groups(
    by: str | None, baseline: str | None, groups: list[str], data: str, apply_output: bool
) -> None:
    """Refuse ``--by`` a field no row has, and a ``--baseline`` that is none of the groups."""
    if by is not None and groups == [_group_name(None)]:
        # every row in one group "(none)" would pass for an estimate by FIELD
        raise ConfigError(
            f"--by {by}: no row of {data} has a field {by!r} (in 'meta' or at the top level)"
            + (
                "; an apply output keeps only id, doc_id and system of each sample: give --data "
                "the samples file"
                if apply_output
                else ""
            )
        )
    if baseline is not None and by is not None and baseline not in groups:
        raise ConfigError(
            f"--baseline {baseline!r} is no group of {by!r} in {data} (groups: "
            f"{', '.join(groups[:10])}{', ...' if len(groups) > 10 else ''})"
        )


def _check_samples(data: str, ev: Any, side: _Side, by: str | None, baseline: str | None) -> None:
    """Before any LLM call: the checks :func:`_collect` and :func:`estimate_file` make that need
    no scores, on the samples ``data`` holds (read as apply reads them): how the labelled ones
    outside the training split were picked, and the groups."""
    from hdeval.data.samples import iter_task_chunks

    task = ev.task
    training = ev.training_ids() if callable(getattr(ev, "training_ids", None)) else frozenset()
    picked = _Picked(side.path)
    groups: set[str] = set()
    for chunk in iter_task_chunks(data, task, require_labels=False):
        for s in chunk:
            group, prob, selection, line = side.of.get(s.id, (ALL, None, None, s.line))
            if s.id in training:  # as the estimate itself: training rows are no part of it
                continue
            groups.add(_shown(group if type(group) is str else _group_name(group)))
            labelled = pair_value(s.label) is not None if isinstance(s, PairSample) else bool(s.scores)
            if labelled:
                picked.prob(prob, selection, line)
    _check_groups(by, baseline, sorted(groups), data, apply_output=False)


def _collect(
    scored: str,
    side: _Side,
    aspects: list[str],
    pairwise: bool,
    notes: list[str],
    ranges: Sequence[tuple[float, float]] | None = None,
) -> tuple[dict[tuple[str, str], _Cell], int]:
    """Read apply's rows into cells (aspect x group); refuse labels that an active strategy
    picked without their probabilities, or a file mixing labelled rows with and without them.
    The rows' predictions go into one array (a row costs a tuple, not a dict per aspect)."""
    import numpy as np

    preds: list[tuple] = []
    lines: list[int] = []
    groups: list[str] = []
    labelled: list[tuple[int, Any, Any, Any, int]] = []  # row, human, sampling_prob, selection, line
    training = 0
    first_line: dict[str, int] = {}  # a row given twice would count as two labels
    for lineno, row in _rows(scored):
        if "id" not in row and "shard" in row:
            continue  # a shard's closing record
        rid = str(row.get("id"))
        if first_line.setdefault(rid, lineno) != lineno:
            raise DataError(f"{scored}: line {lineno}: id {rid!r} already used on line {first_line[rid]}")
        if row.get("in_training"):
            training += 1
            continue
        group, prob, selection, line = side.lookup(row, lineno)
        if pairwise:
            probs = row.get("probabilities")
            f = pair_value(row.get("prediction"), probs if isinstance(probs, dict) else None)
            if f is None and "prediction" in row and row["prediction"] is None:
                f = math.nan  # its LLM calls failed: no verdict, left out below
            elif f is None:
                raise DataError(
                    f"{scored}: line {lineno}: no prediction 'a', 'b' or 'tie' (an apply output of "
                    "a pairwise artifact?)"
                )
            preds.append((f,))
        else:
            pred = row.get("scores")
            if not isinstance(pred, dict):
                raise DataError(
                    f"{scored}: line {lineno}: 'scores' must be an object (an apply output of a "
                    "pointwise artifact?)"
                )
            preds.append(tuple(pred.get(a, _ABSENT) for a in aspects))
        lines.append(lineno)
        groups.append(group if type(group) is str else _group_name(group))
        human = row.get("human")
        if human is not None:
            labelled.append((len(preds) - 1, human, prob, selection, line))
    if training:
        notes.append(
            f"{training} rows were in the artifact's training split: left out (their scores were "
            "fitted to their labels)"
        )
    if not preds:
        return {}, 0
    try:
        P = np.array(preds, dtype=float)
    except (TypeError, ValueError):
        P = np.array([[x if _number(x) else math.nan for x in p] for p in preds], dtype=float)
    for i, j in np.argwhere(~np.isfinite(P)):
        x = preds[i][j]
        if x is None or (isinstance(x, float) and math.isnan(x)):
            continue  # no score: an LLM call failed (apply writes null or NaN); left out below
        raise DataError(
            f"{scored}: line {lines[i]}: "
            + (f"no scores.{aspects[j]}" if x is _ABSENT else f"scores.{aspects[j]} is {x!r}, not a number")
            + " (the artifact scores other aspects?)"
        )
    unscored = (~np.isfinite(P)).sum(axis=0)
    for j, a in enumerate(aspects):
        if unscored[j]:
            notes.append(
                f"{unscored[j]} rows have no {a} score (an LLM call failed): left out of its estimate"
            )
    Y = np.full(P.shape, math.nan)
    prob_of = np.full(len(preds), math.nan)
    picked = _Picked(side.path)
    for i, human, prob, selection, line in labelled:
        where = f"{side.path}: line {line}"
        if pairwise:
            Y[i, 0] = math.nan if pair_value(human) is None else pair_value(human)  # type: ignore[arg-type]
        elif isinstance(human, dict):
            for j, a in enumerate(aspects):
                h = human.get(a)
                if h is not None and not _number(h):
                    raise DataError(f"{where}: human score {a} is {h!r}, not a finite number")
                if h is not None and ranges is not None and not ranges[j][0] <= h <= ranges[j][1]:
                    lo, hi = ranges[j]
                    raise DataError(
                        f"{where}: human score {a} = {h!r} is outside the task's range [{lo:g}, {hi:g}]"
                    )
                Y[i, j] = math.nan if h is None else float(h)
        else:
            raise DataError(f"{where}: 'human' must be an object of scores")
        if np.isnan(Y[i]).all():
            continue
        prob_of[i] = picked.prob(prob, selection, line)
    names, codes = np.unique(np.array(groups, dtype=object).astype(str), return_inverse=True)
    cells: dict[tuple[str, str], _Cell] = {}
    for j, a in enumerate(aspects):
        has = ~np.isnan(Y[:, j])
        for k, g in enumerate(names):
            mine = (codes == k) & np.isfinite(P[:, j])
            lab, rest = mine & has, mine & ~has
            cells[(a, _shown(str(g)))] = _Cell(
                y=Y[lab, j],
                f=P[lab, j],
                prob=None if np.isnan(prob_of[lab]).any() else prob_of[lab],
                rest=P[rest, j],
            )
    return cells, len(preds)


def _constant(values: Any) -> bool:
    return len(values) > 0 and min(values) == max(values)


def _record(
    aspect: str, group: str, cell: _Cell, alpha: float, margin: float | None
) -> tuple[dict, MeanEstimate | None]:
    base: dict[str, Any] = {
        "kind": "mean",
        "aspect": aspect,
        "group": group,
        "n_labelled": int(cell.y.size),
        "n": int(cell.y.size + cell.rest.size),
    }
    # labels that do not vary give a zero-width interval: certainty that two agreeing labels never give
    why = (
        f"{cell.y.size} labelled row(s): an interval needs at least 2"
        if cell.y.size < 2
        else f"all {cell.y.size} labels are {cell.y[0]:g}: no spread to build an interval on"
        if _constant(cell.y)
        else None
    )
    if why is not None:
        n = cell.f.size + cell.rest.size
        return {
            **base,
            "estimate": None,
            "low": None,
            "high": None,
            "classical_low": None,
            "classical_high": None,
            "evaluator_mean": float((cell.f.sum() + cell.rest.sum()) / n) if n else None,
            "reason": why,
        }, None
    e = ppi_mean(cell.y, cell.f, cell.rest, alpha=alpha, sampling_prob=cell.prob)
    target = margin if margin is not None else float(f"{e.half_width / 2:.2g}")
    more = e.labels_for(target) if target > 0 else None
    return {**base, **e.as_dict(), "margin": target, "more_labels": more}, e


def _loaded(path: str | os.PathLike) -> Any:
    from hdeval.methods.registry import load_artifact

    return load_artifact(path)


def _manifest_task(path: str | os.PathLike) -> Any:
    """The artifact's task and warnings, once its manifest and every file's checksum are verified
    (as :func:`hdeval.methods.registry.load_artifact` does, without rebuilding the model)."""
    from types import SimpleNamespace

    from hdeval.artifact.directory import MANIFEST, ArtifactReader, open_artifact
    from hdeval.core.errors import ArtifactError, HdevalError
    from hdeval.data.tasks import task_from_dict
    from hdeval.methods.registry import get_method

    where = os.path.join(path, MANIFEST)
    head = ArtifactReader(Path(path), {}, []).json(MANIFEST) if os.path.isfile(where) else {}
    name = head.get("method", "hdeval") if isinstance(head, dict) else "hdeval"
    try:
        method = get_method(name if isinstance(name, str) else "")
    except HdevalError as exc:
        raise ArtifactError(f"{path}: {exc} (written by a newer hdeval?)") from None
    reader = open_artifact(path, editable=method.editable)
    try:
        task = task_from_dict(reader.manifest["task"], where=where)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: malformed task ({exc})") from None
    return SimpleNamespace(task=task, warnings=reader.warnings)


def estimate_file(
    artifact: str | Any,
    data: str,
    *,
    by: str | None = None,
    alpha: float = 0.1,
    margin: float | None = None,
    baseline: str | None = None,
    score: Callable[[Any, str, str], Any] | None = None,
) -> Estimates:
    """Per aspect (and per ``by`` group) the PPI++ estimate of the human mean of ``data``'s rows.

    ``data``: an apply output of ``artifact`` (read as is), or rows in the sample format, scored
    by ``score(evaluator, data, output_path)`` (the caller's apply, with its LLM options) into a
    temporary apply output. ``margin``: the half-width the "labels needed" figure aims at
    (default: half the current one). ``baseline``: the group each other group is compared
    with (default: the first group by name)."""
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {alpha}")
    if margin is not None and not margin > 0:
        raise ConfigError(f"--margin must be positive, got {margin}")
    if baseline is not None and by is None:
        raise ConfigError(
            f"--baseline {baseline} names a group to compare the others with: give --by FIELD too"
        )
    if is_labels_file(data):
        raise DataError(
            f"{data} is a labels file of hdeval label: write its samples with `hdeval data export-labels "
            f"{data} -o labeled.jsonl` (then each says which strategy picked it: actively picked labels "
            "are refused here, being no random sample)"
        )
    apply_output = is_apply_output(data)
    # an apply output needs only the artifact's task: its verified manifest, not the fitted model
    ev = (
        artifact
        if not isinstance(artifact, (str, os.PathLike))
        else _manifest_task(artifact)
        if apply_output
        else _loaded(artifact)
    )
    task = ev.task
    pairwise = task.shape == "pairwise"
    aspects = [WIN_RATE] if pairwise else list(task.aspect_keys)
    ranges = None if pairwise else [task.aspect(a).range for a in aspects]
    notes: list[str] = []
    notes.extend(f"warning: {w}" for w in ev.warnings)
    if apply_output:
        cells, rows = _collect(data, _Side(data, by, inline=True), aspects, pairwise, notes, ranges)
    else:
        if score is None:
            raise ConfigError(f"{data} holds samples, not an apply output: score them first (hdeval apply)")
        side = _Side(data, by, inline=False)
        for lineno, row in _sample_rows(data, task):
            side.add(row, lineno)
        _check_samples(data, ev, side, by, baseline)  # refused before the LLM calls are paid for
        with tempfile.TemporaryDirectory(prefix=".hdeval-estimate-") as tmp:
            scored = os.path.join(tmp, "scored.jsonl")
            score(ev, data, scored)
            cells, rows = _collect(scored, side, aspects, pairwise, notes, ranges)
    if not rows:
        raise DataError(f"{data}: no rows to estimate on")
    records: list[dict] = []
    fitted: dict[tuple[str, str], MeanEstimate] = {}
    groups = sorted({g for _, g in cells})
    _check_groups(by, baseline, groups, data, apply_output)
    for a in aspects:
        for g in groups:
            if (a, g) in cells:
                rec, e = _record(a, g, cells[(a, g)], alpha, margin)
                records.append(rec)
                if e is not None:
                    fitted[(a, g)] = e
    if by is not None and len(groups) > 1:
        base = baseline or groups[0]
        # no estimate of the baseline, no difference from it: a record per group says why
        unbased = {r["aspect"]: r["reason"] for r in records if r["group"] == base and r["estimate"] is None}
        for a in aspects:
            for g in groups:
                if g != base and a in unbased and (a, g) in cells:
                    records.append(
                        {
                            "kind": "difference",
                            "aspect": a,
                            "group": g,
                            "baseline": base,
                            **dict.fromkeys(_DIFFERENCE_FIGURES),
                            "reason": f"the baseline group {base} has no estimate ({unbased[a]})",
                        }
                    )
                if g == base or (a, g) not in fitted or (a, base) not in fitted:
                    continue
                d = difference(fitted[(a, g)], fitted[(a, base)])
                records.append(
                    {"kind": "difference", "aspect": a, "group": g, "baseline": base, **d.as_dict()}
                )
    weighted = [r for r in records if r.get("weighted")]
    if weighted:
        notes.append(f"labels weighted by 1/{PROB_FIELD} (rows picked with unequal probabilities)")
        if min(r["n_labelled"] for r in weighted) < 100:
            notes.append(
                "warning: with fewer than 100 weighted labels the classical interval may cover less than "
                "its level (0.83-0.86 for 90% at 30-50 labels in benchmarks/ppi.md) and the PPI++ one "
                "is about as wide; label more, or a random sample"
            )
    return Estimates(records, notes, alpha, rows)


class RowsSummary:
    """What ``apply``'s summary says of the human mean: per aspect (pairwise: the win rate of A),
    over the rows outside the artifact's training split, the PPI++ estimate from the rows that
    carry a human score, and how often those rows' prediction intervals hold it. Fed one chunk of
    output rows at a time; keeps the labelled rows' values and the moments of the others."""

    def __init__(self, aspects: list[str], pairwise: bool, alpha: float = 0.1):
        self.aspects = [WIN_RATE] if pairwise else list(aspects)
        self.pairwise, self.alpha = pairwise, alpha
        self.y: dict[str, list[float]] = {a: [] for a in self.aspects}
        self.f: dict[str, list[float]] = {a: [] for a in self.aspects}
        self.inside: dict[str, list[bool]] = {a: [] for a in self.aspects}
        self.rest = {a: Moments(0, 0.0, 0.0) for a in self.aspects}

    def add(self, rows: list[dict]) -> None:
        for a in self.aspects:
            unlabelled = []
            for row in rows:
                if row.get("in_training"):
                    continue
                if self.pairwise:
                    probs = row.get("probabilities")
                    f = pair_value(row.get("prediction"), probs if isinstance(probs, dict) else None)
                    h = pair_value(row["human"]) if isinstance(row.get("human"), str) else None
                else:
                    pred, human = row.get("scores"), row.get("human")
                    f = pred.get(a) if isinstance(pred, dict) else None  # a plug-in's rows may differ
                    h = human.get(a) if isinstance(human, dict) else None
                if not _number(f) or (h is not None and not _number(h)):
                    continue
                if h is None:
                    unlabelled.append(f)
                    continue
                self.y[a].append(h)
                self.f[a].append(f)
                low, high = row.get("lower"), row.get("upper")
                if (
                    isinstance(low, dict)
                    and isinstance(high, dict)
                    and _number(low.get(a))
                    and _number(high.get(a))
                ):
                    self.inside[a].append(
                        low[a] <= h <= high[a]
                    )  # no bound (too few calibration rows): not counted
            if unlabelled:
                self.rest[a] = self.rest[a].merge(Moments.of(unlabelled))

    def summary(self) -> dict[str, dict] | None:
        """Per aspect with at least 2 labels: ``n_labelled``, ``n`` (rows), the estimate with its
        interval (``level``), the evaluator's own mean, and ``interval_coverage`` (the share of
        labelled rows inside their prediction interval, with ``interval_labels`` behind it)."""
        out: dict[str, dict] = {}
        for a in self.aspects:
            if len(self.y[a]) < 2 or _constant(self.y[a]):  # no interval: as estimate says
                continue
            e = ppi_mean(self.y[a], self.f[a], self.rest[a], alpha=self.alpha)
            inside = self.inside[a]
            out[a] = {
                "n_labelled": e.n_labelled,
                "n": e.n,
                "level": 1 - self.alpha,
                "estimate": round(e.estimate, 6),
                "low": round(e.low, 6),
                "high": round(e.high, 6),
                "evaluator_mean": round(e.evaluator_mean, 6),
                "interval_coverage": round(sum(inside) / len(inside), 6) if inside else None,
                "interval_labels": len(inside),
            }
        return out or None
