"""The one cache every LLM call goes through.

Raw completions (text + logprobs + usage) are stored, never parsed scores, so a parser
fix costs no new calls. Each completion is handed to one writer thread the moment it arrives
and committed to SQLite (diskcache) with whatever else finished meanwhile, in one transaction
(a ``set`` per call from every thread made them queue on SQLite's write lock, holding a
concurrency slot each). Until committed, a completion is served from memory, so lookups and
in-flight de-duplication see it. A thread waits for its own previous write to be committed
before it pays for another call, so at most one finished call per thread is ever uncommitted,
and only for the few milliseconds of one commit; ``close()`` (and an ``atexit`` hook, so
Ctrl-C and normal exits too) writes everything still queued. Only a SIGKILL or power loss in
those milliseconds can lose a call, and the rerun asks for it again.

The cache directory is untrusted (it may be shared, copied or planted): keys and values are
plain text only (sha256 hex keys, JSON completions). :class:`JSONDisk` never pickles or
unpickles; a value that is not a JSON completion, is too large, or points outside the
directory is a cache miss plus a :class:`CacheWarning`, never an exception or code run.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import sqlite3
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import diskcache
from diskcache.core import MODE_RAW, MODE_TEXT

from hdeval.backends.base import Backend, Completion, CompletionRequest
from hdeval.cache_guard import refuse_foreign_schema, ro_connect
from hdeval.errors import BudgetExceeded, CacheError

CACHE_SCHEMA = 1
DBNAME = "cache.db"
# A cached completion is a few KB; anything larger than this is not one of ours (and is not
# read into memory or parsed).
MAX_ENTRY_CHARS = 4 * 2**20
# Free space to ask for when the disk fills up: SQLite needs room for its write-ahead log.
FREE_SPACE_HINT = "100 MB"

_KEY = re.compile(r"[0-9a-f]{64}\Z")
# diskcache's own value-file names: two levels of hex directories, then 28 hex digits
_VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val\Z")
# What diskcache itself keeps in the Settings table; anything else was not written by it
_KNOWN_SETTINGS = set(diskcache.DEFAULT_SETTINGS) | set(diskcache.core.METADATA)
# Every setting is ours, whatever an existing database says (diskcache applies stored
# ``sqlite_*`` settings as PRAGMAs); and no eviction: diskcache's default drops the oldest
# replies past 1 GB, and those were paid for.
_STORE_SETTINGS = {**diskcache.DEFAULT_SETTINGS, "eviction_policy": "none"}


def request_key(identity: str, request: CompletionRequest) -> str:
    """The cache key: sha256 over canonical JSON of what changes the output, and nothing else.

    In: the cache schema version, the backend identity (kind, model, base URL; a local
    model's file digest), the rendered messages and the decoding parameters.
    Not in: API keys, timeouts, retry or concurrency settings.
    """
    payload = {"v": CACHE_SCHEMA, "backend": identity, **request.key_fields()}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CacheWarning(UserWarning):
    """A cache entry could not be used (not a JSON completion, pickled, too large): it was
    treated as a miss and the LLM is asked again."""


class UnreadableEntry(ValueError):
    """One cache entry is not a completion hdeval can read. ``foreign``: hdeval never writes
    entries of this kind (a pickled value or key, a key that is not a sha256)."""

    def __init__(self, reason: str, foreign: bool = False):
        super().__init__(reason)
        self.foreign = foreign


class CacheCorrupted(CacheError):
    """The cache database is damaged (``hdeval cache repair`` or ``clear`` deal with it)."""


class EntryTooLarge(ValueError):
    """A completion too large to store (it is still returned, just not cached)."""


class JSONDisk(diskcache.Disk):
    """diskcache serialisation that stores only text and never calls pickle.

    Keys must be ``str``; values must be ``str`` (JSON text) and are stored the way the
    default Disk stores strings (inline below ``min_file_size``, else a ``.val`` file), so a
    cache written by an older hdeval (which stored ``json.dumps`` strings) reads unchanged.
    Reading anything else raises :class:`UnreadableEntry` instead of unpickling it.
    """

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str:
            raise TypeError("hdeval cache keys are str")
        return key, True

    def get(self, key: Any, raw: bool) -> Any:
        if raw and type(key) is str:
            return key
        raise UnreadableEntry("a key hdeval does not write (pickled or binary)", foreign=True)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> tuple:
        if read or type(value) is not str:
            raise TypeError("hdeval cache values are str (JSON text)")
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


def read_value(directory: str | Path, mode: int, filename: Any, value: Any) -> str:
    """The text of one stored value, read with bounds; :class:`UnreadableEntry` otherwise."""
    if mode == MODE_RAW:
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


def storage_error(directory: str | Path, exc: BaseException, writing: bool = False) -> CacheError:
    """A one-line :class:`CacheError` for a failure of the store in ``directory``."""
    d = Path(directory)
    db = d / DBNAME
    kind = _kind(exc)
    if kind == "corrupt":
        return CacheCorrupted(f"the LLM reply cache {db} is corrupted ({_reason(exc)}): {_move_aside(d)}")
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


def _move_aside(directory: Path) -> str:
    """How to get a bad database out of the way (its write-ahead log goes with it: a new
    database next to an old ``-wal`` file would replay it)."""
    db = directory / DBNAME
    logs = [DBNAME + s for s in ("-wal", "-shm") if (directory / (DBNAME + s)).exists()]
    also = f" (and {' and '.join(logs)} likewise)" if logs else ""
    return (f"run `hdeval cache repair --cache-dir {directory}` to keep its readable entries, "
            f"or move it aside with `mv {db} {db}.bad`{also}")


def _ro_connect(db: Path) -> sqlite3.Connection:
    return ro_connect(db)  # works on a read-only file system too


def _precheck(directory: Path) -> None:
    """Before diskcache opens (and writes to) an existing database: it is a database, and its
    settings are ones diskcache writes (diskcache turns ``sqlite_*`` settings into PRAGMAs)."""
    db = directory / DBNAME
    if not db.is_file():
        return
    try:
        con = _ro_connect(db)
    except sqlite3.Error:
        return  # cannot even open it read-only: diskcache's own open says why
    try:
        rows = con.execute("SELECT key FROM Settings").fetchall()
    except sqlite3.Error as exc:
        if _kind(exc) == "corrupt":
            raise storage_error(directory, exc) from None
        return  # no Settings table yet (an empty file) or not readable: diskcache decides
    finally:
        con.close()
    unknown = sorted(str(k)[:40] for (k,) in rows if k not in _KNOWN_SETTINGS)
    if unknown:
        raise CacheError(
            f"the LLM reply cache {db} has settings hdeval and diskcache never write ({', '.join(unknown[:3])}): "
            f"not opening it; {_move_aside(directory)}")


def _writable_or_raise(directory: Path) -> None:
    probe = directory
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise CacheError(f"the LLM reply cache directory {directory} cannot be created: {probe} is a file; "
                         f"pass --cache-dir (or set HDEVAL_CACHE_DIR) to a directory")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise CacheError(f"cannot write the LLM reply cache in {directory} ({probe} is read-only): pass "
                         f"--cache-dir (or set HDEVAL_CACHE_DIR) to a writable directory")


def open_store(cache_dir: str | Path) -> diskcache.Cache:
    """Open (or create) the cache in ``cache_dir`` with :class:`JSONDisk`; one-line
    :class:`CacheError` if it is corrupted, read-only or on a full disk."""
    directory = Path(cache_dir)
    _writable_or_raise(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(directory, exc) from None
    _precheck(directory)
    refuse_foreign_schema(directory)  # a planted trigger would rewrite every reply stored from here on
    try:
        return diskcache.Cache(str(directory), disk=JSONDisk, **_STORE_SETTINGS)
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

    def summary(self) -> str:
        return (
            f"LLM calls made: {self.calls}, cache hits: {self.hits}, "
            f"tokens used: {self.prompt_tokens} prompt + {self.completion_tokens} completion"
        )


# every CachedBackend whose writer thread runs: what it holds is written out at interpreter exit
_OPEN: "weakref.WeakSet[CachedBackend]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for backend in list(_OPEN):
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - at exit there is nobody left to tell
            pass


class CachedBackend:
    """Wraps a backend with a disk cache, usage accounting and an optional call budget.

    Unreadable entries are misses, counted in ``stats.unreadable`` and described in
    ``warnings`` (and one :class:`CacheWarning` per backend). When the store cannot be written
    (a full disk), the reply just paid for is still returned (and kept in memory for this
    run), and the next call that would have to be paid for raises the one-line
    :class:`CacheError` instead, so no more money goes into replies that cannot be saved.
    """

    MAX_WARNINGS = 20
    WRITE_BATCH = 256  # completions committed in one transaction at most
    LOOKUP_CHUNK = 500  # keys per query of stored_keys() (old SQLite builds allow 999 parameters)
    WRITER_IDLE = 2.0  # seconds without writes after which the writer thread ends (restarted on demand)

    def __init__(self, inner: Backend, cache_dir: str | Path | None, max_calls: int | None = None):
        self.inner = inner
        self.identity = inner.identity
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._store = open_store(cache_dir) if cache_dir is not None else None
        self.max_calls = max_calls
        self.stats = UsageStats()
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._reserved = 0
        # keys being fetched right now: a second thread asking for the same request (two
        # samples with identical text) waits for the first instead of paying for it again
        self._inflight: dict[str, threading.Event] = {}
        self._finished = 0  # fetches ended (their reply saved, or failed)
        # replies that could not be written (disk full): still served for this run
        self._unsaved: dict[str, Completion] = {}
        self._write_error: CacheError | None = None
        # the writer: completions waiting to be committed, served from ``_pending`` meanwhile;
        # writes are numbered, ``_written`` is the highest number the writer has dealt with
        self._pending: dict[str, Completion] = {}
        self._queue: list[tuple[int, str, str, Completion]] = []
        self._queued = 0
        self._written = 0
        # its own lock: request threads and the writer never queue on the lock that guards
        # stats, the budget and in-flight requests. Lock order: _wlock before _lock.
        self._wlock = threading.Lock()
        # The writer waits for work on ``_work`` (woken alone, once per queued reply);
        # flush() waits for commits on ``_wcond``; a request thread waiting for its previous
        # reply's commit waits on its own event in ``_commit_waiters`` (write number -> event),
        # set by the writer once that number is committed. One condition for all of them woke
        # every waiting thread on every queued reply and every commit, and they then queued
        # on this lock: at --concurrency 64 that herd was a quarter of the client's GIL time.
        self._wcond = threading.Condition(self._wlock)
        self._work = threading.Condition(self._wlock)
        self._commit_waiters: dict[int, threading.Event] = {}
        self._writer: threading.Thread | None = None
        self._closing = False
        self._mine = threading.local()  # .last: the number of this thread's latest write
        # lookahead(): keys of requests about to be made, and which of them the store lacked
        # when looked up in bulk (a key leaves ``_absent`` when this process saves its reply)
        self._keys: dict[CompletionRequest, str] = {}
        self._absent: set[str] = set()
        self._save_logs: list[set[str]] = []  # keys saved while a lookahead asks the store

    @property
    def store(self) -> diskcache.Cache | None:
        """The disk store, with every completion finished so far written to it."""
        self.flush()
        return self._store

    @property
    def max_concurrency(self) -> int | None:
        """The inner backend's limit on useful parallel calls (a local model: 1)."""
        return getattr(self.inner, "max_concurrency", None)

    def key(self, request: CompletionRequest) -> str:
        if self._keys:  # inside lookahead(): computed already
            try:
                key = self._keys.get(request)
            except TypeError:  # an unhashable request (messages in a list): compute it
                key = None
            if key is not None:
                return key
        return request_key(self.identity, request)

    def stored_keys(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` have an entry in the store, in one query per ``LOOKUP_CHUNK``
        keys (entries are not read: an unreadable one still counts here)."""
        if self._store is None:
            return set()
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        try:
            for i in range(0, len(keys), self.LOOKUP_CHUNK):
                chunk = keys[i : i + self.LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._store._sql(f"SELECT key FROM Cache WHERE raw = 1 AND key IN ({marks})", chunk)
                found.update(k for (k,) in rows if type(k) is str)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise storage_error(self.cache_dir, exc) from None
        return found

    @contextlib.contextmanager
    def lookahead(self, requests: Sequence[CompletionRequest]) -> Iterator[None]:
        """Around a batch of calls (``fill_matrix``): the cache keys of all ``requests`` are
        computed once, and the store is asked in bulk (:meth:`stored_keys`) which it lacks;
        inside, :meth:`complete` reuses those keys and skips its per-call store lookup for
        the keys found missing. Replies come and go as without it: memory (replies queued or
        unsaved) is still looked at first, and a reply this process saves meanwhile drops its
        key from the missing ones before it can leave memory. Only an entry another process
        writes during the batch goes unseen (as one written just after a single lookup would)."""
        if self._store is None or not requests:
            yield
            return
        try:
            keys = {r: request_key(self.identity, r) for r in requests}
        except TypeError:  # an unhashable request: no lookahead, each call looks up alone
            yield
            return
        # The store answers for one moment, and replies keep arriving meanwhile: a reply
        # queued before that moment (not yet committed) or saved since may be on disk, and
        # out of memory, by the time the answer is registered. Those keys are not "missing".
        saved: set[str] = set()
        with self._wlock:
            saved.update(self._pending)
            self._save_logs.append(saved)
        try:
            absent = set(keys.values()) - self.stored_keys(keys.values())
        finally:
            with self._wlock:
                self._save_logs.remove(saved)
        with self._wlock:
            absent -= saved
            self._keys.update(keys)
            self._absent |= absent
        try:
            yield
        finally:
            with self._wlock:
                for r in keys:
                    self._keys.pop(r, None)
                self._absent -= absent

    def is_cached(self, request: CompletionRequest) -> bool:
        return self._read(self.key(request)) is not None

    def _warn(self, key: str, reason: str) -> None:
        with self._lock:
            self.stats.unreadable += 1
            first = self.stats.unreadable == 1
            if len(self.warnings) < self.MAX_WARNINGS:
                self.warnings.append(f"cache entry {key[:12]}... in {self.cache_dir} ignored: {reason}")
        if first:
            warnings.warn(
                f"the LLM reply cache {self.cache_dir} holds an entry hdeval cannot use ({reason}); "
                f"it is asked again (`hdeval cache check --cache-dir {self.cache_dir}` lists them)",
                CacheWarning, stacklevel=4)

    def _read(self, key: str) -> Completion | None:
        # no lock: one dict lookup is atomic, and an entry leaves _pending only once it is
        # on disk or in _unsaved
        unsaved = self._pending.get(key) or self._unsaved.get(key)
        if unsaved is not None:
            return unsaved
        if self._store is None or key in self._absent:
            return None
        try:
            text = self._store.get(key)
        except UnreadableEntry as exc:
            self._warn(key, str(exc))
            return None
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise storage_error(self.cache_dir, exc) from None
        if text is None:
            return None
        try:
            return parse_completion(text)
        except UnreadableEntry as exc:
            self._warn(key, str(exc))
            return None

    def _lookup(self, key: str) -> Completion | None:
        c = self._read(key)
        if c is None:
            return None
        with self._lock:
            self.stats.hits += 1
        return Completion(**{**c.__dict__, "cached": True})

    def complete(self, request: CompletionRequest) -> Completion:
        key = self.key(request)
        while True:
            finished = self._finished
            hit = self._lookup(key)
            if hit is not None:
                return hit
            if self._store is None:
                break
            with self._lock:
                pending = self._inflight.get(key)
                if pending is None:
                    if self._finished != finished:
                        # a fetch ended between our lookup and now: it may have been this
                        # very request (paid, and saved since), so look again
                        continue
                    self._inflight[key] = threading.Event()
                    break
            # another thread is fetching this very request: take its cached reply, or
            # (if it failed) try ourselves
            pending.wait()
        try:
            return self._fetch(key, request)
        finally:
            if self._store is not None:
                with self._lock:
                    self._finished += 1
                    self._inflight.pop(key).set()

    def _fetch(self, key: str, request: CompletionRequest) -> Completion:
        last = getattr(self._mine, "last", 0)
        if self._written < last:
            self._await_commit(last)
        with self._lock:
            if self._write_error is not None:
                raise self._write_error
            if self.max_calls is not None and self._reserved >= self.max_calls:
                raise BudgetExceeded(
                    f"stopped at --max-calls {self.max_calls}: every finished call is cached; "
                    "rerun with a higher limit to continue"
                )
            self._reserved += 1
        try:
            result = self.inner.complete(request)
        except BaseException:
            with self._lock:
                self._reserved -= 1
            raise
        if self._store is not None:
            self._save(key, result)
        with self._lock:
            self.stats.calls += 1
            self.stats.prompt_tokens += result.prompt_tokens
            self.stats.completion_tokens += result.completion_tokens
            if result.prompt_tokens_evaluated is not None:
                self.stats.prompt_tokens_evaluated += result.prompt_tokens_evaluated
        return result

    def _await_commit(self, number: int) -> None:
        """Wait until write ``number`` (this thread's previous reply) is on disk, or known
        not to be, before this thread pays for another call."""
        done = getattr(self._mine, "committed", None)
        if done is None:
            done = self._mine.committed = threading.Event()
        while True:
            with self._wlock:
                if self._written >= number or self._writer is None or not self._writer.is_alive():
                    self._commit_waiters.pop(number, None)
                    return
                done.clear()
                self._commit_waiters[number] = done
            done.wait(0.5)  # set by the writer; the timeout re-checks a writer that died

    def _wake_committed(self) -> None:
        """After ``_written`` moved (``_wlock`` held): wake the threads whose write is done."""
        self._wcond.notify_all()
        waiters = self._commit_waiters
        if waiters:
            for n in [n for n in waiters if n <= self._written]:
                waiters.pop(n).set()

    def _save(self, key: str, result: Completion) -> None:
        """Queue ``result`` for the writer; it is served from memory until committed."""
        text = json.dumps(result.to_dict())
        with self._wlock:
            self._absent.discard(key)  # while still in flight: no reader can miss it meanwhile
            for log in self._save_logs:
                log.add(key)
            if not self._closing:
                self._queued += 1
                self._mine.last = self._queued
                self._pending[key] = result
                self._queue.append((self._queued, key, text, result))
                self._work.notify()
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, name="hdeval-cache-writer",
                                                    daemon=True)
                    _OPEN.add(self)
                    self._writer.start()
                return
        self._write_batch([(0, key, text, result)])  # a call finishing after close(): written here

    def _write_loop(self) -> None:
        """The writer thread: commit whatever is queued, one transaction per batch, until
        closed and drained."""
        while True:
            with self._wlock:
                if not self._queue and not self._closing:
                    self._work.wait(self.WRITER_IDLE)
                if not self._queue:  # closed, or idle: end (the next write starts a new writer)
                    self._writer = None
                    _OPEN.discard(self)
                    if self._store is not None:
                        # diskcache keeps a connection per thread: close this one, so the
                        # last close checkpoints the write-ahead log into the database
                        self._store.close()
                    return
                batch = self._queue[: self.WRITE_BATCH]
                del self._queue[: self.WRITE_BATCH]
            try:
                self._write_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - never leave waiters hanging
                with self._wlock, self._lock:
                    for _n, key, _text, result in batch:
                        self._unsaved[key] = result  # before it leaves _pending: never in neither
                        self._pending.pop(key, None)
                    if self._write_error is None:
                        self._write_error = storage_error(self.cache_dir, exc, writing=True)
                    self._written = max(self._written, batch[-1][0])
                    self._wake_committed()

    def _write_batch(self, batch: list[tuple[int, str, str, Completion]]) -> None:
        """Commit ``batch`` in one transaction; if the store fails, each entry on its own, so
        every one that can be written is. Entries that cannot be written stay served from
        memory for this run, and a storage failure stops the next paid call."""
        store = self._store
        assert store is not None
        failed: dict[str, BaseException] = {}
        try:
            with store.transact():
                for _n, key, text, _result in batch:
                    try:
                        store.set(key, text)
                    except EntryTooLarge as exc:  # raised before any SQL: the transaction goes on
                        failed[key] = exc
        except diskcache.Timeout as exc:  # another process held the lock all along: so would it now
            failed = {key: exc for _n, key, _text, _result in batch}
        except (OSError, sqlite3.Error):
            failed = {}
            for _n, key, text, _result in batch:
                try:
                    store.set(key, text)
                except (EntryTooLarge, OSError, sqlite3.Error, diskcache.Timeout) as exc:
                    failed[key] = exc
        with self._wlock, self._lock:
            for _n, key, _text, result in batch:
                exc = failed.get(key)
                if exc is not None:
                    self._unsaved[key] = result  # before it leaves _pending: never in neither
                self._pending.pop(key, None)
                if exc is None:
                    continue
                if isinstance(exc, EntryTooLarge):
                    if len(self.warnings) < self.MAX_WARNINGS:
                        self.warnings.append(f"not cached: {exc}")
                elif self._write_error is None:
                    self._write_error = storage_error(self.cache_dir, exc, writing=True)
            self._written = max(self._written, batch[-1][0])
            self._wake_committed()

    def flush(self) -> None:
        """Wait until every completion finished so far is written (or known unwritable)."""
        with self._wlock:
            target = self._queued
            while self._written < target and self._writer is not None and self._writer.is_alive():
                self._wcond.wait(0.5)
            rest = list(self._queue) if self._writer is None else []
            if rest:
                self._queue.clear()
        if rest:  # no writer to write them (it cannot be, short of a bug): write them here
            self._write_batch(rest)

    def close(self) -> None:
        """Write out everything queued, stop the writer and close the store (idempotent)."""
        with self._wlock:
            self._closing = True
            self._work.notify_all()
            self._wcond.notify_all()
            writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join()
        self.flush()
        _OPEN.discard(self)
        if self._store is not None:
            self._store.close()

    # ---- bulk reads (issue #15.4: a fully cached retrain looked up 57,600 replies one by one)

    def _bulk_skip(self, key: str) -> bool:
        """Keys ``complete`` treats otherwise than as a plain cache hit (see the batch backend)."""
        return False

    def lookup_many(self, requests: Sequence[CompletionRequest]) -> list[Completion | None]:
        """What ``complete`` would answer from the cache for each request (marked ``cached``
        and counted as a hit), read with one query per ``LOOKUP_CHUNK`` keys; None where
        ``complete`` must run: not cached, or an entry it would reject (it reads that one again
        and warns about it once)."""
        keys = [self.key(r) for r in requests]
        found: dict[str, Completion] = {}
        todo = []
        for key in dict.fromkeys(keys):
            if self._bulk_skip(key):
                continue
            mem = self._pending.get(key) or self._unsaved.get(key)
            if mem is not None:
                found[key] = mem
            elif key not in self._absent:  # inside lookahead(): known missing, not asked again
                todo.append(key)
        if self._store is not None and todo:
            now = time.time()
            for i in range(0, len(todo), self.LOOKUP_CHUNK):
                chunk = todo[i : i + self.LOOKUP_CHUNK]
                try:  # the query diskcache's get() runs, for many keys (raw: str keys)
                    rows = self._store._sql(
                        "SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN "
                        f"({','.join('?' * len(chunk))}) AND (expire_time IS NULL OR expire_time > ?)",
                        (*chunk, now)).fetchall()
                except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
                    raise storage_error(self.cache_dir, exc) from None
                for key, mode, filename, value in rows:
                    try:
                        found[key] = parse_completion(read_value(self._store.directory, mode, filename, value))
                    except UnreadableEntry:
                        pass
        out: list[Completion | None] = []
        hits: dict[str, Completion] = {}
        for key in keys:
            c = found.get(key)
            if c is not None and key not in hits:
                hits[key] = Completion(**{**c.__dict__, "cached": True})
            out.append(hits.get(key))
        with self._lock:
            self.stats.hits += sum(c is not None for c in out)
        return out


def cache_stats(cache_dir: str | Path) -> dict[str, int | str]:
    path = Path(cache_dir)
    if not path.exists():
        return {"path": str(path), "entries": 0, "bytes": 0}
    with open_store(path) as c:
        try:
            entries = len(c)
            size = int(c.volume())
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise storage_error(path, exc) from None
    return {"path": str(path), "entries": entries, "bytes": size}


def clear_cache(cache_dir: str | Path) -> int:
    """Delete every cached reply; the number deleted.

    A corrupted database cannot be asked what it holds: then the database file (and its
    write-ahead log) is deleted and ``-1`` returned. Value files are left alone in that case
    (they may belong to a copy kept aside by ``repair``) and nothing else in the directory
    is ever touched.
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
        for suffix in ("", "-wal", "-shm"):
            f = path / (DBNAME + suffix)
            if f.is_file() and not f.is_symlink():
                f.unlink()
        return -1


# --------------------------------------------------------------------------- check / repair
@dataclass
class CheckReport:
    path: str
    readable: int = 0
    unreadable: int = 0  # hdeval-shaped entries whose value cannot be used
    foreign: int = 0  # entries hdeval never writes (pickled, binary, other keys)
    database_error: str | None = None  # the database could not be read (in part or at all)
    examples: list[str] = field(default_factory=list)

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


def _scan(directory: Path, db: Path, on_good: Callable[[str, str], None] | None = None) -> CheckReport:
    """Read every entry of the database ``db`` (value files relative to ``directory``) without
    writing to it; ``on_good(key, json_text)`` for each readable, valid one."""
    report = CheckReport(str(directory))
    if not db.is_file():
        return report
    try:
        con = _ro_connect(db)
    except sqlite3.Error as exc:
        report.database_error = _reason(exc)
        return report
    try:
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            report.database_error = _reason(exc)
            return report
        for _rowid, key, raw, mode, filename, value in _rows(con, report):
            try:
                if raw != 1 or type(key) is not str or not _KEY.match(key):
                    raise UnreadableEntry("a key that is not an hdeval request hash", foreign=True)
                text = read_value(directory, mode, filename, value)
                parse_completion(text)
            except UnreadableEntry as exc:
                if exc.foreign:
                    report.foreign += 1
                else:
                    report.unreadable += 1
                if len(report.examples) < 5:
                    shown = key[:12] + "..." if isinstance(key, str) else f"(a {type(key).__name__} key)"
                    report.examples.append(f"{shown}: {exc}")
                continue
            report.readable += 1
            if on_good is not None:
                on_good(key, text)
        if report.database_error is None:
            try:
                status = con.execute("PRAGMA quick_check").fetchone()[0]
                if status != "ok":
                    report.database_error = f"integrity check: {status}"
            except sqlite3.Error as exc:
                report.database_error = _reason(exc)
    finally:
        con.close()
    return report


def check_cache(cache_dir: str | Path) -> CheckReport:
    """Count readable, unreadable and foreign entries; writes nothing."""
    directory = Path(cache_dir)
    return _scan(directory, directory / DBNAME)


@dataclass
class RepairReport:
    path: str
    copied: int
    unreadable: int
    foreign: int
    kept_as: str
    database_error: str | None


def repair_cache(cache_dir: str | Path) -> RepairReport:
    """Move the database aside as ``cache.db.corrupt-<timestamp>`` (never deleted) and copy
    every readable, valid entry into a fresh one."""
    directory = Path(cache_dir)
    db = directory / DBNAME
    if not db.is_file():
        raise CacheError(f"no cache database at {db}: nothing to repair")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = directory / f"{DBNAME}.corrupt-{stamp}"
    n = 1
    while any((directory / (aside.name + s)).exists() for s in ("", "-wal", "-shm")):
        n += 1
        aside = directory / f"{DBNAME}.corrupt-{stamp}-{n}"
    try:
        for suffix in ("", "-wal", "-shm"):  # the log belongs to the database: keep them paired
            src = directory / (DBNAME + suffix)
            if src.exists():
                os.rename(src, directory / (aside.name + suffix))
    except OSError as exc:
        raise storage_error(directory, exc) from None
    store = open_store(directory)
    batch: list[tuple[str, str]] = []

    def flush() -> None:
        with store.transact():
            for key, text in batch:
                store.set(key, text)
        batch.clear()

    def copy(key: str, text: str) -> None:
        batch.append((key, text))
        if len(batch) >= 500:
            flush()

    try:
        report = _scan(directory, aside, copy)
        flush()
    except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
        raise storage_error(directory, exc, writing=True) from None
    finally:
        store.close()
    return RepairReport(str(directory), report.readable, report.unreadable, report.foreign,
                        str(aside), report.database_error)
