"""PairEval's analyses on a dataset slice (Park et al., 2024, Tables 2, 3 and 5).

For N in {1, 3, 5} comparison examples, drawn at random from the training split ("Random") or
from the test split itself ("Test"), with and without the position swap, PairEval is fitted over
``--draws`` seeded draws of the comparison examples (the split stays fixed) and the held-out
correlations are averaged: mean and std over the draws (Table 2), N and the example type
(Table 3), swap on/off (Table 5). ``direct`` is the paper's prediction (an aspect's own win
probability); ``final`` is hdeval's learned aggregator over the columns. Every reply is cached, so
a rerun (or a larger N after a smaller one) only pays for new pairs.

    python benchmarks/bench_paireval.py --task topical_chat --limit 84             # fake LLM
    python benchmarks/bench_paireval.py --task convai2_usr --llm gpt-4o-mini --limit 100

Data: ``$HDEVAL_DATA_DIR`` or ``--data``. With the fake LLM the numbers mean nothing (its
preferences are a function of text length and word overlap): the run only exercises the code.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hdeval.core.progress import Progress
from hdeval.methods.base import FitContext
from hdeval.methods.comparisons import draw_comparisons
from hdeval.methods.paireval.fit import fit_with_pool
from hdeval.run.train import TrainConfig, llm_config, open_backend, prepare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="topical_chat")
    ap.add_argument("--data", default=None, help="samples JSONL (default: the task's file in HDEVAL_DATA_DIR)")
    ap.add_argument("--aspects", default=None,
                    help="comma-separated aspects (default: 'overall' when the task has it, the paper's setting)")
    ap.add_argument("--llm", default="fake")
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--limit", type=int, default=84, help="samples (whole conversations, seeded)")
    ap.add_argument("--draws", type=int, default=5, help="draws of comparison examples per setting")
    ap.add_argument("--ns", default="1,3,5", help="numbers of comparison examples")
    ap.add_argument("--aggregator", default="lr")
    ap.add_argument("--seed", type=int, default=0, help="the split's seed (draw k uses seed + 1000 + k)")
    args = ap.parse_args(argv)

    from hdeval.data.tasks import load_task

    aspects = args.aspects
    if aspects is None and "overall" in load_task(args.task).aspect_keys:
        aspects = "overall"
    base = TrainConfig.from_options(task=args.task, data=args.data, aspects=aspects, llm=args.llm,
                                    base_url=args.base_url, cache_dir=args.cache_dir, limit=args.limit,
                                    aggregator=args.aggregator, seed=args.seed, method="paireval")
    prep = prepare(base)
    by_id = {s.id: s for s in prep.samples}
    pools = {"Random": [by_id[i] for i in prep.split.train_ids], "Test": [by_id[i] for i in prep.split.test_ids]}
    ns = [int(x) for x in args.ns.split(",")]
    llm = open_backend(base)
    fake = llm.identity.startswith("fake")
    print(f"PairEval benchmark: task {prep.task.name}, aspects {', '.join(prep.task.aspect_keys)}, "
          f"{len(prep.samples)} samples ({len(prep.split.train_ids)} train, {len(prep.split.test_ids)} test), "
          f"LLM {llm.identity}, {args.draws} draws per setting, held-out Spearman (mean +- std over draws)")
    if fake:
        print("NOTE: the fake LLM's preferences are a function of text length and word overlap; "
              "these numbers mean nothing about PairEval, they only show the benchmark runs.")
    header = f"{'N':>2}  {'examples':<8}  {'swap':<4}  {'direct':>15}  {'final':>15}  {'consistency':>11}  {'bias':>6}"
    print(header)
    print("-" * len(header))
    try:
        for n in ns:
            for kind, pool_samples in pools.items():
                for swap in (True, False):
                    direct, final, cons, bias = [], [], [], []
                    for k in range(args.draws):
                        try:
                            pool = draw_comparisons(pool_samples, n, args.seed + 1000 + k, prep.task,
                                                    f"the {kind} pool", own_docs=True)
                        except Exception as exc:  # too few conversations for this N
                            print(f"{n:>2}  {kind:<8}  {'on' if swap else 'off':<4}  skipped: {exc}")
                            break
                        ctx = FitContext(base, prep, llm, llm_config(base), Progress())
                        ev = fit_with_pool(ctx, pool, n, swap, kind.lower())
                        m = ev.metrics
                        direct.append(m["direct"]["average"]["spearman"])
                        final.append(m["final"]["average"]["spearman"])
                        cons.append(m["position_consistency"])
                        bias.append(m["position_bias"])
                    else:
                        print(f"{n:>2}  {kind:<8}  {'on' if swap else 'off':<4}  {_ms(direct):>15}  "
                              f"{_ms(final):>15}  {_mean(cons):>11}  {_mean(bias):>6}")
    finally:
        u = llm.stats
        llm.close()
    print(f"LLM calls made: {u.calls}, cache hits: {u.hits}")
    if fake:
        print("(fake LLM: the correlations above are meaningless)")
    return 0


def _ms(xs) -> str:
    vals = [x for x in xs if x is not None]
    if not vals:
        return "n/a"
    return f"{np.mean(vals):.3f} +- {np.std(vals):.3f}"


def _mean(xs) -> str:
    vals = [x for x in xs if x is not None]
    return f"{np.mean(vals):.3f}" if vals else "-"


if __name__ == "__main__":
    sys.exit(main())
