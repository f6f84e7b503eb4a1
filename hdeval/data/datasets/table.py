"""Import a user's CSV/TSV/JSON/JSONL with a column mapping into the sample schema
(:func:`import_table`, :func:`write_samples`)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hdeval.core.errors import ConfigError, DataError
from hdeval.core.types import Task
from hdeval.data.samples import content_id, parse_json_line, read_samples, write_jsonl

_MAX_REPORTED_ERRORS = 20


@dataclass(frozen=True)
class ColumnMap:
    """Which column of the user's file feeds which sample field. ``None`` means "the column named
    like the field, if the file has one": ``id``, ``source``, ``context``, ``output``, ``reference``,
    ``doc_id``, ``system``, and for scores the aspect key (in JSON also ``scores.<aspect>``, so our
    own schema imports as is). A column named explicitly must exist."""

    id: str | None = None
    source: str | None = None
    context: str | None = None
    output: str | None = None
    reference: str | None = None
    doc: str | None = None
    system: str | None = None
    scores: Mapping[str, str] = field(default_factory=dict)


def parse_score_columns(items: Sequence[str], task: Task) -> dict[str, str]:
    """``["coherence=coh", ...]`` (``--score-col``) -> ``{"coherence": "coh"}``."""
    out: dict[str, str] = {}
    for item in items:
        aspect, sep, column = item.partition("=")
        aspect, column = aspect.strip(), column.strip()
        if not sep or not aspect or not column:
            raise ConfigError(f"--score-col {item!r}: expected ASPECT=COLUMN")
        if aspect not in task.aspect_keys:
            raise ConfigError(
                f"--score-col {item!r}: task {task.name} has no aspect {aspect!r} "
                f"(aspects: {', '.join(task.aspect_keys)})"
            )
        if aspect in out:
            raise ConfigError(f"--score-col: aspect {aspect!r} is mapped twice")
        out[aspect] = column
    return out


# A record: (the file line where the row starts (CSV/JSONL) or None, its values); the records'
# 1-based position is the row number (header not counted).
_Record = tuple[int | None, dict[str, Any]]
_FORMATS = ("csv", "tsv", "json", "jsonl")


def _guess_format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".").replace("ndjson", "jsonl")
    if fmt in _FORMATS:
        return fmt
    raise ConfigError(
        f"{path}: cannot tell the format from the extension; pass --format ({', '.join(_FORMATS)})"
    )


def _read_table(path: Path, fmt: str) -> tuple[list[str] | None, list[_Record]]:
    """(CSV header or None, records). JSON values keep their types; CSV cells are text."""
    try:
        # Bytes, decoded here: no newline translation (CSV cells may hold \r\n), and
        # utf-8-sig because spreadsheet programs put a byte-order mark in front of exports.
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"input file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from None

    if fmt in ("csv", "tsv"):
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if fmt == "tsv" else ",")
        try:
            header = next(reader, None)
            if not header:
                raise DataError(f"{path}: empty file (no header row)")
            header = [h.strip() for h in header]
            dups = sorted({h for h in header if header.count(h) > 1})
            if dups:
                raise DataError(f"{path}: header names column(s) {', '.join(map(repr, dups))} twice")
            records = []
            start = reader.line_num + 1
            for cells in reader:
                line, start = start, reader.line_num + 1
                if not any(c.strip() for c in cells):
                    continue  # blank line
                n = len(records) + 1
                if len(cells) != len(header):
                    raise DataError(
                        f"{path}: row {n} (line {line}) has {len(cells)} cells, the header has {len(header)}"
                    )
                records.append((line, dict(zip(header, cells))))
        except csv.Error as exc:
            raise DataError(f"{path}: line {reader.line_num}: {exc}") from None
        return header, records

    if fmt == "jsonl":
        records = []
        # split("\n"), not splitlines(): JSON strings may hold a raw U+2028, which
        # splitlines() would treat as a line break.
        for lineno, raw in enumerate(text.split("\n"), 1):
            if raw.strip():
                problem, obj = parse_json_line(raw, 0)
                if problem:
                    raise DataError(f"{path}: line {lineno}: {problem}")
                records.append((lineno, obj))
        return None, records

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
            "for one object per line use a .jsonl name or --format jsonl"
        ) from None
    except RecursionError:
        raise DataError(f"{path}: not usable JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise DataError(f"{path}: not usable JSON ({exc})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects")
    records = []
    for i, obj in enumerate(data, 1):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: row {i}: not a JSON object")
        records.append((None, obj))
    return None, records


_MISSING = object()


def _lookup(values: Mapping[str, Any], column: str) -> Any:
    """A column's value; in JSON a dotted name also reaches into objects (``scores.coherence``)."""
    if column in values:
        return values[column]
    cur: Any = values
    for part in column.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def import_table(
    path: str | Path,
    task: Task,
    columns: ColumnMap | None = None,
    fmt: str | None = None,
    unscored: bool = False,
) -> list[dict]:
    """Convert a user's CSV/TSV/JSON/JSONL into rows of the sample schema for ``task``.

    Every row is checked first and all problems (up to 20) are raised together in one
    :class:`DataError`, each with its row number (1-based, header not counted; the file line
    as well for CSV and JSONL). Ids come from the id column or from the row's texts
    (:func:`hdeval.data.samples.content_id`: a new file's rows never take a training file's ids);
    ``doc_id`` from the doc column, else a hash of the source text, so outputs of one source stay
    on one side of a split. ``unscored``: import without human scores (data to score)."""
    if task.shape != "pointwise":
        raise ConfigError(f"task {task.name} is {task.shape}: data import handles pointwise tasks only")
    path = Path(path)
    cols = columns or ColumnMap()
    header, records = _read_table(path, fmt or _guess_format(path))
    if not records:
        raise DataError(f"{path}: no data rows")

    def exists(column: str) -> bool:
        return (
            column in header
            if header is not None
            else any(_lookup(values, column) is not _MISSING for _, values in records)
        )

    def resolve(explicit: str | None, defaults: Sequence[str], option: str, needed: bool) -> str | None:
        if explicit is not None:
            if not exists(explicit):
                raise DataError(
                    f"{path}: no column {explicit!r} (given by {option}); "
                    f"columns: {_columns_hint(header, records)}"
                )
            return explicit
        found = next((d for d in defaults if exists(d)), None)
        if found is None and needed:
            raise DataError(
                f"{path}: no column {defaults[0]!r}, which task {task.name} needs; name the "
                f"column with {option}; columns: {_columns_hint(header, records)}"
            )
        return found

    needed_fields = {f.key for f in task.fields}
    text_cols: dict[str, str | None] = {
        key: resolve(getattr(cols, key), [key], f"--{key}-col", key in needed_fields)
        for key in ("source", "context", "output", "reference")
    }
    id_col = resolve(cols.id, ["id"], "--id-col", False)
    doc_col = resolve(cols.doc, ["doc_id"], "--doc-col", False)
    system_col = resolve(cols.system, ["system"], "--system-col", False)
    # Naming score columns (--score-col) imports a subset of the aspects: an aspect neither
    # named nor found under its own name is left out (training then needs --aspects).
    score_cols = {
        aspect: col
        for aspect in task.aspect_keys
        if (
            col := resolve(
                cols.scores.get(aspect),
                [aspect, f"scores.{aspect}"],
                f"--score-col {aspect}=COLUMN (or name only the score columns you have)",
                not unscored and not cols.scores,
            )
        )
        is not None
    }

    # the columns named otherwise than their field, as a task's [columns] table: every row keeps
    # it, so training records it and apply reads new files of this layout (hdeval.data.samples.recorded_columns)
    mapped: dict[str, Any] = {
        key: col
        for key, col in (*text_cols.items(), ("id", id_col), ("doc_id", doc_col), ("system", system_col))
        if col is not None and col != key
    }
    if any(col not in (a, f"scores.{a}") for a, col in score_cols.items()):
        mapped["scores"] = {a: col for a, col in score_cols.items() if col not in (a, f"scores.{a}")}

    errors: list[str] = []
    observed: dict[str, list] = {}  # aspect -> [lowest, highest, scores outside the range, first rows]
    rows: list[dict] = []
    seen: dict[str, int] = {}
    derived: dict[str, int] = {}
    for number, (line, values) in enumerate(records, 1):
        problems: list[str] = []
        texts: dict[str, str | None] = {}
        for key, col in text_cols.items():
            value = _lookup(values, col) if col else None
            value = None if value is _MISSING else value
            if value is not None and not isinstance(value, str):
                problems.append(f"column {col!r} ({key}) is {type(value).__name__}, not text")
                continue
            if value is None or not value.strip():
                if key in needed_fields:
                    problems.append(f"empty text in column {col!r} ({key})")
                value = None
            texts[key] = value

        sid = _scalar(values, id_col)
        if id_col and sid is None:
            problems.append(f"empty id in column {id_col!r}")
        sid = sid or content_id(task.name, texts, derived)
        if sid in seen:
            problems.append(f"id {sid!r} already used in row {seen[sid]}")

        scores: dict[str, float] = {}
        if not unscored:
            for aspect, col in score_cols.items():
                value, problem = _score(_lookup(values, col), task, aspect, col)
                if isinstance(value, float):
                    seen_range = observed.setdefault(aspect, [value, value, 0, []])
                    seen_range[:2] = min(seen_range[0], value), max(seen_range[1], value)
                if problem == _OUTSIDE:
                    observed[aspect][2] += 1  # said once per column, below, not once per row
                    observed[aspect][3].extend([number] if len(observed[aspect][3]) < 3 else [])
                    problems.append(_OUTSIDE)
                elif problem:
                    problems.append(problem)
                elif value is not None:
                    scores[aspect] = value

        if problems:
            where = f"row {number}" + (f" (line {line})" if line is not None else "")
            errors.extend(f"{where}: {p}" for p in problems if p != _OUTSIDE)
            continue
        seen[sid] = number
        source = texts["source"]
        doc = _scalar(values, doc_col)
        if doc is None:
            # Same source text -> same doc, so a split never puts one article on both sides.
            doc = "src-" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:16] if source else sid
        rows.append(
            {
                "id": sid,
                "task": task.name,
                **texts,
                "system": _scalar(values, system_col),
                "doc_id": doc,
                "scores": scores,
                "annotations": None,
                **({"columns": mapped} if mapped else {}),
            }
        )
    scales = [
        f"scores in column {score_cols[a]!r} range {lo:g}-{hi:g}; the task says "
        f"[{task.aspect(a).low:g}, {task.aspect(a).high:g}] for {a} ({k} outside it: "
        f"row{'s' if k > 1 else ''} {', '.join(map(str, first))}{' ...' if k > len(first) else ''})"
        for a, (lo, hi, k, first) in observed.items()
        if k
    ]
    if scales:
        others = f"; {len(errors)} other problem(s): " + "; ".join(errors[:3]) if errors else ""
        raise DataError(
            f"{path}: " + "; ".join(scales) + "; rescale the scores or change the task's range" + others
        )
    if errors:
        n, shown = len(errors), errors[:_MAX_REPORTED_ERRORS]
        more = f" (and {n - len(shown)} more)" if n > len(shown) else ""
        raise DataError(f"{path}: {n} problem(s): " + "; ".join(shown) + more)
    return rows


def _columns_hint(header: list[str] | None, records: Sequence[_Record]) -> str:
    names = header if header is not None else list(dict.fromkeys(k for _, row in records[:50] for k in row))
    return ", ".join(names) if names else "(none)"


def _scalar(values: Mapping[str, Any], column: str | None) -> str | None:
    """An id/doc/system cell as text; numbers are accepted (JSON ids are often ints)."""
    if column is None:
        return None
    value = _lookup(values, column)
    if value is _MISSING or value is None or isinstance(value, (dict, list, bool)):
        return None
    text = str(value).strip()
    return text or None


_OUTSIDE = "outside the task's range"  # a score problem said per column, with the range observed


def _score(value: Any, task: Task, aspect: str, column: str) -> tuple[float | None, str | None]:
    label = f"column {column!r} (aspect {aspect})"
    if value is _MISSING or value is None or (isinstance(value, str) and not value.strip()):
        return None, f"no score in {label}"
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None, f"{label}: {value.strip()!r} is not a number"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        return None, f"{label}: {value!r} is not a number"
    if not math.isfinite(number):
        return None, f"{label}: {value!r} is not a finite number"
    a = task.aspect(aspect)
    if not a.low <= number <= a.high:
        return number, _OUTSIDE
    return number, None


def scored_aspects(rows: Sequence[dict], task: Task) -> list[str]:
    """The task's aspects every row has a score for (an import may hold a subset)."""
    return [a for a in task.aspect_keys if all(a in (r.get("scores") or {}) for r in rows)]


def write_samples(path: str | Path, rows: Sequence[dict], task: Task, unscored: bool = False) -> int:
    """Write ``rows`` to ``path`` only if they load back with ``read_samples`` (checked in a temp
    file beside it, renamed into place after): the count."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        write_jsonl(tmp, rows)
        try:
            n = len(
                read_samples(
                    tmp,
                    task,
                    require_scores=not unscored,
                    aspects=None if unscored else scored_aspects(rows, task),
                )
            )
        except DataError as exc:
            # Same lines as the file the user asked for; name that one, not the temp file.
            raise DataError(str(exc).replace(str(tmp), str(path))) from None
        os.replace(tmp, path)
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return n
