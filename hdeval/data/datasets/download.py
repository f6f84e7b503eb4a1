"""Download the public human-judgment files, convert them to the sample schema, say where each
task's data is (:func:`download_datasets`, :func:`convert_records`, :func:`data_status`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple, Sequence

from hdeval.core.errors import ConfigError, DataError, DownloadError  # noqa: F401 (re-exported by hdeval.data.datasets)
from hdeval.core.fetch import fetch_to_file
from hdeval.core.paths import user_data_dir
from hdeval.core.types import Task
from hdeval.data.datasets.table import write_samples
from hdeval.data.samples import data_candidates, read_task_samples
from hdeval.data.tasks import builtin_tasks, load_task

#: UniEval's published meta-evaluation files. Not pinned to a commit because the issue asks
#: for the main branch; the row counts below catch an upstream change of content size.
DEFAULT_SOURCE_URL = "https://raw.githubusercontent.com/maszhongming/UniEval/main/reproduce/data/"
SOURCE_URL_ENV = "HDEVAL_DATA_SOURCE_URL"
DEFAULT_TIMEOUT = 60.0


class UpstreamDataset(NamedTuple):
    """One built-in task's public source file: its path below the source base URL (UniEval's
    ``reproduce/data/`` layout), and its rows in the official file (checked strictly for the
    official source)."""

    path: str
    official_rows: int


DATASETS: dict[str, UpstreamDataset] = {
    "summeval": UpstreamDataset("summarization/summeval.json", 1600),
    "topical_chat": UpstreamDataset("dialogue/topical_chat.json", 360),
    "sfres": UpstreamDataset("data2text/sfres.json", 1181),
    "sfhot": UpstreamDataset("data2text/sfhot.json", 875),
}


def resolve_source_url(explicit: str | None = None) -> str:
    """``--source-url``, else ``$HDEVAL_DATA_SOURCE_URL``, else UniEval on GitHub; ends in ``/``."""
    base = explicit or os.environ.get(SOURCE_URL_ENV) or DEFAULT_SOURCE_URL
    return base if base.endswith("/") else base + "/"


def is_official_source(base_url: str) -> bool:
    return resolve_source_url(base_url) == DEFAULT_SOURCE_URL


def dataset_url(base_url: str, name: str) -> str:
    return resolve_source_url(base_url) + DATASETS[name].path


def _slug(text: str) -> str:
    """``Nucleus Decoding (p = 0.3)`` -> ``nucleus_decoding_p_0_3`` (as in the shared ids)."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _text(rec: Mapping[str, Any], key: str, where: str, required: bool = True) -> str | None:
    """Upstream text, stripped (as in the shared files; UniEval's dialogues end in spaces)."""
    value = rec.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise DataError(f"{where}: field {key!r} is missing, empty or not text")
    return value.strip() or None


def _row(rec: Mapping[str, Any], i: int, task: Task, at: str, docs: dict) -> dict:
    """Record ``i`` (0-based) as a row, keys in the shared files' order (so the two diff readably),
    ids as in ``shared/data/<task>.jsonl``; ``docs``: the distinct inputs so far.

    summeval: ``id`` = ``summeval-<doc_id>-<system_id>``; ``doc_id`` is UniEval's (the CNN/DM id);
    its ``overall`` (the mean of the four aspects) is not an aspect of the task. topical_chat:
    UniEval gives no dialogue id, so ``doc_id`` numbers the distinct (history, fact) pairs in order
    of first appearance (``tc-00``...); ``id`` = ``topical_chat-<nn>-<slug of system_id>``;
    ``source`` is the history, ``context`` the fact. sfres / sfhot: UniEval's integer ``doc_id`` is
    the record's position, which cannot group outputs of one input, so ``doc_id`` numbers the
    distinct meaning representations (``source``) in order of first appearance (``sfres-mr-000``...);
    ``id`` is the position (``sfres-0000``...); UniEval's ``overall`` is the aspect called
    ``quality`` here; ``system`` is ``null`` (UniEval lacks it)."""
    name, doc, system = task.name, rec.get("doc_id"), rec.get("system_id")
    if name == "summeval" and (doc in (None, "") or system in (None, "")):
        raise DataError(f"{at}: needs 'doc_id' and 'system_id'")
    source = _text(rec, "source", at)
    context = _text(rec, "context", at) if name == "topical_chat" else None
    if name == "summeval":
        id_, doc_id, system = f"summeval-{doc}-{system}", str(doc), str(system)
    elif name == "topical_chat":
        if not isinstance(system, str) or not system.strip():
            raise DataError(f"{at}: needs 'system_id'")
        k = docs.setdefault((source, context), len(docs))
        id_, doc_id = f"topical_chat-{k:02d}-{_slug(system)}", f"tc-{k:02d}"
    else:
        k = docs.setdefault(source, len(docs))
        id_, doc_id, system = f"{name}-{i:04d}", f"{name}-mr-{k:03d}", None
    output = _text(rec, "system_output", at)
    reference = _text(rec, "reference", at, required=False)
    raw = rec.get("scores")
    if isinstance(raw, str):
        # Some copies of the UniEval files store the dict JSON-encoded; accept both.
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise DataError(f"{at}: 'scores' is a string that is not a JSON object") from None
    if not isinstance(raw, dict):
        raise DataError(f"{at}: 'scores' must be an object mapping aspect to number")
    rename = {"overall": "quality"} if name in ("sfres", "sfhot") else {}
    scores: dict[str, float] = {}
    for key, value in raw.items():
        if rename.get(key, key) not in task.aspect_keys:
            continue
        with contextlib.suppress(ValueError):  # a number written as text counts; other text fails below
            value = float(value) if isinstance(value, str) else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DataError(f"{at}: scores.{key} is {value!r}, not a finite number")
        scores[rename.get(key, key)] = float(value)
    missing = [a for a in task.aspect_keys if a not in scores]
    if missing:
        raise DataError(f"{at}: no score for aspect(s) {', '.join(missing)}")
    return {
        "id": id_,
        "task": name,
        "source": source,
        "context": context,
        "output": output,
        "reference": reference,
        "system": system,
        "doc_id": doc_id,
        "scores": scores,
        "annotations": None,
    }


def convert_records(name: str, records: Any, where: str = "") -> list[dict]:
    """Convert one parsed UniEval file (a JSON list of records) to rows of our schema; ``where`` (a
    URL or path) prefixes error messages."""
    if name not in DATASETS:
        raise ConfigError(f"no converter for {name!r}: known datasets are {', '.join(DATASETS)}")
    where = where or name
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{where}: expected a JSON list of objects (UniEval layout)")
    if not records:
        raise DataError(f"{where}: no records")
    task, docs = load_task(name), {}
    rows = [_row(rec, i, task, f"{where}: record {i + 1}", docs) for i, rec in enumerate(records)]
    seen: set[str] = set()
    for i, r in enumerate(rows, 1):
        if r["id"] in seen:
            raise DataError(f"{where}: record {i}: id {r['id']!r} occurs twice")
        seen.add(r["id"])
    return rows


@dataclass(frozen=True)
class DownloadEvent:
    """What :func:`download_datasets` reports to its ``progress`` callback. ``kind``: ``start`` (a
    fetch begins), ``bytes`` (``done_bytes`` of ``total_bytes``, None when the server sends no
    length), ``done`` (file written), ``skip`` (already present and valid), ``warning`` (``message``)."""

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

    made = [p for p in (dest, *dest.parents) if not p.exists()]  # removed again if nothing lands
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create data folder {dest}: {exc}") from None
    # Temp names start with "." and do not end in ".jsonl", so neither train nor `data list`
    # ever mistakes them for data; the pid keeps two concurrent runs apart.
    raw_tmp = dest / f".{name}.json.download-{os.getpid()}"
    try:
        report(DownloadEvent("start", name, url=url, path=target))
        fetch_to_file(
            url,
            raw_tmp,
            timeout,
            lambda done, total: report(
                DownloadEvent("bytes", name, url=url, done_bytes=done, total_bytes=total)
            ),
            hint_404=f"check --source-url / ${SOURCE_URL_ENV}",
        )
        try:
            with raw_tmp.open("r", encoding="utf-8") as fh:
                records = json.load(fh)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # where a server that streams without Content-Length and drops the connection ends up
            raise DataError(
                f"{url}: not a valid JSON file ({exc}); if the download was cut off, run the command again"
            ) from None
        rows = convert_records(name, records, where=url)

        warning = None
        if len(rows) != ds.official_rows:
            msg = f"{url} has {len(rows)} rows; the official UniEval file has {ds.official_rows}"
            if strict_count:
                raise DataError(
                    msg + "; nothing was written (use --no-strict-count to accept a mirror "
                    "that holds a different number of rows)"
                )
            warning = (
                msg + " (accepted: not the official source); results on it are not comparable "
                "with the paper's"
            )
            report(DownloadEvent("warning", name, url=url, message=warning))

        n = write_samples(target, rows, task)  # checked as `train` reads it, then renamed into place
    except OSError as exc:
        raise DataError(f"cannot write {target}: {exc}") from None
    finally:
        raw_tmp.unlink(missing_ok=True)
        for folder in made if not target.exists() else ():  # the folders this call made, empty
            try:
                folder.rmdir()
            except OSError:
                break
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

    ``dest``: defaults to :func:`hdeval.core.paths.user_data_dir`, where ``train`` looks.
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
            f"{', '.join(local)}: no download source; set HDEVAL_DATA_DIR to a folder "
            f"holding {', '.join(load_task(n).data_file for n in local)} (downloadable: "
            f"{', '.join(DATASETS)})"
        )
    if unknown:
        raise ConfigError(f"unknown dataset(s) {', '.join(unknown)}: choose from {', '.join(DATASETS)}")
    if timeout <= 0:
        raise ConfigError(f"timeout must be positive, got {timeout}")
    base = resolve_source_url(source_url)
    strict = is_official_source(base) if strict_count is None else strict_count
    folder = Path(dest) if dest is not None else user_data_dir()
    return [
        download_dataset(n, folder, base, strict, force=force, timeout=timeout, progress=progress)
        for n in chosen
    ]


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
    candidate path (:func:`hdeval.data.samples.data_candidates`), whether a file is there, and its
    row count when it loads."""
    out = []
    for name in names or list(builtin_tasks()):
        task = load_task(name)
        cands = tuple(
            CandidateStatus(p, True, *_count_valid(p, task, None))
            if p.is_file()
            else CandidateStatus(p, present=False)
            for p in data_candidates(task)
        )
        ds = DATASETS.get(name)
        out.append(TaskDataStatus(task, cands, ds.official_rows if ds else None))
    return out
