"""DnA's tie margin: the rule training uses against the rule it replaced, and against margin 0.

For each judge, data set, seed and mode (``dna``, ``direct``), trains ``--method dna`` once with
the default (learned) margin, then, from that run's score table (the totals do not depend on the
margin), computes three margins on the training rows and scores each on the training and the
held-out rows (agreement with ties):

- ``new``: the rule training uses (``learn_tie_margin``: a logistic regression on |total A - total B|);
- ``old``: the rule it replaced: of 0 and every training pair's |diff|, the best training agreement
  (kept here only as the baseline);
- ``0``: no learned margin.

The ``gap`` is training minus held-out agreement: how much the training figure flatters the margin.

Judges:
- ``sim``: the simulated judge of ``tests/simjudge.py`` on synthetic pairs whose truth we built
  (humans tie pairs of close latent quality; the judge reads the latent plus ``--noise``). These
  numbers mean what was built into them, nothing about a real LLM.
- ``fake``: the fake LLM on the real FairEval / LLMBar data (``$HDEVAL_DATA_DIR``). The fake
  answers from text features and hashes: a smoke figure that means nothing about a real judge.

    python benchmarks/bench_dna_ties.py                         # both judges, seeds 0-4
    python benchmarks/bench_dna_ties.py --judges sim --seeds 0-9 --noise 0.8,1.5,3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the simulated judge lives with the tests


def old_rule(diffs: np.ndarray, human: np.ndarray) -> float:
    """The replaced rule: the best training agreement with ties over 0 and every |diff|."""
    cands = np.unique(np.concatenate([[0.0], np.abs(diffs)]))
    return float(cands[int(np.argmax([agree(diffs, human, m) for m in cands]))])


def agree(diffs: np.ndarray, human: np.ndarray, margin: float) -> float:
    sides = np.where(diffs > 0, "a", "b")
    return float(np.mean(np.where(np.abs(diffs) <= margin, human == "tie", sides == human)))


def run(data: Path, task: str, cache: str, seed: int, mode: str, backend=None) -> dict[str, dict[str, float]]:
    from hdeval.data.samples import read_task_samples
    from hdeval.data.tasks import load_task
    from hdeval.methods.dna.decision import learn_tie_margin
    from hdeval.run.train import train

    ev = train(task=task, data=str(data), method="dna", llm="fake", cache_dir=cache, seed=seed,
               backend=backend, method_options={"dna_mode": mode})
    t = ev.score_table
    t = t[t["prediction"].notna() & t["human"].notna()]
    diffs = (t["total_a"] - t["total_b"]).to_numpy(float)
    human = t["human"].to_numpy(object)
    tr, te = (t["split"] == "train").to_numpy(), (t["split"] == "test").to_numpy()
    doc = {p.id: p.doc_id for p in read_task_samples(data, load_task(task))}
    new, _ = learn_tie_margin(diffs[tr], human[tr], [doc[i] for i in t["pair_id"][tr]], seed)
    assert new == ev.settings.tie_margin, "the bench's groups must match training's"
    out = {}
    for name, m in (("new", new), ("old", old_rule(diffs[tr], human[tr])), ("0", 0.0)):
        out[name] = {"margin": m, "train": agree(diffs[tr], human[tr], m), "test": agree(diffs[te], human[te], m)}
    return out


def data_sets(judge: str, tmp: Path, seed: int, n_sim: int, noise: float):
    if judge == "sim":
        from simjudge import pair_backend, pairwise_rows, write_pairs

        rows = pairwise_rows(n_sim, seed=seed)
        yield "synthetic", "faireval", write_pairs(tmp / f"sim{seed}.jsonl", rows), pair_backend(noise=noise)
        return
    data_dir = Path(os.environ.get("HDEVAL_DATA_DIR") or REPO.parent / "shared" / "data")
    for task in ("faireval", "llmbar"):
        path = data_dir / f"{task}.jsonl"
        if path.is_file():
            yield task, task, path, None


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judges", default="sim,fake")
    ap.add_argument("--seeds", default="0-4", help="'0-9' or '0,3,5'")
    ap.add_argument("--n-sim", type=int, default=200, help="synthetic pairs per seed (half are held out)")
    ap.add_argument("--noise", default="0.8,1.5,3", help="the simulated judge's noise per aspect score")
    args = ap.parse_args(argv)
    print(f"{'judge':<5} {'data':<9} {'noise':>5} {'seed':>4} {'mode':<6} {'margin new/old':>14} "
          f"{'train new/old/0':>17} {'held-out new/old/0':>20}")
    sums: dict[tuple, list[dict]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-dna-ties-") as tmp_name:
        tmp = Path(tmp_name)
        for judge in args.judges.split(","):
            for noise in ([float(x) for x in args.noise.split(",")] if judge == "sim" else [None]):
                for seed in _seeds(args.seeds):
                    for name, task, data, backend in data_sets(judge, tmp, seed, args.n_sim, noise):
                        cache = str(tmp / f"cache-{judge}-{name}-{noise}-{seed}")
                        for mode in ("dna", "direct"):
                            r = run(data, task, cache, seed, mode, backend)
                            sums[(judge, name, noise, mode)].append(r)
                            nz = "-" if noise is None else f"{noise:g}"
                            print(f"{judge:<5} {name:<9} {nz:>5} {seed:>4} {mode:<6} "
                                  f"{r['new']['margin']:>6.3f}/{r['old']['margin']:<7.3f} "
                                  + "/".join(f"{r[k]['train']:.3f}" for k in ("new", "old", "0")) + "  "
                                  + "/".join(f"{r[k]['test']:.3f}" for k in ("new", "old", "0")))
    print("\nmeans over seeds: held-out agreement with ties, and gap = training minus held-out")
    print(f"{'judge':<5} {'data':<9} {'noise':>5} {'mode':<6} {'seeds':>5} {'held-out new':>12} {'old':>6} {'0':>6} "
          f"{'gap new':>8} {'old':>7} {'0':>7}")
    for (judge, name, noise, mode), rs in sums.items():
        test = {k: np.mean([r[k]["test"] for r in rs]) for k in ("new", "old", "0")}
        gap = {k: np.mean([r[k]["train"] - r[k]["test"] for r in rs]) for k in ("new", "old", "0")}
        nz = "-" if noise is None else f"{noise:g}"
        print(f"{judge:<5} {name:<9} {nz:>5} {mode:<6} {len(rs):>5} {test['new']:>12.3f} {test['old']:>6.3f} "
              f"{test['0']:>6.3f} {gap['new']:>+8.3f} {gap['old']:>+7.3f} {gap['0']:>+7.3f}")
    print("sim: figures mean what tests/simjudge.py built in; fake: smoke figures, nothing about a real judge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
