"""Which criteria HD-Eval's pruning expands with a judge that has a halo, and whether skipping
those whose importance comes from a negative weight (suppressors) would help (issue #39 item 7).

At the level of the criterion-score matrix (``tests/simcriteria.py``, no LLM): a real data set's
human scores, the simulated judge's direct and second-layer criteria (4 informative and some pure
noise per aspect; pure noise carries the halo only), half the documents for training. Pruning
(``hdeval.methods.hdeval.prune``, lr aggregator, as ``hdeval train``) ranks every candidate whose
importance is real; today's choice takes the 4 most important, the alternative skips those whose
weight is negative (the fitted predictions fall as the criterion rises). Each chosen criterion is
decomposed into 3 children that read what it reads (pure noise: the halo and their own noise),
and the aggregator re-fitted on all columns is scored on the held-out documents.

    python benchmarks/bench_expand_suppressors.py --reps 10

Measured on 2026-11-28 (10 tasks each; SFHOT, 439 training rows):

- halo 0.8, misreading 0.3, noise 0.7, 2 pure-noise criteria per aspect: 2.3 pure-noise criteria
  of 6 had real importance per task, 1.3 were among the 4 expanded, all with a negative weight (as
  were 20% of the informative ones). Held-out Spearman: no expansion .803, by importance .822,
  skipping negative weights .815 (-.007, lower in 8 of 10 tasks), 11.1 against 9.3 children.
- halo 0.6, 1 pure-noise criterion per aspect: 2.1 of 3 real, 1.8 expanded; .786 / .819 / .801
  (-.018, lower in 9 of 10), 10.8 against 8.4 children.
- ``--data topical_chat`` (180 training rows), halo 0.8: pruning found 0.1 criteria per task with
  real importance, none of them pure noise; both choices expanded the same.

The children of a suppressor carry the halo too, so the aggregator subtracts it better; and the
skip also drops informative criteria whose weight is negative beside correlated ones. Expansion
stays by importance alone. No setting here expanded 5-6 pure-noise criteria per task (the audit's
figure): with 4 expanded per layer, at most 1.8 of them were pure noise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _slope(agg, X: np.ndarray, column: int) -> float:
    """How the fitted predictions move, each aspect over its range and summed, as ``column`` rises."""
    up, down = X.copy(), X.copy()
    up[:, column] += 0.5
    down[:, column] -= 0.5
    span = np.array([hi - lo for lo, hi in agg.ranges_], float)
    return float(((agg.predict(up) - agg.predict(down)).reshape(len(X), -1) / span).mean(axis=0).sum())


def run(name: str, judge, reps: int, top_k: int = 4, per_parent: int = 3) -> None:
    from simcriteria import children, criteria_sheet, load_human

    from hdeval.core.metrics import average_spearman
    from hdeval.learn.aggregate import Aggregator
    from hdeval.methods.hdeval.prune import prune

    human = load_human(name)
    if human is None:
        sys.exit(f"{name}.jsonl is not in HDEVAL_DATA_DIR")
    H, groups = human.scores, human.groups
    docs = np.unique(groups)

    def aggregator(seed: int) -> Aggregator:
        return Aggregator(
            "lr", list(human.aspects), list(human.ranges), [[a] for a in human.aspects], random_state=seed
        )

    rows = []
    for rep in range(reps):
        sheet = criteria_sheet(H, judge, seed=rep)
        X = sheet.scores
        tr = np.isin(groups, np.random.default_rng(1000 + rep).permutation(docs)[: len(docs) // 2])
        keys = [f"c{j}" for j in range(X.shape[1])]
        cands = [k for j, k in enumerate(keys) if j not in sheet.direct]
        pr = prune(aggregator(rep), X[tr], H[tr], keys, cands, list(groups[tr]), len(cands), n_jobs=1)
        real = [keys.index(k) for k in pr.selected]
        fitted = aggregator(rep).fit(X[tr], H[tr])
        slope = {c: _slope(fitted, X[tr], c) for c in map(keys.index, cands)}
        noise = {c for c in slope if sheet.load[c] == 0}
        choices = {
            "none": [],
            "importance": real[:top_k],
            "skip_negative": [c for c in real if slope[c] > 0][:top_k],
        }
        row = {
            "real": len(real),
            "noise_real": len(noise & set(real)),
            "noise_expanded": len(noise & set(real[:top_k])),
            "noise_negative": np.mean([slope[c] < 0 for c in noise]),
            "informative_negative": np.mean([slope[c] < 0 for c in slope if c not in noise]),
        }
        for label, chosen in choices.items():
            X3 = np.hstack([X, children(sheet, judge, chosen, per_parent, seed=rep)])
            agg = aggregator(rep).fit(X3[tr], H[tr])
            row[label] = average_spearman(H[~tr], agg.predict(X3[~tr]))
            row[label + "_children"] = X3.shape[1] - X.shape[1]
        rows.append(row)
        print(f"  task {rep}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    d = np.array([r["skip_negative"] - r["importance"] for r in rows])
    print(f"{name}, {judge.describe()}")
    print("  mean: " + ", ".join(f"{k} {np.mean([r[k] for r in rows]):.3f}" for k in rows[0]))
    print(
        f"  skipping negative weights - by importance: {d.mean():+.4f} (lower in {int((d < 0).sum())} of {len(d)})"
    )


def main() -> None:
    from simcriteria import Judge

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--data", default="sfhot")
    args = ap.parse_args()
    for judge in (
        Judge(halo=0.8, misread=0.3, noise=0.7, noise_criteria=2),
        Judge(halo=0.6, misread=0.3, noise=0.7, noise_criteria=1),
    ):
        run(args.data, judge, args.reps)


if __name__ == "__main__":
    main()
