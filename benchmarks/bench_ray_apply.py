"""``apply`` on Ray Data with N workers against a single-process ``hdeval apply`` (issue #23.4).

Trains a small HD-Eval artifact on SummEval with the fake LLM, synthesises an input of N
unique samples, then scores it, alternating, with ``hdeval apply`` (one process) and with
:func:`hdeval.integrations.ray.apply_on_ray` on a local Ray cluster (``ray.init(num_cpus=W)``),
each run with a fresh cache so every call is new work. Prints seconds per 1,000 samples of
each, their ratio, whether the two outputs are byte-identical, and the load average, which
matters on a shared machine.

    HDEVAL_DATA_DIR=../shared/data python benchmarks/bench_ray_apply.py
    python benchmarks/bench_ray_apply.py --samples 4000 --workers 2 --repeats 2

Measured 2026-11-23 on the shared 2-core machine (1-layer SummEval artifact, 4 calls per
sample), with eight people's jobs running, so no core was ever idle for a second worker:

    samples  batch  single s/1k  ray s/1k  single/ray  identical  load (1/5/15 min)
       2000    500         7.68     12.14        0.63       True  13.32 12.22 11.08
       2000    500         8.71     12.02        0.72       True  16.06 13.04 11.41
       6000   1000         5.64      7.97        0.71       True  19.52 15.62 12.92

Ray's time includes starting its two workers and loading the artifact in each (every run
makes a new actor pool); the overhead shrinks per 1k samples as the input grows. Whether two
workers beat one process needs cores that are free: rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_apply_memory import REPO, data_dir, hdeval, synthesise  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each, alternating")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--limit", type=int, default=160, help="training samples")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    import ray

    src = data_dir(args.data_dir) / "summeval.jsonl"
    env = {**os.environ, "HDEVAL_DATA_DIR": str(src.parent), "HDEVAL_OFFLINE": "1"}
    env.pop("HDEVAL_LLM", None)
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        work = Path(tmp)
        art = work / "artifact"
        subprocess.run(hdeval(REPO, "train", "--task", "summeval", "--llm", "fake", "--layers", str(args.layers),
                              "--limit", str(args.limit), "--aggregator", "lr", "-q", "--cache-dir",
                              str(work / "train-cache"), "-o", str(art)),
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        data = work / "input.jsonl"
        synthesise(src, data, args.samples)
        os.environ["HDEVAL_OFFLINE"] = "1"
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "HDEVAL_OFFLINE": "1"}})
        from hdeval.integrations.ray import apply_on_ray

        # one untimed Ray run: workers start and import hdeval once per cluster
        apply_on_ray(art, data, str(work / "warm.jsonl"), workers=args.workers, batch_size=args.batch_size,
                     cache_dir=str(work / "warm-cache"))
        print(f"{args.samples} samples, fake LLM, {args.workers} Ray workers, batches of {args.batch_size}; "
              f"load average before: {load()}")
        print(f"{'run':>4} {'single s/1k':>12} {'ray s/1k':>10} {'single/ray':>11} {'identical':>10} {'load (1/5/15 min)':>20}")
        for k in range(args.repeats):
            for d in ("c1", "c2"):
                shutil.rmtree(work / d, ignore_errors=True)
            t = time.monotonic()
            subprocess.run(hdeval(REPO, "apply", str(art), str(data), "-o", str(work / "one.jsonl"),
                                  "--cache-dir", str(work / "c1"), "-q"),
                           check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            one = time.monotonic() - t
            t = time.monotonic()
            apply_on_ray(art, data, str(work / "ray.jsonl"), workers=args.workers, batch_size=args.batch_size,
                         cache_dir=str(work / "c2"))
            on_ray = time.monotonic() - t
            same = (work / "one.jsonl").read_bytes() == (work / "ray.jsonl").read_bytes()
            per = 1000 / args.samples
            print(f"{k + 1:>4} {one * per:>12.2f} {on_ray * per:>10.2f} {one / on_ray:>11.2f} {str(same):>10} "
                  f"{load():>20}", flush=True)
        ray.shutdown()


if __name__ == "__main__":
    main()
