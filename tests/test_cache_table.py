"""The reply table (``replies.db``): what it may hold is checked as diskcache's
file is (anything the cache did not create is refused at open and named by ``cache check``), its
values are read with bounds (a planted one is a miss with a warning), a corrupted table is one
line naming it, and both files' entries are counted by ``cache stats``."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import diskcache
import pytest
from click.testing import CliRunner

from hdeval.cli import cli
from hdeval.core.errors import CacheError
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend, CacheWarning, request_key
from hdeval.llm.cache.codec import MAX_ENTRY_CHARS, encode_completion
from hdeval.llm.cache.store import JSONDisk


def _req(text: str = "q") -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


def _key(text: str = "q") -> str:
    return request_key(FakeBackend().identity, _req(text))


def _filled(tmp_path: Path) -> Path:
    cache = tmp_path / "c"
    cb = CachedBackend(FakeBackend(), cache)
    cb.complete(_req())
    cb.close()
    return cache


def _sql(cache: Path, *statements: str, args: tuple = ()) -> None:
    con = sqlite3.connect(cache / "replies.db")
    for s in statements:
        con.execute(s, args) if args else con.execute(s)
    con.commit()
    con.close()


@pytest.mark.parametrize("planted", [
    "CREATE TRIGGER poison AFTER INSERT ON reply BEGIN DELETE FROM reply; END",
    "CREATE VIEW v AS SELECT * FROM reply",
    "CREATE TABLE extra(x)",
    "CREATE INDEX i ON reply(value)",
])
def test_an_object_the_cache_did_not_create_in_the_table_is_refused_and_named(tmp_path, planted):
    cache = _filled(tmp_path)
    _sql(cache, planted)
    fake = FakeBackend()
    with pytest.raises(CacheError) as exc:
        CachedBackend(fake, cache)
    msg = str(exc.value)
    assert "\n" not in msg and str(cache / "replies.db") in msg and "cache repair" in msg
    assert fake.calls == 0
    res = CliRunner().invoke(cli, ["cache", "check", "--cache-dir", str(cache)])
    assert res.exit_code == 1 and "replies.db: " in res.stdout and "not created by the cache" in res.stdout
    assert str(cache / "replies.db") in res.stderr
    # repair keeps the reply and drops the planted object
    assert CliRunner().invoke(cli, ["cache", "repair", "--cache-dir", str(cache)]).exit_code == 0
    again = CachedBackend(fake, cache)
    assert again.complete(_req()).cached and fake.calls == 0
    again.close()


@pytest.mark.parametrize("value", [b"not ours", "text", 5, b"Z2\x09garbage", b"Z1\xff\xfe"])
def test_a_planted_value_in_the_table_is_a_miss_with_a_warning_then_replaced(tmp_path, value):
    cache = _filled(tmp_path)
    _sql(cache, "UPDATE reply SET value = ?", args=(value,))
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    with pytest.warns(CacheWarning):
        got = cb.complete(_req())
    assert fake.calls == 1 and not got.cached and cb.stats.unreadable == 1
    assert cb.complete(_req()).cached and fake.calls == 1
    cb.close()
    res = CliRunner().invoke(cli, ["cache", "check", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and "1 readable, 0 unreadable, 0 foreign" in res.stdout


def test_a_huge_planted_value_is_never_read_into_memory(tmp_path):
    cache = _filled(tmp_path)
    _sql(cache, "UPDATE reply SET value = zeroblob(?)", args=(MAX_ENTRY_CHARS + 1,))
    cb = CachedBackend(FakeBackend(), cache)
    with pytest.warns(CacheWarning, match="more than hdeval writes"):
        assert not cb.complete(_req()).cached
    cb.close()


def test_a_corrupted_table_is_one_line_naming_it_and_repair_keeps_the_old_rows(tmp_path):
    cache = tmp_path / "c"
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:  # a reply stored before the table
        c.set(_key("old"), encode_completion(FakeBackend().complete(_req("old"))))
    (cache / "replies.db").write_bytes(b"\x00garbage" * 4096)
    fake = FakeBackend()
    with pytest.raises(CacheError) as exc:
        CachedBackend(fake, cache)
    assert str(cache / "replies.db") in str(exc.value) and "cache repair" in str(exc.value)
    res = CliRunner().invoke(cli, ["cache", "repair", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and "copied 1 readable" in res.stdout, res.output
    assert list(cache.glob("replies.db.corrupt-*"))
    cb = CachedBackend(fake, cache)
    assert cb.complete(_req("old")).cached and fake.calls == 0
    cb.close()


def test_stats_and_clear_count_both_databases(tmp_path):
    cache = _filled(tmp_path)
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:  # and one reply an older hdeval stored
        c.set(_key("old"), encode_completion(FakeBackend().complete(_req("old"))))
    res = CliRunner().invoke(cli, ["cache", "stats", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and ": 2 entries," in res.stdout
    res = CliRunner().invoke(cli, ["cache", "clear", "--cache-dir", str(cache), "--yes"])
    assert res.exit_code == 0 and "deleted 2 cached replies" in res.stdout
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    cb.complete_many([_req(), _req("old")])
    assert fake.calls == 2
    cb.close()


def test_a_rolled_back_transaction_leaves_no_reply_and_deletes_no_old_row(tmp_path):
    """The old row of a key rewritten in a transaction is dropped only once the table commits."""
    cache = tmp_path / "c"
    reply = FakeBackend().complete(_req("old"))
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:
        c.set(_key("old"), encode_completion(reply))
    cb = CachedBackend(FakeBackend(), cache)
    store = cb.store
    with pytest.raises(RuntimeError):
        with store.transact():
            store.set(_key("old"), encode_completion(reply))
            raise RuntimeError("stop")
    cb.close()
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:
        assert len(c) == 1
    con = sqlite3.connect(cache / "replies.db")
    assert con.execute("SELECT count(*) FROM reply").fetchone()[0] == 0
    con.close()


def test_the_report_reads_raw_replies_from_the_table_without_writing_and_skips_planted_ones(tmp_path):
    from hdeval.report.samples import read_only_lookup

    cache = tmp_path / "c"
    cb = CachedBackend(FakeBackend(), cache)
    texts = [c.text for c in cb.complete_many([_req("a"), _req("b")])]
    cb.close()
    _sql(cache, "UPDATE reply SET value = ? WHERE key = ?", args=(b"Z2\xff", bytes.fromhex(_key("b"))))
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")}
    found, note = read_only_lookup(cache, [_key("a"), _key("b")])
    assert note is None and found == {_key("a"): texts[0]}
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")} == before


def test_a_failed_commit_ends_the_transaction_and_the_next_one_writes(tmp_path, monkeypatch):
    """A COMMIT refused (a full disk) must not leave the table's transaction open, or every
    later write of the run would fail on 'cannot start a transaction within a transaction'."""
    from hdeval.llm.cache.store import ReplyStore, open_store

    real = ReplyStore._run
    failures = [1]

    def run(self, sql, args=(), writing=False):
        if sql == "COMMIT" and failures:
            failures.pop()
            raise self._error(sqlite3.OperationalError("database or disk is full"), writing)
        return real(self, sql, args, writing)

    monkeypatch.setattr(ReplyStore, "_run", run)
    reply = encode_completion(FakeBackend().complete(_req()))
    with open_store(tmp_path / "c") as store:
        with pytest.raises(CacheError, match="full"):
            with store.transact():
                store.set(_key("a"), reply)
        assert not store.in_transaction() and _key("a") not in store
        with store.transact():
            store.set(_key("b"), reply)
        assert _key("b") in store and len(store) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_uses_its_own_connection_and_is_not_stuck_on_the_parents_lock(tmp_path):
    """A process forked while the store's thread is inside a transaction (a multiprocessing
    pool started mid-run) reads the cache as it did when diskcache held every reply: neither
    through the parent's SQLite connection (SQLite forbids it) nor waiting forever for the
    table's lock, which only the parent's thread could release."""
    from hdeval.llm.cache.store import open_store

    store = open_store(tmp_path / "c")
    store.set(_key("a"), encode_completion(FakeBackend().complete(_req("a"))))
    inherited = store._table
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transact():
            inside.set()
            release.wait(10)

    writer = threading.Thread(target=hold)
    writer.start()
    inside.wait(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's teardown
        code = 1
        try:
            signal.alarm(10)
            got = store.get(_key("a"))
            code = 0 if got and store._table is not inherited else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    time.sleep(0.5)  # the child starts while the parent's transaction is open
    release.set()
    writer.join()
    with os.fdopen(read, "rb") as r:
        got = r.read(1)
    os.waitpid(pid, 0)
    assert got == b"\x00", "the forked child reused the parent's connection or hung on its lock"
    assert _key("a") in store
    store.close()


@pytest.mark.parametrize("table_file", ["empty", "no table yet"])
def test_stats_of_a_reply_table_file_without_its_table_count_its_zero_entries(tmp_path, table_file):
    """A replies.db that holds no reply table yet (a run killed between creating the file and
    its table) is an empty table to `cache stats`, as it is to `cache check` and to a run."""
    cache = tmp_path / "c"
    cache.mkdir()
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:  # one reply an older hdeval stored
        c.set(_key("old"), encode_completion(FakeBackend().complete(_req("old"))))
    if table_file == "empty":
        (cache / "replies.db").write_bytes(b"")
    else:
        con = sqlite3.connect(cache / "replies.db")
        con.execute("PRAGMA journal_mode=WAL")
        con.close()
    res = CliRunner().invoke(cli, ["cache", "stats", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and ": 1 entries," in res.stdout, res.output
    res = CliRunner().invoke(cli, ["cache", "check", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and "1 readable" in res.stdout, res.output


# objects a reply table never holds: a recursive view in the table's place (reading it never
# ends) and a trigger that would drop what is written
PLANTED = [
    "DROP TABLE reply; CREATE VIEW reply AS WITH RECURSIVE n(key, value) AS "
    "(SELECT x'00', x'00' UNION ALL SELECT key, value FROM n) SELECT key, value FROM n",
    "CREATE TRIGGER t AFTER INSERT ON reply BEGIN DELETE FROM reply; END",
]


@pytest.fixture(params=PLANTED, ids=["recursive view", "trigger"])
def planted_cache(request, tmp_path):
    """A cache of one reply whose replies.db then had ``PLANTED`` objects written into it."""
    cache = tmp_path / "c"
    cb = CachedBackend(FakeBackend(), cache)
    cb.complete_many([_req("a")])
    cb.close()
    con = sqlite3.connect(cache / "replies.db")
    con.executescript(request.param)
    con.close()
    return cache


def test_the_report_does_not_read_a_reply_table_with_planted_objects(planted_cache):
    """The report reads raw replies on its own connection, so it checks the file first."""
    import subprocess
    import sys

    code = ("import sys; from hdeval.report.samples import read_only_lookup; "
            f"found, note = read_only_lookup(sys.argv[1], [{_key('a')!r}]); print(len(found)); print(note)")
    done = subprocess.run([sys.executable, "-c", code, str(planted_cache)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    count, note = done.stdout.splitlines()
    assert count == "0" and "never creates" in note and "raw replies are not shown" in note


def test_cache_stats_refuses_a_reply_table_with_planted_objects_in_one_line(planted_cache):
    """`cache stats` reads without opening the cache, so it makes the cache's schema check
    itself: a recursive view in the table's place made it count forever."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hdeval.cli", "cache", "stats", "--cache-dir", str(planted_cache)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert "replies.db holds SQLite objects the cache never creates" in line and "not counting them" in line


def test_cache_check_lists_a_planted_view_in_place_of_diskcaches_table_without_reading_it(tmp_path):
    """`cache check` and `repair` read a cache without opening it: a recursive view named Cache
    (diskcache's table dropped) made them read forever. The view is listed as planted."""
    import subprocess
    import sys

    cache = tmp_path / "c"
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:
        c.set(_key("old"), encode_completion(FakeBackend().complete(_req("old"))))
    con = sqlite3.connect(cache / "cache.db")
    cols = [r[1] for r in con.execute("PRAGMA table_info(Cache)")]
    row = ", ".join(f"x'00' AS {c}" if c == "key" else f"0 AS {c}" for c in cols)
    con.executescript("DROP TABLE Cache; CREATE VIEW Cache AS WITH RECURSIVE n(i) AS "
                      f"(SELECT 1 UNION ALL SELECT i FROM n) SELECT {row} FROM n")
    con.close()
    done = subprocess.run([sys.executable, "-m", "hdeval.cli", "cache", "check", "--cache-dir", str(cache)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "0 readable" in done.stdout and "view 'Cache': not created by the cache" in done.stdout


def test_the_report_reads_a_cache_nobody_has_open_without_leaving_files(tmp_path):
    """The report's raw replies read a closed cache (no write-ahead log) immutable: no -wal/-shm
    file appears and nothing is touched. `cache check` and `cache stats` read with SQLite's locks
    instead, so a run that starts writing meanwhile cannot tear a long scan into false damage."""
    from hdeval.report.samples import read_only_lookup

    cache = tmp_path / "c"
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:  # one reply an older hdeval stored
        c.set(_key("old"), encode_completion(FakeBackend().complete(_req("old"))))
    cb = CachedBackend(FakeBackend(), cache)
    cb.complete(_req("new"))
    cb.close()
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")}
    found, note = read_only_lookup(cache, [_key("old"), _key("new")])
    assert len(found) == 2 and note is None, note
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")} == before
    res = CliRunner().invoke(cli, ["cache", "check", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and "2 readable" in res.stdout, res.output
    res = CliRunner().invoke(cli, ["cache", "stats", "--cache-dir", str(cache)])
    assert res.exit_code == 0 and ": 2 entries," in res.stdout, res.output
