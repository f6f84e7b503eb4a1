"""What a SIGKILL can lose: replies answered (paid) but not yet committed to the cache, sampled
every millisecond of a run, against the writer's group size (``CachedBackend.WRITE_BATCH``).

Drives the same path and server as ``bench_throughput.py`` (``open_llm`` + ``fill_matrix`` over
unique scoring-sized requests, ``fixed_latency_server.py`` answering after L ms) and, while it
runs, samples how many replies are queued for the writer or in the transaction it is writing:
what a kill at that instant would lose. Prints, per group size, calls/s, the mean and maximum of
that count, and the 1-minute load average (on a shared machine the figures depend on it).

    python benchmarks/bench_kill_window.py --concurrency 64 --latency-ms 50 --requests 3000 --groups 256 8 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_throughput import LatencyServer, _load, bench_request  # noqa: E402

from hdeval.judge.fill import Cell, fill_matrix  # noqa: E402
from hdeval.llm.cache.client import CachedBackend  # noqa: E402
from hdeval.llm.client import open_llm  # noqa: E402
from hdeval.llm.config import LLMConfig  # noqa: E402


def run(server: LatencyServer, c: int, latency_ms: float, n: int, group: int, offset: int) -> dict:
    CachedBackend.WRITE_BATCH = group
    writing = [0]
    real = CachedBackend._write_batch

    def counted(self, items):
        writing[0] = len(items)
        try:
            return real(self, items)
        finally:
            writing[0] = 0

    CachedBackend._write_batch = counted
    cache_dir = tempfile.mkdtemp(prefix="hdeval-bench-")
    samples: list[int] = []
    try:
        cells = [Cell(f"s{i}", "coherence", (bench_request(offset + i),)) for i in range(n)]
        llm = open_llm(LLMConfig(model="openai:m", base_url=server.base_url(latency_ms), concurrency=c,
                                 cache_dir=cache_dir, timeout=30.0))
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.001):
                samples.append(len(llm._queue) + writing[0])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        try:
            fill_matrix(llm, cells, lambda got: (1.0, None), concurrency=c)
        finally:
            wall = time.perf_counter() - t0
            done.set()
            sampler.join()
            llm.close()
    finally:
        CachedBackend._write_batch = real
        shutil.rmtree(cache_dir, ignore_errors=True)
    return {"group": group, "rate": n / wall, "mean": sum(samples) / max(1, len(samples)),
            "max": max(samples, default=0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--groups", type=int, nargs="+", default=[256, 8, 1])
    p.add_argument("--rounds", type=int, default=2, help="each group size this often, interleaved")
    args = p.parse_args()
    server = LatencyServer()
    try:
        print(f"c={args.concurrency} L={args.latency_ms:g} ms n={args.requests}")
        print("group  calls/s  uncommitted: mean  max  load")
        offset = 0
        for _ in range(args.rounds):
            for g in args.groups:
                r = run(server, args.concurrency, args.latency_ms, args.requests, g, offset)
                offset += args.requests
                print(f"{r['group']:>5}  {r['rate']:7.0f}  {r['mean']:17.2f}  {r['max']:3d}  {_load()}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    os.environ.setdefault("HDEVAL_OFFLINE", "1")
    main()
