"""Client throughput: how close hdeval gets to a server's limit (issue #15, item 1).

Starts ``benchmarks/fixed_latency_server.py`` (stdlib asyncio, 127.0.0.1, answers every chat
completion after exactly L ms, never the bottleneck) in its own process, then drives hdeval's
real path, ``open_llm(LLMConfig(model="openai:m", base_url=..., concurrency=c, cache_dir=tmp))``
through ``hdeval.judge.fill_matrix``, over N unique scoring-sized requests (a fresh cache
each time, so every request is a paid call), for each c and L. A server that answers in L
seconds allows at most c / L calls/s at concurrency c; the table shows calls/s, that ideal,
the ratio, and the client's CPU per call (``time.process_time`` of this process: every
thread, the cache writes and the final flush on close included).

    python benchmarks/bench_throughput.py                      # c in 1 8 64, L in 50 200 ms
    python benchmarks/bench_throughput.py --concurrency 64 --latency-ms 50 --requests 3000

Results (2 cores shared with six other engineers' test runs: load average 3-5 for the
baseline, 12-22 for the later runs, so wall-clock figures are pessimistic and noisy; the CPU
per call is the steadier figure; 1,000 requests per run, 100 at c = 1):

| c | L ms | baseline calls/s (ratio) | lean client (ratio) | + cache writer (ratio) | + per-request clients, split locks (ratio) | final rerun (ratio) |
|---|---|---|---|---|---|---|
| 1 | 50 | 16.2 (0.81) | 14.8 (0.74) | 15.5 (0.78) | 15.1 (0.76) | 17.4 (0.87) |
| 8 | 50 | 132.0 (0.82) | 122.6 (0.77) | 112.7 (0.70) | 120.0 (0.75) | 139.4 (0.87) |
| 64 | 50 | 246.1 (0.19) | 251.3 (0.20) | 238.4 (0.19) | 323.3 (0.25) | 495.4 (0.39) |
| 1 | 200 | 4.8 (0.97) | 4.8 (0.95) | 4.8 (0.96) | 4.7 (0.95) | 4.9 (0.97) |
| 8 | 200 | 38.3 (0.96) | 37.8 (0.95) | 37.7 (0.94) | 37.7 (0.94) | 38.4 (0.96) |
| 64 | 200 | 204.0 (0.64) | 177.1 (0.55) | 247.8 (0.77) | 233.9 (0.73) | 230.0 (0.72) |
| load average | | 3-5 | 12-14 | 12 | 21-23 | 5-6 |

Client CPU per call (ms, c = 8 / 64 at L = 50): baseline 3.08 / 3.11, lean client 1.70 / 2.03,
+ cache writer 1.70 / 2.41, + per-request clients 1.90 / 2.36, final rerun 2.00 / 1.81 (the
server: 0.15-0.6 ms per call). At the same load as the baseline, c = 64 and L = 50 ms doubled
(246 -> 495 calls/s). c = 64 at L = 200 ms stayed near 230: a 1,000-request run lasts ~4 s there,
and opening 64 connections (and one TLS context) while 64 threads start is a larger share of
it (a likely cause, not profiled separately; more requests per run would show it).

Where it saturates: at c = 64 the client is CPU-bound under the GIL. Single-threaded, per call:
the httpx2/httpcore2/h11 request and response handling of a pre-built body ~0.85-0.95 ms CPU,
the cache (sha256 key, SQLite lookup, the writer's share of a batched commit) ~0.3-0.6 ms, the
per-attempt thread that enforces the whole-request deadline ~0.1 ms, JSON body and reply
~0.05 ms; with 64 threads the GIL hand-offs after every socket call add the rest (a
per-thread cProfile shows the time in poll/send/settimeout, i.e. waiting to get the GIL back).
At ~2 ms of GIL-serialised CPU per call the ceiling is ~500 calls/s on a free core, well below
the 640 calls/s that 0.5 x c/L needs at c = 64, L = 50 ms; on these loaded cores the process
got less than one core. The issue's targets (>= 0.9 x c/L up to c = 64 at 200 ms, >= 0.5 at
c = 64, 50 ms) are met at c <= 8 only. Removing the deadline thread (a watchdog that shuts the
socket instead) and the per-call HTTP library overhead (a leaner HTTP/1.1 client) are the next
levers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's hdeval, not an installed one

from hdeval.backends.base import CompletionRequest, Message  # noqa: E402
from hdeval.config import LLMConfig  # noqa: E402
from hdeval.judge import Cell, fill_matrix  # noqa: E402
from hdeval.llm import open_llm  # noqa: E402

SYSTEM = ("You are an expert evaluator of text summaries. Rate the summary on the criterion "
          "given, on a scale from 1 to 5, and answer with the number only. ") * 3
ARTICLE = ("The committee met on Tuesday to discuss the proposed changes to the city's transit "
           "network, including new bus lanes and longer service hours on weekends. ") * 12


def bench_request(i: int) -> CompletionRequest:
    """About the size of a real scoring request (a ~2.5 KB prompt); unique per ``i``."""
    user = (f"<sample>\nSource: {ARTICLE}\nSummary {i}: the committee discussed transit changes "
            f"(variant {i}).\n</sample>\nCriterion: coherence. Score (1-5):")
    return CompletionRequest(messages=(Message("system", SYSTEM), Message("user", user)),
                             max_tokens=1, top_logprobs=5, kind="bench")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (Linux); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class LatencyServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "fixed_latency_server.py"), "--port", "0"],
            stdout=subprocess.PIPE, text=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("listening on "):
            self.proc.kill()
            raise SystemExit(f"the benchmark server did not start: {line!r}")
        self.url = line.split()[-1]

    def base_url(self, latency_ms: float) -> str:
        return f"{self.url}/lat/{latency_ms:g}/v1"

    def cpu(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_one(server: LatencyServer, c: int, latency_ms: float, n: int, offset: int) -> dict:
    cache_dir = tempfile.mkdtemp(prefix="hdeval-bench-")
    try:
        cells = [Cell(f"s{i}", "coherence", (bench_request(offset + i),)) for i in range(n)]
        config = LLMConfig(model="openai:m", base_url=server.base_url(latency_ms), concurrency=c,
                           cache_dir=cache_dir, timeout=30.0)
        server_cpu0 = server.cpu()
        cpu0, t0 = time.process_time(), time.perf_counter()
        llm = open_llm(config)
        try:
            matrix = fill_matrix(llm, cells, lambda got: (1.0, None), concurrency=c)
        finally:
            llm.close()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        server_cpu = server.cpu() - server_cpu0
        if matrix.failures or llm.stats.calls != n:
            raise SystemExit(f"c={c} L={latency_ms}: {llm.stats.calls} calls, {len(matrix.failures)} failures")
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    ideal = c / (latency_ms / 1000.0)
    rate = n / wall
    return {"c": c, "L": latency_ms, "n": n, "rate": rate, "ideal": ideal, "ratio": rate / ideal,
            "cpu_ms": 1000.0 * cpu / n, "server_cpu_ms": 1000.0 * server_cpu / n}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--latency-ms", type=float, nargs="+", default=[50.0, 200.0])
    p.add_argument("--requests", type=int, default=1000, help="unique requests per run (c > 1)")
    p.add_argument("--requests-c1", type=int, default=100,
                   help="unique requests per run at c = 1 (1,000 at 200 ms would take 200 s)")
    args = p.parse_args(argv)
    server = LatencyServer()
    rows = []
    offset = 0
    try:
        print("| c | L ms | requests | calls/s | ideal c/L | ratio | client CPU ms/call | server CPU ms/call |")
        print("|---|---|---|---|---|---|---|---|")
        for latency in args.latency_ms:
            for c in args.concurrency:
                n = args.requests_c1 if c == 1 else args.requests
                r = run_one(server, c, latency, n, offset)
                offset += n
                rows.append(r)
                print(f"| {c} | {latency:g} | {n} | {r['rate']:.1f} | {r['ideal']:.0f} | {r['ratio']:.2f} "
                      f"| {r['cpu_ms']:.2f} | {r['server_cpu_ms']:.2f} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
