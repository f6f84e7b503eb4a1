"""Peak memory of ``hdeval apply`` against the number of samples (issue #15 item 3).

Trains a small HD-Eval artifact on SummEval with the fake LLM, synthesises new inputs of N
samples (SummEval rows cycled, each output made unique so every sample is new work for the
LLM and its cache), and runs ``hdeval apply`` on each in its own process with a fresh cache,
reading that process's peak RSS from ``resource.getrusage(RUSAGE_CHILDREN)``. Memory is flat
when the peak does not grow with N (the ids seen for duplicate checks and the per-row numbers
of the closing correlations do grow, by a few hundred bytes per sample).

    HDEVAL_DATA_DIR=../shared/data python benchmarks/bench_apply_memory.py
    python benchmarks/bench_apply_memory.py --sizes 2000,20000 --layers 1 --format csv

``--code DIR`` runs another checkout's hdeval (e.g. the pre-streaming main) on the same
artifact and inputs, for a before/after table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Runs one command and prints the peak RSS (KiB on Linux) of it and its children.
PEAK = ("import resource, subprocess, sys\n"
        "rc = subprocess.run(sys.argv[1:]).returncode\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n")


def data_dir(explicit: str | None) -> Path:
    for cand in (explicit, os.environ.get("HDEVAL_DATA_DIR"), str(REPO.parent / "shared" / "data")):
        if cand and (Path(cand) / "summeval.jsonl").is_file():
            return Path(cand)
    sys.exit("no summeval.jsonl: pass --data-dir or set HDEVAL_DATA_DIR")


def synthesise(src: Path, dest: Path, n: int) -> None:
    """``n`` samples: SummEval rows in turn, each output suffixed so no two are alike."""
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    with dest.open("w", encoding="utf-8") as fh:
        for i in range(n):
            r = dict(rows[i % len(rows)])
            r["id"] = f"bench-{i}"
            r["doc_id"] = f"bench-doc-{i // 16}"
            r["output"] = f"{r['output']} (variant {i})"
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def hdeval(code: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from hdeval.cli import main; sys.argv[0] = 'hdeval'; main()", str(code), *args]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,100000", help="comma-separated sample counts")
    ap.add_argument("--layers", type=int, default=1, help="depth of the artifact's criteria tree")
    ap.add_argument("--limit", type=int, default=160, help="training samples")
    ap.add_argument("--format", default="jsonl", choices=["jsonl", "csv", "parquet"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--code", default=str(REPO), help="checkout whose hdeval runs apply (default: this one)")
    ap.add_argument("--workdir", default=None, help="keep the files here (default: a temp dir, removed)")
    args = ap.parse_args()
    src = data_dir(args.data_dir) / "summeval.jsonl"
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HDEVAL_DATA_DIR": str(src.parent), "HDEVAL_OFFLINE": "1"}
        env.pop("HDEVAL_LLM", None)
        art = work / "artifact"
        if not (art / "manifest.json").exists():
            t = time.monotonic()
            subprocess.run(hdeval(REPO, "train", "--task", "summeval", "--llm", "fake", "--layers",
                                  str(args.layers), "--limit", str(args.limit), "--aggregator", "lr", "-q",
                                  "--cache-dir", str(work / "train-cache"), "-o", str(art)),
                           check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"trained {art} ({args.layers} layer(s), {args.limit} samples) in {time.monotonic() - t:.0f} s")
        needed = len(json.loads((art / "manifest.json").read_text()).get("needed_criteria") or [])
        print(f"apply with {args.code}, output .{args.format}, fresh cache per run"
              + (f", {needed} LLM calls per sample" if needed else ""))
        print(f"{'samples':>9} {'peak RSS MB':>12} {'seconds':>8} {'samples/s':>10}")
        for n in sizes:
            data = work / f"input-{n}.jsonl"
            if not data.exists():
                synthesise(src, data, n)
            cache = work / f"cache-{n}"
            if cache.exists():
                shutil.rmtree(cache)  # this script's own cache of an earlier run: every call new again
            out = work / f"scored-{n}.{args.format}"
            t = time.monotonic()
            res = subprocess.run([sys.executable, "-c", PEAK,
                                  *hdeval(Path(args.code), "apply", str(art), str(data), "-o", str(out),
                                          "--llm", "fake", "--cache-dir", str(cache), "-q")],
                                 env=env, capture_output=True, text=True)
            wall = time.monotonic() - t
            kib, rc = res.stdout.split()[-2:]
            if rc != "0":
                print(res.stderr[-2000:], file=sys.stderr)
                sys.exit(f"apply on {n} samples failed (exit {rc})")
            print(f"{n:>9} {int(kib) / 1024:>12.0f} {wall:>8.0f} {n / wall:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
