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
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Iterator

import diskcache

from hdeval.core.errors import CacheError

DBNAME = "cache.db"
# The compact reply table: a request hash's 32 bytes -> encode_completion's bytes, in its
# own file beside diskcache's, so each file holds only what its owner creates.
TABLE_DBNAME = "replies.db"
TABLE_SQL = "CREATE TABLE reply(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"
DATABASES = (DBNAME, TABLE_DBNAME)
# Tables SQLite makes itself (ANALYZE, AUTOINCREMENT); no statement can create them by name.
_SQLITE_INTERNAL = re.compile(r"sqlite_(stat\d|sequence)\Z")
_SHOWN = 5  # foreign objects named in a message
# What diskcache itself keeps in the Settings table; anything else was not written by it
KNOWN_SETTINGS = set(diskcache.DEFAULT_SETTINGS) | set(diskcache.core.METADATA)
BUSY_SECONDS = 10.0  # how long a read waits for another process's lock on the database
# Free space to ask for when the disk fills up: SQLite needs room for its write-ahead log.
FREE_SPACE_HINT = "100 MB"


class CacheCorrupted(CacheError):
    """The cache database is damaged (``hdeval cache repair`` or ``clear`` deal with it)."""


# What a storage failure was, and the one-line error that says so. Here, not in cache.py, so the
# read-only checks below and the client share them without importing each other. A SQLite error
# is told by its primary result code, or by its message when it carries none; first match wins.
_KINDS = (
    ("full", {13}, ("disk is full",)),  # SQLITE_FULL
    ("readonly", {8, 3}, ("readonly", "read-only")),  # SQLITE_READONLY, SQLITE_PERM
    ("corrupt", {11, 26}, ("not a database", "malformed")),  # SQLITE_CORRUPT, SQLITE_NOTADB
    ("busy", {5, 6}, ("locked",)),  # SQLITE_BUSY, SQLITE_LOCKED
    ("readonly", {14}, ("unable to open",)),  # SQLITE_CANTOPEN
)


def _kind(exc: BaseException) -> str:
    """'full', 'readonly', 'corrupt', 'busy' or 'other' for a storage error."""
    if isinstance(exc, diskcache.Timeout):
        return "busy"
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return "full"
        # a file where the directory should be: as unwritable a place for the cache
        unwritable = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST)
        return "readonly" if exc.errno in unwritable else "other"
    code = getattr(exc, "sqlite_errorcode", None)
    code = code & 0xFF if isinstance(code, int) else None
    msg = str(exc).lower()
    found = (kind for kind, codes, words in _KINDS if code in codes or any(w in msg for w in words))
    return next(found, "other")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _free(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 1e6:.0f} MB free"
    except OSError:
        return "free space unknown"


def storage_error(
    directory: str | Path, exc: BaseException, writing: bool = False, name: str = DBNAME
) -> CacheError:
    """A one-line :class:`CacheError` for a failure of the store's file ``name`` in ``directory``."""
    d = Path(directory)
    db = d / name
    kind = _kind(exc)
    if kind == "corrupt":
        return CacheCorrupted(
            f"the LLM reply cache {db} is corrupted ({_reason(exc)}): {_move_aside(d, name)}"
        )
    if kind == "full":
        done = "every call finished before this one is cached" if writing else "every finished call is cached"
        return CacheError(
            f"the disk holding the LLM reply cache {d} is full ({_free(d)}): {done}; free at least "
            f"{FREE_SPACE_HINT} there (or move {d} to a bigger disk and pass --cache-dir) and rerun the same command to resume"
        )
    if kind == "readonly":
        return CacheError(
            f"cannot write the LLM reply cache in {d} ({_reason(exc)}): pass --cache-dir (or set "
            f"HDEVAL_CACHE_DIR) to a writable directory"
        )
    if kind == "busy":
        return CacheError(
            f"the LLM reply cache {db} stayed locked by another process ({_reason(exc)}); "
            f"rerun when it is done, or pass another --cache-dir"
        )
    return CacheError(
        f"the LLM reply cache in {d} failed ({_reason(exc)}); pass another --cache-dir "
        f"or check it with `hdeval cache check --cache-dir {d}`"
    )


def refuse_links(directory: Path) -> None:
    """A one-line :class:`CacheError` when one of the cache's database files (or their logs) is a
    symbolic link: SQLite would write through it, to wherever it points, maybe outside the cache."""
    for name in (DBNAME, TABLE_DBNAME):
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = directory / (name + suffix)
            if path.is_symlink():
                raise CacheError(
                    f"{path} is a symbolic link: hdeval writes its cache files only inside {directory}, never "
                    f"through a link; replace the link by the file itself (or move it away) and rerun"
                )


def _move_aside(directory: Path, name: str = DBNAME) -> str:
    """How to get a bad database out of the way (its write-ahead log goes with it: a new
    database next to an old ``-wal`` file would replay it)."""
    db = directory / name
    logs = [name + s for s in ("-wal", "-shm") if (directory / (name + s)).exists()]
    also = f" (and {' and '.join(logs)} likewise)" if logs else ""
    return (
        f"run `hdeval cache repair --cache-dir {directory}` to keep its readable entries, "
        f"or move it aside with `mv {db} {db}.bad`{also}"
    )


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


def ro_connect(db: Path, leave_no_files: bool = False) -> sqlite3.Connection:
    """A connection reading ``db`` without writing: read-only with SQLite's locks, so a run writing
    (and checkpointing) meanwhile cannot tear what is read. On read-only storage SQLite cannot
    make the shared-memory file that needs, so a file with an empty log is read immutable. With
    ``leave_no_files`` (the report), a file with no log (nothing has it open) is read immutable
    at once, which makes no -wal/-shm file in the user's cache."""
    uri = db.resolve().as_uri()
    wal = db.with_name(db.name + "-wal")
    if wal.exists() or not leave_no_files:
        try:
            con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_SECONDS)
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return con
        except sqlite3.Error as exc:
            if _kind(exc) != "readonly" or (wal.exists() and wal.stat().st_size > 0):
                raise  # replies still in the log: an immutable read would miss them
    return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=BUSY_SECONDS)


@contextmanager
def read_only(
    db: Path, refuse: str | None = None, leave_no_files: bool = False
) -> Iterator[tuple[sqlite3.Connection, list[str], bool]]:
    """The one way the cache's files are read without opening the cache: a :func:`ro_connect`
    connection to ``db``, what the file holds that the cache never creates (e.g. ``trigger 't' on
    'Cache'``; with ``refuse``, a one-line CacheError ending in it), and whether its replies may
    be read: a planted view in their table's place (a recursive one never ends) is not, and a
    reply table not made yet holds nothing (a missing diskcache table is damage, said when read)."""
    table = db.name.startswith(TABLE_DBNAME)
    known = expected_schema(TABLE_DBNAME if table else DBNAME)
    with closing(ro_connect(db, leave_no_files)) as con:
        rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        found = [
            f"{t} {str(n)[:60]!r}" + (f" on {str(tb)[:60]!r}" if t in ("trigger", "index") else "")
            for t, n, tb, sql in rows
            if (t, n, tb, _norm(sql)) not in known
            and not (t == "table" and _SQLITE_INTERNAL.fullmatch(str(n)))
        ]
        if found and refuse:
            raise _foreign(db, found, refuse)
        kinds = {n: t for t, n, _, _ in rows}
        yield con, found, kinds.get("reply" if table else "Cache", None if table else "table") == "table"


def refuse_foreign_schema(directory: Path) -> bool:
    """Before the cache opens (and writes to) its existing databases: one-line CacheError if one
    holds a trigger, view, table or index the cache never creates, or diskcache's file holds
    settings diskcache never writes (it turns ``sqlite_*`` settings into PRAGMAs). True if
    diskcache's file holds text keys (an older hdeval's, before the reply table)."""
    legacy, unknown = False, []
    for name in DATABASES:
        db = directory / name
        if not db.is_file():
            continue
        try:
            why = "not opening it, as they could rewrite or drop the replies you pay for"
            with read_only(db, why) as (con, _, _):
                if name == DBNAME:
                    keys = con.execute("SELECT key FROM Settings")
                    unknown = [str(k)[:40] for (k,) in keys if k not in KNOWN_SETTINGS]
                    # SQLite orders every text value before every BLOB: one step down the key index
                    legacy = con.execute("SELECT 1 FROM Cache WHERE key < x'' LIMIT 1").fetchone() is not None
        except sqlite3.Error as exc:
            if _kind(exc) in ("busy", "corrupt"):  # busy: unchecked, the lock may go before the cache writes
                raise storage_error(directory, exc, name=name) from None
            continue  # not readable (no tables yet): the cache's own open says why
        if unknown:
            raise CacheError(
                f"the LLM reply cache {db} has settings hdeval and diskcache never write "
                f"({', '.join(sorted(unknown)[:3])}): not opening it; {_move_aside(directory)}"
            )
    return legacy


def _foreign(db: Path, found: list[str], why: str) -> CacheError:
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return CacheError(
        f"the LLM reply cache {db} holds SQLite objects the cache never creates "
        f"({', '.join(found[:_SHOWN])}{more}): {why}; `hdeval cache repair --cache-dir {db.parent}` copies "
        "its readable entries into a fresh database (check them: a planted entry cannot be told from a "
        "real one), or pass another --cache-dir"
    )


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
            with read_only(db, "not counting them") as (con, _, readable):
                entries += con.execute(count).fetchone()[0] if readable else 0
                size += (
                    con.execute("PRAGMA page_count").fetchone()[0]
                    * con.execute("PRAGMA page_size").fetchone()[0]
                )
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
