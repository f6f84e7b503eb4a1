"""``labels.db``: the human labels the labelling app collects, a SQLite file a team keeps.

Append-only: a label, an undo and a skip are each new rows (triggers refuse UPDATE and DELETE),
and the latest row of a (sample, aspect, rater) wins. Each write is its own transaction,
committed (WAL, ``synchronous=FULL``) before the call returns, so a label the page has
acknowledged survives a kill -9. The content a rater saw is stored once per content hash, so
export needs no pool file, and a pool sample whose content changed since it was labelled is told
apart (:meth:`LabelStore.changed`).

A pairwise task's label is one choice per pair (A, B or tie, as its data's ``label`` field), kept
under the aspect ``label`` as a number: +1 A is better, 0 a tie, -1 B is better.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hdeval.core.errors import ConfigError, DataError
from hdeval.core.types import PairSample, Sample, Task
from hdeval.data.labels_db import (  # the reading side, below the data readers (train reads the file)
    COLUMNS,
    FORMAT,
    PAIR_ASPECT,
    PAIR_VALUES,
    Rating,
    current_ratings,
    json_or_none,
    labelled_samples,
    read_meta,
    read_rows,
)

# bounds on what a request may store: the page's note field, a rater's name
MAX_NOTE = 2000
MAX_RATER = 64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    content_hash TEXT PRIMARY KEY,
    sample_id TEXT NOT NULL,
    content TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS labels (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sample_id TEXT NOT NULL,
    content_hash TEXT NOT NULL REFERENCES samples(content_hash),
    aspect TEXT NOT NULL,
    action TEXT NOT NULL CHECK (action IN ('label', 'undo', 'skip')),
    value REAL,
    rater TEXT NOT NULL,
    time TEXT NOT NULL,
    session TEXT NOT NULL,
    note TEXT,
    strategy TEXT,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS labels_sample ON labels (sample_id, rater);
CREATE TRIGGER IF NOT EXISTS labels_no_update BEFORE UPDATE ON labels
    BEGIN SELECT RAISE(ABORT, 'labels.db is append-only'); END;
CREATE TRIGGER IF NOT EXISTS labels_no_delete BEFORE DELETE ON labels
    BEGIN SELECT RAISE(ABORT, 'labels.db is append-only'); END;
"""


def content_hash(sample: Sample | PairSample) -> str:
    """What the rater saw, hashed: the document and every shown field (not the id, not scores;
    a pair's two responses too)."""
    shown: dict[str, Any] = {"doc_id": sample.doc_id, "fields": dict(sorted(sample.fields.items()))}
    if isinstance(sample, PairSample):
        shown["outputs"] = [sample.output_a, sample.output_b]
    return hashlib.sha256(json.dumps(shown, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def task_record(task: Task) -> dict[str, Any]:
    """What makes labels of one task: its name, shape and aspects with their ranges."""
    return {"name": task.name, "shape": task.shape, "aspects": [[a.key, a.low, a.high] for a in task.aspects]}


class LabelStore:
    """One ``labels.db``, opened for one task; safe to call from several threads."""

    def __init__(self, path: str | Path, task: Task) -> None:
        self.path = Path(path)
        self.task = task
        if self.path.exists() and not self.path.is_file():
            raise DataError(f"--labels {self.path} is not a file")
        try:
            # a new labels file in a folder not made yet (`--labels artifacts/labels.db` in a fresh
            # folder), as `train -o` makes its output's folder
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(f"--labels {self.path}: cannot make its folder: {exc.strerror}") from None
        try:
            self._con = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise DataError(f"--labels {self.path}: cannot open: {exc}") from None
        self._lock = threading.Lock()
        try:
            self._con.execute("PRAGMA journal_mode=WAL")
            self._con.execute("PRAGMA synchronous=FULL")
            self._con.execute("PRAGMA foreign_keys=ON")
            self._check_or_init()
        except sqlite3.DatabaseError as exc:
            self._con.close()
            raise DataError(f"--labels {self.path} is not a labels file hdeval can read ({exc})") from None
        except DataError:
            self._con.close()
            raise

    def _check_or_init(self) -> None:
        tables = {r[0] for r in self._con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        mine = {"meta", "samples", "labels"}
        if tables and not mine <= tables:
            raise DataError(f"--labels {self.path} is a SQLite file but not an hdeval labels file")
        if not tables:
            with self._lock:  # one transaction: a crash leaves no half-made schema
                self._con.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
        meta = dict(self._con.execute("SELECT key, value FROM meta").fetchall())
        record = json.dumps(task_record(self.task), sort_keys=True)
        if not meta:
            with self._transaction():
                self._con.executemany(
                    "INSERT INTO meta VALUES (?, ?)", [("format", str(FORMAT)), ("task", record)]
                )
            return
        if meta.get("format") != str(FORMAT):
            raise DataError(
                f"--labels {self.path} has format {meta.get('format')!r}; this hdeval reads {FORMAT}"
            )
        theirs = json_or_none(meta.get("task"))
        if not isinstance(theirs, dict) or theirs.get("name") != self.task.name:
            name = theirs.get("name") if isinstance(theirs, dict) else None
            raise DataError(
                f"--labels {self.path} holds labels for task {name!r}, not {self.task.name!r}: "
                "name another labels file"
            )
        if json.dumps(theirs, sort_keys=True) != record:
            raise DataError(
                f"--labels {self.path} holds labels for another version of task {self.task.name!r} "
                "(its aspects or ranges differ): name another labels file"
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One immediate transaction, committed (or rolled back) before the caller goes on."""
        with self._lock:
            self._con.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> LabelStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # writing: each call one committed transaction
    def add(
        self,
        sample: Sample | PairSample,
        values: Mapping[str, Any],
        *,
        rater: str,
        session: str,
        note: str = "",
        strategy: str | None = None,
        reason: str | None = None,
    ) -> None:
        """One sample's labels (every aspect rated; a pair: ``{"label": "a" | "b" | "tie"}``),
        committed before this returns."""
        rater = check_rater(rater)
        if not values:
            raise DataError("a label needs a value for at least one aspect")
        rows: list[tuple[str, str, float | None]] = []
        if self.task.shape == "pairwise":
            choice = values.get(PAIR_ASPECT) if set(values) == {PAIR_ASPECT} else None
            if not isinstance(choice, str) or choice not in PAIR_VALUES:
                raise DataError(f"a pair's label is {{{PAIR_ASPECT!r}: 'a', 'b' or 'tie'}}")
            rows.append((PAIR_ASPECT, "label", PAIR_VALUES[choice]))
            self._append(sample, rows, rater, session, note[:MAX_NOTE] or None, strategy, reason)
            return
        for key, value in values.items():
            try:
                aspect = self.task.aspect(key)
            except KeyError:
                raise DataError(f"task {self.task.name} has no aspect {key!r}") from None
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not aspect.low <= value <= aspect.high
            ):
                raise DataError(
                    f"{key} = {value!r} is outside the task's range [{aspect.low:g}, {aspect.high:g}]"
                )
            rows.append((key, "label", float(value)))
        self._append(sample, rows, rater, session, note[:MAX_NOTE] or None, strategy, reason)

    def skip(self, sample: Sample | PairSample, *, rater: str, session: str) -> None:
        self._append(sample, [("", "skip", None)], check_rater(rater), session, None, None, None)

    def undo(self, *, rater: str, session: str) -> str | None:
        """Withdraw this rater's latest label that still stands: an undo row per aspect (with the
        content hash recorded with that label). The sample id, or None when nothing is left."""
        rater = check_rater(rater)
        standing = [r for r in self.current().values() if r.rater == rater]
        if not standing:
            return None
        last = max(standing, key=lambda r: r.seq)
        aspects = [r.aspect for r in standing if r.sample_id == last.sample_id]
        with self._transaction():
            self._con.executemany(
                "INSERT INTO labels (sample_id, content_hash, aspect, action, value, rater, time, session)"
                " VALUES (?, ?, ?, 'undo', NULL, ?, ?, ?)",
                [(last.sample_id, last.content_hash, a, rater, _now(), session) for a in aspects],
            )
        return last.sample_id

    def _append(
        self,
        sample: Sample | PairSample,
        rows: Sequence[tuple[str, str, float | None]],
        rater: str,
        session: str,
        note: str | None,
        strategy: str | None,
        reason: str | None,
    ) -> None:
        h = content_hash(sample)
        shown: dict[str, Any] = {"id": sample.id, "doc_id": sample.doc_id, **dict(sample.fields)}
        if isinstance(sample, PairSample):
            shown.update({"output_a": sample.output_a, "output_b": sample.output_b})
            shown.update(
                {k: v for k, v in (("system_a", sample.system_a), ("system_b", sample.system_b)) if v}
            )
        elif sample.system is not None:
            shown["system"] = sample.system
        content = json.dumps(shown, ensure_ascii=False)
        time = _now()
        with self._transaction():
            self._con.execute("INSERT OR IGNORE INTO samples VALUES (?, ?, ?)", (h, sample.id, content))
            self._con.executemany(
                "INSERT INTO labels (sample_id, content_hash, aspect, action, value, rater, time, session, note,"
                " strategy, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (sample.id, h, aspect, action, value, rater, time, session, note, strategy, reason)
                    for aspect, action, value in rows
                ],
            )

    # reading
    def rows(self) -> list[dict[str, Any]]:
        """Every row, oldest first (the raw export)."""
        with self._lock:
            cur = self._con.execute(f"SELECT {', '.join(COLUMNS)} FROM labels ORDER BY seq")
            return [dict(zip(COLUMNS, r)) for r in cur.fetchall()]

    def current(self) -> dict[tuple[str, str, str], Rating]:
        """(sample id, aspect, rater) -> its latest label, where that latest row is a label."""
        return current_ratings(self.rows())

    def skipped(self) -> set[tuple[str, str]]:
        """(sample id, rater) pairs a rater skipped."""
        return {(r["sample_id"], r["rater"]) for r in self.rows() if r["action"] == "skip"}

    def changed(self, pool: Iterable[Sample | PairSample]) -> list[str]:
        """Ids of pool samples whose labels were given on other content than the pool now holds."""
        now = {s.id: content_hash(s) for s in pool}
        return sorted(
            {
                r.sample_id
                for r in self.current().values()
                if r.sample_id in now and now[r.sample_id] != r.content_hash
            }
        )

    def contents(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {
                h: json.loads(c) for h, c in self._con.execute("SELECT content_hash, content FROM samples")
            }


def check_rater(name: Any) -> str:
    name = " ".join(str(name or "").split())
    if not name or len(name) > MAX_RATER:
        raise DataError(f"a rater name is 1 to {MAX_RATER} characters")
    return name


def new_session() -> str:
    return uuid.uuid4().hex


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# export
def export_labels(path: str | Path, out: str | Path, *, force: bool = False, raw: bool = False) -> int:
    """Write ``out`` (JSONL, atomically): the labelled samples, or with ``raw`` every row of the
    file. Refuses an existing ``out`` without ``force``. Returns the number of lines written."""
    from hdeval.data.samples import jsonl_output, write_jsonl

    task = read_meta(path)
    out = Path(out)
    jsonl_output(out)
    if out.exists() and not force:
        raise ConfigError(f"-o {out} exists; pass --force to overwrite it")
    if out.resolve() == Path(path).resolve():
        raise ConfigError(f"-o {out} is the labels file itself")
    rows, contents = read_rows(path)
    lines = rows if raw else labelled_samples(rows, contents, pairwise=task.get("shape") == "pairwise")
    if not lines:  # an empty file would only fail later, in train ("no samples")
        raise DataError(f"{path} holds no {'rows' if raw else 'labels'} yet: nothing written to {out}")
    write_jsonl(out, lines)
    return len(lines)
