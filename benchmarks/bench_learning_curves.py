"""Labels needed to reach 95% of full-label held-out agreement, per selection strategy (issue #35).

On SFHOT and Topical-Chat's real human scores (``HDEVAL_DATA_DIR``), the simulated judge of
``tests/simcriteria.py`` makes the criterion-score matrix (no LLM); 30% of the documents are
held out. :func:`hdeval.benchmark.curves.simulate` then labels the training pool from nothing,
one strategy at a time, re-fits the aggregator at each budget and scores the held-out documents.
Printed as a Markdown table with the judge's settings and the load average:

    HDEVAL_DATA_DIR=../shared/data python benchmarks/bench_learning_curves.py --repeats 10 \\
        > benchmarks/bench_learning_curves.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

DATASETS = ("sfhot", "topical_chat")


def main() -> None:
    from simcriteria import Judge, criteria_sheet, load_human
    from sklearn.model_selection import GroupShuffleSplit

    from hdeval.benchmark.curves import CurveSpec, simulate, summarise
    from hdeval.core.metrics import average_spearman
    from hdeval.learn.aggregate import Aggregator

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--budgets", default="10,20,30,50,75,100,150,200,250")
    ap.add_argument("--selection", default="random,uncertainty,diversity,hybrid")
    ap.add_argument("--aggregator", default="lr")
    ap.add_argument("--judge-seed", type=int, default=0)
    args = ap.parse_args()
    judge = Judge()
    spec = CurveSpec(tuple(int(b) for b in args.budgets.split(",")), tuple(args.selection.split(",")),
                     args.repeats, args.aggregator)
    def estimate(values):
        v = [np.inf if x is None else x for x in values]
        m = float(np.median(v))
        return "cannot tell" if not np.isfinite(m) else f"{m:g}"

    start = time.perf_counter()
    print("# Labels needed to reach 95% of full-label agreement\n")
    print(f"Judge: {judge.describe()} (tests/simcriteria.py, judge seed {args.judge_seed}). "
          f"Aggregator {spec.aggregator} re-fitted at each budget; picks in batches of 5; "
          f"{spec.repeats} repeats per strategy; 30% of documents held out.\n")
    for name in DATASETS:
        human = load_human(name)
        if human is None:
            print(f"## {name}\n\nskipped: {name}.jsonl not in HDEVAL_DATA_DIR\n")
            continue
        sheet = criteria_sheet(human.scores, judge, seed=args.judge_seed)
        X, direct = sheet.scores, sheet.direct
        # what train builds: each aspect's columns (its direct one first), read by direct and aspect_mean
        columns = [[i for i, a in enumerate(sheet.aspect) if a == k] for k in range(human.scores.shape[1])]
        template = Aggregator("lr", ranges=list(human.ranges), aspect_columns=columns)
        tr, te = next(GroupShuffleSplit(1, test_size=0.3, random_state=args.judge_seed)
                      .split(X, groups=human.groups))
        direct_rho = average_spearman(human.scores[te], X[te][:, direct])
        res = simulate(X, human.scores, human.groups, tr, te, spec, ranges=list(human.ranges), template=template)
        full = res["full_label"]
        s = summarise(res)
        print(f"## {name}\n")
        print(f"{len(tr)} training rows, {len(te)} held-out rows, {X.shape[1]} criteria. Held-out average "
              f"Spearman: direct (layer-1 criteria) {direct_rho:.3f}; aggregator on all {len(tr)} labels "
              f"{full:.3f} (gain {full - direct_rho:+.3f}); 95% of it: {0.95 * full:.3f}.\n")
        budgets = res["budgets"]
        print("| strategy | " + " | ".join(f"{b} labels" for b in budgets)
              + " | labels to 95% (median [90% CI]) | repeats that reached it | a + b log n estimate (median) |")
        print("|---|" + "---|" * len(budgets) + "---|---|---|")
        for strat, row in s["strategies"].items():
            cells = []
            for b in budgets:
                p = row["points"][str(b)]
                cells.append("n/a" if p["mean"] is None else f"{p['mean']:.3f} ({p['low']:.2f}-{p['high']:.2f})")

            def fmt(x):
                return f">{budgets[-1]}" if x is None else f"{x:g}"

            print(f"| {strat} | " + " | ".join(cells) + f" | {fmt(row['labels_needed'])} "
                  f"[{fmt(row['labels_needed_low'])}, {fmt(row['labels_needed_high'])}] | {row['reached']:.0%} | "
                  f"{estimate(res['estimated'][strat])} |")
        print()
        rnd = s["strategies"].get("random", {}).get("labels_needed")
        for strat, row in s["strategies"].items():
            if strat != "random" and rnd and row["labels_needed"]:
                print(f"- {strat}: {1 - row['labels_needed'] / rnd:+.0%} labels against random "
                      "(positive: fewer)")
        print()
    print(f"Cells: mean held-out average Spearman over repeats (5th-95th percentile). "
          f"Took {time.perf_counter() - start:.0f} s, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
