"""Coverage and width of the PPI++ interval of a human mean (issue #35 item 4), by simulation on
the human scores of SFHOT and Topical-Chat.

Each repetition draws ``n_labelled + n_unlabelled`` rows with replacement from a data set's
human scores (so the true mean is the data set's mean), gives every row a simulated
evaluator's score and keeps the human scores of the first ``n_labelled`` rows, then asks
whether the nominal 90% interval covers the true mean, and how wide it is against the classical
interval from the labelled rows alone.

The simulated evaluator reads the human score with an error shared by all its criteria (it
misreads the sample) plus criterion noise, then maps it onto the scale with a shrink and a shift,
as a fitted aggregator does: ``f = mean + shift * sd + slope * (y - mean + sd * (shared * e1 +
noise * e2))``, clipped to the aspect's range. ``shared`` is scaled to reach each target
held-out Spearman (measured on 20,000 fresh rows). The settings are printed beside each figure.

A second table draws the labels with unequal probabilities (rows the evaluator scores high are
labelled more, as an active strategy would) and checks the inverse-probability-weighted
estimate (``sampling_prob``) against the unweighted one, which is then biased.

    python benchmarks/bench_ppi_coverage.py --reps 1000
    python benchmarks/bench_ppi_coverage.py --reps 200 --datasets sfhot   # quicker

Figures and load average: benchmarks/ppi.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from hdeval.learn.ppi import ppi_mean

ASPECTS = {"sfhot": ("quality", "informativeness"), "topical_chat": ("overall", "engagingness")}
RANGES = {"quality": (1, 6), "informativeness": (1, 6), "overall": (1, 5), "engagingness": (1, 3)}
SHIFT, SLOPE, NOISE = 0.3, 0.8, 0.3  # the evaluator reads 0.3 sd high, shrinks the scale by 0.8


def human_scores(name: str, aspect: str) -> np.ndarray:
    path = Path(os.environ.get("HDEVAL_DATA_DIR", "/work/shared/data")) / f"{name}.jsonl"
    with open(path, encoding="utf-8") as fh:
        return np.array([json.loads(line)["scores"][aspect] for line in fh if line.strip()], float)


def evaluator(y: np.ndarray, pop: np.ndarray, shared: float, rng: np.random.Generator, rng_range) -> np.ndarray:
    m, sd = pop.mean(), pop.std()
    read = y - m + sd * (shared * rng.normal(size=y.size) + NOISE * rng.normal(size=y.size))
    return np.clip(m + SHIFT * sd + SLOPE * read, *rng_range)


def shared_for(target: float, pop: np.ndarray, rng_range) -> float:
    """The shared error that gives ``target`` Spearman with the human scores (bisection)."""
    rng = np.random.default_rng(0)
    y = rng.choice(pop, 20000)
    lo, hi = 0.0, 5.0
    for _ in range(30):
        mid = (lo + hi) / 2
        rho = spearmanr(y, evaluator(y, pop, mid, np.random.default_rng(1), rng_range))[0]
        lo, hi = (mid, hi) if rho > target else (lo, mid)
    return (lo + hi) / 2


def run(pop, rng_range, shared, n, N, reps, rng, weighted=False):
    truth = pop.mean()
    hits = hits_classical = hits_naive = 0
    ratio, gained = [], []
    for _ in range(reps):
        y = rng.choice(pop, n + N)
        f = evaluator(y, pop, shared, rng, rng_range)
        if weighted:
            z = (f - f.mean()) / f.std()
            p = np.clip(n / (n + N) * np.exp(0.5 * z) / np.exp(0.5 * z).mean(), 1e-4, 1)
            lab = rng.random(n + N) < p
            e = ppi_mean(y[lab], f[lab], f[~lab], sampling_prob=p[lab])
            naive = ppi_mean(y[lab], f[lab], f[~lab])
            hits_naive += naive.low <= truth <= naive.high
        else:
            e = ppi_mean(y[:n], f[:n], f[n:])
        hits += e.low <= truth <= e.high
        hits_classical += e.classical_low <= truth <= e.classical_high
        ratio.append((e.high - e.low) / (e.classical_high - e.classical_low))
        gained.append(e.labels_gained / e.n_labelled)
    return {"coverage": hits / reps, "classical": hits_classical / reps, "naive": hits_naive / reps,
            "width_ratio": float(np.mean(ratio)), "gain": float(np.mean(gained))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", default="30,100,300")
    ap.add_argument("--unlabelled", type=int, default=5000)
    ap.add_argument("--spearman", default="0.4,0.6,0.8")
    ap.add_argument("--datasets", default="sfhot,topical_chat")
    args = ap.parse_args()
    start = time.time()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.reps} repetitions per cell, "
          f"{args.unlabelled} unlabelled rows; evaluator shift {SHIFT} sd, slope {SLOPE}, criterion noise {NOISE} sd")
    print("| data set | aspect | held-out Spearman | shared error (sd) | n labelled | PPI++ coverage | "
          "classical coverage | width / classical | labels gained per label |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(35)
    weighted_cells = []
    for name in args.datasets.split(","):
        for aspect in ASPECTS[name]:
            pop, rng_range = human_scores(name, aspect), RANGES[aspect]
            for target in (float(s) for s in args.spearman.split(",")):
                shared = shared_for(target, pop, rng_range)
                for n in (int(x) for x in args.n.split(",")):
                    r = run(pop, rng_range, shared, n, args.unlabelled, args.reps, rng)
                    print(f"| {name} | {aspect} | {target:.1f} | {shared:.2f} | {n} | {r['coverage']:.3f} | "
                          f"{r['classical']:.3f} | {r['width_ratio']:.2f} | {r['gain']:+.2f} |", flush=True)
                if target == 0.6:
                    weighted_cells.append((name, aspect, pop, rng_range, shared))
    print("\nLabels drawn with unequal probabilities (p ~ exp(0.5 z) of the evaluator's z-score), Spearman 0.6:\n")
    print("| data set | aspect | n labelled (expected) | weighted PPI++ coverage | weighted classical | "
          "unweighted PPI++ coverage | width / classical |")
    print("|---|---|---|---|---|---|---|")
    for name, aspect, pop, rng_range, shared in weighted_cells:
        for n in (int(x) for x in args.n.split(",")):
            r = run(pop, rng_range, shared, n, args.unlabelled, args.reps, rng, weighted=True)
            print(f"| {name} | {aspect} | {n} | {r['coverage']:.3f} | {r['classical']:.3f} | {r['naive']:.3f} | "
                  f"{r['width_ratio']:.2f} |", flush=True)
    print(f"\n{time.time() - start:.0f} s; load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
