"""Per-sample prediction intervals (docs/few-labels.md) against issue #35's targets: coverage in
87-93% in every width quintile and the widest fifth's mean absolute error at least 1.5 times the
rest's, on the human scores of SFHOT and Topical-Chat with the simulated judge of
``tests/simcriteria.py`` (lr aggregator, 30% of the documents held out, as
``tests/test_adaptive_intervals.py -m slow``).

Beside hdeval's difficulty model it measures the variants tried to meet the targets, each with
the same normalised conformal quantile:

- ``log``: the difficulty fitted to ``log(|residual| + eps)`` (a multiplicative model);
- ``mondrian3``: one quantile per third of the training rows' difficulty (per aspect);
- ``inconsistency``: the spread feature replaced by the RMS residual of the row's standardised
  criterion scores from their first principal components (one per aspect);
- ``oracle``: the spread feature replaced by the judge's true per-sample difficulty ``kappa``,
  which no model of the criterion scores can know: a bound on what a better feature could give.

It also gives the share of held-out intervals that span an aspect's whole range: such an
interval covers whatever the human says.

    python benchmarks/bench_adaptive_intervals.py --seeds 0-9
    python benchmarks/bench_adaptive_intervals.py --seeds 10-19   # other judge seeds

Figures and load average: benchmarks/adaptive_intervals.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

VARIANTS = ("hdeval", "log", "mondrian3", "inconsistency", "oracle")


def _quantiles(r: np.ndarray, dtr: np.ndarray, dte: np.ndarray, bins: int, level: float = 0.9) -> np.ndarray:
    """Half-widths of the test rows: per aspect (and per difficulty bin) the finite-sample
    ``level`` quantile of ``|residual| / difficulty`` times the row's difficulty."""
    out = np.zeros(dte.shape)
    for j in range(dte.shape[1]):
        s = r[:, j] / dtr[:, j]
        edges = np.quantile(dtr[:, j], np.linspace(0, 1, bins + 1)[1:-1])
        btr, bte = np.searchsorted(edges, dtr[:, j]), np.searchsorted(edges, dte[:, j])
        qs = []
        for b in range(bins):
            col = np.sort(s[btr == b])
            k = math.ceil((len(col) + 1) * level)
            qs.append(col[min(k, len(col)) - 1])
        out[:, j] = np.array(qs)[bte] * dte[:, j]
    return out


def _difficulty(Ftr: np.ndarray, Fte: np.ndarray, r: np.ndarray, log: bool) -> tuple[np.ndarray, np.ndarray]:
    dtr, dte = np.zeros(r.shape), np.zeros((Fte.shape[0], r.shape[1]))
    for j in range(r.shape[1]):
        floor = 0.25 * r[:, j].mean()
        target = np.log(r[:, j] + 0.1 * r[:, j].mean()) if log else r[:, j]
        coef = np.linalg.lstsq(Ftr[:, j], target, rcond=None)[0]
        link = np.exp if log else (lambda v: v)
        dtr[:, j] = np.maximum(link(Ftr[:, j] @ coef), floor)
        dte[:, j] = np.maximum(link(Fte[:, j] @ coef), floor)
    return dtr, dte


def one(variant, X, kappa, Y, oof, pred, tr, te, columns, aspects, ranges):
    from hdeval.learn.intervals import adaptive_calibration, difficulty_features, interval_check

    if variant == "hdeval":
        return adaptive_calibration(Y, oof, tr, pred, te, X, columns, aspects, ranges)["test"], pred, None
    center, sd = X[tr].mean(axis=0), X[tr].std(axis=0)
    scale = np.where(sd > 0, sd, 1.0)
    Ftr = difficulty_features(X[tr], oof, center, scale, ranges)
    Fte = difficulty_features(X[te], pred, center, scale, ranges)
    if variant == "inconsistency":
        Vt = np.linalg.svd((X[tr] - center) / scale, full_matrices=False)[2][: len(aspects)]
        for F, rows in ((Ftr, tr), (Fte, te)):
            Z = (X[rows] - center) / scale
            F[:, :, 1] = np.sqrt(((Z - Z @ Vt.T @ Vt) ** 2).mean(axis=1))[:, None]
    if variant == "oracle":
        Ftr[:, :, 1], Fte[:, :, 1] = kappa[tr][:, None], kappa[te][:, None]
    r = np.abs(Y[tr] - oof)
    dtr, dte = _difficulty(Ftr, Fte, r, log=variant == "log")
    half = _quantiles(r, dtr, dte, 3 if variant == "mondrian3" else 1)
    return interval_check(Y[te], pred, half, ranges), pred, half


def main() -> None:
    from simcriteria import Judge, criteria, load_human
    from sklearn.model_selection import GroupShuffleSplit

    from hdeval.learn.aggregate import Aggregator, cross_val_predictions
    from hdeval.learn.intervals import adaptive_calibration, adaptive_half_widths

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-9", help="judge seeds, a range a-b (inclusive)")
    args = ap.parse_args()
    a, b = (int(x) for x in args.seeds.split("-"))
    seeds = range(a, b + 1)
    start = time.perf_counter()
    print(f"Judge: {Judge().describe()}; judge seeds {a}-{b}; lr; 30% of documents held out.\n")
    print("| data | difficulty model | coverage | per width quintile (narrow → wide) | "
          "widest fifth's error ÷ rest's | mean width | whole-range intervals |")
    print("|---|---|---|---|---|---|---|")
    for name in ("sfhot", "topical_chat"):
        human = load_human(name)
        if human is None:
            print(f"| {name} | skipped: not in HDEVAL_DATA_DIR |||||")
            continue
        aspects, ranges = list(human.aspects), list(human.ranges)
        lo, hi = np.array(ranges, float).T
        rows = {v: [] for v in VARIANTS}
        for seed in seeds:
            X, _, kappa = criteria(human.scores, Judge(), seed=seed)
            tr, te = next(GroupShuffleSplit(1, test_size=0.3, random_state=seed).split(X, groups=human.groups))
            agg = Aggregator("lr", aspects=aspects, ranges=ranges, groups=[aspects])
            oof = cross_val_predictions(agg, X[tr], human.scores[tr], list(human.groups[tr]))
            pred = agg.fit(X[tr], human.scores[tr]).predict(X[te])
            columns = [f"c{i}" for i in range(X.shape[1])]
            for v in VARIANTS:
                t, p, half = one(v, X, kappa, human.scores, oof, pred, tr, te, columns, aspects, ranges)
                if half is None:
                    ad = adaptive_calibration(human.scores, oof, tr, pred, te, X, columns, aspects, ranges)
                    half = adaptive_half_widths(ad, X[te], pred, aspects, ranges)
                whole = (np.minimum(p + half, hi) - np.maximum(p - half, lo)) >= (hi - lo) - 1e-9
                rows[v].append((t["coverage"], t["coverage_by_width_quintile"], t["error_lift"],
                                t["mean_width"], float(whole.mean())))
        for v in VARIANTS:
            r = rows[v]
            quint = ", ".join(f"{c:.3f}" for c in np.mean([x[1] for x in r], axis=0))
            print(f"| {name} | {v} | {np.mean([x[0] for x in r]):.3f} | {quint} | "
                  f"{np.mean([x[2] for x in r]):.2f} | {np.mean([x[3] for x in r]):.2f} | "
                  f"{np.mean([x[4] for x in r]):.3f} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
