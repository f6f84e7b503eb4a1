"""What the cache's SQLite files may hold, reading them without writing, and the one-line error
for a failure of the store.

A shared cache directory is input from outside: an object the cache did not create could
rewrite or drop every reply the user pays for, so such a file is refused before the cache writes
to it. The expected schema comes from diskcache itself, so an upgrade does not make caches foreign."""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

import diskcache

from hdeval.errors import CacheError

DBNAME = "cache.db"
# The compact reply table (#23): a request hash's 32 bytes -> encode_completion's bytes, in its
# own file beside diskcache's, so each file holds only what its owner creates.
TABLE_DBNAME = "replies.db"
TABLE_SQL = "CREATE TABLE reply(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"
DATABASES = (DBNAME, TABLE_DBNAME)
# Tables SQLite makes itself (ANALYZE, AUTOINCREMENT); no statement can create them by name.
_SQLITE_INTERNAL = re.compile(r"sqlite_(stat\d|sequence)\Z")
_SHOWN = 5  # foreign objects named in a message
BUSY_SECONDS = 10.0  # how long a read waits for another process's lock on the database
# Free space to ask for when the disk fills up: SQLite needs room for its write-ahead log.
FREE_SPACE_HINT = "100 MB"


class CacheCorrupted(CacheError):
    """The cache database is damaged (``hdeval cache repair`` or ``clear`` deal with it)."""


# What a storage failure was, and the one-line error that says so. Here, not in cache.py, so the
# read-only checks below and the client share them without importing each other.
_SQLITE_FULL, _SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_PERM = 13, 8, 14, 3
_SQLITE_CORRUPT, _SQLITE_NOTADB, _SQLITE_BUSY, _SQLITE_LOCKED = 11, 26, 5, 6


def _kind(exc: BaseException) -> str:
    """'full', 'readonly', 'corrupt', 'busy' or 'other' for a storage error."""
    if isinstance(exc, diskcache.Timeout):
        return "busy"
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return "full"
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return "readonly"
        return "other"
    code = getattr(exc, "sqlite_errorcode", None)
    code = code & 0xFF if isinstance(code, int) else None
    msg = str(exc).lower()
    if code == _SQLITE_FULL or "disk is full" in msg:
        return "full"
    if code in (_SQLITE_READONLY, _SQLITE_PERM) or "readonly" in msg or "read-only" in msg:
        return "readonly"
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or "not a database" in msg or "malformed" in msg:
        return "corrupt"
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in msg:
        return "busy"
    if code == _SQLITE_CANTOPEN or "unable to open" in msg:
        return "readonly"
    return "other"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _free(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 1e6:.0f} MB free"
    except OSError:
        return "free space unknown"


def storage_error(directory: str | Path, exc: BaseException, writing: bool = False,
                  name: str = DBNAME) -> CacheError:
    """A one-line :class:`CacheError` for a failure of the store's file ``name`` in ``directory``."""
    d = Path(directory)
    db = d / name
    kind = _kind(exc)
    if kind == "corrupt":
        return CacheCorrupted(f"the LLM reply cache {db} is corrupted ({_reason(exc)}): {_move_aside(d, name)}")
    if kind == "full":
        done = "every call finished before this one is cached" if writing else "every finished call is cached"
        return CacheError(
            f"the disk holding the LLM reply cache {d} is full ({_free(d)}): {done}; free at least "
            f"{FREE_SPACE_HINT} there (or move {d} to a bigger disk and pass --cache-dir) and rerun the same command to resume")
    if kind == "readonly":
        return CacheError(
            f"cannot write the LLM reply cache in {d} ({_reason(exc)}): pass --cache-dir (or set "
            f"HDEVAL_CACHE_DIR) to a writable directory")
    if kind == "busy":
        return CacheError(
            f"the LLM reply cache {db} stayed locked by another process ({_reason(exc)}); "
            f"rerun when it is done, or pass another --cache-dir")
    return CacheError(f"the LLM reply cache in {d} failed ({_reason(exc)}); pass another --cache-dir "
                      f"or check it with `hdeval cache check --cache-dir {d}`")


def _move_aside(directory: Path, name: str = DBNAME) -> str:
    """How to get a bad database out of the way (its write-ahead log goes with it: a new
    database next to an old ``-wal`` file would replay it)."""
    db = directory / name
    logs = [name + s for s in ("-wal", "-shm") if (directory / (name + s)).exists()]
    also = f" (and {' and '.join(logs)} likewise)" if logs else ""
    return (f"run `hdeval cache repair --cache-dir {directory}` to keep its readable entries, "
            f"or move it aside with `mv {db} {db}.bad`{also}")


def _norm(sql: str | None) -> str | None:
    return None if sql is None else " ".join(sql.split())


@functools.lru_cache(maxsize=None)
def expected_schema(name: str) -> frozenset[tuple[str, str, str, str | None]]:
    """(type, name, table, sql) of everything the cache creates in its file ``name``: the reply
    table, or what diskcache creates under any eviction policy."""
    with tempfile.TemporaryDirectory(prefix="hdeval-schema-") as tmp:
        if name == TABLE_DBNAME:
            sqls = [TABLE_SQL]
        else:
            diskcache.Cache(tmp, eviction_policy="none").close()
            sqls = [policy["init"] for policy in diskcache.EVICTION_POLICY.values() if policy.get("init")]
        with closing(sqlite3.connect(os.path.join(tmp, name))) as con:
            for sql in sqls:
                con.execute(sql)
            rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    return frozenset((t, n, tb, _norm(sql)) for t, n, tb, sql in rows)


def ro_connect(db: Path) -> sqlite3.Connection:
    """A read-only connection that also works on a read-only file system: there SQLite cannot
    make the shared-memory file a WAL database needs even to read, so the file is opened as
    immutable (nothing can change it while it cannot be written)."""
    uri = db.resolve().as_uri()
    try:
        con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_SECONDS)
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return con
    except sqlite3.Error as exc:
        if _kind(exc) != "readonly":
            raise
        wal = db.with_name(db.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise  # replies still in the write-ahead log: an immutable read would miss them
    return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=BUSY_SECONDS)


def foreign_objects(db: Path, con: sqlite3.Connection | None = None) -> list[str]:
    """What the SQLite file ``db`` holds that the cache never creates, e.g. ``trigger t on
    Cache``; an empty list for a missing file or a clean one. Reads only (through ``con`` if
    given, a connection to ``db`` the caller opened as it needs)."""
    if con is None:
        if not db.is_file():
            return []
        with closing(ro_connect(db)) as own:
            return foreign_objects(db, own)
    rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    known = expected_schema(TABLE_DBNAME if db.name == TABLE_DBNAME else DBNAME)
    found = []
    for t, n, tb, sql in rows:
        if (t, n, tb, _norm(sql)) in known or (t == "table" and _SQLITE_INTERNAL.fullmatch(str(n))):
            continue
        name = str(n)[:60]
        found.append(f"{t} {name!r}" + (f" on {str(tb)[:60]!r}" if t in ("trigger", "index") else ""))
    return found


def refuse_foreign_schema(directory: str | Path) -> None:
    """Before the cache opens (and writes to) its existing databases: one-line CacheError if one
    holds a trigger, view, table or index the cache never creates."""
    directory = Path(directory)
    for name in DATABASES:
        db = directory / name
        try:
            found = foreign_objects(db)
        except sqlite3.Error as exc:
            if _kind(exc) == "busy":  # unchecked: the lock may go before the cache opens and writes
                raise storage_error(directory, exc, name=name) from None
            continue  # unreadable: the cache's own open says why
        if found:
            raise _foreign(db, found, "not opening it, as they could rewrite or drop the replies you pay for")


def _foreign(db: Path, found: list[str], why: str) -> CacheError:
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return CacheError(
        f"the LLM reply cache {db} holds SQLite objects the cache never creates "
        f"({', '.join(found[:_SHOWN])}{more}): {why}; `hdeval cache repair --cache-dir {db.parent}` copies "
        "its readable entries into a fresh database (check them: a planted entry cannot be told from a "
        "real one), or pass another --cache-dir")


def read_stats(directory: str | Path) -> dict[str, int | str]:
    """Entries and bytes of the cache in ``directory`` (both its databases), read without writing
    anything (works on a read-only copy or mount); the same figures the store's ``len`` and
    ``volume`` give."""
    path = Path(directory)
    entries = size = 0
    for name, count in ((DBNAME, "SELECT count(*) FROM Cache"), (TABLE_DBNAME, "SELECT count(*) FROM reply")):
        db = path / name
        if not db.is_file():
            continue
        try:
            with closing(ro_connect(db)) as con:
                if found := foreign_objects(db, con):  # a planted recursive view would never be counted
                    raise _foreign(db, found, "not counting them")
                # a replies.db whose table is not made yet (a run killed just after creating the
                # file) holds no reply, as `cache check` and a run see it
                if name == DBNAME or con.execute("SELECT 1 FROM sqlite_master WHERE name = 'reply'").fetchone():
                    entries += con.execute(count).fetchone()[0]
                size += con.execute("PRAGMA page_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]
                if name == DBNAME:
                    row = con.execute("SELECT value FROM Settings WHERE key = 'size'").fetchone()
                    size += row[0] if row and isinstance(row[0], int) else 0  # diskcache's value files
        except sqlite3.Error as exc:
            if _kind(exc) == "corrupt":
                raise storage_error(path, exc, name=name) from None
            raise CacheError(f"cannot read the LLM reply cache {db} ({_reason(exc)})") from None
    return {"path": str(path), "entries": int(entries), "bytes": int(size)}


def on_read_only_storage(directory: str | Path) -> bool:
    """Whether files cannot be written in ``directory`` (a read-only mount or folder)."""
    try:
        return not os.access(directory, os.W_OK) or bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
