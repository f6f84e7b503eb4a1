"""Held-out Spearman of the aggregators: lr vs the old MLP vs the tuned MLP (issue #12.1).

Two kinds of criterion scores, both split exactly as ``hdeval train`` splits (grouped by
``doc_id``, seeded):

* a **simulated judge**: criteria are noisy functions of the human scores (random mixtures of
  the standardised aspects plus Gaussian noise of three sizes, every fourth one folded by
  abs(), three pure-noise criteria), rounded to 0.1 and clipped to 1-5 like LLM scores;
* **fake runs**: ``hdeval train --llm fake`` on a slice of the task (cached under
  ``--cache-dir``, so a second run makes no calls), refitted from the artifact's score table.

"old nn" is the aggregator before #12: a (64, 32) MLP with alpha 1e-4, adam, 2000 iterations,
no early stopping. "new nn" is today's ``nn``: an L-BFGS MLP whose alpha is chosen by grouped
CV on the training split from ``hdeval.learn.aggregate.NN_GRID`` (one hidden width, (32,), since
issue #15.4: with L-BFGS the wider (64, 32) never won the grid; held-out Spearman, 3 seeds,
adam grid -> L-BFGS grid: summeval .668 -> .677, topical_chat .826 -> .845, sfhot .780 -> .827).

    python benchmarks/bench_mlp.py --tasks topical_chat,sfhot --seeds 3
    python benchmarks/bench_mlp.py --tasks sfres --fake-limit 120 --cache-dir /tmp/bench-cache

Data: ``$HDEVAL_DATA_DIR`` or ``--data-dir``.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from hdeval.core.metrics import mean_spearman
from hdeval.data.samples import read_samples, split_samples
from hdeval.data.tasks import load_task
from hdeval.learn.aggregate import Aggregator, select_cv


def simulated(task_name: str, data_dir: Path, seed: int, n_criteria: int = 12):
    task = load_task(task_name)
    samples = read_samples(data_dir / f"{task_name}.jsonl", task)
    split = split_samples(samples, 0.5, 0.5, seed)
    pos = {s.id: i for i, s in enumerate(samples)}
    tr = np.array([pos[i] for i in split.train_ids])
    te = np.array([pos[i] for i in split.test_ids])
    Y = np.array([[s.scores[a] for a in task.aspect_keys] for s in samples])
    Z = (Y - Y.mean(0)) / (Y.std(0) + 1e-9)
    rng = np.random.default_rng(seed)
    cols = []
    for k in range(n_criteria):
        c = Z @ rng.dirichlet(np.full(Y.shape[1], 0.3)) + (0.5, 1.0, 2.0)[k % 3] * rng.normal(size=len(Y))
        cols.append(np.abs(c) if k % 4 == 3 else c)
    cols += [rng.uniform(-2, 2, len(Y)) for _ in range(3)]
    X = np.clip(np.round(3 + np.column_stack(cols), 1), 1, 5)
    return task, X, Y, tr, te, [samples[i].doc_id for i in tr]


def fake_run(task_name: str, data_dir: Path, seed: int, limit: int, cache_dir: str):
    from hdeval.run.train import train

    ev = train(task=task_name, data=str(data_dir / f"{task_name}.jsonl"), llm="fake", layers=2,
               aggregator="lr", limit=limit, seed=seed, cache_dir=cache_dir)
    t = ev.score_table
    X = t[list(ev.feature_keys)].to_numpy(float)
    Y = t[[f"human:{a}" for a in ev.task.aspect_keys]].to_numpy(float)
    tr = np.flatnonzero(t["split"].to_numpy() == "train")
    te = np.flatnonzero(t["split"].to_numpy() == "test")
    doc = {s.id: s.doc_id for s in read_samples(data_dir / f"{task_name}.jsonl", ev.task)}
    ids = t["sample_id"].tolist()
    return ev.task, X, Y, tr, te, [doc[ids[i]] for i in tr]


def old_nn(base: Aggregator, X: np.ndarray, Y: np.ndarray, seed: int) -> Aggregator:
    """The pre-#12 ``nn``: (64, 32), alpha 1e-4, adam for 2000 iterations, no early stopping."""
    agg = clone(base).fit(X, Y)  # the layout and pipelines; the model is swapped and refitted
    for group, pipe in zip(agg.groups_, agg.models_):
        y = Y[:, [agg.aspects_.index(a) for a in group]]
        pipe.set_params(model=MLPRegressor(hidden_layer_sizes=(64, 32), alpha=1e-4, max_iter=2000,
                                           early_stopping=False, random_state=seed))
        pipe.fit(X, y[:, 0] if y.shape[1] == 1 else y)
    return agg


def compare(task, X, Y, tr, te, docs, seed: int) -> dict[str, float]:
    base = Aggregator.for_task("lr", task, seed)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the old MLP does not converge
        out["lr"] = mean_spearman(Y[te], clone(base).fit(X[tr], Y[tr]).predict(X[te]))
        old = old_nn(base, X[tr], Y[tr], seed)
        out["old nn"] = mean_spearman(Y[te], old.predict(X[te]))
        new, _, grid, _ = select_cv(base, X[tr], Y[tr], docs, ("nn",))
        out["new nn"] = mean_spearman(Y[te], new.fit(X[tr], Y[tr]).predict(X[te]))
        out["chosen"] = f"alpha={new.alpha:g} hidden={new.hidden_layer_sizes}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="topical_chat,sfhot")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--data-dir", default=os.environ.get("HDEVAL_DATA_DIR", "../shared/data"))
    ap.add_argument("--fake-limit", type=int, default=0, help="also refit on fake runs of N samples (0: skip)")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    data_dir = Path(args.data_dir)
    sources = [("simulated", simulated)]
    if args.fake_limit:
        sources.append(("fake run", lambda t, d, s: fake_run(t, d, s, args.fake_limit, args.cache_dir)))
    print(f"{'source':<10} {'task':<14} seed  {'lr':>6} {'old nn':>7} {'new nn':>7}  chosen")
    for label, make in sources:
        for task_name in args.tasks.split(","):
            rows = []
            for seed in range(args.seeds):
                r = compare(*make(task_name, data_dir, seed), seed)
                rows.append(r)
                print(f"{label:<10} {task_name:<14} {seed:>4}  {r['lr']:6.3f} {r['old nn']:7.3f} "
                      f"{r['new nn']:7.3f}  {r['chosen']}", flush=True)
            mean = {k: np.mean([r[k] for r in rows]) for k in ("lr", "old nn", "new nn")}
            print(f"{label:<10} {task_name:<14} mean  {mean['lr']:6.3f} {mean['old nn']:7.3f} {mean['new nn']:7.3f}")


if __name__ == "__main__":
    main()
