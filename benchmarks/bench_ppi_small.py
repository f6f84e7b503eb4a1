"""Coverage of the two PPI++ intervals ``bench_ppi_coverage.py`` leaves at few labels (issue #35
follow-up): the difference of two groups (``hdeval estimate --by``) and labels drawn with
unequal probabilities and weighted back (``sampling_prob``).

Same populations and simulated evaluator as ``bench_ppi_coverage.py`` (the human scores of
SFHOT and Topical-Chat drawn with replacement, so the truth is the data set's mean; the
evaluator's shared error set for a held-out Spearman of 0.6, criterion noise 0.3 sd, slope 0.8,
0.3 sd high).

- Difference: two "systems" on disjoint rows, one an aspect's scores and the other the second
  aspect's of the same data set (SFHOT quality - informativeness, Topical-Chat overall -
  engagingness), each with ``n`` labelled and ``--unlabelled`` unlabelled rows and its own
  evaluator; the truth is the difference of the two data-set means.
- Weighted: as ``bench_ppi_coverage.py``'s second table (``p ~ exp(0.5 z)`` of the evaluator's
  z-score, Poisson sampling with ``n`` labels expected).

    python benchmarks/bench_ppi_small.py --reps 1000
    python benchmarks/bench_ppi_small.py --reps 200 --only difference   # quicker

Figures and load average: benchmarks/ppi.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ppi_coverage import ASPECTS, NOISE, RANGES, SHIFT, SLOPE, evaluator, human_scores, shared_for  # noqa: E402

from hdeval.learn.ppi import difference, ppi_mean  # noqa: E402


def run_difference(a, b, n, N, reps, rng):
    """Coverage of the difference's interval (and the classical one) and their mean widths."""
    (pop_a, range_a, shared_a), (pop_b, range_b, shared_b) = a, b
    truth = pop_a.mean() - pop_b.mean()
    hits = hits_classical = 0
    width, width_classical = [], []
    for _ in range(reps):
        ya, yb = rng.choice(pop_a, n + N), rng.choice(pop_b, n + N)
        fa, fb = evaluator(ya, pop_a, shared_a, rng, range_a), evaluator(yb, pop_b, shared_b, rng, range_b)
        d = difference(ppi_mean(ya[:n], fa[:n], fa[n:]), ppi_mean(yb[:n], fb[:n], fb[n:]))
        hits += d.low <= truth <= d.high
        hits_classical += d.classical_low <= truth <= d.classical_high
        width.append(d.high - d.low)
        width_classical.append(d.classical_high - d.classical_low)
    return hits / reps, hits_classical / reps, float(np.mean(width)), float(np.mean(width_classical))


def run_weighted(pop, rng_range, shared, n, N, reps, rng):
    """As ``bench_ppi_coverage.run(weighted=True)``, without its unweighted comparison."""
    truth = pop.mean()
    hits = hits_classical = 0
    ratio = []
    for _ in range(reps):
        y = rng.choice(pop, n + N)
        f = evaluator(y, pop, shared, rng, rng_range)
        z = (f - f.mean()) / f.std()
        p = np.clip(n / (n + N) * np.exp(0.5 * z) / np.exp(0.5 * z).mean(), 1e-4, 1)
        lab = rng.random(n + N) < p
        e = ppi_mean(y[lab], f[lab], f[~lab], sampling_prob=p[lab])
        hits += e.low <= truth <= e.high
        hits_classical += e.classical_low <= truth <= e.classical_high
        ratio.append((e.high - e.low) / (e.classical_high - e.classical_low))
    return {"coverage": hits / reps, "classical": hits_classical / reps, "width_ratio": float(np.mean(ratio))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", default="30,50,100")
    ap.add_argument("--unlabelled", type=int, default=5000)
    ap.add_argument("--spearman", type=float, default=0.6)
    ap.add_argument("--only", choices=("difference", "weighted"), default=None)
    ap.add_argument("--datasets", default="sfhot,topical_chat")
    args = ap.parse_args()
    start = time.time()
    ns = [int(x) for x in args.n.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.reps} repetitions per cell, "
          f"{args.unlabelled} unlabelled rows (per group); evaluator Spearman {args.spearman}, shift {SHIFT} sd, "
          f"slope {SLOPE}, criterion noise {NOISE} sd; nominal 90%", flush=True)
    cells = {}
    for name in args.datasets.split(","):
        for aspect in ASPECTS[name]:
            pop = human_scores(name, aspect)
            cells[(name, aspect)] = (pop, RANGES[aspect], shared_for(args.spearman, pop, RANGES[aspect]))
    rng = np.random.default_rng(45)
    if args.only in (None, "difference"):
        print("\n| data set | difference | n labelled per group | PPI++ coverage | classical coverage | "
              "PPI++ width | classical width |")
        print("|---|---|---|---|---|---|---|")
        for name in args.datasets.split(","):
            first, second = ASPECTS[name]
            for n in ns:
                cov, cov_c, w, w_c = run_difference(cells[(name, first)], cells[(name, second)], n,
                                                     args.unlabelled, args.reps, rng)
                print(f"| {name} | {first} - {second} | {n} | {cov:.3f} | {cov_c:.3f} | {w:.3f} | {w_c:.3f} |",
                      flush=True)
    if args.only in (None, "weighted"):
        print("\n| data set | aspect | n labelled (expected) | weighted PPI++ coverage | weighted classical | "
              "width / classical |")
        print("|---|---|---|---|---|---|")
        for (name, aspect), (pop, rng_range, shared) in cells.items():
            for n in ns:
                r = run_weighted(pop, rng_range, shared, n, args.unlabelled, args.reps, rng)
                print(f"| {name} | {aspect} | {n} | {r['coverage']:.3f} | {r['classical']:.3f} | "
                      f"{r['width_ratio']:.2f} |", flush=True)
    print(f"\n{time.time() - start:.0f} s; load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
