"""Which aggregator HD-Eval keeps (issue #40), against the baselines it must never lose to.

The judge is the simulated one of ``tests/simjudge.py`` reading the real data sets' human
scores (``$HDEVAL_DATA_DIR``): each aspect's human score mapped onto 1-5, plus a halo shared by
every criterion of a sample, a misreading shared by the criteria of one aspect (for one sample)
and each criterion's own noise; deeper criteria carry the same signal (``simjudge.REALISTIC``:
halo 0.8, misreading 2.0, noise 0.7). ``--judge independent`` drops the misreading; ``--judge
deep-noise`` makes every deeper criterion pure noise. The numbers mean what was built into the
judge, nothing about a real LLM.

For each data set, size and seed, trains HD-Eval (``--layers 3``, the tool's own document split)
with ``--aggregator auto`` and with ``--aggregator lr`` (the same cached criterion scores), then
prints held-out average Spearman from ``metrics.json``: direct (each aspect's layer-1 score), the
mean of all criteria, the kept evaluator (its layer and aggregator), lr and whether lr's run
warned; and every candidate refitted on the kept layer's training rows (nn at its default
penalty, not tuned). The summary is the mean over seeds and a 95% interval of the kept
evaluator minus direct and minus the mean, by a bootstrap that draws each document once for
every seed (the seeds' test sets overlap) and re-ranks only the test rows: it holds the test
documents' variability, not the training's.

    python benchmarks/bench_automl.py                                  # SFHOT 120 and 240, Topical-Chat
    python benchmarks/bench_automl.py --sets sfhot:120 --seeds 0-4 --judge independent
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the simulated judge lives with the tests

JUDGES = {
    "realistic": None,  # simjudge.REALISTIC
    "independent": {"noise": 0.7, "halo": 0.0, "misreading": 0.0, "deep_signal": True},
    "deep-noise": {"noise": 0.7, "halo": 0.8, "misreading": 2.0, "deep_signal": False},
    # independent errors, but each criterion with its own noise level (0.7 times a log-normal
    # factor of spread 0.7): some criteria read their aspect better than others
    "independent-uneven": {"noise": 0.7, "halo": 0.0, "misreading": 0.0, "deep_signal": True, "uneven": 0.7},
}


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def run_one(name: str, n_docs: int | None, seed: int, judge: dict, workdir: Path) -> dict:
    from simjudge import pointwise_backend, real_rows
    from sklearn.base import clone

    import hdeval.methods.hdeval.fake  # noqa: F401  (registers the fake decomposer)
    from hdeval.core.metrics import average_spearman
    from hdeval.data.tasks import load_task
    from hdeval.learn.aggregate import CANDIDATES
    from hdeval.run.train import train

    task = load_task(name)
    rows = real_rows(Path(os.environ["HDEVAL_DATA_DIR"]) / f"{name}.jsonl", task, n_docs, seed)
    data = workdir / f"{name}-{n_docs}-{seed}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    doc_of = {r["id"]: r["doc_id"] for r in rows}
    out: dict = {"set": f"{name}:{n_docs or 'all'}", "seed": seed}
    for agg in ("auto", "lr"):
        t0 = time.time()
        ev = train(task=name, data=str(data), llm="fake", layers=3, cache_dir=str(workdir / "cache"),
                   backend=pointwise_backend(**judge), seed=seed, aggregator=agg)
        m = ev.metrics
        out[f"seconds_{agg}"] = round(time.time() - t0, 1)
        out[agg] = m["final"]["average"]["spearman"]
        if agg == "lr":
            out["lr_warned"] = bool(m["selection"].get("simpler_was_better"))
            continue
        out["kept"] = f"{m['selection']['kept_layer']}:{ev.aggregator.kind}"
        out["direct"] = m["direct_layer1"]["average"]["spearman"]
        out["mean_all"] = m["mean_all_criteria"]["average"]["spearman"]
        out["mean_subtree"] = m["mean_subtree"]["average"]["spearman"]
        table = ev.score_table
        aspects = list(ev.task.aspect_keys)
        train_rows, test_rows = table[table.split == "train"], table[table.split == "test"]
        Xtr, Xte = (t[list(ev.feature_keys)].to_numpy(float) for t in (train_rows, test_rows))
        Ytr, Yte = (t[[f"human:{a}" for a in aspects]].to_numpy(float) for t in (train_rows, test_rows))
        out["candidates"] = {}
        for kind in CANDIDATES:
            fitted = clone(ev.aggregator).set_params(kind=kind).fit(Xtr, Ytr)
            out["candidates"][kind] = round(average_spearman(Yte, fitted.predict(Xte)), 4)
        # per test row: doc, human scores, the kept evaluator's, direct's and the mean's predictions
        all_keys = [c for c in table.columns if c not in ("sample_id", "split") and not c.startswith("human:")]
        with np.errstate(all="ignore"):
            mean_all = np.nanmean(test_rows[all_keys].to_numpy(float), axis=1)
        out["rows"] = {
            "doc": [doc_of[s] for s in test_rows.sample_id], "y": Yte.tolist(),
            "kept": ev.aggregator.predict(Xte).tolist(), "direct": test_rows[aspects].to_numpy(float).tolist(),
            "mean_all": np.repeat(mean_all[:, None], len(aspects), axis=1).tolist(),
        }
    return out


def interval(runs: list[dict], a: str, b: str, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean over seeds of held-out Spearman ``a`` minus ``b``, and its 95% bootstrap interval:
    each draw takes every document once, for all seeds (their test sets overlap)."""
    from hdeval.core.metrics import average_spearman

    docs = sorted({d for r in runs for d in r["rows"]["doc"]})
    index = {d: i for i, d in enumerate(docs)}
    per = []
    for r in runs:
        rows = r["rows"]
        per.append((np.array([index[d] for d in rows["doc"]]), np.array(rows["y"]), np.array(rows[a]),
                    np.array(rows[b])))

    def diff(weights: np.ndarray) -> float:
        vals = []
        for doc, y, pa, pb in per:
            take = np.repeat(np.arange(len(doc)), weights[doc])
            vals.append(average_spearman(y[take], pa[take]) - average_spearman(y[take], pb[take]))
        return float(np.nanmean(vals))

    rng = np.random.default_rng(seed)
    point = diff(np.ones(len(docs), int))
    boots = [diff(rng.multinomial(len(docs), np.full(len(docs), 1 / len(docs)))) for _ in range(n_boot)]
    lo, hi = np.nanpercentile(boots, [2.5, 97.5])
    return point, float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="sfhot:120,sfhot:240,topical_chat:all",
                    help="NAME:DOCUMENTS (all: every document of the data set)")
    ap.add_argument("--seeds", default="0-2")
    ap.add_argument("--judge", default="realistic", choices=sorted(JUDGES))
    ap.add_argument("--json", help="also write every run's figures here")
    args = ap.parse_args()
    if not os.environ.get("HDEVAL_DATA_DIR"):
        sys.exit("bench_automl: set HDEVAL_DATA_DIR to the shared data folder (the real human scores)")
    from simjudge import REALISTIC

    judge = JUDGES[args.judge] or REALISTIC
    print(f"judge {args.judge}: {judge}", flush=True)
    everything = []
    for spec in args.sets.split(","):
        name, _, size = spec.partition(":")
        n_docs = None if size in ("", "all") else int(size)
        runs = []
        for seed in seeds_of(args.seeds):
            with tempfile.TemporaryDirectory() as d:
                r = run_one(name, n_docs, seed, judge, Path(d))
            runs.append(r)
            cands = " ".join(f"{k} {v:.3f}" for k, v in r["candidates"].items())
            print(f"{r['set']:<18} seed {seed}: direct {r['direct']:.3f}  mean-all {r['mean_all']:.3f}  "
                  f"subtree {r['mean_subtree']:.3f}  kept {r['auto']:.3f} ({r['kept']})  lr {r['lr']:.3f}"
                  f"{' (warned)' if r['lr_warned'] else ''}  [{r['seconds_auto']}s]\n    candidates on the kept "
                  f"layer: {cands}", flush=True)
        mean = {k: float(np.mean([r[k] for r in runs])) for k in ("direct", "mean_all", "mean_subtree", "auto", "lr")}
        d_direct, d_mean = interval(runs, "kept", "direct"), interval(runs, "kept", "mean_all")
        print(f"{spec}: mean over {len(runs)} seeds: direct {mean['direct']:.3f}, mean of all criteria "
              f"{mean['mean_all']:.3f}, subtree mean {mean['mean_subtree']:.3f}, kept (auto) {mean['auto']:.3f}, "
              f"lr {mean['lr']:.3f} (warned in {sum(r['lr_warned'] for r in runs)} of {len(runs)}); kept - direct "
              f"{d_direct[0]:+.3f} [{d_direct[1]:+.3f}, {d_direct[2]:+.3f}], kept - mean {d_mean[0]:+.3f} "
              f"[{d_mean[1]:+.3f}, {d_mean[2]:+.3f}]", flush=True)
        everything += runs
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "rows"} for r in everything],
                                              indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
