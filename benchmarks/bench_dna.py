"""Decompose and Aggregate vs its same-LLM baselines on a slice of a pairwise task.

Trains ``--method dna`` in each mode (dna with the LLM's weights, direct, cot, and the learned
aggregation of dna's aspect scores) on the same seeded split and prints the held-out agreement with
the human labels without and with ties (the DnA paper's two numbers), the failure rate and the
LLM calls. Every reply is cached, so the modes share what they can (dna and learned use the same
calls) and a rerun is free.

    python benchmarks/bench_dna.py --task faireval                      # fake LLM: numbers mean nothing
    python benchmarks/bench_dna.py --task llmbar --limit 120 --llm gpt-4o-mini --swap

Data: ``$HDEVAL_DATA_DIR`` or ``--data-dir`` (default: ``../shared/data`` next to the repo).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from hdeval.core.errors import HdevalError
from hdeval.run.train import train

REPO = Path(__file__).resolve().parents[1]


def run(args: argparse.Namespace) -> list[tuple[str, dict]]:
    rows = []
    for mode in ("dna", "direct", "cot"):
        options = {"dna_mode": mode, "swap": args.swap} | (
            {} if args.tie_margin is None else {"tie_margin": args.tie_margin})
        ev = train(task=args.task, method="dna", llm=args.llm, base_url=args.base_url, limit=args.limit,
                   seed=args.seed, cache_dir=args.cache_dir, method_options=options)
        m = ev.metrics
        extra = {"failure_rate": m["failure_rate"], "calls": m["usage"].get("calls", 0),
                 "position_consistency": m.get("position_consistency")}
        rows.append((mode, {**m["test"][m["primary"]], **extra}))
        if mode == "dna" and "learned" in m["test"]:
            rows.append(("learned", {**m["test"]["learned"], **extra, "calls": 0}))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="faireval")
    ap.add_argument("--llm", default="fake")
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--limit", type=int, default=None, help="pairs (whole documents, seeded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--swap", action="store_true")
    ap.add_argument("--tie-margin", type=float, default=None, help="default: learned on the training split")
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temporary directory")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    data_dir = args.data_dir or os.environ.get("HDEVAL_DATA_DIR") or str(REPO.parent / "shared" / "data")
    os.environ["HDEVAL_DATA_DIR"] = data_dir
    tmp = None
    if args.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-dna-")
        args.cache_dir = tmp.name
    try:
        rows = run(args)
    except HdevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"task {args.task}, LLM {args.llm}, limit {args.limit or 'all'}, seed {args.seed}, "
          f"swap {args.swap}, tie margin {'learned' if args.tie_margin is None else args.tie_margin}: "
          "held-out agreement with human labels")
    if args.llm.startswith("fake"):
        print("NOTE: the fake LLM answers from text features and hashes; these numbers mean nothing "
              "about any real judge (they only show the pipeline runs).")
    print(f"{'method':<8} {'w/o ties':>9} {'w/ ties':>8} {'n':>4} {'failed':>6} {'pos.cons':>8} {'calls':>6}")
    for name, r in rows:
        pc = "-" if r["position_consistency"] is None else f"{r['position_consistency']:.3f}"
        wo = "-" if r["wo_ties"] is None else f"{r['wo_ties']:.3f}"
        w = "-" if r["w_ties"] is None else f"{r['w_ties']:.3f}"
        print(f"{name:<8} {wo:>9} {w:>8} {r['n']:>4} {r['failed']:>6} {pc:>8} {r['calls']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
