"""DnA's tie margin learned on the training split against margin 0, next to its direct baseline.

For each judge and each data set, trains ``--method dna`` in modes ``dna`` and ``direct`` with the
margin learned (the default) and with ``--tie-margin 0`` on the same seeded split, and prints the
held-out agreement with the human labels with and without ties and the margin chosen.

Judges:
- ``sim``: the simulated judge of ``tests/simjudge.py`` on synthetic pairs whose truth we built
  (humans tie pairs of close latent quality; the judge reads the latent plus noise). These numbers
  mean what was built into them, nothing about a real LLM.
- ``fake``: the fake LLM on the real FairEval / LLMBar data (``$HDEVAL_DATA_DIR``). The fake
  answers from text features and hashes: a smoke figure that means nothing about a real judge.

    python benchmarks/bench_dna_ties.py                  # both judges, seeds 0-2
    python benchmarks/bench_dna_ties.py --judges sim --seeds 0
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the simulated judge lives with the tests


def _train(data: Path, task: str, cache: str, seed: int, mode: str, margin: float | None, backend=None):
    from hdeval.train import train

    options = {"dna_mode": mode} | ({} if margin is None else {"tie_margin": margin})
    ev = train(task=task, data=str(data), method="dna", llm="fake", cache_dir=cache, seed=seed,
               backend=backend, method_options=options)
    m = ev.metrics
    return m["test"][m["primary"]], m["tie_margin"]["value"]


def data_sets(judge: str, tmp: Path, seed: int, n_sim: int):
    if judge == "sim":
        from simjudge import pair_backend, pairwise_rows, write_pairs

        rows = pairwise_rows(n_sim, seed=seed)
        yield "synthetic", "faireval", write_pairs(tmp / f"sim{seed}.jsonl", rows), pair_backend()
        return
    data_dir = Path(os.environ.get("HDEVAL_DATA_DIR") or REPO.parent / "shared" / "data")
    for task in ("faireval", "llmbar"):
        path = data_dir / f"{task}.jsonl"
        if path.is_file():
            yield task, task, path, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judges", default="sim,fake")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n-sim", type=int, default=200, help="synthetic pairs per seed")
    args = ap.parse_args(argv)
    print(f"{'judge':<6} {'data':<10} {'seed':>4} {'mode':<7} {'margin':>7} {'w/ ties':>8} {'w/o ties':>9} "
          f"{'w/ ties @0':>10} {'w/o @0':>7} {'n':>4}")
    with tempfile.TemporaryDirectory(prefix="bench-dna-ties-") as tmp_name:
        tmp = Path(tmp_name)
        for judge in args.judges.split(","):
            for seed in [int(s) for s in args.seeds.split(",")]:
                for name, task, data, backend in data_sets(judge, tmp, seed, args.n_sim):
                    cache = str(tmp / f"cache-{judge}-{name}-{seed}")
                    for mode in ("dna", "direct"):
                        got, margin = _train(data, task, cache, seed, mode, None, backend)
                        at0, _ = _train(data, task, cache, seed, mode, 0.0, backend)
                        print(f"{judge:<6} {name:<10} {seed:>4} {mode:<7} {margin:>7.3f} {got['w_ties']:>8.3f} "
                              f"{got['wo_ties']:>9.3f} {at0['w_ties']:>10.3f} {at0['wo_ties']:>7.3f} {got['n']:>4}")
    print("sim: figures mean what tests/simjudge.py built in; fake: smoke figures, nothing about a real judge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
