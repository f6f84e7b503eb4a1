"""The reply store: diskcache's ``Cache`` (plain data only, never pickled) and the compact reply
table beside it, opened with its schema checked first (:func:`open_store`)."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import diskcache

from hdeval.llm.cache.codec import (
    MAX_ENTRY_CHARS,
    VALUE_MAGIC,
    VALUE_MAGIC_PACKED,
    EntryTooLarge,
    UnreadableEntry,
    expand_value,
    read_value,
    table_value,
    value_path,
)
from hdeval.llm.cache.guard import (
    TABLE_DBNAME,
    TABLE_SQL,
    _kind,
    refuse_foreign_schema,
    refuse_links,
    storage_error,
)

# a reply table value and its length: past the cap (the ? bound, MAX_ENTRY_CHARS) only its length is read
TABLE_VALUE = "CASE WHEN length(value) <= ? THEN value END, length(value)"
TABLE_LOOKUP = f"SELECT {TABLE_VALUE} FROM reply WHERE key = ?"

REQUEST_HASH = re.compile(r"[0-9a-f]{64}\Z")
# Every setting is ours, whatever an existing database says (diskcache applies stored
# ``sqlite_*`` settings as PRAGMAs); no eviction: the replies past diskcache's 1 GB were paid for
# (and hdeval never sets an expiry). The store is read one key at a time: no memory map and a
# small page cache keep RSS flat in the cache's size.
_STORE_SETTINGS = {
    **diskcache.DEFAULT_SETTINGS,
    "eviction_policy": "none",
    "cull_limit": 0,
    "sqlite_mmap_size": 0,
    "sqlite_cache_size": 2**10,
}


class LegacyKey(str):
    """A request hash as an older hdeval stored it: its 64 hex characters as text."""


def stored_key(key: str) -> Any:
    """How the store holds the request hash ``key``: its 32 raw bytes (an older hdeval stored its
    hex text, :class:`LegacyKey`); any other ``str`` key as text."""
    return sqlite3.Binary(bytes.fromhex(key)) if REQUEST_HASH.match(key) else key


class JSONDisk(diskcache.Disk):
    """diskcache serialisation of plain data only (never pickle): ``str`` keys (a request hash as
    :func:`stored_key`), values of JSON text or compact replies, stored as the default Disk does,
    so an older hdeval's cache reads unchanged. Anything else is :class:`UnreadableEntry`."""

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is LegacyKey:
            return str(key), True
        if type(key) is not str:
            raise TypeError("hdeval cache keys are str")
        return stored_key(key), True

    def get(self, key: Any, raw: bool) -> Any:
        if raw and type(key) is str:
            return key
        if raw and type(key) is bytes and len(key) == 32:
            return key.hex()
        raise UnreadableEntry("a key hdeval does not write (pickled or binary)", foreign=True)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> tuple:
        if not read and type(value) is bytes and value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED)):
            if len(value) < self.min_file_size:
                return super().store(value, False, key=key)  # inline in the row, as a blob
            value = expand_value(value)  # a huge reply: a value file of JSON text, as before
        if read or type(value) is not str:
            raise TypeError("hdeval cache values are str (JSON text) or compact replies")
        if len(value) > MAX_ENTRY_CHARS:
            raise EntryTooLarge(f"a completion of {len(value)} characters is too large to cache")
        return super().store(value, False, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> str:
        return read_value(self._directory, mode, filename, value)

    def remove(self, file_path: Any) -> None:
        # diskcache deletes the file a row names when the row is replaced or cleared: a
        # planted row naming ../../something must not make hdeval delete it
        try:
            value_path(self._directory, file_path)
        except UnreadableEntry:
            return
        super().remove(file_path)


class ReplyStore(diskcache.Cache):
    """The store hdeval opens (:func:`open_store`). A reply is written to the compact reply table
    (``replies.db``: a request hash's 32 bytes -> :func:`encode_completion`'s bytes, as diskcache's
    row schema alone costs more than a reply; SQLite in WAL mode, safe for several processes on
    one host) and looked up there first, then in diskcache's rows, where an older hdeval stored it
    (never rewritten in place: that hdeval can still read them), so a rerun pays nothing."""

    _table: sqlite3.Connection | None = None  # the reply table's one connection

    def __init__(self, directory: Path, legacy: bool):
        super().__init__(str(directory), disk=JSONDisk, **_STORE_SETTINGS)
        self.legacy = legacy  # diskcache's rows held text keys when opened
        self._lock = threading.RLock()  # the table's connection: the store's thread and close() use it
        self._pending: list[str] = []  # keys written in the open transaction: their old rows go at commit
        try:
            self._connect()
            self.old = super().__len__() > 0  # diskcache's rows held any entry when opened
        except BaseException:
            super().close()
            raise
        _STORES.add(self)

    def _after_fork(self) -> None:
        """In a forked child: its own lock (a parent's thread may hold this one) and connection.
        The parent's is kept, never used (SQLite forbids it) nor closed (that could undo its locks)."""
        self._lock = threading.RLock()
        if self._table is not None:
            _INHERITED.append(self._table)
            self._table = None

    def _connect(self) -> sqlite3.Connection:
        if self._table is not None:
            return self._table
        try:
            con = sqlite3.connect(
                Path(self.directory) / TABLE_DBNAME, timeout=60, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            # as _STORE_SETTINGS; synchronous NORMAL keeps every commit through a process kill
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "mmap_size=0", f"cache_size=-{2**12}"):
                con.execute(f"PRAGMA {pragma}")
            con.execute(TABLE_SQL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
        except sqlite3.Error as exc:
            con.close()
            raise self._error(exc) from None
        self._table = con
        return con

    def _error(self, exc: BaseException, writing: bool = False) -> BaseException:
        if _kind(exc) == "busy":
            return diskcache.Timeout(str(exc))  # as diskcache raises it: the writer's path for a held lock
        return storage_error(self.directory, exc, writing, name=TABLE_DBNAME)

    def _run(self, sql: str, args: tuple = (), writing: bool = False) -> Any:
        """One statement on the reply table; its first row."""
        with self._lock:
            try:
                return self._connect().execute(sql, args).fetchone()
            except sqlite3.Error as exc:
                raise self._error(exc, writing) from None

    def _old_keys(self, key: str) -> tuple:
        """``key`` as diskcache's rows may hold it: 32 bytes, or hex text in an older database."""
        return (key, LegacyKey(key)) if self.legacy else (key,)

    def get(self, key: Any, default: Any = None, *args: Any, **kwargs: Any) -> Any:
        """The JSON text of ``key``'s reply, ``default`` if absent; :class:`UnreadableEntry` if unusable."""
        if args or kwargs or type(key) is not str or not REQUEST_HASH.match(key):
            return super().get(key, default, *args, **kwargs)
        row = self._run(TABLE_LOOKUP, (MAX_ENTRY_CHARS, bytes.fromhex(key)))
        got = None if row is None else table_value(*row)
        for old in self._old_keys(key):
            if got is not None:
                break
            got = super().get(old)
        return default if got is None else got

    def __getitem__(self, key: Any) -> Any:
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __contains__(self, key: Any) -> bool:
        if type(key) is not str or not REQUEST_HASH.match(key):
            return super().__contains__(key)
        return self._run("SELECT 1 FROM reply WHERE key = ?", (bytes.fromhex(key),)) is not None or any(
            super(ReplyStore, self).__contains__(k) for k in self._old_keys(key)
        )

    def set(self, key: Any, value: Any, *args: Any, **kwargs: Any) -> bool:
        if args or kwargs or type(key) is not str or not REQUEST_HASH.match(key):
            return super().set(key, value, *args, **kwargs)
        if type(value) is not bytes or not value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED)):
            raise TypeError("hdeval cache values are compact replies (encode_completion)")
        if len(value) > 1024:  # a long reply: its expanded size is what the cap is about
            size = len(expand_value(value)) if len(value) <= MAX_ENTRY_CHARS else len(value)
            if size > MAX_ENTRY_CHARS:
                raise EntryTooLarge(f"a completion of {size} characters is too large to cache")
        with self.transact():
            sql = "INSERT OR REPLACE INTO reply (key, value) VALUES (?, ?)"
            self._run(sql, (bytes.fromhex(key), value), True)
            if self.old:
                # a request is stored again only when its entry could not be used (a damaged or
                # planted one): the fresh reply replaces it, once the table has committed it
                self._pending.append(key)
        return True

    def in_transaction(self) -> bool:
        return self._table is not None and self._table.in_transaction

    @contextmanager
    def transact(self, retry: bool = False) -> Iterator[None]:
        """One transaction of the reply table (where every reply is written)."""
        with self._lock:
            if self.in_transaction():
                yield  # nested: the outer one commits
                return
            self._run("BEGIN IMMEDIATE", writing=True)
            try:
                yield
                self._run("COMMIT", writing=True)
            except BaseException:
                self._pending.clear()  # rolled back: those replies were not written
                # a failed COMMIT (a full disk) can leave the transaction open: end it
                if self.in_transaction():
                    self._table.rollback()
                raise
        if self._pending:
            keys, self._pending = self._pending, []
            with super().transact():
                for key in keys:
                    for k in self._old_keys(key):
                        super().delete(k)

    def __len__(self) -> int:
        return int(self._run("SELECT count(*) FROM reply")[0]) + super().__len__()

    def volume(self) -> int:
        return int(self._run("PRAGMA page_count")[0] * self._run("PRAGMA page_size")[0]) + super().volume()

    def clear(self, retry: bool = False) -> int:
        with self._lock:
            n = int(self._run("SELECT count(*) FROM reply")[0])
            self._run("DELETE FROM reply", writing=True)
        return n + super().clear(retry=retry)

    def close(self) -> None:
        if hasattr(self, "_lock"):  # diskcache closes itself while opening, too
            with self._lock:
                if self._table is not None:
                    self._table.close()
                    self._table = None
        super().close()


_STORES: "weakref.WeakSet[ReplyStore]" = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []  # connections of a parent process, kept open (see _after_fork)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [t._after_fork() for t in list(_STORES)])


# --------------------------------------------------------------------------- opening
def open_store(cache_dir: str | Path) -> ReplyStore:
    """Open (or create) the cache in ``cache_dir`` with :class:`JSONDisk`; one-line
    :class:`CacheError` if it is corrupted, read-only, not a directory or on a full disk."""
    directory = Path(cache_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(directory, exc) from None
    refuse_links(directory)
    # a planted trigger would rewrite every reply stored from here on
    legacy = refuse_foreign_schema(directory)
    try:
        return ReplyStore(directory, legacy)
    except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
        raise storage_error(directory, exc) from None
