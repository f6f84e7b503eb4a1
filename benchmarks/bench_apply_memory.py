"""Peak memory, time and cache size of ``hdeval apply`` against the number of samples
(issues #15 item 3 and #23 items 3-4).

Trains a small HD-Eval artifact on SummEval with the fake LLM, synthesises new inputs of N
samples (SummEval rows cycled, each output made unique so every sample is new work for the
LLM and its cache), and runs ``hdeval apply`` on each in its own process with a fresh cache.
For each run it prints the peak RSS (``wait4``'s ``ru_maxrss``), the peaks of its anonymous
and file-backed parts (``/proc/PID/status`` polled every 0.1 s: file-backed pages are SQLite's
memory map of the cache database), milliseconds per 1k samples, and the cache's bytes per
sample; then, per checkout, how much each figure grew from the smallest size to the largest.

    HDEVAL_DATA_DIR=../shared/data python benchmarks/bench_apply_memory.py   # 20k and 200k
    python benchmarks/bench_apply_memory.py --million   # 1M as well (~3 h on a 2-core machine)
    python benchmarks/bench_apply_memory.py --sizes 2000,20000 --layers 1 --format csv

``--code DIR[,DIR...]`` runs other checkouts' hdeval (e.g. ``git archive`` of the commit
before a change) on the same artifact and inputs, interleaved per size: a before/after table
from one invocation, under the same load.
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



def _status_kib(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    return out


def measure(cmd: list[str], env: dict) -> tuple[int, float, int, int, int, str]:
    """(exit code, seconds, peak RSS, peak anonymous RSS, peak file-backed RSS (KiB), stderr)."""
    t = time.monotonic()
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    anon = file = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        got = _status_kib(proc.pid)
        anon, file = max(anon, got.get("RssAnon", 0)), max(file, got.get("RssFile", 0))
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    return proc.returncode, time.monotonic() - t, usage.ru_maxrss, anon, file, err.read().decode(errors="replace")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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
    ap.add_argument("--sizes", default="20000,200000", help="comma-separated sample counts")
    ap.add_argument("--million", action="store_true", help="also 1,000,000 samples")
    ap.add_argument("--layers", type=int, default=1, help="depth of the artifact's criteria tree")
    ap.add_argument("--limit", type=int, default=160, help="training samples")
    ap.add_argument("--format", default="jsonl", choices=["jsonl", "csv", "parquet"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--code", default=str(REPO),
                    help="checkout(s) whose hdeval runs apply, comma-separated (default: this one)")
    ap.add_argument("--workdir", default=None, help="keep the files here (default: a temp dir, removed)")
    args = ap.parse_args()
    src = data_dir(args.data_dir) / "summeval.jsonl"
    sizes = [int(s) for s in args.sizes.split(",")] + ([1_000_000] if args.million else [])
    codes = [Path(c) for c in args.code.split(",")]
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
        print(f"apply, output .{args.format}, fresh cache per run"
              + (f", {needed} LLM calls per sample" if needed else "") + f"; load: {os.getloadavg()}")
        print(f"{'code':<28} {'samples':>9} {'peak RSS MB':>12} {'anon MB':>8} {'file MB':>8} {'ms/1k':>7} "
              f"{'cache B/sample':>15}")
        rows: dict[Path, list[tuple[int, float, float, float]]] = {code: [] for code in codes}
        for n in sizes:
            data = work / f"input-{n}.jsonl"
            if not data.exists():
                synthesise(src, data, n)
            for code in codes:
                cache = work / f"cache-{n}"
                if cache.exists():
                    shutil.rmtree(cache)  # this script's own cache of an earlier run: every call new again
                out = work / f"scored-{n}.{args.format}"
                rc, wall, peak, anon, file, err = measure(
                    hdeval(code, "apply", str(art), str(data), "-o", str(out), "--llm", "fake",
                           "--cache-dir", str(cache), "-q"), env)
                if rc != 0:
                    print(err[-2000:], file=sys.stderr)
                    sys.exit(f"apply on {n} samples with {code} failed (exit {rc})")
                print(f"{str(code)[-28:]:<28} {n:>9} {peak / 1024:>12.1f} {anon / 1024:>8.1f} {file / 1024:>8.1f} "
                      f"{1e6 * wall / n:>7.0f} {dir_bytes(cache) / n:>15.0f}", flush=True)
                rows[code].append((n, peak / 1024, anon / 1024, file / 1024))
                shutil.rmtree(cache)
        if len(sizes) > 1:
            for code, got in rows.items():
                (n0, *first), (n1, *last) = got[0], got[-1]
                grew = ", ".join(f"{what} {b - a:+.1f} MB" for what, a, b in zip(("peak RSS", "anon", "file"), first, last))
                print(f"{str(code)[-28:]}: {n0} -> {n1} samples: {grew}")
        print(f"load at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
