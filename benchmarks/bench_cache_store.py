"""Bytes per entry, write and read throughput of the reply cache: diskcache as hdeval configured
it until the reply table (``JSONDisk``, ``_STORE_SETTINGS``) against a plain SQLite ``WITHOUT
ROWID`` key->value table, and hdeval's store as it is (``hdeval.llm.cache.store.open_store``: the reply table, with
diskcache beside it for older caches) (issue #23 item 3, #19 item 2).

Both get the same N real-shaped entries: a 32-byte request digest as the key and, as the value,
``encode_completion`` of the fake LLM's scoring reply (a digit and five full-precision logprobs)
to a distinct prompt. Writes go in transactions of ``CachedBackend.WRITE_BATCH`` (as the one
writer commits); reads are one key at a time, in random order (as a rerun looks replies up).
Bytes are the files in the directory once closed; per sample at 4 entries a sample (the 1-layer
SummEval artifact asks 4 criteria per sample).

    python benchmarks/bench_cache_store.py              # 80,000 entries
    python benchmarks/bench_cache_store.py -n 20000
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import diskcache  # noqa: E402

from hdeval.llm.backends.base import CompletionRequest, Message  # noqa: E402
from hdeval.llm.backends.fake import FakeBackend  # noqa: E402
from hdeval.llm.cache import store as reply_store  # noqa: E402
from hdeval.llm.cache.client import CachedBackend  # noqa: E402
from hdeval.llm.cache.codec import encode_completion  # noqa: E402
from hdeval.llm.cache.store import open_store  # noqa: E402
from hdeval.methods.hdeval.fake import score_reply  # noqa: E402

PER_SAMPLE = 4


def entries(n: int) -> list[tuple[str, bytes]]:
    fake = FakeBackend(record=False)
    out = []
    for i in range(n):
        prompt = f"<sample>sample {i} " + "word " * (i % 97) + f"</sample> criterion {i % 4}"
        req = CompletionRequest((Message("user", prompt),), top_logprobs=5, kind="score")
        reply = dataclasses.replace(score_reply(req, fake), prompt_tokens=300 + i % 200)
        out.append((hashlib.sha256(prompt.encode()).hexdigest(), encode_completion(reply)))
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def diskcache_rows(directory: Path) -> diskcache.Cache:
    return diskcache.Cache(str(directory), disk=reply_store.JSONDisk, **reply_store._STORE_SETTINGS)


def bench_store(directory: Path, items: list[tuple[str, bytes]], order: list[int], opener=open_store) -> tuple[float, float]:
    store = opener(directory)
    t = time.perf_counter()
    for i in range(0, len(items), CachedBackend.WRITE_BATCH):
        with store.transact():
            for key, value in items[i:i + CachedBackend.WRITE_BATCH]:
                store.set(key, value)
    write = time.perf_counter() - t
    t = time.perf_counter()
    for j in order:
        assert store.get(items[j][0]) is not None
    read = time.perf_counter() - t
    store.close()
    return write, read


def bench_table(directory: Path, items: list[tuple[str, bytes]], order: list[int]) -> tuple[float, float]:
    directory.mkdir()
    con = sqlite3.connect(directory / "replies.db", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")  # as diskcache sets it
    con.execute("CREATE TABLE reply(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")
    t = time.perf_counter()
    for i in range(0, len(items), CachedBackend.WRITE_BATCH):
        con.execute("BEGIN IMMEDIATE")
        con.executemany("INSERT OR REPLACE INTO reply VALUES (?, ?)",
                        [(bytes.fromhex(k), v) for k, v in items[i:i + CachedBackend.WRITE_BATCH]])
        con.execute("COMMIT")
    write = time.perf_counter() - t
    t = time.perf_counter()
    for j in order:
        assert con.execute("SELECT value FROM reply WHERE key = ?", (bytes.fromhex(items[j][0]),)).fetchone()
    read = time.perf_counter() - t
    con.close()
    return write, read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=80_000, help="entries (default 80,000)")
    args = ap.parse_args()
    items = entries(args.n)
    order = list(range(args.n))
    random.Random(0).shuffle(order)
    value_bytes = sum(len(v) for _, v in items) / args.n
    print(f"{args.n} entries, 32-byte keys, values {value_bytes:.1f} B on average; load {os.getloadavg()[0]:.2f}")
    print(f"{'store':<26}{'B/entry':>9}{'MB/100k samples':>17}{'writes/s':>10}{'reads/s':>10}")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="hdeval-bench-cache-") as tmp:
        runs = (("diskcache (JSONDisk)", lambda *a: bench_store(*a, opener=diskcache_rows)),
                ("WITHOUT ROWID table", bench_table), ("hdeval open_store", bench_store))
        for name, run in runs:
            d = Path(tmp) / name.split()[0]
            write, read = run(d, items, order)
            per = dir_bytes(d) / args.n
            rows[name] = (per, args.n / write, args.n / read)
            print(f"{name:<26}{per:>9.1f}{per * PER_SAMPLE * 1e5 / 1e6:>17.1f}"
                  f"{args.n / write:>10.0f}{args.n / read:>10.0f}", flush=True)
    a, b, c = rows.values()
    print(f"{'table / diskcache':<26}{b[0] / a[0]:>9.2f}{'':>17}{b[1] / a[1]:>10.2f}{b[2] / a[2]:>10.2f}")
    print(f"{'open_store / diskcache':<26}{c[0] / a[0]:>9.2f}{'':>17}{c[1] / a[1]:>10.2f}{c[2] / a[2]:>10.2f}")


if __name__ == "__main__":
    main()
