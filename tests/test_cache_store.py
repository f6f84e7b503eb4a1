"""How the cache stores its keys and which SQLite settings it runs with: a
request hash is stored as its 32 raw bytes, a cache written with hex text keys keeps serving
(its entries are never rewritten), and the store's memory does not grow with the cache file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import diskcache
import pytest

from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.check import check_cache, repair_cache
from hdeval.llm.cache.client import CachedBackend, request_key
from hdeval.llm.cache.codec import _deflate as _deflated
from hdeval.llm.cache.codec import encode_completion
from hdeval.llm.cache.store import JSONDisk, open_store


def _req(text: str) -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


def _key(text: str) -> str:
    return request_key(FakeBackend().identity, _req(text))


def _keys(cache: Path) -> list[tuple[str, object]]:
    con = sqlite3.connect(cache / "cache.db")
    try:
        return con.execute("SELECT typeof(key), key FROM Cache ORDER BY rowid").fetchall()
    finally:
        con.close()


def _table(cache: Path) -> list[tuple[str, object]]:
    """The reply table's keys (where replies are written)."""
    con = sqlite3.connect(cache / "replies.db")
    try:
        return con.execute("SELECT typeof(key), key FROM reply ORDER BY key").fetchall()
    finally:
        con.close()


def _fill_old_way(cache: Path, texts: list[str]) -> None:
    """Entries as hdeval stored them before the compact key: the default Disk, the hex key as
    text, the deflated compact value."""
    fake = FakeBackend()
    with diskcache.Cache(str(cache)) as c:
        for t in texts:
            c.set(_key(t), _deflated(fake.complete(_req(t)).to_dict()))


def test_a_reply_is_stored_under_the_32_bytes_of_its_hash(tmp_path: Path) -> None:
    cb = CachedBackend(FakeBackend(), tmp_path / "c")
    cb.complete(_req("q"))
    cb.close()
    assert _table(tmp_path / "c") == [("blob", bytes.fromhex(_key("q")))] and _keys(tmp_path / "c") == []
    with open_store(tmp_path / "c") as store:
        assert _key("q") in store and len(store) == 1
    assert check_cache(tmp_path / "c").readable == 1


def test_the_compact_key_and_the_reply_table_make_the_cache_smaller(tmp_path: Path) -> None:
    fake = FakeBackend()
    texts = [f"sample {i}" for i in range(5000)]
    values = {_key(t): encode_completion(fake.complete(_req(t))) for t in texts}
    _fill_old_way(tmp_path / "old", texts)
    with diskcache.Cache(str(tmp_path / "rows"), disk=JSONDisk) as c:  # 32-byte keys in diskcache's rows
        for k, v in values.items():
            c.set(k, v)
    with open_store(tmp_path / "new") as store:
        with store.transact():
            for k, v in values.items():
                store.set(k, v)

    def size(d: Path) -> int:
        pages = 0
        for name in ("cache.db", "replies.db"):
            if (d / name).is_file():
                con = sqlite3.connect(d / name)
                try:
                    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    pages += con.execute("PRAGMA page_count").fetchone()[0]
                finally:
                    con.close()
        return pages

    # 64 hex characters twice (the row and diskcache's key index) become 32 bytes twice
    assert size(tmp_path / "rows") < 0.8 * size(tmp_path / "old")
    # and the table keeps each key once, without diskcache's times, size, mode and rowid
    # (benchmarks/bench_cache_store.py: 110 B an entry against 185)
    assert size(tmp_path / "new") < 0.7 * size(tmp_path / "rows")


def test_a_cache_with_hex_text_keys_keeps_serving_beside_new_entries(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    _fill_old_way(cache, ["old 1", "old 2"])
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    assert cb.stored([_key("old 1"), _key("new"), _key("old 2")]) == {_key("old 1"), _key("old 2")}
    got = cb.complete_many([_req("old 1"), _req("new"), _req("old 2")])
    assert fake.calls == 1 and [c.cached for c in got] == [True, False, True]
    assert cb.stored([_key("new")]) == {_key("new")}
    cb.close()
    with open_store(cache) as store:  # the store's own doors find both forms
        assert all(store.get(_key(t)) == store[_key(t)] is not None for t in ("old 1", "new", "old 2"))
        assert store.get(_key("absent")) is None and _key("absent") not in store
        with pytest.raises(KeyError):
            store[_key("absent")]
    # the old entries are left as they were (an older hdeval sharing the cache still reads them)
    assert sorted(t for t, _ in _keys(cache)) == ["text", "text"] and _table(cache) == [
        ("blob", bytes.fromhex(_key("new")))]
    again = CachedBackend(fake, cache)
    assert all(c.cached for c in again.complete_many([_req("old 1"), _req("new"), _req("old 2")]))
    again.close()
    assert fake.calls == 1
    assert check_cache(cache).readable == 3
    report = repair_cache(cache)  # nothing wrong with it: left as it is
    assert report.readable == 3 and not report.kept_as and len(_keys(cache)) == 2 and len(_table(cache)) == 1
    with diskcache.Cache(str(cache)) as c:  # an entry hdeval never writes: now there is something to repair
        c.set("not a request hash", "x")
    report = repair_cache(cache)  # copies every readable entry, into the reply table
    assert (report.readable, report.foreign) == (3, 1) and report.kept_as
    assert _keys(cache) == [] and [t for t, _ in _table(cache)] == ["blob"] * 3
    final = CachedBackend(fake, cache)
    assert all(c.cached for c in final.complete_many([_req("old 1"), _req("new"), _req("old 2")]))
    final.close()


def test_a_damaged_old_entry_is_replaced_by_the_fresh_reply(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    _fill_old_way(cache, ["q"])
    con = sqlite3.connect(cache / "cache.db")
    con.execute("UPDATE Cache SET value = ?", (b"Z1\xff\xfe garbage",))
    con.commit()
    con.close()
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    with pytest.warns(UserWarning):
        cb.complete(_req("q"))
    cb.close()
    # the fresh reply is in the table and the damaged row gone
    assert fake.calls == 1 and _keys(cache) == [] and _table(cache) == [("blob", bytes.fromhex(_key("q")))]
    assert check_cache(cache).ok


@pytest.mark.parametrize("key", [b"\x01" * 16, b"\x01" * 33, "q" * 64, 7])
def test_a_key_of_the_reply_table_that_is_not_32_bytes_is_foreign(tmp_path: Path, key: object) -> None:
    cache = tmp_path / "c"
    reply = FakeBackend().complete(_req("q"))
    with open_store(cache) as store:
        store.set(_key("q"), encode_completion(reply))
    con = sqlite3.connect(cache / "replies.db")
    con.execute("INSERT INTO reply VALUES (?, ?)", (key, encode_completion(reply)))
    con.commit()
    con.close()
    report = check_cache(cache)
    assert (report.foreign, report.readable) == (1, 1)


@pytest.mark.parametrize("key", [b"\x01" * 16, b"\x01" * 33])
def test_a_binary_key_of_another_length_is_foreign(tmp_path: Path, key: bytes) -> None:
    cache = tmp_path / "c"
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:  # as hdeval stored replies before the table
        c.set(_key("q"), encode_completion(FakeBackend().complete(_req("q"))))
    con = sqlite3.connect(cache / "cache.db")
    con.execute("UPDATE Cache SET key = ?", (key,))
    con.commit()
    con.close()
    report = check_cache(cache)
    assert report.foreign == 1 and report.readable == 0
    with diskcache.Cache(str(cache), disk=JSONDisk) as c, pytest.raises(ValueError, match="does not write"):
        list(c.iterkeys())


def test_the_store_maps_no_memory_and_keeps_a_small_page_cache(tmp_path: Path) -> None:
    """SQLite's memory map and page cache grew apply's RSS with the cache file (64 MB and 32 MB
    by diskcache's defaults), whatever settings an existing database holds."""
    cache = tmp_path / "c"
    diskcache.Cache(str(cache)).close()  # a database holding diskcache's default settings
    with open_store(cache) as store:
        con = store._con  # the store's own connection: the PRAGMAs are per connection
        assert con.execute("PRAGMA mmap_size").fetchone()[0] == 0
        assert 0 < con.execute("PRAGMA cache_size").fetchone()[0] <= 2**10
        assert store.eviction_policy == "none"  # a paid reply is never dropped
        table = store._table  # the reply table's, likewise
        assert table.execute("PRAGMA mmap_size").fetchone()[0] == 0
        assert -(2**12) <= table.execute("PRAGMA cache_size").fetchone()[0] < 0  # KiB: 4 MiB
        assert table.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
