"""``hdeval cache clear``, ``check`` and ``repair``: every entry of both databases read without
writing, counted, and the readable ones copied into a fresh cache."""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import diskcache

from hdeval.core.errors import CacheError, ConfigError
from hdeval.llm.backends.base import Completion
from hdeval.llm.cache.codec import (
    MAX_ENTRY_CHARS,
    UnreadableEntry,
    encode_completion,
    parse_completion,
    read_value,
    table_value,
)
from hdeval.llm.cache.guard import (
    DATABASES,
    DBNAME,
    KNOWN_SETTINGS,
    TABLE_DBNAME,
    CacheCorrupted,
    _reason,
    read_only,
    storage_error,
)
from hdeval.llm.cache.store import REQUEST_HASH, TABLE_VALUE, open_store


def holds_cache(cache_dir: str | Path) -> bool:
    """Whether ``cache_dir`` holds a reply cache (one of its databases); False when it is missing
    or empty (nothing cached yet). A directory holding other things but no database is not a
    cache: a one-line ConfigError, since clearing (or opening) it would plant one there."""
    path = Path(cache_dir)
    if any((path / name).is_file() for name in DATABASES):
        return True
    try:
        entries = [e.name for e in itertools.islice(os.scandir(path), 3)]
    except FileNotFoundError:
        return False
    except OSError as exc:  # a file, or no permission to look
        raise ConfigError(
            f"{path} is not an LLM reply cache ({exc.strerror or exc}): nothing deleted"
        ) from None
    if entries:
        raise ConfigError(
            f"{path} is not an LLM reply cache (it holds {', '.join(sorted(entries))}"
            f"{', ...' if len(entries) == 3 else ''} but no {' or '.join(DATABASES)}): nothing deleted; "
            "give the cache's folder with --cache-dir"
        )
    return False


def clear_cache(cache_dir: str | Path) -> int:
    """Delete every cached reply; the number deleted.

    A corrupted database cannot be asked what it holds: then both database files (with their
    write-ahead logs) are deleted and ``-1`` returned. Value files are left alone (they may belong
    to a copy kept aside by ``repair``) and nothing else in the directory is ever touched. A
    directory without a cache is left as it is (:func:`holds_cache`: 0 when missing or empty, a
    ConfigError when it holds something else).
    """
    path = Path(cache_dir)
    if not holds_cache(path):
        return 0
    try:
        with open_store(path) as c:
            try:
                return int(c.clear())
            except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
                raise storage_error(path, exc) from None
    except CacheCorrupted:
        for name in DATABASES:
            for suffix in ("", "-wal", "-shm"):
                f = path / (name + suffix)
                if f.is_file() and not f.is_symlink():
                    f.unlink()
        return -1


@dataclass
class CheckReport:
    path: str
    readable: int = 0  # and copied, by repair
    unreadable: int = 0  # hdeval-shaped entries whose value cannot be used
    foreign: int = 0  # entries hdeval never writes (pickled, binary, other keys)
    database_error: str | None = None  # the database could not be read (in part or at all)
    examples: list[str] = field(default_factory=list)
    planted: dict[str, list[str]] = field(default_factory=dict)  # file -> what the cache never creates
    kept_as: str = ""  # repair: where the old databases are

    @property
    def ok(self) -> bool:
        return self.database_error is None and not self.unreadable and not self.foreign


def _rows(con: sqlite3.Connection, report: CheckReport) -> Iterator[tuple]:
    """Every Cache row that can still be read, in rowid order; damaged stretches are skipped
    (row by row) and noted in ``report.database_error``."""
    cols = "rowid, key, raw, mode, filename, value"
    page = 256
    try:
        hi = con.execute("SELECT max(rowid) FROM Cache").fetchone()[0] or 0
    except sqlite3.Error as exc:
        report.database_error = _reason(exc)
        return
    last = 0
    while last < hi:
        try:
            rows = con.execute(
                f"SELECT {cols} FROM Cache WHERE rowid > ? ORDER BY rowid LIMIT ?", (last, page)
            ).fetchall()
        except sqlite3.Error as exc:
            report.database_error = _reason(exc)
            for r in range(last + 1, min(last + page, hi) + 1):
                try:
                    row = con.execute(f"SELECT {cols} FROM Cache WHERE rowid = ?", (r,)).fetchone()
                except sqlite3.Error:
                    report.unreadable += 1
                    continue
                if row is not None:
                    yield row
            last += page
            continue
        if not rows:
            break
        yield from rows
        last = rows[-1][0]


def _table_rows(con: sqlite3.Connection, report: CheckReport) -> Iterator[tuple]:
    """Every row of the reply table as (key, value or None if too long, length), in key order;
    past a damaged stretch (noted in ``report.database_error``) the rest is read from the end."""
    cols = f"key, {TABLE_VALUE}"
    last = None
    try:
        for row in con.execute(f"SELECT {cols} FROM reply ORDER BY key", (MAX_ENTRY_CHARS,)):
            yield row
            last = row
        return
    except sqlite3.Error as exc:
        report.database_error = _reason(exc)
    try:
        if last is None:
            yield from con.execute(f"SELECT {cols} FROM reply ORDER BY key DESC", (MAX_ENTRY_CHARS,))
        else:
            yield from con.execute(
                f"SELECT {cols} FROM reply WHERE key > ? ORDER BY key DESC", (MAX_ENTRY_CHARS, last[0])
            )
    except sqlite3.Error:
        pass  # the damage, reached from the other side


def _check_entry(
    report: CheckReport, key: Any, read: Callable[[], str], raw: bool = True
) -> Iterator[tuple[str, Completion]]:
    """(key, completion) if the entry is readable and valid; counted into ``report`` either way."""
    try:
        if type(key) is bytes and len(key) == 32:
            key = key.hex()  # the compact form the store writes
        if not raw or type(key) is not str or not REQUEST_HASH.match(key):
            raise UnreadableEntry("a key that is not an hdeval request hash", foreign=True)
        completion = parse_completion(read())
    except UnreadableEntry as exc:
        report.foreign += exc.foreign
        report.unreadable += not exc.foreign
        if len(report.examples) < 5:
            shown = key[:12] + "..." if isinstance(key, str) else f"(a {type(key).__name__} key)"
            report.examples.append(f"{shown}: {exc}")
        return
    report.readable += 1
    yield key, completion


def _entries(
    directory: Path, db: Path, report: CheckReport, leave_no_files: bool = False
) -> Iterator[tuple[str, Completion]]:
    """(key, completion) of every readable, valid entry of the database ``db`` (the reply table's,
    told by its name, or diskcache's, value files relative to ``directory``), read without
    writing (with ``leave_no_files``, see :func:`ro_connect`); every entry and database error is
    counted into ``report``."""
    if not db.is_file():
        return
    table = db.name.startswith(TABLE_DBNAME)
    before, report.database_error = report.database_error, None
    try:
        with read_only(db, leave_no_files=leave_no_files) as (con, found, readable):
            if found:  # listed by `cache check`; repair copies only the real table's entries
                report.planted[db.name] = found
            for key, value, length in _table_rows(con, report) if table and readable else ():
                yield from _check_entry(report, key, partial(table_value, value, length))
            for _, key, raw, mode, filename, value in () if table or not readable else _rows(con, report):
                read = partial(read_value, directory, mode, filename, value)
                yield from _check_entry(report, key, read, raw == 1)
            if readable and not table:  # diskcache turns a stored ``sqlite_*`` setting into a PRAGMA
                try:
                    keys = [k for (k,) in con.execute("SELECT key FROM Settings")]
                except sqlite3.Error as exc:
                    report.database_error = report.database_error or _reason(exc)
                else:
                    odd = [f"setting {str(k)[:40]!r}" for k in keys if k not in KNOWN_SETTINGS]
                    if odd:  # the store refuses to open the file: repair copies its entries
                        report.planted.setdefault(db.name, []).extend(odd)
            if report.database_error is None:
                status = con.execute("PRAGMA quick_check").fetchone()[0]
                if status != "ok":
                    report.database_error = f"integrity check: {status}"
    except sqlite3.Error as exc:
        report.database_error = _reason(exc)
    finally:
        if report.database_error is not None and table:
            report.database_error = f"{TABLE_DBNAME}: {report.database_error}"
        report.database_error = before or report.database_error


def check_cache(cache_dir: str | Path, leave_no_files: bool = False) -> CheckReport:
    """Count readable, unreadable and foreign entries of both databases; writes nothing (with
    ``leave_no_files``, a database nothing has open is read immutable: no -wal/-shm file made)."""
    directory = Path(cache_dir)
    report = CheckReport(str(directory))
    for name in DATABASES:
        for _ in _entries(directory, directory / name, report, leave_no_files):
            pass
    return report


def repair_cache(cache_dir: str | Path) -> CheckReport:
    """Move the databases aside as ``cache.db.corrupt-<timestamp>`` and ``replies.db.corrupt-<timestamp>``
    (never deleted) and copy every readable, valid entry of both into a fresh cache (the reply
    table). A cache ``check`` finds nothing wrong with is left as it is: its report is returned
    with ``kept_as`` empty."""
    directory = Path(cache_dir)
    names = [name for name in DATABASES if (directory / name).is_file()]
    if not names:
        raise CacheError(f"no cache database at {directory / DBNAME}: nothing to repair")
    # Read first, making no -wal/-shm file: only a damaged database, an unreadable or foreign
    # entry, or a planted SQLite object or setting is reason to move the user's databases.
    found = check_cache(directory, leave_no_files=True)
    if found.ok and not found.planted:
        return found
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag, n = stamp, 1
    while any(
        (directory / f"{name}.corrupt-{tag}{s}").exists() for name in names for s in ("", "-wal", "-shm")
    ):
        n += 1
        tag = f"{stamp}-{n}"
    asides = [directory / f"{name}.corrupt-{tag}" for name in names]
    try:
        for name, aside in zip(names, asides):
            for suffix in ("", "-wal", "-shm"):  # the log belongs to the database: keep them paired
                src = directory / (name + suffix)
                if src.exists():
                    os.rename(src, directory / (aside.name + suffix))
    except OSError as exc:
        raise storage_error(directory, exc) from None
    store = open_store(directory)
    report = CheckReport(str(directory), kept_as=" and ".join(map(str, asides)))
    try:
        for aside in asides:
            entries = _entries(directory, aside, report)
            while batch := list(itertools.islice(entries, 500)):
                with store.transact():
                    for key, completion in batch:
                        store.set(key, encode_completion(completion))
    except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
        raise storage_error(directory, exc, writing=True) from None
    finally:
        store.close()
    return report
