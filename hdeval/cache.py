"""The one LLM client (:class:`CachedBackend`) and the reply cache it owns.

Raw completions are stored, never parsed scores, so a parser fix costs no new calls. Replies go
to a compact SQLite table (:class:`ReplyStore`'s); diskcache's file is still read for replies an
older hdeval stored there. One writer commits a reply before its call returns, so a SIGKILL
loses at most the commit in progress. The cache directory is untrusted: keys and values are
plain data only, never pickled; an entry hdeval cannot use is a miss plus a
:class:`CacheWarning`, never an exception or code run.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import json
import math
import os
import re
import sqlite3
import struct
import threading
import time
import warnings
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import diskcache
from diskcache.core import MODE_RAW, MODE_TEXT

from hdeval.backends.base import Backend, Completion, CompletionRequest
from hdeval.cache_guard import (DATABASES, DBNAME, TABLE_DBNAME, TABLE_SQL, CacheCorrupted, _kind, _reason,
                                read_only, refuse_foreign_schema, storage_error)
from hdeval.config import DEFAULT_CONCURRENCY
from hdeval.errors import BudgetExceeded, CacheError, ConfigError, RequestRejected, RetriesExhausted
from hdeval.progress import Progress

CACHE_SCHEMA = 1
# A cached completion is a few KB; anything larger is not one of ours (and is not read or parsed).
MAX_ENTRY_CHARS = 4 * 2**20
# a reply table value and its length: past the cap (the ? bound, MAX_ENTRY_CHARS) only its length is read
TABLE_VALUE = "CASE WHEN length(value) <= ? THEN value END, length(value)"
TABLE_LOOKUP = f"SELECT {TABLE_VALUE} FROM reply WHERE key = ?"

# How a reply is stored since #23: VALUE_MAGIC, then raw DEFLATE (with the preset dictionary
# below, part of the format) of a compact JSON (short keys, a logprob as [token, logprob], zero
# counts left out) that holds every field Completion.from_dict reads back, losslessly.
VALUE_MAGIC = b"Z1"
_ZDICT = b'{"t":"1","l":[[["1",-0.["2",-1.["3",-2.["4",-3.["5",-4.]]],"p":7,"c":1}'
_COMPACT = {"prompt_tokens": "p", "completion_tokens": "c", "prompt_tokens_evaluated": "e"}
_MISSING = {"prompt_tokens": 0, "completion_tokens": 0, "prompt_tokens_evaluated": None}
# The same fields packed, when shorter (DEFLATE cannot shrink a full-precision logprob's digits),
# and only when exact (finite float logprobs, plain integer counts): a flags byte (_LOGPROBS,
# _TEXT_IS_TOP: the text is the first top token, _EVALUATED), prompt, completion [and evaluated]
# token counts as LEB128 varints, [the text as varint length + UTF-8], [varint positions, per
# position varint tokens, per token varint length + UTF-8 + little-endian double].
VALUE_MAGIC_PACKED = b"Z2"
_LOGPROBS, _TEXT_IS_TOP, _EVALUATED = 1, 2, 4
_DOUBLE = struct.Struct("<d")

_KEY = re.compile(r"[0-9a-f]{64}\Z")
# diskcache's own value-file names: two levels of hex directories, then 28 hex digits
_VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val\Z")
# Every setting is ours, whatever an existing database says (diskcache applies stored
# ``sqlite_*`` settings as PRAGMAs); no eviction: the replies past diskcache's 1 GB were paid for
# (and hdeval never sets an expiry). The store is read one key at a time: no memory map and a
# small page cache keep RSS flat in the cache's size.
_STORE_SETTINGS = {**diskcache.DEFAULT_SETTINGS, "eviction_policy": "none", "cull_limit": 0,
                   "sqlite_mmap_size": 0, "sqlite_cache_size": 2**10}


def request_key(identity: str, request: CompletionRequest) -> str:
    """The cache key: sha256 over canonical JSON of what changes the output: the cache schema
    version, the backend identity (kind, model, base URL; a local model's file digest), the
    rendered messages and the decoding parameters; never API keys, timeouts, retry or concurrency."""
    payload = {"v": CACHE_SCHEMA, "backend": identity, **request.key_fields()}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CacheWarning(UserWarning):
    """A cache entry could not be used: it was treated as a miss and the LLM is asked again."""


class UnreadableEntry(ValueError):
    """One cache entry is not a completion hdeval can read. ``foreign``: hdeval never writes
    entries of this kind (a pickled value or key, a key that is not a sha256)."""

    def __init__(self, reason: str, foreign: bool = False):
        super().__init__(reason)
        self.foreign = foreign


class EntryTooLarge(ValueError):
    """A completion too large to store (it is still returned, just not cached)."""


class LegacyKey(str):
    """A request hash as hdeval stored it before #23: its 64 hex characters as text."""


def stored_key(key: str) -> Any:
    """How the store holds the request hash ``key`` since #23: its 32 raw bytes; any other
    ``str`` key as text, as before."""
    return sqlite3.Binary(bytes.fromhex(key)) if _KEY.match(key) else key


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
            _value_path(self._directory, file_path)
        except UnreadableEntry:
            return
        super().remove(file_path)


def table_value(value: Any, length: Any = None) -> str:
    """The JSON text of one value of the reply table, read with bounds; :class:`UnreadableEntry`
    otherwise (``value`` None: longer than MAX_ENTRY_CHARS, so not read)."""
    if value is None:
        raise UnreadableEntry(f"a value of {length} bytes (more than hdeval writes)")
    if type(value) is not bytes or not value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED)):
        raise UnreadableEntry("a value hdeval does not write (not a compact reply)", foreign=True)
    return expand_value(value)


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
            con = sqlite3.connect(Path(self.directory) / TABLE_DBNAME, timeout=60, isolation_level=None,
                                  check_same_thread=False)
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
        if args or kwargs or type(key) is not str or not _KEY.match(key):
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
        if type(key) is not str or not _KEY.match(key):
            return super().__contains__(key)
        return (self._run("SELECT 1 FROM reply WHERE key = ?", (bytes.fromhex(key),)) is not None
                or any(super(ReplyStore, self).__contains__(k) for k in self._old_keys(key)))

    def set(self, key: Any, value: Any, *args: Any, **kwargs: Any) -> bool:
        if args or kwargs or type(key) is not str or not _KEY.match(key):
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


def _value_path(directory: str | Path, filename: Any) -> str:
    """The full path of a value file, if ``filename`` is one diskcache would have made and it
    resolves inside ``directory``; :class:`UnreadableEntry` otherwise."""
    if not isinstance(filename, str) or not _VALUE_FILE.match(filename):
        raise UnreadableEntry(f"a value file name hdeval does not write: {str(filename)[:80]!r}", foreign=True)
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, filename))
    if not full.startswith(root + os.sep):
        raise UnreadableEntry("a value file outside the cache directory", foreign=True)
    return full


def encode_completion(c: Completion) -> bytes:
    """``c`` as the cache stores it: the shorter of VALUE_MAGIC_PACKED (when it can hold ``c``
    exactly) and VALUE_MAGIC."""
    d = c.to_dict()
    packed = _pack(d)
    deflated = _deflate(d)
    return packed if packed is not None and len(packed) <= len(deflated) else deflated


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate a server sent is kept, as the JSON form keeps it
    data = text.encode("utf-8", "surrogatepass")
    return _varint(len(data)) + data


def _pack(d: dict[str, Any]) -> bytes | None:
    """``d`` (a :meth:`Completion.to_dict`) as VALUE_MAGIC_PACKED, or None if that format cannot
    hold it exactly."""
    counts = [d["prompt_tokens"], d["completion_tokens"]]
    flags = 0
    if d["prompt_tokens_evaluated"] is not None:
        flags |= _EVALUATED
        counts.append(d["prompt_tokens_evaluated"])
    if not all(type(n) is int and 0 <= n < 2**53 for n in counts) or type(d["text"]) is not str:
        return None
    lp = d["top_logprobs"]
    body = bytearray()
    if lp is not None:
        flags |= _LOGPROBS
        body += _varint(len(lp))
        for pos in lp:
            body += _varint(len(pos))
            for t in pos:
                v = t["logprob"]
                if type(t["token"]) is not str or type(v) is not float or not math.isfinite(v):
                    return None
                body += _utf8(t["token"]) + _DOUBLE.pack(v)
        if lp and lp[0] and lp[0][0]["token"] == d["text"]:
            flags |= _TEXT_IS_TOP
    head = VALUE_MAGIC_PACKED + bytes([flags]) + b"".join(map(_varint, counts))
    return head + (b"" if flags & _TEXT_IS_TOP else _utf8(d["text"])) + bytes(body)


def _take(r: io.BytesIO, n: int) -> bytes:
    """The next ``n`` bytes of a VALUE_MAGIC_PACKED blob, checked against its end."""
    got = r.read(n)
    if len(got) < n:
        raise UnreadableEntry("its packed value is cut short")
    return got


def _read_varint(r: io.BytesIO) -> int:
    n = 0
    for shift in range(0, 56, 7):
        (b,) = _take(r, 1)
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
    raise UnreadableEntry("its packed value holds a number larger than hdeval writes")


def _read_text(r: io.BytesIO) -> str:
    try:
        return _take(r, _read_varint(r)).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise UnreadableEntry("its packed value holds text that is not UTF-8") from None


def _unpack(blob: bytes) -> str:
    """A VALUE_MAGIC_PACKED blob as the JSON text of :meth:`Completion.to_dict`."""
    r = io.BytesIO(blob)
    r.seek(len(VALUE_MAGIC_PACKED))
    (flags,) = _take(r, 1)
    if flags & ~(_LOGPROBS | _TEXT_IS_TOP | _EVALUATED) or (flags & _TEXT_IS_TOP and not flags & _LOGPROBS):
        raise UnreadableEntry("its packed value has flags hdeval does not write")
    d: dict[str, Any] = {"prompt_tokens": _read_varint(r), "completion_tokens": _read_varint(r),
                         "prompt_tokens_evaluated": _read_varint(r) if flags & _EVALUATED else None}
    text = None if flags & _TEXT_IS_TOP else _read_text(r)
    lp = None
    if flags & _LOGPROBS:
        # each position and token takes bytes: a count cannot outrun the blob
        lp = [[{"token": _read_text(r), "logprob": _DOUBLE.unpack(_take(r, 8))[0]}
               for _ in range(_read_varint(r))] for _ in range(_read_varint(r))]
        if text is None:
            if not (lp and lp[0]):
                raise UnreadableEntry("its packed value has no top token to be its text")
            text = lp[0][0]["token"]
    if r.tell() != len(blob):
        raise UnreadableEntry("its packed value has bytes after its end")
    return json.dumps({"text": text, "top_logprobs": lp, **d})


def _deflate(d: dict[str, Any]) -> bytes:
    """``d`` (a :meth:`Completion.to_dict`) as VALUE_MAGIC."""
    compact: dict[str, Any] = {"t": d["text"]}
    if d["top_logprobs"] is not None:
        compact["l"] = [[[t["token"], t["logprob"]] for t in pos] for pos in d["top_logprobs"]]
    # left out: the value a missing field reads back as (0, or None for prompt_tokens_evaluated)
    compact.update({short: d[name] for name, short in _COMPACT.items() if d[name] != _MISSING[name]})
    raw = json.dumps(compact, separators=(",", ":")).encode("ascii")
    z = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=_ZDICT)
    return VALUE_MAGIC + z.compress(raw) + z.flush()


def expand_value(blob: bytes) -> str:
    """A compact stored reply as the JSON text of :meth:`Completion.to_dict` (what
    :func:`parse_completion` then checks); :class:`UnreadableEntry` if it is not one, read with
    bounds (a planted blob must not inflate to gigabytes)."""
    if blob.startswith(VALUE_MAGIC_PACKED):
        return _unpack(blob)
    z = zlib.decompressobj(-15, zdict=_ZDICT)
    try:
        raw = z.decompress(blob[len(VALUE_MAGIC):], MAX_ENTRY_CHARS)
    except zlib.error:
        raise UnreadableEntry("its compressed value is damaged") from None
    if z.unconsumed_tail or not z.eof:
        raise UnreadableEntry("its compressed value is cut short or larger than hdeval writes")
    try:
        c = json.loads(raw)
    except (ValueError, RecursionError):
        raise UnreadableEntry("its compressed value is not JSON") from None
    if not isinstance(c, dict):
        raise UnreadableEntry("its compressed value is not a compact completion")
    lp = c.get("l")
    if lp is not None:
        if not (isinstance(lp, list) and all(isinstance(pos, list) and all(
                isinstance(t, list) and len(t) == 2 for t in pos) for pos in lp)):
            raise UnreadableEntry("its compressed value has malformed top_logprobs")
        lp = [[{"token": t[0], "logprob": t[1]} for t in pos] for pos in lp]
    d = {"text": c.get("t"), "top_logprobs": lp}
    d.update({name: c.get(short, _MISSING[name]) for name, short in _COMPACT.items()})
    return json.dumps(d)


def read_value(directory: str | Path, mode: int, filename: Any, value: Any) -> str:
    """The text of one stored value, read with bounds; :class:`UnreadableEntry` otherwise."""
    if mode == MODE_RAW:
        if type(value) is bytes and value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED)):
            return table_value(value if len(value) <= MAX_ENTRY_CHARS else None, len(value))
        if type(value) is not str:
            raise UnreadableEntry("a binary or numeric value (hdeval stores only JSON text)", foreign=True)
        if len(value) > MAX_ENTRY_CHARS:
            raise UnreadableEntry(f"a value of {len(value)} characters (more than hdeval writes)")
        return value
    if mode != MODE_TEXT:
        # MODE_PICKLE or MODE_BINARY: hdeval never writes these; never unpickle them
        raise UnreadableEntry("a pickled or binary value (hdeval stores only JSON text)", foreign=True)
    full = _value_path(directory, filename)
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(4 * MAX_ENTRY_CHARS + 1)  # UTF-8: at most 4 bytes a character
    except OSError as exc:
        raise UnreadableEntry(f"its value file cannot be read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableEntry("its value file is not UTF-8 text") from None
    if len(text) > MAX_ENTRY_CHARS:
        raise UnreadableEntry("its value file is larger than hdeval writes")
    return text


def _count(x: Any) -> bool:
    return x is None or (type(x) is int and 0 <= x < 2**53)


def parse_completion(text: str) -> Completion:
    """A cached completion from its JSON text; :class:`UnreadableEntry` if it is not one."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        raise UnreadableEntry("its value is not JSON") from None
    if not isinstance(d, dict) or not isinstance(d.get("text"), str):
        raise UnreadableEntry("its value is not a JSON completion (no text)")
    lp = d.get("top_logprobs")
    if lp is not None:
        ok = isinstance(lp, list) and all(
            isinstance(pos, list) and all(
                isinstance(t, dict) and isinstance(t.get("token"), str)
                # null: a logprob the server sent unreadable (NaN, Infinity), kept as delivered
                # so the replay records the same failure instead of paying for it again
                and (t.get("logprob") is None
                     or (type(t.get("logprob")) in (int, float) and not math.isnan(t["logprob"])))
                for t in pos)
            for pos in lp)
        if not ok:
            raise UnreadableEntry("its value has malformed top_logprobs")
    if not all(_count(d.get(k)) for k in ("prompt_tokens", "completion_tokens", "prompt_tokens_evaluated")):
        raise UnreadableEntry("its value has malformed token counts")
    return Completion.from_dict(d)


# --------------------------------------------------------------------------- opening
def open_store(cache_dir: str | Path) -> ReplyStore:
    """Open (or create) the cache in ``cache_dir`` with :class:`JSONDisk`; one-line
    :class:`CacheError` if it is corrupted, read-only, not a directory or on a full disk."""
    directory = Path(cache_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(directory, exc) from None
    # a planted trigger would rewrite every reply stored from here on
    legacy = refuse_foreign_schema(directory)
    try:
        return ReplyStore(directory, legacy)
    except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
        raise storage_error(directory, exc) from None


@dataclass
class UsageStats:
    calls: int = 0  # requests that reached the backend and succeeded
    hits: int = 0  # requests answered from the cache
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_evaluated: int = 0
    unreadable: int = 0  # cache entries that were not a readable completion (asked again)

    def add(self, c: Completion) -> None:
        """Count one paid call."""
        self.calls += 1
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        if c.prompt_tokens_evaluated is not None:
            self.prompt_tokens_evaluated += c.prompt_tokens_evaluated

    def summary(self) -> str:
        return (
            f"LLM calls made: {self.calls}, cache hits: {self.hits}, "
            f"tokens used: {self.prompt_tokens} prompt + {self.completion_tokens} completion"
        )


class CachedBackend:
    """The one LLM client: every call goes through :meth:`acomplete_many` (or its synchronous
    doors :meth:`complete_many` and :meth:`complete`), which owns the cache lookup, the Batch
    API strategy (``batch``), concurrency (one semaphore), the call budget (``max_calls``,
    shared by every stage that uses this client) and progress.

    The one writer commits a reply (batched, on the store's own thread) before its call returns
    and its concurrency slot is given back. Identical requests cost one call. Unreadable entries
    are misses, counted in ``stats.unreadable`` and described in ``warnings``. When the store
    cannot be written (a full disk), the reply just paid for is still returned (and kept in
    memory), and the next call that would be paid for raises the one-line :class:`CacheError`.
    """

    MAX_WARNINGS = 20
    WRITE_BATCH = 256  # replies committed in one transaction at most
    # requests in a row that exhaust their retries with no success between them: the server is
    # down (fewer are each that cell's recorded failure)
    STOP_STREAK = 3

    def __init__(self, inner: Backend, cache_dir: str | Path | None, max_calls: int | None = None, *,
                 concurrency: int = DEFAULT_CONCURRENCY, batch: Any = None):
        self.inner = inner
        self.identity = inner.identity
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # every call returned so far is committed to it
        self.store: ReplyStore | None = open_store(cache_dir) if cache_dir is not None else None
        self.max_calls = max_calls
        cap = self.max_concurrency  # a local model runs one call at a time
        self.concurrency = max(1, min(concurrency, cap) if cap else concurrency)
        self.batch = batch
        self.stats = UsageStats()
        self.warnings: list[str] = []
        self._reserved = 0
        self._streak = 0
        # everything below is touched on the LLM loop only
        self._inflight: dict[str, asyncio.Future] = {}
        self._unsaved: dict[str, Completion] = {}  # replies that could not be written
        self._saved: set[str] = set()  # keys this client committed (a later lookup must see them)
        self._batches = 0  # acomplete_many calls running; _saved is needed only while one is
        self._write_error: CacheError | None = None
        self._queue: list[tuple[str, bytes, Completion, asyncio.Future]] = []
        self._writer: asyncio.Future | None = None
        self._sem = asyncio.Semaphore(self.concurrency)
        # the one thread that touches the store (diskcache keeps a connection per thread)
        self._io = ThreadPoolExecutor(1, thread_name_prefix="hdeval-cache") if self.store is not None else None
        self._pool: ThreadPoolExecutor | None = None  # a synchronous backend's calls run here
        self._pid = os.getpid()

    def _same_process(self) -> None:
        # A forked child has none of the parent's threads (the store's writer, the call pool) and
        # would share its connections: refused in one line instead of waiting forever.
        if os.getpid() != self._pid:
            raise ConfigError(f"this LLM client was opened in process {self._pid}, and a forked process "
                              "cannot use its cache writer or connections: open one in the new process "
                              "(hdeval.llm.open_llm, or pass no backend and the evaluator opens its own)")

    @property
    def max_concurrency(self) -> int | None:
        return getattr(self.inner, "max_concurrency", None)

    def key(self, request: CompletionRequest) -> str:
        return request_key(self.identity, request)

    def flush(self) -> None:
        """Nothing to do: a call returns once its reply is committed."""

    def stored(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` have a reply this client would serve without a call: in the store
        (read on the store's thread) or kept in memory because the store could not take them.
        Whether an entry is readable is not checked here."""
        self._same_process()
        keys = list(dict.fromkeys(keys))
        found = {k for k in keys if k in self._unsaved}
        rest = [k for k in keys if k not in found]
        if rest and self._io is not None:
            try:
                found.update(self._io.submit(lambda: {k for k in rest if k in self.store}).result())
            except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
                raise storage_error(self.cache_dir, exc) from None
        return found

    def is_cached(self, request: CompletionRequest) -> bool:
        self._same_process()
        key = self.key(request)
        return key in self._unsaved or self._read(key) is not None

    # ---- synchronous doors ----------------------------------------------------------------
    def complete(self, request: CompletionRequest) -> Completion:
        from hdeval import aio

        self._same_process()
        return aio.run(self.acomplete(request))

    def complete_many(self, requests: Sequence[CompletionRequest], progress: Progress | None = None, *,
                      keep_rejected: bool = False, concurrency: int | None = None) -> list:
        from hdeval import aio

        self._same_process()
        halt: list[bool] = []
        return aio.run(self.acomplete_many(requests, progress, keep_rejected=keep_rejected,
                                           concurrency=concurrency, halt=halt),
                       on_interrupt=lambda: halt.append(True))

    def close(self) -> None:
        """Close the store and the client's threads (idempotent); in a forked child, only let go
        of them: they are the parent's."""
        if os.getpid() != self._pid:
            self._io = self._pool = self.batch = None
            return
        if self.batch is not None:
            self.batch.close()
        if self._io is not None:
            io, self._io = self._io, None
            io.submit(self.store.close).result()  # the store thread's own connection
            io.shutdown()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.store is not None:
            self.store.close()

    # ---- the store (on its thread) -------------------------------------------------------------
    def _warn(self, key: str, reason: str) -> None:
        self.stats.unreadable += 1
        if len(self.warnings) < self.MAX_WARNINGS:
            self.warnings.append(f"cache entry {key[:12]}... in {self.cache_dir} ignored: {reason}")
        if self.stats.unreadable == 1:
            warnings.warn(
                f"the LLM reply cache {self.cache_dir} holds an entry hdeval cannot use ({reason}); "
                f"it is asked again (`hdeval cache check --cache-dir {self.cache_dir}` lists them)",
                CacheWarning, stacklevel=2)

    def _read(self, key: str) -> Completion | None:
        if self.store is None:
            return None
        try:
            text = self.store.get(key)
            return None if text is None else parse_completion(text)
        except UnreadableEntry as exc:
            self._warn(key, str(exc))
            return None
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise storage_error(self.cache_dir, exc) from None

    def _read_many(self, keys: Iterable[str]) -> dict[str, Completion]:
        return {key: c for key in keys if (c := self._read(key)) is not None}

    def _write_batch(self, items: list[tuple[str, bytes]]) -> dict[str, BaseException]:
        """Commit ``items`` in one transaction; if the store fails, each on its own, so every
        one that can be written is. The keys that could not be written, and why."""
        store = self.store
        failed: dict[str, BaseException] = {}
        try:
            with store.transact():
                for key, text in items:
                    try:
                        store.set(key, text)
                    except EntryTooLarge as exc:  # raised before any SQL: the transaction goes on
                        failed[key] = exc
        except diskcache.Timeout as exc:  # another process held the lock all along: so would it now
            failed = {key: exc for key, _ in items}
        except (OSError, sqlite3.Error):
            failed = {}
            for key, text in items:
                try:
                    store.set(key, text)
                except (EntryTooLarge, OSError, sqlite3.Error, diskcache.Timeout) as exc:
                    failed[key] = exc
        return failed

    # ---- the call path (on the LLM loop) ---------------------------------------------------------
    async def acomplete(self, request: CompletionRequest) -> Completion:
        """One request (never through the Batch API); a rejection is raised."""
        (got,) = await self.acomplete_many([request], use_batch=False)
        return got

    async def acomplete_many(self, requests: Sequence[CompletionRequest], progress: Progress | None = None, *,
                             keep_rejected: bool = False, concurrency: int | None = None,
                             use_batch: bool = True, halt: list | None = None) -> list:
        """Complete ``requests``; results in input order.

        Replies in the cache come first (counted on ``progress`` as cached); with ``batch``, the
        rest go through the Batch API first; what is still missing is asked with at most
        ``concurrency`` in flight, in order (a local model sees one sample's requests back to
        back). With ``keep_rejected``, a request the server refused on its own account
        (:class:`RequestRejected`, and a request that kept failing while others succeed) is
        returned in its place as the exception. Any other error (server down, budget, Ctrl-C)
        starts nothing new, lets the calls running finish (and be cached), and is raised.
        """
        self._same_process()
        self._batches += 1
        try:
            loop = asyncio.get_running_loop()
            keys = [self.key(r) for r in requests]
            out: list[Any] = [None] * len(requests)
            found: dict[str, Completion] = {k: self._unsaved[k] for k in keys if k in self._unsaved}
            want = [k for k in dict.fromkeys(keys) if k not in found]
            if self._io is not None and want:
                found.update(await loop.run_in_executor(self._io, self._read_many, want))
            fresh: dict[str, Completion] = {}  # paid for through the Batch API just now
            if self.batch is not None and use_batch and self._io is not None:
                miss = {k: r for k, r in zip(keys, requests) if k not in found}
                if miss:
                    fresh = await self.batch.prefetch(self, miss, progress, halt)
                else:
                    await self.batch.tidy(self, progress)
            todo: list[int] = []
            first: dict[str, int] = {}
            later: list[int] = []
            for i, k in enumerate(keys):
                if k in found:
                    out[i] = replace(found[k], cached=True)
                elif k in first:
                    later.append(i)
                else:
                    first[k] = i
                    if k in fresh:
                        out[i] = fresh[k]
                    else:
                        todo.append(i)
            self.stats.hits += sum(k in found for k in keys)
            if progress is not None and len(todo) < len(requests) - len(later):
                progress.advance(len(requests) - len(todo) - len(later), cached=True)
            errors: list[tuple[int, BaseException]] = []
            pending = iter(todo)

            async def work() -> None:
                for i in pending:
                    if errors or halt:
                        return
                    try:
                        got: Any = await self._fetch(keys[i], requests[i])
                    except RequestRejected as exc:
                        if not keep_rejected:
                            errors.append((i, exc))
                            return
                        got = exc
                    except BaseException as exc:  # noqa: BLE001 - raised below, once the others ended
                        errors.append((i, exc))
                        return
                    out[i] = got
                    if progress is not None:
                        progress.advance(1, cached=getattr(got, "cached", False))

            n = min(concurrency or self.concurrency, self.concurrency, len(todo))
            if n:
                await asyncio.gather(*(work() for _ in range(n)))
            if errors:
                raise min(errors, key=lambda e: e[0])[1]
            if halt:
                raise KeyboardInterrupt
            for i in later:  # the same request again: one call served both
                got = out[first[keys[i]]]
                if isinstance(got, Completion):
                    got = replace(got, cached=True)
                    self.stats.hits += 1
                out[i] = got
                if progress is not None:
                    progress.advance(1, cached=True)
            return out
        finally:
            # once no batch runs, the keys committed are forgotten: later lookups read the store
            self._batches -= 1
            if not self._batches:
                self._saved.clear()

    async def _fetch(self, key: str, request: CompletionRequest) -> Completion:
        """``request``'s reply: joined to the same request in flight, re-read if this client
        committed it since the lookup, else paid for."""
        running = self._inflight.get(key)
        got = None
        if running is not None:
            try:
                got = await asyncio.shield(running)
            except BaseException:  # noqa: BLE001 - that call failed (its future is cancelled): try ourselves
                if not running.cancelled():
                    raise  # this joiner was cancelled itself: it must not pay for the call again
        if got is None:
            got = self._unsaved.get(key)
        if got is None and key in self._saved and self._io is not None:
            got = await asyncio.get_running_loop().run_in_executor(self._io, self._read, key)
        if got is not None:
            self.stats.hits += 1
            return replace(got, cached=True)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            got = await self._call(key, request)
        except BaseException:
            fut.cancel()
            raise
        finally:
            self._inflight.pop(key, None)
        fut.set_result(got)
        return got

    async def _call(self, key: str, request: CompletionRequest) -> Completion:
        if self._write_error is not None:
            raise self._write_error
        if self.max_calls is not None and self._reserved >= self.max_calls:
            raise BudgetExceeded(f"stopped at --max-calls {self.max_calls}: every finished call is cached; "
                                 "rerun with a higher limit to continue")
        self._reserved += 1
        try:
            async with self._sem:
                result = await self._ask(request)
                if self.store is not None:
                    await self.commit(key, result)
        except RetriesExhausted as exc:
            self._reserved -= 1
            self._streak += 1
            if self._streak < self.STOP_STREAK and self.stats.calls > 0:
                raise RequestRejected(f"{exc} (while other requests succeed: this one is recorded as failed, "
                                      "and the next run asks again)") from None
            raise
        except BaseException:
            self._reserved -= 1
            raise
        self._streak = 0
        self.stats.add(result)
        return result

    async def _ask(self, request: CompletionRequest) -> Completion:
        acomplete = getattr(self.inner, "acomplete", None)
        if acomplete is not None:
            return await acomplete(request)
        if self._pool is None:  # a synchronous backend (a local model, the fake): in threads
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="hdeval-llm")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.inner.complete, request)

    async def commit(self, key: str, result: Completion) -> None:
        """Store ``result`` under ``key`` through the one writer (also the Batch API strategy's
        way in); returns once it is committed (or known unwritable, then kept in memory)."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((key, encode_completion(result), result, fut))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_loop())
        # no shield needed: a cancelled waiter cancels only its future; the reply stays queued
        # and is written all the same
        await fut

    async def _write_loop(self) -> None:
        """The one writer: whatever is queued, one transaction at a time, until nothing is."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch = self._queue[: self.WRITE_BATCH]
                del self._queue[: self.WRITE_BATCH]
                try:
                    if self._io is None:
                        raise CacheError(f"the LLM reply cache {self.cache_dir} is closed")
                    failed = await loop.run_in_executor(self._io, self._write_batch, [(k, t) for k, t, _, _ in batch])
                except BaseException as exc:  # noqa: BLE001 - never leave a call waiting
                    failed = {k: exc for k, _, _, _ in batch}
                for key, _text, result, fut in batch:
                    exc = failed.get(key)
                    if exc is None:
                        self._saved.add(key)
                    else:
                        self._unsaved[key] = result
                        if isinstance(exc, EntryTooLarge):
                            if len(self.warnings) < self.MAX_WARNINGS:
                                self.warnings.append(f"not cached: {exc}")
                        elif self._write_error is None:
                            self._write_error = (exc if isinstance(exc, CacheError)
                                                 else storage_error(self.cache_dir, exc, writing=True))
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._writer = None


def clear_cache(cache_dir: str | Path) -> int:
    """Delete every cached reply; the number deleted.

    A corrupted database cannot be asked what it holds: then both database files (with their
    write-ahead logs) are deleted and ``-1`` returned. Value files are left alone (they may belong
    to a copy kept aside by ``repair``) and nothing else in the directory is ever touched.
    """
    path = Path(cache_dir)
    if not path.exists():
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


# --------------------------------------------------------------------------- check / repair
@dataclass
class CheckReport:
    path: str
    readable: int = 0  # and copied, by repair
    unreadable: int = 0  # hdeval-shaped entries whose value cannot be used
    foreign: int = 0  # entries hdeval never writes (pickled, binary, other keys)
    database_error: str | None = None  # the database could not be read (in part or at all)
    examples: list[str] = field(default_factory=list)
    planted: dict[str, list[str]] = field(default_factory=dict)  # file -> objects the cache never creates
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
            rows = con.execute(f"SELECT {cols} FROM Cache WHERE rowid > ? ORDER BY rowid LIMIT ?",
                               (last, page)).fetchall()
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
            yield from con.execute(f"SELECT {cols} FROM reply WHERE key > ? ORDER BY key DESC",
                                   (MAX_ENTRY_CHARS, last[0]))
    except sqlite3.Error:
        pass  # the damage, reached from the other side


def _check_entry(report: CheckReport, key: Any, read: Callable[[], str],
                 raw: bool = True) -> Iterator[tuple[str, Completion]]:
    """(key, completion) if the entry is readable and valid; counted into ``report`` either way."""
    try:
        if type(key) is bytes and len(key) == 32:
            key = key.hex()  # the compact form (since #23)
        if not raw or type(key) is not str or not _KEY.match(key):
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


def _entries(directory: Path, db: Path, report: CheckReport) -> Iterator[tuple[str, Completion]]:
    """(key, completion) of every readable, valid entry of the database ``db`` (the reply table's,
    told by its name, or diskcache's, value files relative to ``directory``), read without
    writing; every entry and database error is counted into ``report``."""
    if not db.is_file():
        return
    table = db.name.startswith(TABLE_DBNAME)
    before, report.database_error = report.database_error, None
    try:
        with read_only(db) as (con, found, readable):
            if found:  # listed by `cache check`; repair copies only the real table's entries
                report.planted[db.name] = found
            for key, value, length in _table_rows(con, report) if table and readable else ():
                yield from _check_entry(report, key, partial(table_value, value, length))
            for _, key, raw, mode, filename, value in () if table or not readable else _rows(con, report):
                read = partial(read_value, directory, mode, filename, value)
                yield from _check_entry(report, key, read, raw == 1)
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


def check_cache(cache_dir: str | Path) -> CheckReport:
    """Count readable, unreadable and foreign entries of both databases; writes nothing."""
    directory = Path(cache_dir)
    report = CheckReport(str(directory))
    for name in DATABASES:
        for _ in _entries(directory, directory / name, report):
            pass
    return report


def repair_cache(cache_dir: str | Path) -> CheckReport:
    """Move the databases aside as ``cache.db.corrupt-<timestamp>`` and ``replies.db.corrupt-<timestamp>``
    (never deleted) and copy every readable, valid entry of both into a fresh cache (the reply
    table)."""
    directory = Path(cache_dir)
    names = [name for name in DATABASES if (directory / name).is_file()]
    if not names:
        raise CacheError(f"no cache database at {directory / DBNAME}: nothing to repair")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag, n = stamp, 1
    while any((directory / f"{name}.corrupt-{tag}{s}").exists() for name in names for s in ("", "-wal", "-shm")):
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
