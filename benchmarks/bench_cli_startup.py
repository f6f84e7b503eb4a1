"""How long the commands a user runs after training take, and how much of it is imports (#37).

Trains the quick start's shape once (``examples/qa_task.toml``, ``qa_tree.json``, 2 layers, 24
rows) with the fake LLM, then runs, each in a new process: ``hdeval report``, ``hdeval apply`` on
``examples/new_qa.jsonl``, ``hdeval check`` on ``examples/qa.jsonl`` and ``hdeval --help``. Each
is timed (wall, from the parent) and run once more under ``python -X importtime`` to sum the
imports (top-level cumulative microseconds, and the packages that took most).

``--compare DIR`` runs the same commands with the hdeval package found in DIR (a detached
``git worktree add`` of main), alternating old and new run by run, so both see the same load.
The 1-minute load average is printed beside every timing.

    python benchmarks/bench_cli_startup.py --compare /tmp/main-worktree --repeats 5

Measured (2 cores shared by 8 engineers; old = main at bb84f84, new = b9ca1b0 (later commits leave these paths as they are);
both read one artifact the new code trained; medians of 5 runs, old and new alternating; CPU is
user + system of the command's process, which the load inflates far less than wall time; imports
from one ``-X importtime`` run each, inflated by the load as much as the wall time):

    2026-11-27 23:13-23:35 UTC        wall old -> new      CPU old -> new    imports old -> new
    report   (load 11.0-15.2)         58.8 s -> 34.1 s     5.74 s -> 4.56 s  41.4 s -> 27.5 s
    apply    (load 14.6-17.5)         39.8 s -> 31.2 s     3.73 s -> 2.59 s  26.6 s -> 15.9 s
    check    (load 13.5-14.8)         34.7 s -> 20.7 s     3.59 s -> 2.42 s   8.3 s ->  7.9 s
    --help   (load 11.4-11.7)          0.52 s -> 0.53 s    0.18 s -> 0.18 s   0.63 s -> 0.36 s

    again 23:47-23:53 UTC, 3 runs each   wall old -> new      CPU old -> new    imports old -> new
    report   (load 3.6-4.8)           15.8 s -> 8.6 s      6.30 s -> 4.63 s  13.8 s -> 10.1 s
    apply    (load 6.5-9.9)           12.6 s -> 12.3 s     3.67 s -> 2.59 s  11.8 s ->  6.3 s
    check    (load 9.9-10.8)          13.8 s -> 9.0 s      3.51 s -> 2.36 s   9.3 s ->  7.6 s
    --help   (load 10.7)               0.67 s -> 0.63 s    0.20 s -> 0.19 s   0.64 s -> 0.60 s

    The old runs' largest imports: openai (1.0-4.1 s under that load), gone from all three new
    ones. What stays is used: skops.io (it imports 440 scikit-learn modules, a superset of what
    aggregate.py imports), shap and matplotlib for report's SHAP values and plots. On a quiet
    machine (load 0.5, 22:58 UTC) report took 4.3 s wall, of which imports 2.55 s (openai 0.37 s).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def run(code_dir: Path, args: list[str], cwd: Path, importtime: bool = False) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds (user + system), stderr) of ``hdeval ARGS`` in a new process."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HDEVAL_LLM", "HDEVAL_BASE_URL")
    }
    env["PYTHONPATH"] = str(code_dir)
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "hdeval.cli", *args]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed with {code_dir}: {stderr[-800:]}")
    return wall, usage.ru_utime + usage.ru_stime, stderr


def import_summary(stderr: str) -> tuple[float, list[tuple[float, str]]]:
    """Seconds of top-level imports, and the five packages whose own import time was largest."""
    top, own = 0, {}
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if not m:
            continue
        if len(m[3]) == 1:
            top += int(m[2])
        name = m[4].split(".")[0]
        own[name] = own.get(name, 0) + int(m[1])
    most = sorted(((v / 1e6, k) for k, v in own.items()), reverse=True)[:5]
    return top / 1e6, most


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", type=Path, default=None, help="a checkout of the code to compare with")
    ap.add_argument("--repeats", type=int, default=3)
    opts = ap.parse_args()
    codes = {"new": REPO, **({"old": opts.compare} if opts.compare else {})}
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        run(
            REPO,
            [
                "train",
                "--task",
                str(EXAMPLES / "qa_task.toml"),
                "--tree",
                str(EXAMPLES / "qa_tree.json"),
                "--layers",
                "2",
                "--llm",
                "fake",
                "-o",
                str(work / "qa"),
                "--cache-dir",
                str(cache),
                "-q",
            ],
            work,
        )
        commands = {
            "report": lambda n: ["report", str(work / "qa"), "-q", "-o", str(work / f"report-{n}")],
            "apply": lambda n: [
                "apply",
                str(work / "qa"),
                str(EXAMPLES / "new_qa.jsonl"),
                "--llm",
                "fake",
                "--cache-dir",
                str(cache),
                "-q",
                "-o",
                str(work / f"scored-{n}.jsonl"),
            ],
            "check": lambda n: [
                "check",
                str(work / "qa"),
                "--data",
                str(EXAMPLES / "qa.jsonl"),
                "--llm",
                "fake",
                "--cache-dir",
                str(cache),
                "-q",
                "--min-spearman",
                "-1",
            ],
            "--help": lambda n: ["--help"],
        }
        n = 0
        for name, argv in commands.items():
            walls: dict[str, list[float]] = {k: [] for k in codes}
            cpus: dict[str, list[float]] = {k: [] for k in codes}
            loads = []
            for _ in range(opts.repeats):
                for which, code in codes.items():
                    n += 1
                    loads.append(load())
                    wall, cpu, _ = run(code, argv(n), work)
                    walls[which].append(wall)
                    cpus[which].append(cpu)
            print(f"{name}: load {min(loads)}-{max(loads)}", flush=True)
            for which, code in codes.items():
                n += 1
                seconds, most = import_summary(run(code, argv(n), work, importtime=True)[2])
                print(
                    f"  {which:4s} wall median {statistics.median(walls[which]):5.2f} s "
                    f"(runs {', '.join(f'{w:.1f}' for w in walls[which])}), CPU median "
                    f"{statistics.median(cpus[which]):5.2f} s; imports {seconds:.2f} s: "
                    + ", ".join(f"{k} {v:.2f}" for v, k in most),
                    flush=True,
                )


if __name__ == "__main__":
    main()
