"""A learned jury against each judge alone and against the jury's mean (issue #36).

Simulated judges (tests/simjury.py) read each sample's hidden latent quality with noise of known
size; the humans rate the latent plus their own noise (tests/simjudge.py). Per seed: a fresh
data set (60 documents x 3 samples, split by document), HD-Eval trained with the jury
(``--layers 1``: the aspects; aggregator lr), and on the held-out documents the average Spearman of
the learned jury, of each judge alone (direct: its own aspect scores; HD-Eval: the aggregator on
its own columns), and of the jury mean (PoLL's average pooling of the judges' aspect scores).
The table gives the mean over seeds and a 95% t-interval of the per-seed differences.

    python benchmarks/bench_jury.py --seeds 10 --noises 0.7,0.9,1.2
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from simjudge import pointwise_rows, write_pointwise  # noqa: E402
from simjury import jury  # noqa: E402

from hdeval.run.train import train  # noqa: E402

NOISES = (0.7, 0.9, 1.2)  # three judges of different quality


def one_seed(seed: int, noises: tuple, layers: int, prune: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=60, seed=seed))
        judges = jury(*noises)
        jf = tmp_path / "jury.toml"
        jf.write_text("".join(f'[[judge]]\nname = "{n}"\nllm = "fake"\n' for n in judges), encoding="utf-8")
        ev = train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=layers,
                   aggregator="lr", cache_dir=str(tmp_path / "cache"), seed=seed, prune_judges=prune)
    b = ev.metrics["jury"]["baselines"]
    out = {"learned jury": b["learned"]["average"]["spearman"], "jury mean": b["jury_mean"]["average"]["spearman"]}
    for n, v in b["judges"].items():
        out[f"{n} direct"] = v["direct"]["average"]["spearman"]
        out[f"{n} HD-Eval"] = v["hdeval"]["average"]["spearman"]
    out["effective judges"] = ev.metrics["jury"]["effective_judges"]
    return out


def interval(x: np.ndarray) -> tuple[float, float]:
    if len(x) < 2:
        return float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def run(seeds: int, noises: tuple, layers: int) -> tuple[list[str], dict[str, np.ndarray]]:
    rows = [one_seed(s, noises, layers) for s in range(seeds)]
    keys = list(rows[0])
    return keys, {k: np.array([r[k] for r in rows], float) for k in keys}


def table(keys: list[str], res: dict[str, np.ndarray]) -> list[str]:
    singles = [k for k in keys if re.match(r"j[0-9]+ ", k)]
    best_per_seed = np.max(np.stack([res[k] for k in singles]), axis=0)
    learned = res["learned jury"]
    lines = ["| evaluator | held-out Spearman (mean) | learned jury minus it (mean, 95% CI) |", "|---|---|---|"]
    for k in ["learned jury", "jury mean", *singles]:
        d = learned - res[k]
        lo, hi = interval(d)
        lines.append(f"| {k} | {res[k].mean():.3f} | " + ("|" if k == "learned jury" else
                                                            f"{d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |"))
    d = learned - best_per_seed
    lo, hi = interval(d)
    lines.append(f"| best single judge, per seed | {best_per_seed.mean():.3f} | {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    lines.append("")
    lines.append(f"effective number of independent judges: {res['effective judges'].mean():.2f} (mean over seeds)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--noises", default=",".join(map(str, NOISES)),
                    help="each judge's noise, comma-separated; 'none' for a pure-noise judge")
    args = ap.parse_args()
    noises = tuple(None if x.strip() == "none" else float(x) for x in args.noises.split(","))
    keys, res = run(args.seeds, noises, args.layers)
    print(f"# Learned jury vs single judges and the jury mean ({args.seeds} seeds, --layers {args.layers})\n")
    print(f"Judges j1, j2, ... read the latent with noise {args.noises} (tests/simjury.py; none: pure "
          "noise); held-out documents; `python benchmarks/bench_jury.py --seeds "
          f"{args.seeds} --layers {args.layers} --noises {args.noises}`.\n")
    print("\n".join(table(keys, res)))


if __name__ == "__main__":
    main()
