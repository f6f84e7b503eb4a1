"""Memory of two parts of ``hdeval apply`` that must not grow with the input the way a list would:
the closing correlations (every row's human/predicted pair ranked at the end) and the
duplicate-id index (``hdeval.data.samples.DiskIds``).

- closing correlations: the traced (``tracemalloc``) peak of ``_Summary.correlations()`` over
  one aspect of N rows, in bytes a row. The columns are read from disk when a figure needs them
  and ranked one at a time; holding both and letting scipy's ``rankdata`` copy them costs about
  81 bytes a row. Target: under 56 bytes a row.
- duplicate-id index: what SQLite reports it holds (``sqlite3_memory_used``) after N distinct
  ids, in KiB. Its page cache (``DiskIds.CACHE_KIB``) is full early, so the figure levels off.
  Target: under 800 KiB at 60,000 ids.

A row per size; ``--check`` exits 1 when a figure misses its target (for a before/after run).

    python benchmarks/bench_apply_parts_memory.py
    python benchmarks/bench_apply_parts_memory.py --rows 100000,400000 --ids 20000,60000 --check
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import sys
import tempfile
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hdeval.data.samples import DiskIds  # noqa: E402
from hdeval.run.apply import _Summary  # noqa: E402

ROW_BYTES_TARGET = 56
IDS_KIB_TARGET = 800
IDS_TARGET_AT = 60_000


def closing_bytes_a_row(n: int, seed: int = 5) -> float:
    rng = np.random.default_rng(seed)
    human = rng.integers(3, 16, size=n) / 3  # averages of three 1-5 ratings: heavy ties
    pred = human * 0.3 + rng.normal(0, 1, n)
    with tempfile.TemporaryDirectory() as tmp:
        summary = _Summary(tmp, "held-out")
        summary.add(
            [SimpleNamespace(scores={"coherence": h}) for h in human.tolist()],
            SimpleNamespace(aspects=["coherence"], predictions=pred[:, None]),
        )
        del human, pred
        summary.correlations()  # scipy's first-call set-up is not what is measured
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            table = summary.correlations()
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    if table is None or table["coherence"]["spearman"] is None:
        sys.exit("the closing correlations gave no Spearman: nothing to measure")
    return peak / n


def sqlite_used():
    name = ctypes.util.find_library("sqlite3")
    try:
        used = ctypes.CDLL(name or "libsqlite3.so.0").sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    used.restype = ctypes.c_int64
    return used


def index_kib(n: int, used) -> float:
    with tempfile.TemporaryDirectory() as tmp, DiskIds(tmp) as ids:
        before = used()
        for i in range(n):
            ids.first_line(f"sample-{i:08x}-{i * 7919 % n}", i + 1)
        return (used() - before) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="100000,200000", help="row counts of the closing correlations")
    ap.add_argument("--ids", default="20000,60000,120000", help="id counts of the duplicate-id index")
    ap.add_argument("--check", action="store_true", help="exit 1 when a figure misses its target")
    args = ap.parse_args()
    missed = []
    print("part\tsize\tfigure\ttarget")
    for n in (int(x) for x in args.rows.split(",")):
        b = closing_bytes_a_row(n)
        print(f"closing correlations\t{n}\t{b:.1f} B/row\t< {ROW_BYTES_TARGET}")
        missed += [f"closing correlations at {n} rows"] if b >= ROW_BYTES_TARGET else []
    used = sqlite_used()
    if used is None:
        print("duplicate-id index\t-\tno shared SQLite library to ask its memory use\t-")
    else:
        for n in (int(x) for x in args.ids.split(",")):
            kib = index_kib(n, used)
            target = f"< {IDS_KIB_TARGET}" if n <= IDS_TARGET_AT else "level"
            print(f"duplicate-id index\t{n}\t{kib:.0f} KiB\t{target}")
            missed += [f"duplicate-id index at {n} ids"] if n <= IDS_TARGET_AT and kib >= IDS_KIB_TARGET else []
    if missed:
        print("missed: " + "; ".join(missed), file=sys.stderr)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
