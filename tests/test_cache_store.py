"""Which SQLite settings the cache runs with (issue #23 item 3): the store's memory does not grow
with the cache file."""

from __future__ import annotations

from pathlib import Path

import diskcache

from hdeval.cache import open_store


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
