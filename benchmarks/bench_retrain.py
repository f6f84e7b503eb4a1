"""How long a retrain takes when every LLM call is already in the cache (issue #15.4).

Runs ``hdeval train --llm fake`` twice into temporary directories with its own cache
directory: first uncached (every call made, by the fake LLM), then fully cached (the same
command again: no call made, so the run is the tool's own work: reading the cache and
fitting the aggregators). Prints the wall time and peak RSS of each run (separate
processes, measured with ``os.wait4``), then profiles a third, cached run with cProfile and
prints its top functions by cumulative time (that run with ``HDEVAL_JOBS=1``, so the fitting
happens in the profiled process).

``--compare DIR`` also runs the cached train (timed, not profiled) with the hdeval package
found in DIR (e.g. ``git archive <commit> | tar -x -C DIR``), side by side with this
checkout, so before/after ratios come from the same machine load.

    python benchmarks/bench_retrain.py                       # summeval, 3 layers, auto
    python benchmarks/bench_retrain.py --aggregator lr --limit 400
    python benchmarks/bench_retrain.py --compare /tmp/hdeval-base --no-profile
    python benchmarks/bench_retrain.py --cache-dir /tmp/c --cached-only --serial  # cache filled

Data: ``$HDEVAL_DATA_DIR`` (or ``--data-dir``).

Measured (issue #15.4; 2 cores shared with 3 other engineers, all 1,600 SummEval samples,
3 layers, ``--aggregator auto``, default ``HDEVAL_JOBS`` = one process; one filled cache):

    side by side, 11:05 UTC, load average 2.2-2.6 (``--cached-only --compare``):
    cached, after (L-BFGS nn, 1 BLAS thread, pruning reuse, bulk reads)  wall 28.5 s  CPU 28.2 s  366 MB
    cached, before (main at 148ffb8)                                     wall 73.7 s  CPU 73.1 s  665 MB
    after, again at 11:25 UTC (load 0.2-0.9): 33-34 s CPU and wall in one process;
    HDEVAL_JOBS=2: wall 26.4 s, CPU 39.6 s (1.16x the CPU for a 1.3x shorter run)
    -> 0.39x CPU and wall side by side. The same "before" measured 94.9 s CPU (176 s wall) at load 5-6
       (10:10 UTC; uncached 126 s CPU, 184 s wall): OpenBLAS threads spinning on 640-row
       matrices made its CPU grow with the load; one thread while fitting removes that.

    where the cached run's CPU goes, after (in-process timers, unprofiled): model selection
    20.8 s (rf 12.5 s: 100-tree forests, 5 folds x 3 layers, kept bit-identical; nn 7 s:
    4 alphas x 5 folds x 3 layers), cache reads and parsing 4.9 s (57,600 lookups; 7.8 s of
    it in run_requests before bulk reads, 3.2 s after), pruning 0.6 s (was 7 s profiled: five
    refits of the chosen kind plus every column shuffled), the rest reading data and writing
    the artifact. Before, under cProfile: 88% in run_jobs, the adam MLP alone 66% (121 fits
    x 300 epochs, none converged). cProfile inflates L-BFGS's Python callbacks about 3x, so
    read the profile below for shares of the call chain, not for totals.
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROFILED = """\
import cProfile, sys, time
prof = cProfile.Profile(time.process_time)
out = sys.argv.pop(1)
sys.argv[0] = "hdeval"
from hdeval.cli import main
try:
    prof.runcall(main)
except SystemExit as e:
    code = e.code
else:
    code = 0
prof.dump_stats(out)
sys.exit(code)
"""


def run_train(args: argparse.Namespace, work: Path, out_name: str, src: Path,
              profile: Path | None = None, jobs: str | None = None) -> tuple[float, float, float]:
    """One ``hdeval train`` in a child process: (wall seconds, CPU seconds, peak RSS in MB).
    CPU and RSS come from ``os.wait4`` (the child plus the worker processes it reaped): on a
    shared machine the CPU time is the steadier figure."""
    cmd = [sys.executable]
    if profile is not None:  # cProfile timed in CPU seconds: the machine may be shared
        cmd += ["-c", PROFILED, str(profile)]
    else:
        cmd += ["-m", "hdeval.cli"]
    cmd += ["train", "--task", args.task, "--layers", str(args.layers),
            "--llm", "fake", "--aggregator", args.aggregator, "--cache-dir", str(args.cache_dir or work / "cache"),
            "-o", str(work / out_name), "-q"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    env = dict(os.environ, PYTHONPATH=str(src), HDEVAL_DATA_DIR=str(args.data_dir))
    if jobs is not None:
        env["HDEVAL_JOBS"] = jobs
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"train failed ({proc.returncode}):\n{out.decode(errors='replace')[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # maxrss: KB on Linux


def show(row: tuple[str, float, float, float]) -> None:
    print(f"{row[0]:<20} wall {row[1]:7.1f} s  CPU {row[2]:7.1f} s  peak RSS {row[3]:6.0f} MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="summeval")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--aggregator", default="auto")
    ap.add_argument("--limit", type=int, default=None, help="Only N samples (default: all).")
    ap.add_argument("--data-dir", type=Path, default=os.environ.get("HDEVAL_DATA_DIR"))
    ap.add_argument("--src", type=Path, default=REPO,
                    help="Run the hdeval package in this directory (default: this checkout).")
    ap.add_argument("--compare", type=Path, default=None,
                    help="Also time the cached run with the hdeval package in this directory.")
    ap.add_argument("--serial", action="store_true",
                    help="Also time the cached run with HDEVAL_JOBS=1 (no worker processes).")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="Use (and keep) this cache directory instead of a temporary one.")
    ap.add_argument("--cached-only", action="store_true",
                    help="Skip the uncached run (with --cache-dir holding a finished run's calls).")
    ap.add_argument("--profile-only", action="store_true",
                    help="With --cached-only: only the profiled run.")
    ap.add_argument("--no-profile", action="store_true", help="Skip the profiled cached run.")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if args.cached_only and args.cache_dir is None:
        sys.exit("--cached-only needs --cache-dir (a cache a finished run filled)")
    if args.data_dir is None or not (args.data_dir / f"{args.task}.jsonl").is_file():
        sys.exit("set HDEVAL_DATA_DIR (or --data-dir) to a directory with the task's .jsonl")

    print(f"hdeval from {args.src}")
    print(f"task {args.task}, {args.layers} layers, --aggregator {args.aggregator}, "
          f"{'all' if not args.limit else args.limit} samples, {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-retrain-") as tmp:
        work = Path(tmp)
        if not args.cached_only:
            rows.append(("uncached", *run_train(args, work, "a", args.src)))
            show(rows[-1])
        if not args.profile_only:
            rows.append(("cached", *run_train(args, work, "b", args.src)))
            show(rows[-1])
            cached = rows[-1]
        if args.compare is not None and not args.profile_only:
            rows.append((f"cached ({args.compare.name})", *run_train(args, work, "c", args.compare)))
            show(rows[-1])
            print(f"cached this/compare: wall {cached[1] / rows[-1][1]:.2f}, CPU {cached[2] / rows[-1][2]:.2f}")
        if args.serial and not args.profile_only:
            rows.append(("cached, 1 job", *run_train(args, work, "s", args.src, jobs="1")))
            show(rows[-1])
            print(f"cached default jobs / 1 job: wall {cached[1] / rows[-1][1]:.2f}, "
                  f"CPU {cached[2] / rows[-1][2]:.2f}")
        if not args.no_profile:
            prof = work / "cached.prof"
            # one job: cProfile sees only its own process, not the fitting in worker processes
            show(("cached, profiled", *run_train(args, work, "d", args.src, profile=prof, jobs="1")))
            print()
            stats = pstats.Stats(str(prof))
            total = stats.total_tt  # type: ignore[attr-defined]
            print(f"cProfile of the cached run (CPU time), top {args.top} by cumulative time below "
                  f"the command's own call chain (total {total:.1f} s; share = cumulative / total):")
            stats.sort_stats("cumulative")
            shown = 0
            for func in stats.fcn_list:  # type: ignore[attr-defined]
                cc, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
                if ct > 0.9 * total:  # main -> click -> train -> run_command -> ...: every run
                    continue
                print(f"  {ct:8.1f} s {100 * ct / total:5.1f}% {nc:9d} calls  "
                      f"{Path(func[0]).name}:{func[1]}({func[2]})")
                shown += 1
                if shown == args.top:
                    break


if __name__ == "__main__":
    main()
