"""The cache directory is untrusted and can break: planted pickles, corrupted databases,
read-only locations and full disks give a miss or one clear line, never code or a traceback,
and never lose a reply that was paid for."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import warnings
from pathlib import Path

import diskcache
import pytest
from click.testing import CliRunner
from conftest import cache_entries

from hdeval.cli import cli
from hdeval.core.errors import CacheError
from hdeval.llm.backends.base import Completion, CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.check import check_cache
from hdeval.llm.cache.client import CachedBackend, CacheWarning, request_key
from hdeval.llm.cache.codec import MAX_ENTRY_CHARS, encode_completion
from hdeval.llm.cache.store import ReplyStore, open_store


def _req(text: str = "hello") -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


def _key(text: str = "hello") -> str:
    return request_key(FakeBackend().identity, _req(text))


class Payload:
    """What an attacker plants: unpickling it creates ``marker``."""

    def __init__(self, marker: Path, pad: int = 0):
        self.marker = str(marker)
        self.pad = "x" * pad  # a large payload is stored in a .val file instead of inline

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args))


def _error_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def _train_args(toy, cache: Path, out: Path) -> list[str]:
    task, data = toy
    return ["train", "--task", str(task), "--data", str(data), "--layers", "1", "--aggregator", "lr",
            "--llm", "fake", "--cache-dir", str(cache), "-o", str(out), "-q"]


# --------------------------------------------------------------------------- planted entries
@pytest.mark.parametrize("pad", [0, 40_000], ids=["inline", "value-file"])
def test_planted_pickle_never_runs_and_the_llm_is_asked_again(tmp_path, pad):
    cache, marker = tmp_path / "cache", tmp_path / "pwned"
    # planted exactly as an attacker with write access to a shared cache dir would
    with diskcache.Cache(str(cache)) as c:
        c.set(_key(), Payload(marker, pad))
    # the payload is live: diskcache's default reader runs it
    with diskcache.Cache(str(cache)) as c:
        c.get(_key()).close()  # what it made: the file the payload opened
    assert marker.exists()
    marker.unlink()

    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    with pytest.warns(CacheWarning, match="asked again"):
        got = cb.complete(_req())
    assert not marker.exists()
    assert fake.calls == 1 and not got.cached and got.text
    assert cb.stats.unreadable == 1 and "pickled" in cb.warnings[0]
    # the fresh reply replaced the planted one
    again = cb.complete(_req())
    assert again.cached and again.text == got.text and fake.calls == 1
    cb.close()
    assert not marker.exists()


def _plant_raw(cache: Path, key: str, mode: int, filename, value) -> None:
    """Write a Cache row directly, as a hostile or broken writer could."""
    with diskcache.Cache(str(cache)):
        pass
    con = sqlite3.connect(cache / "cache.db")
    con.execute("INSERT INTO Cache(key, raw, store_time, access_time, mode, filename, value) "
                "VALUES (?, 1, 0, 0, ?, ?, ?)", (key, mode, filename, value))
    con.commit()
    con.close()


NOT_COMPLETIONS = {
    "not-json": (1, None, "{not json"),
    "json-list": (1, None, json.dumps(["text"])),
    "text-not-str": (1, None, json.dumps({"text": 5})),
    "bad-logprob": (1, None, json.dumps({"text": "4", "top_logprobs": [[{"token": "4", "logprob": "x"}]]})),
    "huge-tokens": (1, None, '{"text": "4", "prompt_tokens": 1e999}'),
    "deep-nesting": (1, None, "[" * 100_000),
    "too-large": (1, None, json.dumps({"text": "x" * (MAX_ENTRY_CHARS + 1)})),
    "binary": (1, None, b"\x80\x04 not text"),
    "path-escape": (3, "../../../../etc/passwd", None),
    "absolute-path": (3, "/etc/passwd", None),
    "missing-file": (3, "ab/cd/0123456789abcdef0123456789ab.val", None),
}


@pytest.mark.parametrize("case", sorted(NOT_COMPLETIONS))
def test_a_value_that_is_not_a_completion_is_a_miss_with_a_warning(tmp_path, case):
    cache = tmp_path / "cache"
    _plant_raw(cache, _key(), *NOT_COMPLETIONS[case])
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    with pytest.warns(CacheWarning):
        got = cb.complete(_req())
    assert fake.calls == 1 and not got.cached
    assert cb.stats.unreadable == 1
    assert cb.complete(_req()).cached  # replaced by the fresh reply
    cb.close()


@pytest.mark.parametrize("relative", [True, False], ids=["dotdot", "absolute"])
def test_a_planted_file_name_never_makes_hdeval_delete_outside_the_cache(tmp_path, relative):
    """diskcache deletes the file a row names when the row is replaced or cleared."""
    cache, victim = tmp_path / "cache", tmp_path / "victim.txt"
    victim.write_text("precious")
    name = "../victim.txt" if relative else str(victim)
    _plant_raw(cache, _key(), 3, name, None)
    cb = CachedBackend(FakeBackend(), cache)
    with pytest.warns(CacheWarning):
        cb.complete(_req())  # the fresh reply replaces the planted row
    cb.close()
    _plant_raw(cache, "d" * 64, 3, name, None)
    assert _cli("cache", "clear", "--cache-dir", str(cache), "--yes").exit_code == 0
    assert victim.read_text() == "precious"


def test_clear_changes_nothing_in_a_folder_that_is_not_a_cache(tmp_path):
    # `cache clear --cache-dir DIR --yes` used to open (so create) a cache in any folder given
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("precious")
    res = _cli("cache", "clear", "--cache-dir", str(mine), "--yes")
    assert res.exit_code == 2 and "is not an LLM reply cache" in _error_line(res)
    assert "chapter1.tex" in _error_line(res) and sorted(os.listdir(mine)) == ["chapter1.tex"]
    for where in (tmp_path / "empty", tmp_path / "missing"):  # nothing cached yet: nothing to do
        if where.name == "empty":
            where.mkdir()
        res = _cli("cache", "clear", "--cache-dir", str(where), "--yes")
        assert res.exit_code == 0 and "nothing to delete" in res.stdout, res.output
        assert (os.listdir(where) == []) if where.name == "empty" else not where.exists()


def test_clear_without_a_terminal_says_to_pass_yes(tmp_path):
    # with no terminal to ask, the question ended in a bare "Aborted!"
    cache = tmp_path / "cache"
    cb = CachedBackend(FakeBackend(), cache)
    cb.complete(_req())
    cb.close()
    res = _cli("cache", "clear", "--cache-dir", str(cache))  # CliRunner's stdin is no terminal
    assert res.exit_code == 2 and "Aborted" not in res.output
    assert _error_line(res) == f"error: delete 1 cached LLM replies in {cache}: there is no terminal to ask; pass --yes to delete"
    assert len(cache_entries(cache)) == 1
    res = _cli("cache", "clear", "--cache-dir", str(cache), "--yes")
    assert res.exit_code == 0 and "deleted 1 cached replies" in res.stdout and cache_entries(cache) == {}


def test_a_cache_written_by_an_older_hdeval_still_hits(tmp_path):
    """Old hdeval stored json.dumps strings with diskcache's default Disk: inline below 32 KB,
    in a .val file above. Both read unchanged, with no call made."""
    cache = tmp_path / "cache"
    short = Completion("4", prompt_tokens=3, completion_tokens=1)
    long = Completion("x" * 40_000, prompt_tokens=5, completion_tokens=9)
    with diskcache.Cache(str(cache)) as c:
        c.set(_key("a"), json.dumps(short.to_dict()))
        c.set(_key("b"), json.dumps(long.to_dict()))
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert cb.complete(_req("a")) == short
        assert cb.complete(_req("b")) == long
    assert fake.calls == 0 and cb.stats.hits == 2
    cb.close()
    report = check_cache(cache)
    assert (report.readable, report.unreadable, report.foreign, report.ok) == (2, 0, 0, True)


def test_check_and_repair_keep_every_readable_entry_and_drop_planted_ones(toy, tmp_path, fake_calls):
    cache, marker = tmp_path / "cache", tmp_path / "pwned"
    assert _cli(*_train_args(toy, cache, tmp_path / "a1")).exit_code == 0
    paid = len(fake_calls)
    good = cache_entries(cache)
    with diskcache.Cache(str(cache)) as c:
        c.set("f" * 64, Payload(marker))  # foreign: a pickle
        c.set(("not", "ours"), "x")  # foreign: a pickled key
    _plant_raw(cache, "e" * 64, 1, None, "{broken")  # unreadable

    res = _cli("cache", "check", "--cache-dir", str(cache))
    assert res.exit_code == 1
    assert f"{len(good)} readable, 1 unreadable, 2 foreign" in res.stdout
    assert "cache repair" in _error_line(res)

    res = _cli("cache", "repair", "--cache-dir", str(cache))
    assert res.exit_code == 0, res.output
    assert f"copied {len(good)} readable entries" in res.stdout
    assert "1 unreadable and 2 foreign" in res.stdout
    aside = [p for p in cache.glob("cache.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and f"kept as {aside[0]}" in res.stdout
    assert cache_entries(cache) == good
    assert not marker.exists()
    assert _cli("cache", "check", "--cache-dir", str(cache)).exit_code == 0
    # nothing paid for was lost: the same run makes no call
    assert _cli(*_train_args(toy, cache, tmp_path / "a2")).exit_code == 0
    assert len(fake_calls) == paid


# --------------------------------------------------------------------------- corrupted database
def test_corrupted_database_is_one_line_naming_it_and_clear_still_works(toy, tmp_path, fake_calls):
    cache = tmp_path / "cache"
    assert _cli(*_train_args(toy, cache, tmp_path / "a1")).exit_code == 0
    paid = len(fake_calls)
    db = cache / "cache.db"
    garbage = os.urandom(64 * 1024)
    db.write_bytes(garbage)

    res = _cli(*_train_args(toy, cache, tmp_path / "a2"))
    assert res.exit_code != 0
    line = _error_line(res)
    assert str(db) in line and f"mv {db} {db}.bad" in line and "hdeval cache repair" in line
    assert len(fake_calls) == paid  # stopped before any LLM call
    assert not (tmp_path / "a2").exists()

    for cmd in ("stats", "check"):
        res = _cli("cache", cmd, "--cache-dir", str(cache))
        assert res.exit_code != 0 and str(db) in _error_line(res)

    res = _cli("cache", "clear", "--cache-dir", str(cache), "--yes")
    assert res.exit_code == 0, res.output
    assert "corrupted" in res.stdout and not db.exists()
    assert _cli(*_train_args(toy, cache, tmp_path / "a3")).exit_code == 0
    assert _cli("cache", "check", "--cache-dir", str(cache)).exit_code == 0


def test_planted_settings_are_refused_and_repair_keeps_the_entries(tmp_path):
    """diskcache turns every stored ``sqlite_*`` setting into a PRAGMA when it opens a cache."""
    cache = tmp_path / "cache"
    cb = CachedBackend(FakeBackend(), cache)
    reply = cb.complete(_req())
    cb.close()
    con = sqlite3.connect(cache / "cache.db")
    con.execute("INSERT INTO Settings VALUES ('sqlite_writable_schema', 1)")
    con.commit()
    con.close()
    with pytest.raises(CacheError, match="sqlite_writable_schema") as exc:
        CachedBackend(FakeBackend(), cache)
    assert str(cache / "cache.db") in str(exc.value) and "cache repair" in str(exc.value)
    res = _cli("cache", "check", "--cache-dir", str(cache))  # something to repair: check says so
    assert res.exit_code == 1 and "setting 'sqlite_writable_schema': not created" in res.stdout, res.output
    res = _cli("cache", "repair", "--cache-dir", str(cache))
    assert res.exit_code == 0 and "copied 1 readable" in res.stdout, res.output
    fake = FakeBackend()
    assert CachedBackend(fake, cache).complete(_req()) == reply and fake.calls == 0


@pytest.mark.parametrize("name, survivors", [("cache.db", 1), ("replies.db", 0)])
def test_repair_of_a_garbage_database_keeps_it_aside(tmp_path, name, survivors):
    """Either database garbage: it is kept aside, and the reply in the other one (the reply
    table holds every reply a current hdeval writes) is copied."""
    cache = tmp_path / "cache"
    cb = CachedBackend(FakeBackend(), cache)
    cb.complete(_req())
    cb.close()
    garbage = os.urandom(64 * 1024)
    (cache / name).write_bytes(garbage)
    res = _cli("cache", "repair", "--cache-dir", str(cache))
    assert res.exit_code == 0, res.output
    assert f"copied {survivors} readable entries" in res.stdout and "damaged" in res.stdout
    kept = [p for p in cache.glob(f"{name}.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(kept) == 1 and kept[0].read_bytes() == garbage and str(kept[0]) in res.stdout
    assert check_cache(cache).ok  # a fresh, working cache
    assert CachedBackend(FakeBackend(), cache).complete(_req()).text


def test_repair_recovers_what_a_partly_overwritten_database_still_holds(tmp_path):
    cache = tmp_path / "cache"
    cb = CachedBackend(FakeBackend(), cache)
    replies = {_key(f"q{i} " + "x" * 500): cb.complete(_req(f"q{i} " + "x" * 500)) for i in range(400)}
    cb.close()
    db = cache / "replies.db"  # where the replies are
    assert not (cache / "replies.db-wal").exists() or (cache / "replies.db-wal").stat().st_size == 0
    size = db.stat().st_size
    with db.open("r+b") as fh:  # a few pages in the middle overwritten
        fh.seek(size // 2)
        fh.write(os.urandom(3 * 4096))
    report = check_cache(cache)
    assert report.database_error and not report.ok
    res = _cli("cache", "repair", "--cache-dir", str(cache))
    assert res.exit_code == 0, res.output
    recovered = cache_entries(cache)
    assert 0 < len(recovered) < len(replies)
    assert all(recovered[k] == replies[k] for k in recovered)


# A run that stores replies and is then killed with SIGKILL: its write-ahead log stays behind.
_KILLED_RUN = """
import json, os, signal, sys
from hdeval.llm.cache.store import open_store
store = open_store(sys.argv[1])
for key, value in json.load(sys.stdin).items():
    store.set(key, bytes.fromhex(value))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _files(cache: Path) -> dict[str, object]:
    """Every file of the cache directory and its bytes; a -shm file by its size only: SQLite's
    index of the write-ahead log, whose read marks every reader (`cache check` too) updates."""
    return {p.name: p.stat().st_size if p.name.endswith("-shm") else p.read_bytes() for p in cache.iterdir()}


@pytest.mark.parametrize("logs", ["closed", "open", "killed"])
def test_repair_leaves_a_healthy_cache_as_it_is(tmp_path, logs):
    """`cache repair` moved a cache `cache check` found nothing wrong with aside all the same
    (both databases renamed *.corrupt-<timestamp>, with -wal/-shm files): a healthy cache, closed,
    open in another run or left by a killed one (its write-ahead log unmerged), keeps every file
    and every entry as it was."""
    import subprocess
    import sys

    import hdeval

    cache = tmp_path / "cache"
    cb = CachedBackend(FakeBackend(), cache)
    replies = {_key(f"q{i}"): cb.complete(_req(f"q{i}")) for i in range(20)}
    cb.close()
    more = {_key(f"more {i}"): FakeBackend().complete(_req(f"more {i}")) for i in range(20)}
    store = None
    if logs == "open":
        store = open_store(cache)
        for key, reply in more.items():
            store.set(key, encode_completion(reply))
    elif logs == "killed":
        values = json.dumps({key: encode_completion(reply).hex() for key, reply in more.items()})
        env = {**os.environ, "PYTHONPATH": str(Path(hdeval.__file__).parents[1])}
        done = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(cache)], input=values, text=True,
                              capture_output=True, env=env, timeout=60)
        assert done.returncode == -9, done.stderr
    if logs != "closed":
        assert (cache / "replies.db-wal").stat().st_size > 0 and (cache / "replies.db-shm").is_file()
        replies.update(more)
    else:
        assert sorted(p.name for p in cache.iterdir()) == ["cache.db", "replies.db"]
    before = _files(cache)
    try:
        res = _cli("cache", "repair", "--cache-dir", str(cache))
        assert res.exit_code == 0, res.output
        assert res.stdout.splitlines() == [
            f"nothing to repair in {cache}: {len(replies)} readable entries, none unreadable or "
            "foreign; the cache is left as it is"]
        assert _files(cache) == before  # nothing moved aside, made or rewritten
    finally:
        if store is not None:
            store.close()
    assert cache_entries(cache) == replies


# --------------------------------------------------------------------------- read-only, full disk
def test_read_only_cache_dir_fails_before_any_call(toy, tmp_path, fake_calls, monkeypatch):
    """A directory that cannot be created (read-only file system), simulated because the
    tests may run as root (who can write anywhere)."""
    cache = tmp_path / "ro" / "cache"
    real = os.mkdir

    def mkdir(path, *a, **kw):
        if str(path).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    res = _cli(*_train_args(toy, cache, tmp_path / "a1"))
    assert res.exit_code != 0
    line = _error_line(res)
    assert str(cache) in line and "--cache-dir" in line and "Read-only" in line
    assert fake_calls == []


def test_existing_cache_on_read_only_storage_fails_before_any_call(toy, tmp_path, fake_calls, monkeypatch):
    cache = tmp_path / "cache"
    assert _cli(*_train_args(toy, cache, tmp_path / "a1")).exit_code == 0
    paid = len(fake_calls)
    real = sqlite3.connect

    def read_only(database, *a, **kw):  # what SQLite sees on a read-only mount
        if str(database).startswith(str(cache)):
            kw.pop("uri", None)
            return real(f"{Path(database).as_uri()}?mode=ro", *a, uri=True, **kw)
        return real(database, *a, **kw)

    monkeypatch.setattr(diskcache.core.sqlite3, "connect", read_only)
    res = _cli(*_train_args(toy, cache, tmp_path / "a2"))
    assert res.exit_code != 0
    line = _error_line(res)
    assert str(cache) in line and "--cache-dir" in line and "writable" in line
    assert len(fake_calls) == paid


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_directory_for_a_normal_user(toy, tmp_path, fake_calls):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = _cli(*_train_args(toy, ro / "cache", tmp_path / "a1"))
    finally:
        ro.chmod(0o755)
    assert res.exit_code != 0 and str(ro / "cache") in _error_line(res)
    assert fake_calls == []


FULL = {
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "SQLITE_FULL": lambda: sqlite3.OperationalError("database or disk is full"),
}


def _fill_disk_after(monkeypatch, n: int, kind: str) -> list[int]:
    """From the ``n+1``-th write on, the reply table's set fails as on a full disk."""
    real = ReplyStore.set
    writes: list[int] = []

    def set_(self, key, value, *a, **kw):
        if len(writes) >= n:
            raise FULL[kind]()
        writes.append(1)
        return real(self, key, value, *a, **kw)

    monkeypatch.setattr(ReplyStore, "set", set_)
    return writes


@pytest.mark.parametrize("kind", sorted(FULL))
def test_full_disk_returns_the_paid_reply_then_stops_before_paying_again(tmp_path, kind):
    fake = FakeBackend()
    with pytest.MonkeyPatch.context() as mp:
        _fill_disk_after(mp, 1, kind)
        cb = CachedBackend(fake, tmp_path / "cache")
        saved = cb.complete(_req("a"))
        unsaved = cb.complete(_req("b"))  # paid for, could not be written: still returned
        assert unsaved.text and fake.calls == 2
        assert cb.complete(_req("b")).text == unsaved.text and fake.calls == 2  # served from memory
        with pytest.raises(CacheError) as exc:
            cb.complete(_req("c"))
        assert fake.calls == 2  # no money spent on a reply that could not be saved
        msg = str(exc.value)
        assert "\n" not in msg and "full" in msg and str(tmp_path / "cache") in msg
        assert "cached" in msg and "free at least" in msg and "rerun" in msg
        cb.close()
    assert [c.text for c in cache_entries(tmp_path / "cache").values()] == [saved.text]


def test_full_disk_during_train_stops_with_one_line_and_the_rerun_resumes(toy, tmp_path, fake_calls):
    cache = tmp_path / "cache"
    args = _train_args(toy, cache, tmp_path / "a1") + ["--concurrency", "1"]
    assert _cli(*_train_args(toy, tmp_path / "ref", tmp_path / "ref-art"), "--concurrency", "1").exit_code == 0
    total = len(fake_calls)
    fake_calls.clear()
    with pytest.MonkeyPatch.context() as mp:
        _fill_disk_after(mp, 30, "SQLITE_FULL")
        res = _cli(*args)
    assert res.exit_code != 0
    line = _error_line(res)
    assert str(cache) in line and "full" in line and "cached" in line and "rerun" in line
    assert len(fake_calls) == 31 and not (tmp_path / "a1").exists()
    assert len(cache_entries(cache)) == 30
    fake_calls.clear()
    res = _cli(*args)
    assert res.exit_code == 0, res.output
    assert len(fake_calls) == total - 30


def test_a_planted_trigger_is_not_let_through_while_the_database_is_locked(tmp_path, monkeypatch) -> None:
    """The foreign-schema check cannot read a database another connection holds locked; it used to
    skip the check, and once the lock went, the cache opened and wrote under the planted trigger."""
    import sqlite3
    import threading

    import diskcache

    from hdeval.core.errors import CacheError
    from hdeval.llm.cache import guard as cache_guard
    from hdeval.llm.cache.store import open_store

    directory = tmp_path / "c"
    diskcache.Cache(str(directory)).close()
    holder = sqlite3.connect(directory / "cache.db", isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TRIGGER poison AFTER INSERT ON Cache BEGIN DELETE FROM Cache; END")
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("COMMIT")  # the lock is kept until the connection closes
    monkeypatch.setattr(cache_guard, "BUSY_SECONDS", 0.2, raising=False)
    release = threading.Timer(1.0, holder.close)
    release.start()
    try:
        with pytest.raises(CacheError) as err:
            open_store(directory).close()
    finally:
        release.join()
    assert "locked" in str(err.value) and "\n" not in str(err.value)
    assert check_cache(directory).planted == {"cache.db": ["trigger 'poison' on 'Cache'"]}


@pytest.mark.parametrize("where", ["the directory", "a parent"])
def test_a_file_where_the_cache_directory_should_be_is_one_line_before_any_call(tmp_path, where):
    blocker = tmp_path / "taken"
    blocker.write_text("a user's file\n")
    cache = blocker if where == "the directory" else blocker / "cache"
    fake = FakeBackend()
    with pytest.raises(CacheError) as err:
        CachedBackend(fake, cache)
    msg = str(err.value)
    assert "\n" not in msg and str(cache) in msg and "--cache-dir" in msg and fake.calls == 0
    assert blocker.read_text() == "a user's file\n"
