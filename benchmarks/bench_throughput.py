"""Client throughput: how close hdeval gets to a server's limit (issue #15, item 1).

Starts ``benchmarks/fixed_latency_server.py`` (stdlib asyncio, 127.0.0.1, answers every chat
completion after exactly L ms, never the bottleneck) in its own process, then drives hdeval's
real path, ``open_llm(LLMConfig(model="openai:m", base_url=..., concurrency=c, cache_dir=tmp))``
through ``hdeval.judge.fill.fill_matrix``, over N unique scoring-sized requests (a fresh cache
each time, so every request is a paid call), for each c and L. A server that answers in L
seconds allows at most c / L calls/s at concurrency c; the table shows calls/s, that ideal,
the ratio, and the client's CPU per call (``time.process_time`` of this process: every
thread, the cache writes and the final flush on close included), and the 1-minute load average
(on a shared machine the wall-clock figures depend on it).

    python benchmarks/bench_throughput.py                      # c in 1 8 64, L in 50 200 ms
    python benchmarks/bench_throughput.py --concurrency 64 --latency-ms 50 --requests 3000

With ``--baseline REV`` each row is run twice, interleaved: first with the hdeval of git
revision REV (extracted to a temporary directory, in a subprocess), then with this checkout,
e.g. ``--baseline b877c61`` for the hand-written ``http.client`` transport the asyncio client
(AsyncOpenAI + tenacity) replaced. With ``--bare`` each row is also run with the bare SDK (one
``openai.AsyncOpenAI``, ``c`` tasks calling ``chat.completions.create`` with the same body, no
cache), and what hdeval adds on top of it is printed as a difference in CPU per call. Figures
and their load averages go in the commit message that changes the client, not here.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT_ENV = "HDEVAL_BENCH_ROOT"  # (--baseline) the hdeval tree the subprocess imports
sys.path.insert(0, os.environ.get(ROOT_ENV) or str(HERE.parent))  # this checkout's hdeval, not an installed one

from hdeval.judge.fill import Cell, fill_matrix  # noqa: E402
from hdeval.llm.backends.base import CompletionRequest, Message  # noqa: E402
from hdeval.llm.client import open_llm  # noqa: E402
from hdeval.llm.config import LLMConfig  # noqa: E402

try:  # imported before any timing: a once-per-process cost, not one of the calls measured
    importlib.import_module("hdeval.llm.backends.openai_compat")
except ImportError:
    pass

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


def _load() -> str:
    """The 1-minute load average (the machine may be shared: wall-clock figures depend on it)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


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
        return _cpu_seconds(self.proc.pid) if self.proc is not None else float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_one(server: LatencyServer, c: int, latency_ms: float, n: int, offset: int) -> dict:
    cache_dir = tempfile.mkdtemp(prefix="hdeval-bench-")
    try:
        cells = [Cell(f"s{i}", "coherence", (bench_request(offset + i),)) for i in range(n)]
        config = LLMConfig(model="m", base_url=server.base_url(latency_ms), concurrency=c,
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


def run_bare(server: LatencyServer, c: int, latency_ms: float, n: int, offset: int) -> dict:
    """The same requests through the bare SDK: one ``AsyncOpenAI`` (its defaults, its own
    retries off) and ``c`` tasks, each awaiting ``chat.completions.create`` in turn."""
    import openai

    requests = [bench_request(offset + i) for i in range(n)]

    async def drive() -> None:
        sdk = openai.AsyncOpenAI(base_url=server.base_url(latency_ms), api_key="not-needed", max_retries=0,
                                 timeout=30.0)
        todo = iter(requests)

        async def worker() -> None:
            for r in todo:
                await sdk.chat.completions.create(
                    model="m", messages=[{"role": m.role, "content": m.content} for m in r.messages],
                    temperature=r.temperature, max_tokens=r.max_tokens, logprobs=True, top_logprobs=r.top_logprobs)

        try:
            await asyncio.gather(*(worker() for _ in range(c)))
        finally:
            await sdk.close()

    server_cpu0 = server.cpu()
    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(drive())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    ideal = c / (latency_ms / 1000.0)
    return {"c": c, "L": latency_ms, "n": n, "rate": n / wall, "ideal": ideal, "ratio": n / wall / ideal,
            "cpu_ms": 1000.0 * cpu / n, "server_cpu_ms": 1000.0 * (server.cpu() - server_cpu0) / n}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--latency-ms", type=float, nargs="+", default=[50.0, 200.0])
    p.add_argument("--requests", type=int, default=1000, help="unique requests per run (c > 1)")
    p.add_argument("--requests-c1", type=int, default=100,
                   help="unique requests per run at c = 1 (1,000 at 200 ms would take 200 s)")
    p.add_argument("--baseline", metavar="REV", help="also run each row with the hdeval of git revision REV")
    p.add_argument("--bare", action="store_true",
                   help="also run each row with the bare AsyncOpenAI SDK and print hdeval's added CPU per call")
    p.add_argument("--one", nargs=4, type=float, metavar=("C", "L", "N", "OFFSET"), help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # a row in a subprocess (--baseline), against the parent's server
        c, latency, n, offset = args.one
        server = LatencyServer.__new__(LatencyServer)
        server.url, server.proc = args.server, None
        print(json.dumps(run_one(server, int(c), latency, int(n), int(offset))))
        return
    baseline = _extract(args.baseline) if args.baseline else None
    server = LatencyServer()
    rows = []
    added: list[str] = []  # (--bare) hdeval's CPU per call minus the bare SDK's, per row
    offset = 0
    try:
        print("| c | L ms | requests | calls/s | ideal c/L | ratio | client CPU ms/call | server CPU ms/call "
              "| load average |")
        print("|---|---|---|---|---|---|---|---|---|")
        for latency in args.latency_ms:
            for c in args.concurrency:
                n = args.requests_c1 if c == 1 else args.requests
                runs = []
                if baseline is not None:
                    runs.append((args.baseline, _in_subprocess(baseline, server, c, latency, n, offset)))
                    offset += n
                runs.append(("this", run_one(server, c, latency, n, offset)))
                offset += n
                if args.bare:
                    runs.append(("bare AsyncOpenAI", run_bare(server, c, latency, n, offset)))
                    offset += n
                for label, r in runs:
                    rows.append(r)
                    print(f"| {c} | {latency:g} | {n} | {r['rate']:.1f} | {r['ideal']:.0f} | {r['ratio']:.2f} "
                          f"| {r['cpu_ms']:.2f} | {r['server_cpu_ms']:.2f} | {_load()} |"
                          + (f" {label}" if len(runs) > 1 else ""), flush=True)
                if args.bare:
                    ours, bare = dict(runs)["this"], dict(runs)["bare AsyncOpenAI"]
                    added.append(f"c={c} L={latency:g} ms: hdeval {ours['cpu_ms']:.2f} - bare SDK "
                                 f"{bare['cpu_ms']:.2f} = {ours['cpu_ms'] - bare['cpu_ms']:+.2f} ms CPU per call")
        for line in added:
            print(line)
    finally:
        server.stop()
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)


def _extract(rev: str) -> str:
    """The ``hdeval`` package of git revision ``rev``, in a temporary directory."""
    root = tempfile.mkdtemp(prefix="hdeval-baseline-")
    archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", rev, "hdeval"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    return root


def _in_subprocess(root: str, server: "LatencyServer", c: int, latency: float, n: int, offset: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", str(c), str(latency), str(n), str(offset),
                          "--server", server.url], env={**os.environ, ROOT_ENV: root}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
