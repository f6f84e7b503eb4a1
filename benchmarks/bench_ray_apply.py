"""``apply`` on Ray Data with N workers against a single-process ``hdeval apply`` (issue #23.4).

Trains a small HD-Eval artifact on SummEval with the fake LLM, synthesises an input of N
unique samples, then scores it, alternating, with ``hdeval apply`` (one process) and with
:func:`hdeval.integrations.ray.apply_on_ray` on a local Ray cluster (``ray.init(num_cpus=W)``,
started once), each run with a fresh cache so every call is new work. The single process is
``hdeval apply`` timed from start to exit (Python and hdeval's imports included); the Ray side
is ``apply_on_ray`` called in this process, the driver, timed from call to return (its workers
and read task start in each run; the cluster is not restarted, and hdeval is already imported
in the driver: a second driver process cannot connect where Ray binds a non-loopback address).

Printed per run, side by side: seconds per 1,000 samples and peak RSS of each, and their
ratios (single / Ray: above 1, Ray was faster or smaller), whether the two outputs are
byte-identical, and the load average (on a shared machine it decides the timings). Peak RSS:
the single process's from ``wait4`` (``ru_maxrss``); the Ray driver's and workers' (the
scoring actors and the read task) by polling ``/proc/PID/status`` every 0.2 s, each process's
highest ``VmRSS`` during the run, summed for the workers (an upper bound of their joint peak;
Ray's own daemons, raylet, GCS and the object store, are left out).

    python benchmarks/bench_ray_apply.py --help
    HDEVAL_DATA_DIR=../shared/data python benchmarks/bench_ray_apply.py --samples 2000
    python benchmarks/bench_ray_apply.py --samples 20000 --workers 2 --repeats 2

Measured 2026-11-24 on the shared 2-core machine with eight people's jobs running (load ~15:
the timings say nothing about a quiet machine; rerun there), 600 samples, batches of 200:

    run single s/1k  ray s/1k time single/ray single MB ray driver MB ray workers MB RSS single/ray identical
      1       21.88     47.23            0.46       317           322            846           0.27      True
      2       21.94     39.67            0.55       322           325            838           0.28      True

Again at load ~4.4 (still not quiet), the defaults (2000 samples, batches of 500):

      1        2.65      6.13            0.43       318           329            876           0.26      True

Each Ray worker holds Python, Ray and hdeval with the artifact loaded (~280 MB), so Ray's
memory is the driver plus about that per worker and the read task, whatever the input size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the titles Ray gives this job's processes: the scoring actors and the read task
RAY_TITLES = ("ArtifactScorer", "InputFile")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def data_dir(explicit: str | None) -> Path:
    for cand in (explicit, os.environ.get("HDEVAL_DATA_DIR"), str(REPO.parent / "shared" / "data")):
        if cand and (Path(cand) / "summeval.jsonl").is_file():
            return Path(cand)
    sys.exit("no summeval.jsonl: pass --data-dir or set HDEVAL_DATA_DIR (see `hdeval data download`)")


def synthesise(src: Path, dest: Path, n: int) -> None:
    """``n`` samples: SummEval rows in turn, each output suffixed so no two are alike."""
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    with dest.open("w", encoding="utf-8") as fh:
        for i in range(n):
            r = dict(rows[i % len(rows)])
            r["id"], r["doc_id"] = f"bench-{i}", f"bench-doc-{i // 16}"
            r["output"] = f"{r['output']} (variant {i})"
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def hdeval(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from hdeval.cli import main; sys.argv[0] = 'hdeval'; main()", str(REPO), *args]


def _vm_rss_kib(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class RayWorkersPeak:
    """Each of this job's Ray worker processes' highest RSS while it ran the job (by title)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.driver = 0  # this process's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        title = fh.read(200).decode(errors="replace")
                except OSError:
                    continue
                if title.startswith("ray::") and any(t in title for t in RAY_TITLES):
                    self.peaks[pid] = max(self.peaks.get(pid, 0), _vm_rss_kib(pid))
            self.driver = max(self.driver, _vm_rss_kib(str(os.getpid())))
            self._stop.wait(0.2)

    def __enter__(self) -> "RayWorkersPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def total_kib(self) -> int:
        return sum(self.peaks.values())


def timed(cmd: list[str], env: dict) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of ``cmd`` run to its end; its stderr shown if it fails."""
    t = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - t
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            sys.exit(f"failed: {' '.join(cmd[-8:])}\n{err.read().decode(errors='replace')[-2000:]}")
    return seconds, usage.ru_maxrss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000, help="samples in the input (default 2000)")
    ap.add_argument("--workers", type=int, default=2, help="Ray workers, and the local cluster's CPUs")
    ap.add_argument("--batch-size", type=int, default=500, help="samples per Ray batch")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each, alternating")
    ap.add_argument("--layers", type=int, default=1, help="depth of the artifact's criteria tree")
    ap.add_argument("--limit", type=int, default=160, help="training samples")
    ap.add_argument("--data-dir", default=None, help="holding summeval.jsonl (default: HDEVAL_DATA_DIR)")
    args = ap.parse_args()
    for name in ("samples", "workers", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        import ray
    except ImportError:
        sys.exit('this benchmark needs the ray extra: pip install -e ".[ray]"')

    src = data_dir(args.data_dir) / "summeval.jsonl"
    env = {**os.environ, "HDEVAL_DATA_DIR": str(src.parent), "HDEVAL_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("HDEVAL_LLM", None)
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        work = Path(tmp)
        art = work / "artifact"
        timed(hdeval("train", "--task", "summeval", "--llm", "fake", "--layers", str(args.layers),
                     "--limit", str(args.limit), "--aggregator", "lr", "-q", "--cache-dir",
                     str(work / "train-cache"), "-o", str(art)), env)
        data = work / "input.jsonl"
        synthesise(src, data, args.samples)
        os.environ["HDEVAL_OFFLINE"] = "1"
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "HDEVAL_OFFLINE": "1"}})
        sys.path.insert(0, str(REPO))
        from hdeval.integrations.ray import apply_on_ray

        # the table only: Ray Data's progress lines would interleave with it
        ray.data.DataContext.get_current().enable_progress_bars = False
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.WARNING)

        def on_ray(name: str, inp: Path) -> tuple[float, int, int]:
            with RayWorkersPeak() as peak:
                t = time.monotonic()
                apply_on_ray(art, inp, str(work / f"{name}.jsonl"), workers=args.workers,
                             batch_size=args.batch_size, cache_dir=str(work / f"{name}-cache"))
                seconds = time.monotonic() - t
            return seconds, peak.driver, peak.total_kib

        warm = work / "warm-input.jsonl"  # untimed: the first run on a cluster starts its worker pool
        synthesise(src, warm, min(args.samples, 200))
        on_ray("warm", warm)
        print(f"{args.samples} samples, fake LLM, {args.layers}-layer SummEval artifact; Ray: {args.workers} "
              f"workers on a local {args.workers}-CPU cluster, batches of {args.batch_size}; "
              f"load average before: {load()}")
        print("seconds per 1k samples, and peak RSS in MB (Ray: driver + workers)")
        head = (f"{'run':>3} {'single s/1k':>11} {'ray s/1k':>9} {'time single/ray':>15} {'single MB':>9} "
                f"{'ray driver MB':>13} {'ray workers MB':>14} {'RSS single/ray':>14} {'identical':>9} "
                f"{'load (1/5/15 min)':>18}")
        print(head)
        per = 1000 / args.samples
        for k in range(args.repeats):
            for d in ("one-cache", "ray-cache"):
                shutil.rmtree(work / d, ignore_errors=True)
            one, one_kib = timed(hdeval("apply", str(art), str(data), "-o", str(work / "one.jsonl"),
                                        "--cache-dir", str(work / "one-cache"), "-q"), env)
            two, driver_kib, workers_kib = on_ray("ray", data)
            same = (work / "one.jsonl").read_bytes() == (work / "ray.jsonl").read_bytes()
            ray_kib = driver_kib + workers_kib
            print(f"{k + 1:>3} {one * per:>11.2f} {two * per:>9.2f} {one / two:>15.2f} {one_kib / 1024:>9.0f} "
                  f"{driver_kib / 1024:>13.0f} {workers_kib / 1024:>14.0f} "
                  f"{(one_kib / ray_kib if ray_kib else float('nan')):>14.2f} {str(same):>9} {load():>18}",
                  flush=True)
        ray.shutdown()


if __name__ == "__main__":
    main()
