"""Reading samples (JSONL, schema of the shared data README), finding data files, splits."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from hdeval.core.errors import ConfigError, DataError
from hdeval.core.paths import user_data_dir
from hdeval.core.types import PAIR_LABELS, PairSample, Sample, Task, has_lone_surrogate
from hdeval.data.labels_db import is_labels_file, labelled_rows
from hdeval.data.tasks import builtin_tasks

MAX_REPORTED_ERRORS = 20
#: The longest line a JSONL reader accepts (bytes, or characters of a text file): a sample is
#: far smaller; a file with no line ends (``/dev/zero``, a binary file) must not fill memory.
MAX_LINE_BYTES = 16 << 20


def bounded_lines(fh: Any, path: str | Path, limit: int | None = None, start: int = 0) -> Iterator[Any]:
    """The lines of ``fh`` (text or binary), each read with a bound (``MAX_LINE_BYTES`` unless
    given): a longer line is one :class:`DataError` naming the file and line. ``start``: lines
    already read."""
    limit = MAX_LINE_BYTES if limit is None else limit
    lineno = start
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        lineno += 1
        if len(line) > limit:
            raise DataError(
                f"{path}: line {lineno}: longer than {limit:,} bytes: not a JSONL file of samples "
                "(one JSON object per line)?"
            )
        yield line


BOM = "\ufeff"
_INVALID_BYTE = re.compile("[\udc80-\udcff]")  # how errors="surrogateescape" shows a non-UTF-8 byte
MIN_TRAIN_SAMPLES = 2  # cross-validation on the training split needs two folds


def data_candidates(task: Task) -> list[Path]:
    """Where a task's file is looked for, in order: at its ``data_file`` from the task's .toml
    file's folder (a user's task, see :func:`hdeval.data.tasks.load_task`), then by its name in
    HDEVAL_DATA_DIR, then in the per-user dir."""
    out = []
    name = Path(task.data_file).name
    if task.source_dir:  # a task file's data_file may be a relative path from its folder
        out.append(Path(os.path.normpath(Path(task.source_dir) / task.data_file)))
    env = os.environ.get("HDEVAL_DATA_DIR")
    if env:
        out.append(Path(env) / name)
    out.append(user_data_dir() / name)
    return out


def find_data(task: Task, explicit: str | Path | None) -> Path:
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise DataError(f"data file not found: {path}")
        return path
    cands = data_candidates(task)
    for c in cands:
        if c.is_file():
            return c
    raise DataError(missing_data_message(task, cands))


def missing_data_message(task: Task, cands: Sequence[Path] | None = None, why: str = "") -> str:
    """One line: where a task's data was looked for, why it is not there, and every way forward."""
    cands = data_candidates(task) if cands is None else cands
    name = Path(task.data_file).name
    ways = f"pass --data FILE.jsonl, or set HDEVAL_DATA_DIR to a folder holding {name}"
    if task.name in builtin_tasks() and not task.source_dir:
        ways += (
            f", or run `hdeval data download {task.name}` (from a local copy: add "
            "--source-url file:///path/to/reproduce/data/ or set HDEVAL_DATA_SOURCE_URL)"
        )
    return (
        f"no data for task {task.name}: looked in {', '.join(str(c) for c in cands)}"
        + (f"; {why}" if why else "")
        + f"; {ways}"
    )


def read_samples(
    path: str | Path, task: Task, require_scores: bool = True, aspects: Sequence[str] | None = None
) -> list[Sample]:
    """Read and validate every line. All broken lines (up to a cap) are reported together with their
    line numbers, so a user fixes a file in one pass; nothing is returned unless the whole file is
    valid. ``require_scores``: every sample must carry a human score for each aspect (training)."""
    if task.shape != "pointwise":
        raise ConfigError(
            f"task {task.name} judges pairs of responses (output_a, output_b, label), but this "
            "reads single responses: use a pointwise task (see `hdeval tasks`)"
        )
    return list(_iter_task(path, task, require_scores, aspects))


def _iter_task(
    path: str | Path,
    task: Task,
    require_labels: bool,
    aspects: Sequence[str] | None = None,
    seen: DictIds | DiskIds | None = None,
    keep: Callable[[str], bool] | None = None,
    labels_file: bool = False,
) -> Iterator[Any]:
    """The samples (or pairs) of ``path`` one at a time, holding only the ids seen (for duplicates).
    Samples are yielded only while no line has been bad; the rest of the file is still checked,
    and the :class:`DataError` listing every bad line is raised at the end."""
    path = Path(path)
    if task.shape == "pairwise":
        hint: Callable[[], str] = lambda: ""  # noqa: E731 (one-line defaults, replaced below for pointwise tasks)
        shown_where = ", ".join(
            f"{k} in {list(v)}" if len(v) > 1 else f"{k} = {v[0]!r}" for k, v in task.where
        )
        what = f"pairs matching where {shown_where}" if task.where else "pairs"
        match: Callable[[dict], bool] | None = lambda row: _matches(row, task.where)  # noqa: E731 (see above)

        def parse(row: dict, lineno: int) -> tuple[str | None, Any]:
            return _pair_from_row(row, lineno, task, require_labels)
    else:
        match = None
        what, aspect_keys = "samples", list(aspects) if aspects is not None else list(task.aspect_keys)
        unscored: dict[str, int] = {}  # aspect -> lines without its score (hint for --aspects)

        def parse(row: dict, lineno: int) -> tuple[str | None, Any]:
            if require_labels and isinstance(row.get("scores"), dict):
                for key in aspect_keys:
                    if row["scores"].get(key) is None:
                        unscored[key] = unscored.get(key, 0) + 1
            return _sample_from_row(row, lineno, task, aspect_keys, require_labels)

        def hint() -> str:
            have = [a for a in aspect_keys if a not in unscored]
            return (
                f"; lines lack scores for {', '.join(unscored)}: to train on the aspects every line has, "
                f"pass --aspects {','.join(have)}"
                if unscored and have
                else ""
            )

    problems: dict[str, list[int]] = {}  # each distinct problem -> [lines it is on, the first three of them]
    n_bad = n_rows = 0
    seen = DictIds() if seen is None else seen
    fmt = table_format(path)
    unit = row_unit(path)
    mapped = fmt is not None or bool(task.columns)
    derived: dict[str, int] = {}  # content ids handed out: a repeat of the same texts gets -2, -3, ...
    if is_labels_file(path):  # hdeval label's labels.db: the samples export-labels would write
        if not labels_file:
            raise labels_file_refused(path)
        unit, mapped = "labelled sample", False
        rows: Iterator[tuple[int, str | None, dict | None]] = (
            (i, None, row) for i, row in enumerate(labelled_rows(path, task.name, task.shape), 1)
        )
    else:
        rows = _jsonl_rows(path) if fmt is None else _table_rows(path, fmt)
    for lineno, problem, item in rows:
        if item is not None:
            if mapped:
                item = map_columns(item, task, derived)
            if match is not None and not match(item):
                continue
            if (
                keep is not None
                and not _no_id(item.get("id"))
                and _id_type(item["id"])
                and not keep(str(item["id"]))
            ):
                n_rows += 1  # another shard's, so the file is not empty (a row with no id is everyone's)
                continue
            where = _lone_surrogate(item)
            problem, item = (
                parse(item, lineno)
                if where is None
                else (
                    f"{where} holds a lone surrogate (a \\u escape between \\ud800 and \\udfff without its "
                    "pair), which is not text",
                    None,
                )
            )
            if problem is None and item is None:
                continue
            first = None if problem else seen.first_line(item.id, lineno)
            if first is not None:
                problem = f"id {item.id!r} already used on {unit} {first}"
        if problem:
            n_bad += 1
            if problem in problems or len(problems) < MAX_REPORTED_ERRORS:
                on = problems.setdefault(problem, [0])
                on[0] += 1
                on.extend([lineno] if len(on) < 4 else [])
            continue
        n_rows += 1
        if not n_bad:
            yield item
    if n_bad:
        shown = sum(on[0] for on in problems.values())
        more = f" (and {n_bad - shown} more)" if n_bad > shown else ""
        raise DataError(
            f"{path}: {n_bad} bad {unit}(s): {hint().lstrip('; ')}{'; ' if hint() else ''}"
            + "; ".join(_on_lines(unit, p, on[0], on[1:]) for p, on in problems.items())
            + more
        )
    if not n_rows:
        raise DataError(f"{path}: no {what}")


def _on_lines(unit: str, problem: str, count: int, first: list[int]) -> str:
    """``line 3: PROBLEM``, or for a problem on many lines ``lines 1, 2, 5 and 17 more: PROBLEM``."""
    if count == 1:
        return f"{unit} {first[0]}: {problem}"
    head = ", ".join(map(str, first)) + (f" and {count - len(first)} more" if count > len(first) else "")
    return f"{unit}s {head}: {problem}"


#: data files read as tables (one column per field) by their extension; any other name is JSONL
TABLE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".json": "json", ".parquet": "parquet"}


def labels_file_refused(path: str | Path) -> DataError:
    """The one-line refusal of a labels file by a command that reads data files only."""
    return DataError(
        f"{path} is a labels file of hdeval label, which this command does not read: write its "
        f"samples with `hdeval data export-labels {path} -o labeled.jsonl` (train reads it as it is)"
    )


def table_format(path: str | Path) -> str | None:
    """``csv``, ``tsv``, ``json`` (a list of objects) or ``parquet`` by the extension; None: JSONL."""
    return TABLE_FORMATS.get(Path(path).suffix.lower())


def jsonl_output(out: str | Path, option: str = "-o") -> None:
    """Refuse an output name a JSONL writer would betray: another format's extension (the file
    would then be read as that format and fail) or ``-`` (a file named "-", not standard output)."""
    name = str(out)
    if name == "-":
        raise ConfigError(f"{option} -: this command writes a file; name one ending in .jsonl")
    if not name.lower().endswith(".jsonl"):
        raise ConfigError(f"{option} {name}: this command writes JSONL; name the file *.jsonl")


def row_unit(path: str | Path) -> str:
    """What a message calls one record of ``path``: ``row`` in JSON and Parquet, whose records
    are not lines, else ``line``."""
    return "row" if table_format(path) in ("json", "parquet") else "line"


def recorded_columns(path: str | Path, task: Task) -> Task:
    """``task`` with the column mapping ``hdeval data import`` recorded in the JSONL file ``path``
    (each row's ``columns``; the first row's is read) when the task maps none of its own, so the
    artifact keeps it and ``apply`` reads new files of the user's layout. A ``columns`` that is no
    mapping of this task's fields is a one-line :class:`DataError` naming the file's line 1."""
    import dataclasses

    from hdeval.data.tasks import parse_columns

    if task.columns or task.shape != "pointwise" or table_format(path) is not None or is_labels_file(path):
        return task
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            first = next((line for line in bounded_lines(fh, path) if line.strip()), None)
    except OSError:
        return task  # reading the samples says what is wrong with the file
    _, row = parse_json_line(first.lstrip(BOM), 0) if first else (None, None)
    if not isinstance(row, dict) or row.get("columns") is None:
        return task
    try:
        columns = parse_columns(row["columns"], list(task.aspect_keys), f"{path}: line 1")
    except ConfigError as exc:
        raise DataError(str(exc)) from None
    return dataclasses.replace(task, columns=columns)


def check_readable(path: str | Path) -> None:
    """A one-line :class:`DataError` when the data file cannot be opened: commands that load an
    artifact say so first, not after the heavy libraries it needs have loaded."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise DataError(f"cannot open data file {path}: {exc}") from exc


def data_rows(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line or row number, values by column) of each row of a data file as it is, before any
    column mapping (``hdeval init`` reads a file's columns so); the first bad row raises."""
    path = Path(path)
    fmt = table_format(path)
    for lineno, problem, values in _jsonl_rows(path) if fmt is None else _table_rows(path, fmt):
        if problem or values is None:
            raise DataError(f"{path}: {'row' if fmt in ('json', 'parquet') else 'line'} {lineno}: {problem}")
        yield lineno, values


def _jsonl_rows(path: Path) -> Iterator[tuple[int, str | None, dict | None]]:
    """(line number, problem, the line's JSON object) of each non-blank line of a JSONL file."""
    try:
        # Invalid bytes become lone surrogates (U+DC80-U+DCFF) so each is reported with its
        # line; newline="" keeps line ends as they are, so byte offsets stay exact.
        fh = path.open("r", encoding="utf-8", errors="surrogateescape", newline="")
    except OSError as exc:
        raise DataError(f"cannot open data file {path}: {exc}") from exc
    offset = 0  # bytes of the file before the current line
    with fh:
        for lineno, line in enumerate(bounded_lines(fh, path), 1):
            start = offset
            offset += len(line.encode("utf-8", "surrogateescape"))
            if lineno == 1 and line.startswith(BOM):
                line = line[
                    1:
                ]  # a byte-order mark, as spreadsheet exports write (data import accepts it too)
                start += len(BOM.encode("utf-8"))
            if not line.strip():
                continue
            problem, item = parse_json_line(line, start)
            yield lineno, problem, item


def _table_rows(path: Path, fmt: str) -> Iterator[tuple[int, str | None, dict | None]]:
    """(line (CSV/TSV) or row (JSON, parquet) number, problem, the row's values by column)."""
    if fmt in ("csv", "tsv"):
        import csv

        try:
            fh = path.open("r", encoding="utf-8-sig", newline="")  # spreadsheets put a BOM in front
        except OSError as exc:
            raise DataError(f"cannot open data file {path}: {exc}") from exc
        with fh:
            reader = csv.reader(fh, delimiter="\t" if fmt == "tsv" else ",")
            try:
                header = [h.strip() for h in next(reader, None) or []]
                if not header:
                    raise DataError(f"{path}: empty file (no header row)")
                dups = sorted({h for h in header if header.count(h) > 1})
                if dups:
                    raise DataError(f"{path}: header names column(s) {', '.join(map(repr, dups))} twice")
                start = reader.line_num + 1
                for cells in reader:
                    line, start = start, reader.line_num + 1
                    if not any(c.strip() for c in cells):
                        continue  # a blank line
                    if len(cells) != len(header):
                        yield line, f"{len(cells)} cells, the header has {len(header)}", None
                        continue
                    yield line, None, {h: c for h, c in zip(header, cells) if c.strip()}
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}: not UTF-8 text (byte {exc.start} of a block near line {reader.line_num + 1})"
                ) from None
            except csv.Error as exc:
                raise DataError(f"{path}: line {reader.line_num}: {exc}") from None
        return
    if fmt == "parquet":
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            raise ConfigError(
                f"reading {path} needs pyarrow: pip install pyarrow (or give CSV, TSV, JSON or JSONL)"
            )
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise DataError(
                f"{path}: cannot read it as parquet ({str(exc).splitlines()[0] if str(exc) else exc})"
            ) from None
        records = frame.to_dict("records")
    else:
        try:
            if path.stat().st_size > MAX_LINE_BYTES * 8:
                raise DataError(
                    f"{path}: larger than {MAX_LINE_BYTES * 8:,} bytes: a JSON list is read whole; "
                    "write it as JSONL (one object per line), which is read a line at a time"
                )
            records = json.loads(path.read_bytes().decode("utf-8-sig"))
        except OSError as exc:
            raise DataError(f"cannot read data file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        except RecursionError:
            raise DataError(f"{path}: not usable JSON (nested too deeply)") from None
        except ValueError as exc:
            raise DataError(
                f"{path}: not valid JSON ({exc}); for one object per line name it .jsonl"
            ) from None
        if not isinstance(records, list):
            raise DataError(
                f"{path}: expected a JSON list of objects; for one object per line name it .jsonl"
            )
    for n, values in enumerate(records, 1):
        if not isinstance(values, dict):
            yield n, "not a JSON object", None
            continue
        yield n, None, {k: v for k, v in values.items() if not _missing(v)}


def _missing(value: Any) -> bool:
    """An empty cell: None, NaN (pandas' empty parquet cell) or blank text."""
    return (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or (isinstance(value, str) and not value.strip())
    )


def content_id(task: str, texts: Mapping[str, Any], derived: dict[str, int]) -> str:
    """An id from a row's texts, the same for the same texts whatever file or position they are in
    (a new file's rows never take a training row's id unless they are that row); ``derived``
    counts what was handed out, so a repeat of the same texts gets ``-2``, ``-3``, ..."""
    import hashlib

    key = "\x00".join(
        f"{k}={texts.get(k) or ''}"
        for k in ("source", "context", "output", "reference", "output_a", "output_b")
    )
    sid = f"{task}-{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
    derived[sid] = derived.get(sid, 0) + 1
    return sid if derived[sid] == 1 else f"{sid}-{derived[sid]}"


def map_columns(values: Mapping[str, Any], task: Task, derived: dict[str, int]) -> dict:
    """A row of a user's table (or JSONL in their own layout) as a row of hdeval's sample schema,
    through the task's ``[columns]`` (a field's own name when it maps none or the row lacks the
    mapped column, so a file already in hdeval's schema reads as well): texts, ``id`` (else
    :func:`content_id`), ``doc_id`` (else a hash of the source, so outputs of one source stay on
    one side of a split), ``system`` and ``scores`` (a number given as text becomes a number)."""
    import hashlib

    if isinstance(values.get("columns"), dict):
        # a row ``hdeval data import`` wrote is in hdeval's schema already: mapped again, a
        # mapping that names another field's column (--source-col context) would swap texts
        return dict(values)
    cols = dict(task.columns)

    def get(key: str) -> Any:
        col = cols.get(key, key)
        return values[col] if col in values else values.get(key)

    row = dict(values)
    for key in ("source", "context", "output", "reference"):
        row[key] = get(key)
    for key in ("id", "doc_id", "system"):
        value = get(key)
        row[key] = (
            str(value).strip()
            if isinstance(value, (int, float, str)) and not isinstance(value, bool)
            else value
        )
    scores = dict(values["scores"]) if isinstance(values.get("scores"), dict) else {}
    for aspect in task.aspect_keys:
        col = cols.get(f"scores.{aspect}", aspect)
        value = values.get(col, values.get(aspect, scores.get(aspect)))
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value.strip())
        if value is not None:
            scores[aspect] = value
    row["scores"] = scores
    if _no_id(row["id"]):
        row["id"] = content_id(task.name, row, derived)
    if _no_id(row["doc_id"]):
        source = row["source"] if isinstance(row["source"], str) else None
        row["doc_id"] = (
            "src-" + hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            if source
            else row["id"]
        )
    return row


def _matches(row: Mapping[str, Any], where: Sequence[tuple[str, Sequence[Any]]]) -> bool:
    """Whether ``row`` passes a task's ``where``: each key looked up in ``meta`` first, then at the top level."""
    meta = row["meta"] if isinstance(row.get("meta"), Mapping) else {}
    return all((meta[k] if k in meta else row.get(k)) in values for k, values in where)


def parse_json_line(line: str, start: int) -> tuple[str | None, dict | None]:
    """(problem, None) or (None, the JSON object on ``line``, which starts at byte ``start``)."""
    bad_byte = _INVALID_BYTE.search(line)
    if bad_byte:
        col = len(line[: bad_byte.start()].encode("utf-8", "surrogateescape"))
        return (
            f"not UTF-8 text (byte 0x{ord(bad_byte.group()) - 0xDC00:02x} at byte {col + 1} of the line, "
            f"offset {start + col} in the file)"
        ), None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at column {exc.colno})", None
    except RecursionError:
        return "not usable JSON (nested too deeply)", None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        return f"not usable JSON ({exc})", None
    return (None, row) if isinstance(row, dict) else ("not a JSON object", None)


def _no_id(sid: object) -> bool:
    return sid is None or (isinstance(sid, str) and not sid.strip())


def _id_type(value: object) -> bool:
    """An ``id``/``doc_id`` as the docs allow: text or a whole number (absent: checked elsewhere);
    never a list, an object, a float or true/false, whose ``str`` would make up an id."""
    return value is None or isinstance(value, str) or type(value) is int


def _kind(value: object) -> str:
    """How a wrong JSON value is named in a message: its JSON type, not the value (which may be huge)."""
    if isinstance(value, bool):
        return "true/false"
    return {list: "a list", dict: "an object", float: "a decimal number"}.get(
        type(value), type(value).__name__
    )


def _lone_surrogate(row: object) -> str | None:
    """Where a lone surrogate is (``field 'output'``), or None; iterative: rows nest deep."""
    stack: list[tuple[str, object]] = [("", row)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if has_lone_surrogate(value):
                return f"field {where!r}" if where else "the line"
        elif isinstance(value, dict):
            for k, v in value.items():
                name = f"{where}.{k}" if where else k
                if has_lone_surrogate(k):
                    return f"a key in {where!r}" if where else "a key"
                stack.append((name, v))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
    return None


class DictIds(dict):
    """Ids seen, in memory (a reader's default; ``apply`` keeps them on disk instead)."""

    def first_line(self, sample_id: str, lineno: int) -> int | None:
        first = self.setdefault(sample_id, lineno)
        return None if first == lineno else first


class DiskIds(contextlib.AbstractContextManager):
    """Ids seen, in an SQLite file in a private temporary directory (in ``near`` when given, or
    the nearest folder above it that exists, as an output's folder may be made later; removed by
    :meth:`close`): memory stays within SQLite's page cache however many ids there
    are, where a dict costs ~170 bytes an id. Ids are stored as UTF-8 bytes (surrogates kept),
    so any id a reader accepts is indexed."""

    # SQLite's page cache for the index: small enough to be full early in a run, so apply's peak
    # does not grow with the input past that (the figures are in affb958's message)
    CACHE_KIB = 512

    def __init__(self, near: str | Path | None = None):
        import sqlite3
        import tempfile

        if near is not None:
            near = Path(os.path.abspath(near))
            while not near.is_dir() and near != near.parent:
                near = near.parent
        try:
            self._dir = tempfile.TemporaryDirectory(prefix=".hdeval-ids-", suffix=".tmp", dir=near)
        except OSError as exc:
            raise ConfigError(
                f"cannot write the duplicate-id index in {near or tempfile.gettempdir()}: "
                f"{exc.strerror or exc}"
            ) from None
        # a scratch index rebuilt by every run: no journal, no fsync
        self._con = sqlite3.connect(os.path.join(self._dir.name, "ids.db"), isolation_level=None)
        for pragma in (
            "journal_mode=OFF",
            "synchronous=OFF",
            f"cache_size=-{self.CACHE_KIB}",
            "temp_store=FILE",
        ):
            self._con.execute("PRAGMA " + pragma)
        self._con.execute("CREATE TABLE ids (id BLOB PRIMARY KEY, line INTEGER) WITHOUT ROWID")
        self._con.execute("BEGIN")

    def first_line(self, sample_id: str, lineno: int) -> int | None:
        key = sample_id.encode("utf-8", "surrogatepass")
        if self._con.execute("INSERT OR IGNORE INTO ids VALUES (?, ?)", (key, lineno)).rowcount:
            return None
        return int(self._con.execute("SELECT line FROM ids WHERE id = ?", (key,)).fetchone()[0])

    @property
    def directory(self) -> str:
        """The private temporary directory (removed with the index): room for other scratch files."""
        return self._dir.name

    def close(self) -> None:
        self._con.close()
        self._dir.cleanup()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text_fields(
    row: dict, task: Task, keys: Sequence[tuple[str, str]], skip_empty: bool = False
) -> tuple[str | None, dict[str, str], bool]:
    """(problem, the texts ``keys`` names and the optional shown ones, whether one is empty)."""
    if _no_id(row.get("id")):
        return "missing field 'id'", {}, False
    for name in ("id", "doc_id"):
        if not _id_type(row.get(name)):
            return f"field {name!r} must be text or a whole number, got {_kind(row[name])}", {}, False
    fields: dict[str, str] = {}
    for key, label in keys:
        value = row.get(key)
        if not isinstance(value, str) or not (value.strip() or skip_empty):
            what = "missing" if value is None else "empty" if isinstance(value, str) else "not text"
            return f"field {key!r} ({label}) is {what} (task {task.name} needs it)", {}, False
        fields[key] = value
    empty = not all(v.strip() for v in fields.values())
    for extra in ("source", "context", "reference"):
        if extra not in fields and isinstance(row.get(extra), str):
            fields[extra] = row[extra]
    return None, fields, empty


def _doc_id(row: dict) -> str:
    doc = row.get("doc_id")
    return str(doc) if doc not in (None, "") else str(row["id"])


def _sample_from_row(
    row: dict, lineno: int, task: Task, aspect_keys: Sequence[str], require_scores: bool
) -> tuple[str | None, Sample | None]:
    problem, fields, _ = _text_fields(row, task, [(f.key, f.label) for f in task.fields])
    if problem:
        return problem, None
    raw_scores = {} if row.get("scores") is None else row["scores"]
    if not isinstance(raw_scores, dict):
        return "field 'scores' must be an object mapping aspect to number", None
    scores: dict[str, float] = {}
    for key in aspect_keys:
        value = raw_scores.get(key)
        if value is None:
            if require_scores:
                return f"scores.{key} is missing (needed to train on aspect {key!r})", None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"scores.{key} is {value!r}, not a finite number", None
        aspect = task.aspect(key)
        if not aspect.low <= float(value) <= aspect.high:
            return (
                f"scores.{key} = {value} is outside the task's range [{aspect.low:g}, {aspect.high:g}]"
            ), None
        scores[key] = float(value)
    return None, Sample(
        id=str(row["id"]),
        doc_id=_doc_id(row),
        fields=fields,
        scores=scores,
        system=row.get("system"),
        line=lineno,
    )


S = TypeVar("S", Sample, PairSample)  # what a split needs: an id and the source document (doc_id)


@dataclass(frozen=True)
class Split:
    train_ids: tuple[str, ...]
    test_ids: tuple[str, ...]

    def to_dict(self) -> dict[str, list[str]]:
        return {"train": list(self.train_ids), "test": list(self.test_ids)}


def _docs_in_seeded_order(samples: Sequence[S], seed: int) -> list[list[S]]:
    groups: dict[str, list[S]] = {}
    for s in samples:
        groups.setdefault(s.doc_id, []).append(s)
    docs = sorted(groups)
    random.Random(seed).shuffle(docs)
    return [groups[d] for d in docs]


def limit_samples(samples: Sequence[S], limit: int | None, seed: int) -> list[S]:
    """``--limit N``: whole source documents in seeded order until at least N samples are taken
    (the last document is never cut: its outputs are compared with each other)."""
    if limit is None or limit >= len(samples):
        return list(samples)
    if limit < 1:
        raise ConfigError("--limit must be at least 1")
    out: list[S] = []
    for group in _docs_in_seeded_order(samples, seed):
        out.extend(group)
        if len(out) >= limit:
            break
    return out


def split_samples(samples: Sequence[S], test_frac: float, train_frac: float, seed: int) -> Split:
    """Deterministic split grouped by ``doc_id``: no source document is on both sides. ``test_frac``
    of the samples are held out; ``train_frac`` of all samples are used for training (the rest, if
    any, are left unused, as in the paper's 25% setting)."""
    if not 0 < test_frac < 1:
        raise ConfigError(f"--test-frac must be between 0 and 1, got {test_frac}")
    if not 0 < train_frac < 1 or train_frac + test_frac > 1 + 1e-9:
        raise ConfigError(
            f"--train-frac must be in (0, 1) and at most 1 - test-frac, got {train_frac} (test {test_frac})"
        )
    docs = _docs_in_seeded_order(samples, seed)
    if len(docs) < 2:
        raise DataError(
            f"need samples from at least 2 source documents (doc_id) to split train/test, found "
            f"{len(docs)} ({len(samples)} sample(s)); use more data or raise --limit"
        )
    n = len(samples)
    test: list[S] = []
    train: list[S] = []
    i = 0
    while i < len(docs) - 1 and len(test) < test_frac * n:
        test.extend(docs[i])
        i += 1
    for group in docs[i:]:
        if len(train) >= train_frac * n - 1e-9:
            break
        train.extend(group)
    if len(train) < MIN_TRAIN_SAMPLES:
        # Checked here, before any LLM call: cross-validation would fail only after scoring.
        raise DataError(
            f"the split left {len(train)} training sample(s) (of {n} in {len(docs)} documents, "
            f"{len(test)} held out); training needs at least {MIN_TRAIN_SAMPLES}: use more data, "
            "raise --limit or --train-frac, or lower --test-frac"
        )
    order = {s.id: k for k, s in enumerate(samples)}
    return Split(
        tuple(sorted((s.id for s in train), key=order.__getitem__)),
        tuple(sorted((s.id for s in test), key=order.__getitem__)),
    )


def read_task_samples(
    path: str | Path, task: Task, require_labels: bool = True, labels_file: bool = False
) -> list[Sample] | list[PairSample]:
    """Read ``path`` with the reader of the task's shape (scores / labels required); errors are
    reported as by :func:`read_samples`. A pairwise file holds ``output_a``, ``output_b`` and
    ``label`` (a/b/tie); only rows matching the task's ``where`` are kept (the others are not
    checked beyond being JSON objects); with its ``skip_empty``, rows whose shown text or a
    response is an empty string are left out. ``labels_file``: ``path`` may also be the labels
    file ``hdeval label`` writes, read as the samples ``hdeval data export-labels`` would write
    (else such a file is refused with a one-line error)."""
    return list(_iter_task(path, task, require_labels, labels_file=labels_file))


def iter_task_chunks(
    path: str | Path,
    task: Task,
    require_labels: bool = True,
    size: int = 1000,
    seen: DictIds | DiskIds | None = None,
    keep: Callable[[str], bool] | None = None,
    labels_file: bool = False,
) -> Iterator[list[Sample] | list[PairSample]]:
    """Read ``path`` as :func:`read_task_samples` does, ``size`` samples at a time: memory
    holds one chunk (and the ids seen, unless ``seen`` keeps them elsewhere). Every line is
    validated as there; a bad line raises the same :class:`DataError` when the scan reaches the
    end of the file, and no chunk after the first bad line is yielded. ``keep(id)`` False: the
    row is another reader's (a shard): skipped unchecked beyond its JSON and id."""
    if size < 1:
        raise ConfigError(f"chunk size must be at least 1, got {size}")
    it = _iter_task(path, task, require_labels, None, seen, keep, labels_file)
    yield from iter(lambda: list(itertools.islice(it, size)), [])


def _pair_from_row(
    row: dict, lineno: int, task: Task, require_labels: bool
) -> tuple[str | None, PairSample | None]:
    """(problem, None) for a bad row, (None, None) for a row skipped by ``skip_empty``."""
    output = next(f.label for f in task.fields if f.key == "output")
    keys = [(f.key, f.label) for f in task.fields if f.key != "output"]
    problem, fields, empty = _text_fields(
        row, task, keys + [("output_a", f"{output} A"), ("output_b", f"{output} B")], task.skip_empty
    )
    if problem:
        return problem, None
    label = row.get("label")
    if label is None:
        if require_labels:
            return "field 'label' is missing (a, b or tie; needed to train)", None
    elif label not in PAIR_LABELS:
        return f"field 'label' is {label!r}, not one of a, b, tie", None
    meta = row.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return "field 'meta' must be an object or null", None
    for key in ("system_a", "system_b"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return f"field {key!r} must be text or null, got {row[key]!r}", None
    if empty:
        return None, None
    a, b = fields.pop("output_a"), fields.pop("output_b")
    return None, PairSample(
        id=str(row["id"]),
        doc_id=_doc_id(row),
        fields=fields,
        output_a=a,
        output_b=b,
        label=label,
        system_a=row.get("system_a"),
        system_b=row.get("system_b"),
        meta=dict(meta or {}),
        line=lineno,
    )


def sample_from_line(task: Task, text: str, where: str) -> Sample | PairSample | None:
    """The sample ``apply`` would read from one JSONL line, for readers that get lines one at a
    time (Ray Data): None when the line is blank or a pairwise task's ``where`` filters it out;
    a bad line is a :class:`DataError` naming ``where``."""
    text = text.removeprefix(BOM)
    if not text.strip():
        return None
    try:
        row = json.loads(text)
    except (ValueError, RecursionError):
        raise DataError(f"{where}: not valid JSON") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: not a JSON object")
    if task.shape == "pairwise" and not _matches(row, task.where):
        return None
    problem: str | None
    sample: Sample | PairSample | None
    lone = _lone_surrogate(row)  # apply checks both shapes for it before reading the row
    if lone:
        problem, sample = f"{lone} holds a lone surrogate", None
    elif task.shape == "pairwise":
        problem, sample = _pair_from_row(row, 0, task, require_labels=False)
        if problem is None and sample is None:
            return None  # skip_empty, as apply skips it
    else:
        problem, sample = _sample_from_row(row, 0, task, list(task.aspect_keys), False)
    if problem:
        raise DataError(f"{where}: {problem}")
    return sample


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Write atomically: a temp file renamed into place, so no half-written output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
