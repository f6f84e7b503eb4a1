"""How long ``hdeval estimate`` takes on an ``apply`` output of 100,000 rows with 50 labelled
(issue #35: under 5 s).

Trains HD-Eval (1 layer, lr) on the toy task with the fake LLM, applies it to 120 new rows, then
repeats those output rows (new ids, two systems) up to ``--rows``, keeping the human scores on
``--labelled`` of them, and times the command as a user runs it (a new process: imports,
artifact check, reading, the estimate), a few times, with the load average and the CPU time
it used (on a shared machine the wall time mostly measures the others' load).

    python benchmarks/bench_estimate_speed.py --rows 100000 --labelled 50

Figures: benchmarks/ppi.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def hdeval(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hdeval.cli", *map(str, args)], capture_output=True, text=True,
                          check=False)


def main() -> None:
    from conftest import TOY_TASK, toy_rows

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--labelled", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "task.toml").write_text(TOY_TASK, encoding="utf-8")
        (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
        new = toy_rows(n_docs=40, per_doc=3)
        for i, row in enumerate(new):
            row.update(id=f"new-{i}", doc_id=f"new-doc-{i // 3}")
        (d / "new.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new), encoding="utf-8")
        for step in (("train", "--task", d / "task.toml", "--data", d / "train.jsonl", "--layers", "1",
                      "--aggregator", "lr", "--llm", "fake", "--cache-dir", d / "c", "-o", d / "art", "-q"),
                     ("apply", d / "art", d / "new.jsonl", "--llm", "fake", "--cache-dir", d / "c", "-o",
                      d / "scored.jsonl", "-q")):
            r = hdeval(*step)
            if r.returncode:
                sys.exit(r.stderr)
        template = [json.loads(line) for line in (d / "scored.jsonl").read_text().splitlines()]
        big = d / "big.jsonl"
        with open(big, "w", encoding="utf-8") as fh:
            for i in range(args.rows):
                row = dict(template[i % len(template)], id=f"row-{i}", system="A" if i % 2 else "B")
                if i >= args.labelled:
                    row.pop("human", None)
                fh.write(json.dumps(row) + "\n")
        size = big.stat().st_size
        print(f"{args.rows} rows ({size / 1e6:.1f} MB), {args.labelled} labelled; "
              f"{len(template[0].get('criteria', {}))} criteria per row")
        for extra in ((), ("--by", "system"), ("--json",)):
            for _ in range(args.runs):
                load = os.getloadavg()[0]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                r = hdeval("estimate", d / "art", "--data", big, *extra)
                took = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                if r.returncode:
                    sys.exit(r.stderr)
                print(f"hdeval estimate {' '.join(extra) or '(table)'}: {took:.2f} s wall, {cpu:.2f} s CPU "
                      f"(load average {load:.2f})", flush=True)
        print(r.stdout if extra != ("--json",) else r.stdout.splitlines()[0])


if __name__ == "__main__":
    main()
