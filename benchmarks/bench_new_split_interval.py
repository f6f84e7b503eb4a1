"""Coverage of the benchmark's 95% interval for the figure of a new split (issue #39 items 1/2),
at several training fractions and simulation seeds: the simulation of
``tests/test_interval_coverage.py`` (200 synthetic data sets per seed, 3 benchmark seeds each),
run at more seeds than the test, so a change is not judged on the test's seed alone.

    python benchmarks/bench_new_split_interval.py --fractions 0.15,0.3,0.5 --seeds 39,1,2

Measured on 2026-11-28 (load average ~3 on 2 cores; ~15-20 s per fraction and seed), coverage at
seeds 39 / 1 / 2 and over all 600 data sets:

- training fraction 0.15: 0.940 / 0.920 / 0.920, 0.927 (before: 0.950 / 0.930 / 0.940, 0.940)
- training fraction 0.3:  0.945 / 0.920 / 0.945, 0.937 (before: 0.970 / 0.970 / 0.970, 0.970)
- training fraction 0.5:  0.975 / 0.965 / 0.970, 0.970 (before: 0.985 / 0.985 / 0.990, 0.987)

"Before": the training part's degrees of freedom from its own estimate (Welch-Satterthwaite), and
seeds - 1 of them where that estimate was clipped at 0, which put t(2) = 4.3 on the test part alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    from test_interval_coverage import SEEDS, _data_set, _run

    from hdeval.benchmark.statistics import pooled_bootstrap_ci
    from hdeval.core.metrics import average_spearman

    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", default="0.15,0.3,0.5")
    ap.add_argument("--seeds", default="39,1,2")
    args = ap.parse_args()
    for frac in (float(f) for f in args.fractions.split(",")):
        pooled = []
        for seed in (int(s) for s in args.seeds.split(",")):
            rng = np.random.default_rng(seed)
            truth = np.mean([average_spearman(*_run(_data_set(rng), frac, rng)[:2]) for _ in range(2000)])
            hits, halves = [], []
            for k in range(200):
                data = _data_set(rng)
                runs = [_run(data, frac, rng) for _ in range(SEEDS)]
                ci = pooled_bootstrap_ci(
                    [r[:3] for r in runs], n_resamples=100, seed=k, train_sizes=[r[3] for r in runs]
                )
                hits.append(ci["low"] <= truth <= ci["high"])
                halves.append((ci["high"] - ci["low"]) / 2)
            pooled += hits
            print(
                f"train frac {frac} seed {seed}: truth {truth:.3f}, coverage {np.mean(hits):.3f}, "
                f"median half-width {np.median(halves):.3f}",
                flush=True,
            )
        print(f"train frac {frac}: coverage over {len(pooled)} data sets {np.mean(pooled):.3f}", flush=True)


if __name__ == "__main__":
    main()
