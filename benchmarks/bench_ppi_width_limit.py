"""How much narrower than the classical interval PPI++ can be (issue #35's width target),
for the simulated evaluators of ``bench_ppi_coverage.py`` at each held-out Spearman.

With ``n`` labels and ``N`` unlabelled rows the PPI++ variance at the best ``lam`` is
``var(y - lam f) / n + lam**2 var(f) / N``, ``lam = cov(y, f) / var(f) / (1 + n / N)``: about
``1 - r**2`` of the classical variance, ``r`` being the Pearson correlation of evaluator and
label. This prints ``r`` and that best width ratio (square root of the variance ratio), computed
on 200,000 simulated rows, so no tuning noise: what any power-tuned PPI++ with this one
prediction can reach, against the measured ratios in benchmarks/ppi.md.

    python benchmarks/bench_ppi_width_limit.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ppi_coverage import ASPECTS, RANGES, evaluator, human_scores, shared_for  # noqa: E402


def main() -> None:
    N = 5000
    print("| data set | aspect | held-out Spearman | Pearson | best width / classical at n = 30, 100, 300 |")
    print("|---|---|---|---|---|")
    for name, aspects in ASPECTS.items():
        for aspect in aspects:
            pop, rng_range = human_scores(name, aspect), RANGES[aspect]
            for target in (0.6, 0.8):
                shared = shared_for(target, pop, rng_range)
                rng = np.random.default_rng(3)
                y = rng.choice(pop, 200_000)
                f = evaluator(y, pop, shared, rng, rng_range)
                r = pearsonr(y, f)[0]
                ratios = []
                for n in (30, 100, 300):
                    lam = np.cov(y, f)[0, 1] / f.var() / (1 + n / N)
                    var = np.var(y - lam * f) / n + lam**2 * f.var() / N
                    ratios.append(np.sqrt(var / (y.var() / n)))
                print(f"| {name} | {aspect} | {target:.1f} | {r:.3f} | {', '.join(f'{v:.3f}' for v in ratios)} |")


if __name__ == "__main__":
    main()
