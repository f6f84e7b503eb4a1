"""Getting human-judgment data onto a machine: download the public files, convert, import.

Three jobs, one theme (turning someone else's file into rows of the sample schema in
``shared/data/README.md``):

* :func:`download_datasets` fetches the human-judgment files that UniEval publishes
  (``maszhongming/UniEval``, ``reproduce/data/...``), converts them with
  :func:`convert_records` and writes ``<task>.jsonl`` into the per-user data dir that
  ``train`` searches (:func:`hdeval.paths.user_data_dir`).
* :func:`data_status` says, per built-in task, where its file is looked for and what is there.
* :func:`import_table` converts a user's CSV/TSV/JSON/JSONL with a column mapping.

Library code: problems are raised as :class:`~hdeval.errors.HdevalError` subclasses and
progress goes through a callback; nothing here prints.
"""

from __future__ import annotations

import csv
import hashlib
import http.client
import io
import json
import math
import os
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

from hdeval.errors import ConfigError, DataError, DownloadError
from hdeval.paths import user_data_dir

if TYPE_CHECKING:
    from hdeval.types import Task


# hdeval.data and hdeval.tasks load numpy (via hdeval.types); `hdeval --help` imports this
# module for its option lists, so they are imported on first use.
def load_task(name: str | Path) -> Task:
    from hdeval.tasks import load_task as load

    return load(name)


def read_samples(path: str | Path, task: Task, **kwargs: Any) -> list:
    from hdeval.data import read_samples as read

    return read(path, task, **kwargs)


def write_jsonl(path: str | Path, rows: Any) -> None:
    from hdeval.data import write_jsonl as write

    write(path, rows)


def data_candidates(task: Task) -> list[Path]:
    from hdeval.data import data_candidates as candidates

    return candidates(task)


def read_task_samples(path: str | Path, task: Task, **kwargs: Any) -> list:
    from hdeval.data import read_task_samples as read

    return read(path, task, **kwargs)


def builtin_tasks() -> dict[str, Path]:
    from hdeval.tasks import builtin_tasks as tasks

    return tasks()

#: UniEval's published meta-evaluation files. Not pinned to a commit because the issue asks
#: for the main branch; the row counts below catch an upstream change of content size.
DEFAULT_SOURCE_URL = "https://raw.githubusercontent.com/maszhongming/UniEval/main/reproduce/data/"
SOURCE_URL_ENV = "HDEVAL_DATA_SOURCE_URL"
DEFAULT_TIMEOUT = 60.0
_CHUNK = 64 * 1024
_MAX_REPORTED_ERRORS = 20


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class UpstreamDataset:
    """One built-in task's public source file."""

    task: str
    #: path below the source base URL, in UniEval's ``reproduce/data/`` layout
    path: str
    #: rows in the official UniEval file (checked strictly for the official source)
    official_rows: int


DATASETS: dict[str, UpstreamDataset] = {
    "summeval": UpstreamDataset("summeval", "summarization/summeval.json", 1600),
    "topical_chat": UpstreamDataset("topical_chat", "dialogue/topical_chat.json", 360),
    "sfres": UpstreamDataset("sfres", "data2text/sfres.json", 1181),
    "sfhot": UpstreamDataset("sfhot", "data2text/sfhot.json", 875),
}


def resolve_source_url(explicit: str | None = None) -> str:
    """``--source-url``, else ``$HDEVAL_DATA_SOURCE_URL``, else UniEval on GitHub; ends in ``/``."""
    base = explicit or os.environ.get(SOURCE_URL_ENV) or DEFAULT_SOURCE_URL
    return base if base.endswith("/") else base + "/"


def is_official_source(base_url: str) -> bool:
    return resolve_source_url(base_url) == DEFAULT_SOURCE_URL


def dataset_url(base_url: str, name: str) -> str:
    return resolve_source_url(base_url) + DATASETS[name].path


# --------------------------------------------------------------------------- conversion


def _slug(text: str) -> str:
    """``Nucleus Decoding (p = 0.3)`` -> ``nucleus_decoding_p_0_3`` (as in the shared ids)."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _text(rec: Mapping[str, Any], key: str, where: str, required: bool = True) -> str | None:
    """Upstream text, stripped: UniEval's dialogue fields carry trailing spaces/newlines
    that the shared files do not, and a prompt gains nothing from them."""
    value = rec.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise DataError(f"{where}: field {key!r} is missing, empty or not text")
    return value.strip() or None


def _scores(
    rec: Mapping[str, Any], task: Task, rename: Mapping[str, str], drop: Sequence[str], where: str
) -> dict[str, float]:
    raw = rec.get("scores")
    if isinstance(raw, str):
        # Some copies of the UniEval files store the dict JSON-encoded; accept both.
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise DataError(f"{where}: 'scores' is a string that is not a JSON object") from None
    if not isinstance(raw, dict):
        raise DataError(f"{where}: 'scores' must be an object mapping aspect to number")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if key in drop:
            continue
        name = rename.get(key, key)
        if name not in task.aspect_keys:
            continue
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DataError(f"{where}: scores.{key} is {value!r}, not a finite number")
        out[name] = float(value)
    missing = [a for a in task.aspect_keys if a not in out]
    if missing:
        raise DataError(f"{where}: no score for aspect(s) {', '.join(missing)}")
    return out


def _row(
    task: Task,
    id_: str,
    doc_id: str,
    source: str | None,
    context: str | None,
    output: str | None,
    reference: str | None,
    system: str | None,
    scores: dict[str, float],
) -> dict[str, Any]:
    # Key order as in the shared files, so a diff between the two is readable.
    return {
        "id": id_,
        "task": task.name,
        "source": source,
        "context": context,
        "output": output,
        "reference": reference,
        "system": system,
        "doc_id": doc_id,
        "scores": scores,
        "annotations": None,
    }


def convert_summeval(records: Sequence[Mapping[str, Any]], task: Task, where: str) -> list[dict]:
    """UniEval ``summeval.json`` -> rows. ``id`` = ``summeval-<doc_id>-<system_id>``.

    ``doc_id`` is UniEval's (the CNN/DM id); ``system`` its ``system_id`` (M0...M23).
    ``overall`` is dropped: UniEval computes it as the mean of the four aspects, so it adds
    no human judgment. Not in the upstream file and therefore absent here, unlike in
    ``shared/data/summeval.jsonl``: ``meta.references`` (the 11 references) and
    ``meta.source_untokenized`` (the raw article).
    """
    rows = []
    for i, rec in enumerate(records, 1):
        at = f"{where}: record {i}"
        doc = rec.get("doc_id")
        system = rec.get("system_id")
        if doc in (None, "") or system in (None, ""):
            raise DataError(f"{at}: needs 'doc_id' and 'system_id'")
        rows.append(
            _row(
                task,
                f"summeval-{doc}-{system}",
                str(doc),
                _text(rec, "source", at),
                None,
                _text(rec, "system_output", at),
                _text(rec, "reference", at, required=False),
                str(system),
                _scores(rec, task, {}, ("overall",), at),
            )
        )
    return rows


def convert_topical_chat(records: Sequence[Mapping[str, Any]], task: Task, where: str) -> list[dict]:
    """UniEval ``topical_chat.json`` -> rows.

    UniEval gives no dialogue id, so ``doc_id`` numbers the distinct (history, fact) pairs
    in order of first appearance: ``tc-00``, ``tc-01``...; ``id`` =
    ``topical_chat-<nn>-<slug of system_id>``. Both equal the ids of
    ``shared/data/topical_chat.jsonl`` because that file keeps UniEval's order. ``source``
    is the dialogue history, ``context`` the fact. The per-annotator ``annotations`` of the
    shared file come from USR's ``tc_usr_data.json``, not from UniEval, so they are ``null``
    here; the averaged ``scores`` are the same.
    """
    rows = []
    docs: dict[tuple[str, str], int] = {}
    for i, rec in enumerate(records, 1):
        at = f"{where}: record {i}"
        source = _text(rec, "source", at)
        context = _text(rec, "context", at)
        system = rec.get("system_id")
        if not isinstance(system, str) or not system.strip():
            raise DataError(f"{at}: needs 'system_id'")
        k = docs.setdefault((source or "", context or ""), len(docs))
        rows.append(
            _row(
                task,
                f"topical_chat-{k:02d}-{_slug(system)}",
                f"tc-{k:02d}",
                source,
                context,
                _text(rec, "system_output", at),
                _text(rec, "reference", at, required=False),
                system,
                _scores(rec, task, {}, (), at),
            )
        )
    return rows


def convert_data2text(records: Sequence[Mapping[str, Any]], task: Task, where: str) -> list[dict]:
    """UniEval ``sfres.json`` / ``sfhot.json`` -> rows.

    UniEval's integer ``doc_id`` is the record's position, not a meaning-representation
    (MR) id, so it cannot group outputs of one input. ``doc_id`` here numbers the distinct
    MRs (``source``) in order of first appearance: ``sfres-mr-000``...; ``id`` is the
    position, ``sfres-0000``... Both equal those of ``shared/data/sfres.jsonl``, which keeps
    UniEval's order. UniEval's ``overall`` is the aspect this project calls ``quality``.
    ``system`` (WEN/LOLS) is ``null``: the shared file takes it from Novikova et al.'s
    ``emnlp_data_medians.csv``, which UniEval does not carry; likewise ``meta.references``
    (all references of an MR) is absent - ``reference`` is UniEval's single reference.
    """
    rows = []
    docs: dict[str, int] = {}
    for i, rec in enumerate(records):
        at = f"{where}: record {i + 1}"
        source = _text(rec, "source", at)
        k = docs.setdefault(source or "", len(docs))
        rows.append(
            _row(
                task,
                f"{task.name}-{i:04d}",
                f"{task.name}-mr-{k:03d}",
                source,
                None,
                _text(rec, "system_output", at),
                _text(rec, "reference", at, required=False),
                None,
                _scores(rec, task, {"overall": "quality"}, (), at),
            )
        )
    return rows


_CONVERTERS: dict[str, Callable[[Sequence[Mapping[str, Any]], Task, str], list[dict]]] = {
    "summeval": convert_summeval,
    "topical_chat": convert_topical_chat,
    "sfres": convert_data2text,
    "sfhot": convert_data2text,
}


def convert_records(name: str, records: Any, where: str = "") -> list[dict]:
    """Convert one parsed UniEval file (a JSON list of records) to rows of our schema.

    ``where`` (a URL or path) prefixes error messages. The same function serves downloads
    and tests, so the tests exercise exactly the conversion users get.
    """
    if name not in _CONVERTERS:
        raise ConfigError(f"no converter for {name!r}: known datasets are {', '.join(DATASETS)}")
    where = where or name
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{where}: expected a JSON list of objects (UniEval layout)")
    if not records:
        raise DataError(f"{where}: no records")
    rows = _CONVERTERS[name](records, load_task(name), where)
    seen: set[str] = set()
    for i, r in enumerate(rows, 1):
        if r["id"] in seen:
            raise DataError(f"{where}: record {i}: id {r['id']!r} occurs twice")
        seen.add(r["id"])
    return rows


# --------------------------------------------------------------------------- download


@dataclass(frozen=True)
class DownloadEvent:
    """What :func:`download_datasets` reports to its ``progress`` callback.

    ``kind``: ``start`` (a fetch begins), ``bytes`` (``done_bytes`` of ``total_bytes``,
    which is ``None`` when the server sends no length), ``done`` (file written), ``skip``
    (already present and valid), ``warning`` (``message`` says what).
    """

    kind: Literal["start", "bytes", "done", "skip", "warning"]
    dataset: str
    url: str = ""
    path: Path | None = None
    done_bytes: int = 0
    total_bytes: int | None = None
    rows: int | None = None
    message: str = ""


ProgressFn = Callable[[DownloadEvent], None]


@dataclass(frozen=True)
class DownloadResult:
    dataset: str
    path: Path
    rows: int
    #: False when a valid file was already there and nothing was fetched
    downloaded: bool
    warning: str | None = None


def _count_valid(path: Path, task: Task, expected: int | None) -> tuple[int | None, str | None]:
    """(rows, None) when ``path`` loads with ``read_samples`` and has ``expected`` rows."""
    if not path.is_file():
        return None, "missing"
    try:
        n = len(read_task_samples(path, task))
    except DataError as exc:
        return None, str(exc)
    if expected is not None and n != expected:
        return None, f"{n} rows, expected {expected}"
    return n, None


def _fetch(url: str, out: Path, timeout: float, on_bytes: Callable[[int, int | None], None]) -> None:
    """Stream ``url`` into ``out``; raise :class:`DownloadError` unless every byte arrived."""
    req = urllib.request.Request(url, headers={"User-Agent": "hdeval (hdeval data download)"})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise DownloadError(
                f"{url}: not found (HTTP 404); check --source-url / ${SOURCE_URL_ENV}"
            ) from None
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DownloadError(f"cannot reach {url}: {exc.reason}") from None
    except (TimeoutError, socket.timeout):
        raise DownloadError(f"{url}: no answer within {timeout:g} s") from None
    except (ValueError, http.client.HTTPException, OSError) as exc:
        raise DownloadError(f"cannot download {url}: {exc}") from None
    with resp:
        length = resp.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        done = 0
        # Write errors (disk full) are left to propagate as OSError: they are not the
        # network's fault and the caller words them.
        with out.open("wb") as fh:
            while True:
                try:
                    # read(n) returns b"" when the peer closes early instead of raising,
                    # so a cut-off body is caught by the length comparison below.
                    chunk = resp.read(_CHUNK)
                except http.client.IncompleteRead as exc:
                    raise DownloadError(
                        f"{url}: connection closed after {done + len(exc.partial)} bytes"
                        + (f" of {total}" if total is not None else "")
                        + "; nothing was written, run the command again"
                    ) from None
                except (TimeoutError, socket.timeout):
                    raise DownloadError(
                        f"{url}: stalled for {timeout:g} s after {done} bytes"
                    ) from None
                except (http.client.HTTPException, OSError) as exc:
                    raise DownloadError(
                        f"{url}: download failed after {done} bytes ({exc})"
                    ) from None
                if not chunk:
                    break
                fh.write(chunk)
                done += len(chunk)
                on_bytes(done, total)
    if total is not None and done != total:
        raise DownloadError(
            f"{url}: connection closed after {done} of {total} bytes; "
            "nothing was written, run the command again"
        )


def download_dataset(
    name: str,
    dest: Path,
    base_url: str,
    strict_count: bool,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: ProgressFn | None = None,
) -> DownloadResult:
    """Fetch, convert, verify and place one dataset; see :func:`download_datasets`."""
    ds = DATASETS[name]
    task = load_task(name)
    report = progress or (lambda e: None)
    target = dest / task.data_file
    expected = ds.official_rows if strict_count else None
    url = dataset_url(base_url, name)

    if not force:
        rows, _ = _count_valid(target, task, expected)
        if rows is not None:
            report(DownloadEvent("skip", name, url=url, path=target, rows=rows))
            return DownloadResult(name, target, rows, downloaded=False)

    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create data folder {dest}: {exc}") from None
    # Temp names start with "." and do not end in ".jsonl", so neither train nor `data list`
    # ever mistakes them for data; the pid keeps two concurrent runs apart.
    raw_tmp = dest / f".{name}.json.download-{os.getpid()}"
    out_tmp = dest / f".{task.data_file}.partial-{os.getpid()}"
    try:
        report(DownloadEvent("start", name, url=url, path=target))
        _fetch(
            url,
            raw_tmp,
            timeout,
            lambda done, total: report(
                DownloadEvent("bytes", name, url=url, done_bytes=done, total_bytes=total)
            ),
        )
        try:
            with raw_tmp.open("r", encoding="utf-8") as fh:
                records = json.load(fh)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # A server that streams without Content-Length and drops the connection ends
            # up here, so the message mentions that possibility.
            raise DataError(
                f"{url}: not a valid JSON file ({exc}); if the download was cut off, "
                "run the command again"
            ) from None
        rows = convert_records(name, records, where=url)

        warning = None
        if len(rows) != ds.official_rows:
            msg = (
                f"{url} has {len(rows)} rows; the official UniEval file has {ds.official_rows}"
            )
            if strict_count:
                raise DataError(
                    msg + "; nothing was written (use --no-strict-count to accept a mirror "
                    "that holds a different number of rows)"
                )
            warning = (
                msg + " (accepted: not the official source); results on it are not "
                "comparable with the paper's"
            )
            report(DownloadEvent("warning", name, url=url, message=warning))

        write_jsonl(out_tmp, rows)
        # The same check `train` will run, done before the file takes its final name.
        try:
            n = len(read_samples(out_tmp, task))
        except DataError as exc:
            raise DataError(f"{url}: converted rows do not load ({exc})") from None
        os.replace(out_tmp, target)
    except OSError as exc:
        raise DataError(f"cannot write {target}: {exc}") from None
    finally:
        raw_tmp.unlink(missing_ok=True)
        out_tmp.unlink(missing_ok=True)
    report(DownloadEvent("done", name, url=url, path=target, rows=n))
    return DownloadResult(name, target, n, downloaded=True, warning=warning)


def download_datasets(
    names: Sequence[str] | None = None,
    dest: str | Path | None = None,
    source_url: str | None = None,
    strict_count: bool | None = None,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: ProgressFn | None = None,
) -> list[DownloadResult]:
    """Download and convert the built-in tasks' data (all four when ``names`` is empty).

    ``dest``: defaults to :func:`hdeval.paths.user_data_dir`, where ``train`` looks.
    ``source_url``: base URL in UniEval's ``reproduce/data/`` layout; defaults to
    ``$HDEVAL_DATA_SOURCE_URL``, then to UniEval on GitHub. ``file://`` URLs work too.

    Row counts: every file is converted and checked to load with ``read_samples``.
    ``strict_count`` (default: True exactly when the source is the official one) makes a
    row count other than UniEval's (1600/360/1181/875) an error; otherwise a different
    count is accepted with a ``warning`` event, since a mirror may hold a subset. A file
    already in ``dest`` that loads (and, when strict, has the official count) is kept and
    nothing is fetched, unless ``force``. Each file is written to a temp name in ``dest``
    and renamed only after it passed every check, so an interrupted run leaves no
    half-written file; datasets finished before an error stay, and a rerun resumes.
    """
    chosen = list(dict.fromkeys(names)) if names else list(DATASETS)
    unknown = [n for n in chosen if n not in DATASETS]
    local = [n for n in unknown if n in builtin_tasks()]
    if local:
        raise ConfigError(
            f"{', '.join(local)}: no download source; set HDEVAL_DATA_DIR to a folder holding "
            f"{', '.join(load_task(n).data_file for n in local)} (downloadable: {', '.join(DATASETS)})"
        )
    if unknown:
        raise ConfigError(
            f"unknown dataset(s) {', '.join(unknown)}: choose from {', '.join(DATASETS)}"
        )
    if timeout <= 0:
        raise ConfigError(f"timeout must be positive, got {timeout}")
    base = resolve_source_url(source_url)
    strict = is_official_source(base) if strict_count is None else strict_count
    folder = Path(dest) if dest is not None else user_data_dir()
    return [
        download_dataset(n, folder, base, strict, force=force, timeout=timeout, progress=progress)
        for n in chosen
    ]


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class CandidateStatus:
    """One place a task's data file is looked for."""

    path: Path
    present: bool
    rows: int | None = None
    #: why a present file does not load (first errors of ``read_samples``)
    problem: str | None = None


@dataclass(frozen=True)
class TaskDataStatus:
    task: Task
    candidates: tuple[CandidateStatus, ...]
    official_rows: int | None

    @property
    def used(self) -> CandidateStatus | None:
        """The file ``train`` picks: the first candidate that exists (even if broken)."""
        return next((c for c in self.candidates if c.present), None)


def data_status(names: Sequence[str] | None = None) -> list[TaskDataStatus]:
    """Per built-in task (all of them by default, with or without a download source): each
    candidate path (:func:`hdeval.data.data_candidates`), whether a file is there, and its
    row count when it loads."""
    out = []
    for name in names or list(builtin_tasks()):
        task = load_task(name)
        cands = []
        for path in data_candidates(task):
            if not path.is_file():
                cands.append(CandidateStatus(path, present=False))
                continue
            rows, problem = _count_valid(path, task, None)
            cands.append(CandidateStatus(path, True, rows, problem))
        ds = DATASETS.get(name)
        out.append(TaskDataStatus(task, tuple(cands), ds.official_rows if ds else None))
    return out


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class ColumnMap:
    """Which column of the user's file feeds which sample field.

    ``None`` means "the column named like the field, if the file has one": ``id``,
    ``source``, ``context``, ``output``, ``reference``, ``doc_id``, ``system``, and for
    scores the aspect key (in JSON also ``scores.<aspect>``, so our own schema imports as
    is). A column named explicitly must exist.
    """

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


@dataclass(frozen=True)
class _Record:
    number: int  # 1-based data row (header not counted)
    line: int | None  # file line where the row starts (CSV/JSONL)
    values: dict[str, Any]

    @property
    def where(self) -> str:
        return f"row {self.number}" + (f" (line {self.line})" if self.line is not None else "")


_FORMATS = ("csv", "tsv", "json", "jsonl")


def _guess_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    if suffix in _FORMATS:
        return suffix
    if suffix == "ndjson":
        return "jsonl"
    raise ConfigError(
        f"{path}: cannot tell the format from the extension; pass --format "
        f"({', '.join(_FORMATS)})"
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
                        f"{path}: row {n} (line {line}) has {len(cells)} cells, "
                        f"the header has {len(header)}"
                    )
                records.append(_Record(n, line, dict(zip(header, cells))))
        except csv.Error as exc:
            raise DataError(f"{path}: line {reader.line_num}: {exc}") from None
        return header, records

    if fmt == "jsonl":
        records = []
        # split("\n"), not splitlines(): JSON strings may hold a raw U+2028, which
        # splitlines() would treat as a line break.
        for lineno, raw in enumerate(text.split("\n"), 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}: line {lineno}: not a JSON object")
            records.append(_Record(len(records) + 1, lineno, obj))
        return None, records

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
            "for one object per line use a .jsonl name or --format jsonl"
        ) from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects")
    records = []
    for i, obj in enumerate(data, 1):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: row {i}: not a JSON object")
        records.append(_Record(i, None, obj))
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
    as well for CSV and JSONL): missing column (named, with the file), non-numeric or
    out-of-range score (row, column, range), empty text in a field the task shows.

    Ids come from the id column or are generated as ``<task>-<row:05d>``. ``doc_id`` comes
    from the doc column, else from a hash of the source text so outputs of the same source
    group together in train/test splits; with no source, each row is its own doc.
    ``unscored``: import without human scores (for scoring with a trained evaluator).
    """
    if task.shape != "pointwise":
        raise ConfigError(f"task {task.name} is {task.shape}: data import handles pointwise tasks only")
    path = Path(path)
    cols = columns or ColumnMap()
    header, records = _read_table(path, fmt or _guess_format(path))
    if not records:
        raise DataError(f"{path}: no data rows")

    def exists(column: str) -> bool:
        if header is not None:
            return column in header
        return any(_lookup(r.values, column) is not _MISSING for r in records)

    def resolve(explicit: str | None, default: str | Sequence[str], option: str, needed: bool) -> str | None:
        if explicit is not None:
            if not exists(explicit):
                raise DataError(
                    f"{path}: no column {explicit!r} (given by {option}); "
                    f"columns: {_columns_hint(header, records)}"
                )
            return explicit
        defaults = [default] if isinstance(default, str) else list(default)
        for d in defaults:
            if exists(d):
                return d
        if needed:
            raise DataError(
                f"{path}: no column {defaults[0]!r}, which task {task.name} needs; name the "
                f"column with {option}; columns: {_columns_hint(header, records)}"
            )
        return None

    needed_fields = {f.key for f in task.fields}
    text_cols: dict[str, str | None] = {
        key: resolve(getattr(cols, key), key, f"--{key}-col", key in needed_fields)
        for key in ("source", "context", "output", "reference")
    }
    id_col = resolve(cols.id, "id", "--id-col", False)
    doc_col = resolve(cols.doc, "doc_id", "--doc-col", False)
    system_col = resolve(cols.system, "system", "--system-col", False)
    score_cols: dict[str, str] = {}
    # Naming score columns (--score-col) imports a subset of the aspects: an aspect neither
    # named nor found under its own name is left out (training then needs --aspects).
    subset = bool(cols.scores)
    for aspect in task.aspect_keys:
        col = resolve(
            cols.scores.get(aspect),
            [aspect, f"scores.{aspect}"],
            f"--score-col {aspect}=COLUMN (or name only the score columns you have)",
            not unscored and not subset,
        )
        if col is not None:
            score_cols[aspect] = col

    errors: list[str] = []
    n_errors = 0
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for rec in records:
        problems: list[str] = []
        texts: dict[str, str | None] = {}
        for key, col in text_cols.items():
            value = _lookup(rec.values, col) if col else None
            if value is _MISSING:
                value = None
            if value is not None and not isinstance(value, str):
                problems.append(f"column {col!r} ({key}) is {type(value).__name__}, not text")
                continue
            if value is None or not value.strip():
                if key in needed_fields:
                    problems.append(f"empty text in column {col!r} ({key})")
                value = None
            texts[key] = value

        sid = _scalar(rec.values, id_col)
        if id_col and sid is None:
            problems.append(f"empty id in column {id_col!r}")
        sid = sid or f"{task.name}-{rec.number:05d}"
        if sid in seen:
            problems.append(f"id {sid!r} already used in row {seen[sid]}")

        scores: dict[str, float] = {}
        if not unscored:
            for aspect, col in score_cols.items():
                value, problem = _score(_lookup(rec.values, col), task, aspect, col)
                if problem:
                    problems.append(problem)
                elif value is not None:
                    scores[aspect] = value

        if problems:
            n_errors += len(problems)
            errors.extend(f"{rec.where}: {p}" for p in problems)
            continue
        seen[sid] = rec.number
        source = texts.get("source")
        doc = _scalar(rec.values, doc_col)
        if doc is None:
            # Same source text -> same doc, so a split never puts one article on both sides.
            doc = "src-" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:16] if source else sid
        rows.append(
            {
                "id": sid,
                "task": task.name,
                "source": source,
                "context": texts.get("context"),
                "output": texts.get("output"),
                "reference": texts.get("reference"),
                "system": _scalar(rec.values, system_col),
                "doc_id": doc,
                "scores": scores,
                "annotations": None,
            }
        )
    if n_errors:
        shown = errors[:_MAX_REPORTED_ERRORS]
        more = f" (and {n_errors - len(shown)} more)" if n_errors > len(shown) else ""
        raise DataError(f"{path}: {n_errors} problem(s): " + "; ".join(shown) + more)
    return rows


def _columns_hint(header: list[str] | None, records: Sequence[_Record]) -> str:
    names = header if header is not None else list(dict.fromkeys(k for r in records[:50] for k in r.values))
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


def _score(value: Any, task: Task, aspect: str, column: str) -> tuple[float | None, str | None]:
    label = f"column {column!r} (aspect {aspect})"
    if value is _MISSING or value is None or (isinstance(value, str) and not value.strip()):
        return None, f"no score in {label}"
    if isinstance(value, bool):
        return None, f"{label}: {value!r} is not a number"
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None, f"{label}: {value.strip()!r} is not a number"
    elif isinstance(value, (int, float)):
        number = float(value)
    else:
        return None, f"{label}: {value!r} is not a number"
    if not math.isfinite(number):
        return None, f"{label}: {value!r} is not a finite number"
    a = task.aspect(aspect)
    if not a.low <= number <= a.high:
        return None, f"{label} = {number:g} is outside the task's range [{a.low:g}, {a.high:g}]"
    return number, None


def scored_aspects(rows: Sequence[dict], task: Task) -> list[str]:
    """The task's aspects every row has a score for (an import may hold a subset)."""
    return [a for a in task.aspect_keys if all(a in (r.get("scores") or {}) for r in rows)]


def write_samples(path: str | Path, rows: Sequence[dict], task: Task, unscored: bool = False) -> int:
    """Write ``rows`` to ``path`` only if they load back with ``read_samples``; returns the count.

    The rows go to a temp file beside ``path`` first (atomically, via ``write_jsonl``) and
    are renamed into place after the check, so a failure never leaves a file at ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        write_jsonl(tmp, rows)
        try:
            n = len(read_samples(tmp, task, require_scores=not unscored,
                                 aspects=None if unscored else scored_aspects(rows, task)))
        except DataError as exc:
            # Same lines as the file the user asked for; name that one, not the temp file.
            raise DataError(str(exc).replace(str(tmp), str(path))) from None
        os.replace(tmp, path)
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return n
