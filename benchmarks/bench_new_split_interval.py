"""Coverage of the benchmark's 95% interval for the figure of a new split (issue #39 items 1/2),
at several training fractions and simulation seeds: the simulation of
``tests/test_interval_coverage.py`` (200 synthetic data sets per seed, 3 benchmark seeds each),
run at more seeds than the test, so a change is not judged on the test's seed alone.

    python benchmarks/bench_new_split_interval.py --fractions 0.15,0.3,0.5 --seeds 39,1,2 [--resplit]

Measured on 2026-11-28 06:40-07:07 UTC at commit f704667 (load average 10-16 on 2 cores, a load
test running), coverage at seeds 39 / 1 / 2 / 7 / 11 and over all 1,000 data sets, with in brackets
each seed's mean estimated variance over its mean squared error (1.00: right on average):

- training fraction 0.15: 0.940 / 0.920 / 0.920 / 0.940 / 0.925, 0.929
  (0.99 / 1.06 / 0.87 / 1.00 / 0.89; pooled 0.95)
- training fraction 0.3:  0.945 / 0.920 / 0.945 / 0.955 / 0.945, 0.942
  (seeds 7 / 11: 0.94 / 0.95)
- training fraction 0.5:  0.975 / 0.965 / 0.970 / 0.975 / 0.960, 0.969
  (1.11 / 1.28 / 1.09 / 1.00 / 1.05; pooled 1.11)

(0.15 and 0.5 at seeds 39 / 1 / 2 were run again and reproduce the figures measured before at load
~3; 0.3 at those seeds is that earlier run's; seeds 7 and 11 are new. The ratio is from a copy of
this computation on the same intervals; this script now prints it.) Where the misses come from,
from the same runs:

- 0.15: the variance is right on average; the seeds' spread (3 seeds) varies as a sample variance
  of ~1.7 degrees of freedom would, not 2 (a model fitted on 9 documents now and then fails), so
  the t quantile is a little short and the interval errs narrow.
- 0.5: the seeds' spread less what their test sets explain averages 0.00006 (+- 0.00004) while the
  squared error beyond the test part is ~0.0005 (25% of it); the training part is clipped at 0 in
  61% of data sets (34% at 0.3, 9% at 0.15). The interval's variance is right on average only
  through that clip, and the Satterthwaite t quantile (median ~2.6 degrees of freedom) makes it
  wide.

Tried on the same data sets and bootstrap draws (a copy of the interval's code, not committed),
pooled coverage at 0.15 / 0.3 / 0.5 (0.3: seeds 7 and 11 only; the others all five): the normal
quantile 0.907 / 0.910 / 0.922; degrees of freedom from the clipped training part 0.925 / 0.915 / 0.926;
the quantile of the studentized mean with the seeds' spread drawn from its chi-square (plug-in)
0.920 / 0.910 / 0.921; the training part not clipped 0.928 / 0.938 / 0.837; the training part
scaled by 1 / seeds only (no shared training documents) 0.915 / 0.910 / 0.920. Each narrows 0.5
only by also going below 0.93; none kept. What 0.5 misses is not visible in the seeds' figures;
a bootstrap that re-splits and re-fits sees it, but overshoots (below).

Re-splitting prototypes (issue #39's suggestion; ``--resplit``, :func:`_resplit_intervals`, from the
criterion scores already at hand, no new LLM calls), measured 2026-11-28 11:04-11:23 UTC at commit
9f59ffc (load average 0.6-3.6 on 2 cores), 200 data sets per seed, normal quantile, the estimate
today's mean of the 3 seeds; coverage at simulation seeds 39 / 1 (a copy; this script's
``--resplit`` run of 0.15 at seed 39 gives the same 1.000 and 0.950, and today's 0.940):

- Nadeau-Bengio (20 re-splits of the same documents, variance x (1/3 + n_test / n_train)):
  1.000 (seed 39 only) @ 0.15, 0.985 / 0.985 @ 0.3, 0.925 / 0.920 @ 0.5. Its correction is a
  guess at how much two splits of the same data share; here 5.7 at 0.15 is far too much and 1
  at 0.5 too little.
- Re-fitting bootstrap, training documents drawn among the distinct drawn ones once each, its
  variance less 2/3 of the re-splits' (mean variance / mean squared error in brackets):
  0.950 / 0.975 @ 0.15 (1.26 / 1.39), 0.990 / 0.995 @ 0.3 (1.90 / 1.91); without the
  subtraction 0.990 / 1.000 and 1.000 / 1.000. Not defined at 0.5: a resample draws ~38 distinct
  documents of 60, the 30 for training leave ~8 to test on. The test part of a resample is fewer
  distinct documents repeated, noisier than a fresh test set of the same size, and more so the
  larger the training share: the variance comes out too large, increasingly with the fraction.
- Re-fitting bootstrap with the training documents taken as drawn, repeats kept, until their rows
  reach the run's training rows (a copy, not committed): 0.990 @ 0.15 (seed 39; without the
  subtraction 0.995): a model fitted on repeated documents varies more than one fitted on as
  many distinct ones.

None lands in 0.93-0.97 at every fraction; none kept, the benchmark's interval is unchanged. Also
to know before building one into the benchmark: a re-fit from the score table re-fits only a
method's aggregator (HD-Eval's, PairEval's; DnA not checked), on the criteria that seed's run
chose from its own training documents; the criteria search, also training variability, would not
be re-run, and direct scoring has nothing to re-fit.

Today's test part + a training part from re-fits (``--refit-train``, :func:`_refit_training_part`:
20 re-splits of the same documents at the run's fraction, aggregator re-fitted on the cached
scores, their spread less their own bootstrap test variances (10 draws each) x test share, scaled
as ``_new_split`` scales the seeds' with k = 3; t quantile, Satterthwaite with at least 19 degrees
of freedom), measured 2026-11-28 11:43-11:58 UTC at commit 1f71965 (load average 1.3-4.3 on 2
cores), ONLY THE FIRST 40 DATA SETS per seed (out of time for 200; the same 40 as the 200's
first), coverage at seeds 39 / 1 and pooled over 80, today's interval on the same 40 in brackets:

- 0.15: 0.925 / 0.950, 0.938 (0.950 / 0.875, 0.912); variance / squared error 0.99 / 1.00
- 0.3:  0.925 / 0.975, 0.950 (0.950 / 0.950, 0.950); 1.05 / 1.22
- 0.5:  0.975 / 0.975, 0.975 (1.000 / 0.975, 0.988); 0.85 / 1.27; training part 0 in 35% / 45%

At 40 data sets a coverage's standard error is ~0.035: this does not show the 93-97% target met
or missed; 0.5 still at the top. Needs the full 200 per seed before any decision.

The same on all 200 data sets at five simulation seeds (``--seeds 39,1,2,7,11 --refit-train``,
one fraction per process, two at a time), measured 2026-11-28 14:51-15:11 UTC at commits
367a077-b187656 (none changes the statistics or this script; load average 0.7-3.5 on 2 cores),
coverage at seeds 39 / 1 / 2 / 7 / 11 and over all 1,000 data sets, today's interval on the same
data sets in brackets (its figures above, reproduced), variance / squared error of the re-fitted
version:

- 0.15: 0.950 / 0.975 / 0.930 / 0.945 / 0.925, **0.945** (0.929); 1.04 / 1.08 / 0.89 / 1.02 / 0.87
- 0.3:  0.915 / 0.920 / 0.945 / 0.945 / 0.925, **0.930** (0.942); 0.94 / 0.93 / 0.91 / 0.89 / 0.87
- 0.5:  0.950 / 0.940 / 0.945 / 0.945 / 0.930, **0.942** (0.969); 0.96 / 1.00 / 0.95 / 0.89 / 0.84;
  training part 0 in 38-42% of data sets

Pooled over 1,000 data sets it lands in 93-97% at every fraction, where today's misses at 0.15 by
0.001; but 0.3 sits on the lower edge, its variance 6-13% short at every seed, and per seed (200
data sets each, as the Done-means count them) it is in the band in 9 of 15 runs, as today's is.
It centres 0.5, which today's cannot see, and errs narrow at 0.3: not a clear gain, and building it
into the benchmark means re-fitting each method's aggregator 20 times per seed (HD-Eval's on the
criteria its seed's run chose; direct has nothing to re-fit). Not kept; the benchmark's interval is
unchanged.

"Before" (an earlier commit): the training part's degrees of freedom from its own estimate
(Welch-Satterthwaite), seeds - 1 where that estimate was clipped at 0 (t(2) = 4.3 on the test part
alone): coverage at seeds 39 / 1 / 2 0.950 / 0.930 / 0.940 (0.15), 0.970 / 0.970 / 0.970 (0.3),
0.985 / 0.985 / 0.990 (0.5).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _fit_score(data, counts: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    """The simulation's aggregator fitted on the ``train`` documents' rows and scored on the
    ``test`` documents' rows, each document's rows repeated ``counts`` times."""
    from sklearn.linear_model import Ridge

    from hdeval.core.metrics import average_spearman

    scores, human, docs = data
    rows = [
        np.repeat(np.flatnonzero(np.isin(docs, d)), counts[docs[np.isin(docs, d)]]) for d in (train, test)
    ]
    pred = Ridge(alpha=1.0).fit(scores[rows[0]], human[rows[0]]).predict(scores[rows[1]])
    return average_spearman(human[rows[1]], pred)


def _resplit_intervals(data, frac: float, rng: np.random.Generator, splits: int = 20, resamples: int = 100):
    """(Nadeau-Bengio variance, re-fitting bootstrap variance) of the mean of the 3 seeds' figures,
    from the cached criterion scores only (prototypes, issue #39; not in the benchmark).

    Nadeau-Bengio: the variance over ``splits`` fresh re-splits of the same documents times
    (1 / seeds + n_test / n_train). Re-fitting bootstrap: per resample the documents drawn with
    replacement, the run's number of training documents taken among the distinct drawn ones, each
    once (a fresh training set has no repeats), the aggregator re-fitted on them and scored on the
    other drawn documents as often as drawn; its variance less (1 - 1 / seeds) times the re-splits'
    (the seeds' mean averages the split's share of the variance)."""
    from test_interval_coverage import DOCS, SEEDS

    n = round(frac * DOCS)
    ones = np.ones(DOCS, int)
    split = []
    for _ in range(splits):
        order = rng.permutation(DOCS)
        split.append(_fit_score(data, ones, order[:n], order[n:]))
    s2 = float(np.var(split, ddof=1))
    nb = s2 * (1 / SEEDS + (DOCS - n) / n)
    boot = []
    # a resample draws ~63% of the documents once or more: where the training documents would take
    # over half of those, too few are left to test on (0.5 of 60); no figure there
    for _ in range(resamples if n <= 0.5 * 0.632 * DOCS else 0):
        counts = np.bincount(rng.integers(0, DOCS, DOCS), minlength=DOCS)
        drawn = rng.permutation(np.flatnonzero(counts))
        if len(drawn) - n < 2:  # too few distinct drawn documents left to test on
            continue
        counts[drawn[:n]] = 1
        boot.append(_fit_score(data, counts, drawn[:n], drawn[n:]))
    if len(boot) < resamples / 2:
        return nb, float("nan")
    vb = float(np.var(boot, ddof=1))
    return nb, max(vb - (1 - 1 / SEEDS) * s2, vb / SEEDS)


def _refit_training_part(data, frac: float, rng: np.random.Generator, splits: int = 20, resamples: int = 30):
    """(training part, its degrees of freedom) for the mean of the 3 seeds' figures, from
    ``splits`` re-splits of the same documents at the run's fraction, each re-fitting the aggregator
    on the cached scores (prototype, issue #39; not in the benchmark). As :func:`_new_split` does
    for seeds: the re-splits' spread less what their own test sets explain (each one's bootstrap
    test variance, ``resamples`` draws, times the test share), scaled up for the shared training
    documents and down for the 3 seeds averaged; Satterthwaite with ``splits`` - 1 behind it."""
    from sklearn.linear_model import Ridge
    from test_interval_coverage import DOCS, SEEDS

    from hdeval.benchmark.statistics import pooled_bootstrap_ci
    from hdeval.core.metrics import average_spearman

    scores, human, docs = data
    n = round(frac * DOCS)
    figs, own = [], []
    for _ in range(splits):
        train = np.isin(docs, rng.permutation(DOCS)[:n])
        pred = Ridge(alpha=1.0).fit(scores[train], human[train]).predict(scores[~train])
        figs.append(average_spearman(human[~train], pred))
        ci = pooled_bootstrap_ci(
            [(human[~train], pred, docs[~train])], n_resamples=resamples, seed=int(rng.integers(1 << 31))
        )
        own.append(ci["test_sd"] ** 2)
    test_share = (DOCS - n) / DOCS
    between = float(np.var(figs, ddof=1))
    scale = (1 - test_share) / test_share + 1 / SEEDS
    return max(0.0, between - float(np.mean(own)) * (1 - test_share)) * scale, scale * between


def main() -> None:
    from scipy import stats
    from test_interval_coverage import SEEDS, _data_set, _run

    from hdeval.benchmark.statistics import pooled_bootstrap_ci
    from hdeval.core.metrics import average_spearman

    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", default="0.15,0.3,0.5")
    ap.add_argument("--seeds", default="39,1,2")
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--resplit", action="store_true", help="also the re-splitting prototypes' coverage")
    ap.add_argument(
        "--refit-train", action="store_true", help="also today's test part + a re-fitted training part"
    )
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument(
        "--split-resamples", type=int, default=10, help="bootstrap draws per re-split's test variance"
    )
    args = ap.parse_args()
    for frac in (float(f) for f in args.fractions.split(",")):
        pooled, pooled_refit = [], []
        for seed in (int(s) for s in args.seeds.split(",")):
            rng = np.random.default_rng(seed)
            truth = np.mean([average_spearman(*_run(_data_set(rng), frac, rng)[:2]) for _ in range(2000)])
            hits, halves, var, err2 = [], [], [], []
            alt: dict[str, list[bool]] = {"nadeau_bengio": [], "refit_bootstrap": []}
            refit: dict[str, list[float]] = {"hit": [], "var": [], "clip": []}
            for k in range(args.datasets):
                data = _data_set(rng)
                runs = [_run(data, frac, rng) for _ in range(SEEDS)]
                ci = pooled_bootstrap_ci(
                    [r[:3] for r in runs], n_resamples=100, seed=k, train_sizes=[r[3] for r in runs]
                )
                hits.append(ci["low"] <= truth <= ci["high"])
                halves.append((ci["high"] - ci["low"]) / 2)
                var.append(ci["test_sd"] ** 2 + ci["training_sd"] ** 2)
                err2.append((ci["estimate"] - truth) ** 2)
                if args.resplit:  # its own random stream: the data sets above stay the same
                    z = stats.norm.ppf(0.975)
                    for name, v in zip(
                        alt,
                        _resplit_intervals(data, frac, np.random.default_rng([seed, k, 7])),
                    ):
                        if np.isfinite(v):
                            alt[name].append(abs(ci["estimate"] - truth) <= z * np.sqrt(v))
                if args.refit_train:  # its own random stream too: every other figure stays the same
                    tv, spread = _refit_training_part(
                        data, frac, np.random.default_rng([seed, k, 11]), args.splits, args.split_resamples
                    )
                    total = ci["test_sd"] ** 2 + tv
                    # Satterthwaite: the training part's noise is the re-splits' spread's
                    df = (
                        max(args.splits - 1.0, total**2 / (spread**2 / (args.splits - 1)))
                        if spread > 0
                        else np.inf
                    )
                    q = stats.t.ppf(0.975, df) if np.isfinite(df) else stats.norm.ppf(0.975)
                    refit["hit"].append(abs(ci["estimate"] - truth) <= q * np.sqrt(total))
                    refit["var"].append(total)
                    refit["clip"].append(tv == 0)
            if refit["hit"]:
                print(
                    f"  test part + re-fitted training part: coverage {np.mean(refit['hit']):.3f}, "
                    f"mean variance / mean squared error {np.mean(refit['var']) / np.mean(err2):.2f}, "
                    f"training part 0 in {np.mean(refit['clip']):.0%}",
                    flush=True,
                )
                pooled_refit += refit["hit"]
            pooled += hits
            print(
                f"train frac {frac} seed {seed}: truth {truth:.3f}, coverage {np.mean(hits):.3f}, "
                f"median half-width {np.median(halves):.3f}, "
                # is the variance right on average (the quantile then decides the rest)?
                f"mean variance / mean squared error {np.mean(var) / np.mean(err2):.2f}",
                flush=True,
            )
            for name, h in alt.items():
                if h:
                    print(f"  {name}: coverage {np.mean(h):.3f} over {len(h)} data sets", flush=True)
        print(f"train frac {frac}: coverage over {len(pooled)} data sets {np.mean(pooled):.3f}", flush=True)
        if pooled_refit:
            print(
                f"  re-fitted training part over {len(pooled_refit)}: {np.mean(pooled_refit):.3f}", flush=True
            )


if __name__ == "__main__":
    main()
