"""The reply cache writes only inside its directory: a database file or log of it that is a symbolic
link (to a file outside, or anywhere) is refused with one line saying so, and nothing is written
through it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import one_error, run_cli, train_artifact

from hdeval.core.errors import CacheError
from hdeval.llm.cache.store import open_store


def _real_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "made"
    open_store(cache).close()
    return cache


@pytest.mark.parametrize("name", ["replies.db", "cache.db"])
def test_a_database_linked_outside_the_cache_is_refused_not_written_through(tmp_path: Path, name: str) -> None:
    made = _real_cache(tmp_path)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    outside.write_bytes((made / name).read_bytes())
    before = outside.read_bytes()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / name).symlink_to(outside)
    with pytest.raises(CacheError, match="is a symbolic link") as err:
        open_store(cache).close()
    assert str(cache / name) in str(err.value) and "\n" not in str(err.value)
    assert outside.read_bytes() == before


def test_a_linked_write_ahead_log_is_refused_with_what_is_wrong(toy, tmp_path: Path) -> None:
    task, data = toy
    # any artifact will do: one layer with lr, not the default three with auto (5-8 s)
    art = train_artifact(str(task), data, tmp_path, "--layers", 1, "--aggregator", "lr")
    cache = tmp_path / "cache"
    (cache / "replies.db-wal").unlink(missing_ok=True)
    target = tmp_path / "wal-target"
    target.write_bytes(b"")
    (cache / "replies.db-wal").symlink_to(target)
    r = run_cli("apply", art, data, "-o", tmp_path / "out.jsonl", "--llm", "fake", "--cache-dir", cache)
    line = one_error(r, "replies.db-wal", "symbolic link")
    assert "not writable" not in line and "writable directory" not in line
    assert target.read_bytes() == b""
    (cache / "replies.db-wal").unlink()
    with sqlite3.connect(cache / "replies.db") as con:  # the cache itself is untouched
        assert con.execute("SELECT count(*) FROM reply").fetchone()[0] > 0
