"""Per-run records and per-setting figures (mean/std over seeds, bootstraps, layer
ablation, criteria efficiency): the content of results.json's ``runs`` and ``settings``."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdeval.errors import ConfigError
from hdeval.metrics import METRICS
from hdeval.benchmark.heldout import PAIR_STATISTICS, HeldOut, PairHeldOut, pair_arrays
from hdeval.benchmark.spec import BenchmarkSpec
from hdeval.benchmark.statistics import (
    _num, bootstrap_ci, mean_std, paired_bootstrap, ranking_exact_match, summary_level_correlation,
)

BASELINE = "direct"  # the paired bootstrap is taken to it when it is among --methods
PAIR_BASELINE = "dna-direct"  # the pairwise difference is taken to it when it is among --methods
PAIR_VS = "vs_" + PAIR_BASELINE.replace("-", "_")


DEFINITIONS = {
    "dataset": "Pearson/Spearman/Kendall between predicted and human scores over all test samples, per "
               "aspect; average = mean over aspects (as the paper and metrics.json).",
    "summary_level": "Per doc_id, the correlation of the outputs' predicted and human scores; mean over "
                     "the documents where both vary (as G-Eval reports SummEval).",
    "ranking": "exact_match: share of documents whose outputs are ranked exactly in the human order "
               "(pairs the humans tied are not judged); kendall_per_document: mean per-document Kendall tau.",
    "bootstrap": "Documents of the test split resampled with replacement (seeded): 95% percentile interval "
                 "of the average dataset-level Spearman, and of its difference to the direct method on the "
                 "same resamples, with a two-sided bootstrap p-value. One entry per seed.",
    "seeds": "mean and sample std over seeds (each seed: its own split and model randomness).",
    "agreement": "pairwise tasks: w_ties = 3-way accuracy (a/b/tie) over the test pairs with a prediction; "
                 "wo_ties = accuracy on the pairs whose human label is not a tie, the prediction forced to "
                 "a or b (as metrics.json and `agreement` of --method dna). 'evaluator' is the method's own "
                 "prediction (DnA: its LLM weights; HD-Eval: its classifier), 'learned' DnA's logistic "
                 "regression on aspect-score differences. The pairwise bootstrap resamples test documents "
                 "for both figures and takes the difference to dna-direct when it is among --methods; "
                 "for DnA's learned aggregation the same under 'learned', on the same resamples.",
    "layers": "HD-Eval's per-layer proxy aggregators (layer k = without the layers after k) and the "
              "'w/o aggregator' baselines, from each artifact's metrics.json.",
    "criteria_efficiency": "held-out average Spearman against the number of criteria the evaluator uses "
                           "(mean/std over seeds): HD-Eval a point per layer (its layer-k proxy aggregator "
                           "uses the criteria of layers 1..k, counted from its layer reports), direct one "
                           "point at its criteria count (the aspects).",
}


def _per_aspect(ho: HeldOut, fn: Callable[..., dict[str, Any]], **kw: Any) -> dict[str, Any]:
    table = {a: fn(ho.y[:, j], ho.pred[:, j], ho.doc_ids, **kw) for j, a in enumerate(ho.aspects)}
    vals = [t["value"] for t in table.values() if t["value"] is not None]
    table["average"] = {"value": _num(np.mean(vals)) if vals else None,
                        "documents": min((t["documents"] for t in table.values()), default=0)}
    return table


def _run_record(fitted: Any, ho: HeldOut, method: str, agg: str | None, frac: float, seed: int) -> dict[str, Any]:
    from hdeval.metrics import metric_table

    m = fitted.metrics
    rec: dict[str, Any] = {
        "method": method, "aggregator": agg, "train_frac": frac, "seed": seed,
        "fitted_aggregator": fitted.fitted_aggregator(),
        "n_train": m["split"]["train"], "n_test": m["split"]["test"],
        "usage": dict(m.get("usage") or {}),
        "dataset": metric_table(ho.y, ho.pred, ho.aspects),
        "summary_level": {metric: _per_aspect(ho, summary_level_correlation, metric=metric) for metric in METRICS},
        "ranking": {"exact_match": _per_aspect(ho, ranking_exact_match),
                    "kendall_per_document": _per_aspect(ho, summary_level_correlation, metric="kendall")},
    }
    rec.update(fitted.benchmark_record())
    return rec


def criteria_efficiency(settings: Sequence[Mapping[str, Any]],
                        runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Held-out average Spearman against the number of criteria an evaluator uses: per HD-Eval
    setting a point per layer (its layer-k proxy aggregator; criteria and Spearman as mean/std
    over seeds) and per direct setting one reference point at its criteria count (the aspects)."""
    out = []
    for s in settings:
        if s["method"] != BASELINE and "layers" not in s:  # no criteria count to plot
            continue
        mine = [r for r in runs if (r["method"], r["aggregator"], r["train_frac"])
                == (s["method"], s["aggregator"], s["train_frac"])]
        if s["method"] == BASELINE:
            points = [{"layer": None, "criteria": mean_std([r["criteria"] for r in mine]),
                       "spearman": s["dataset"]["average"]["spearman"]}]
        else:
            points = [{"layer": int(k), "criteria": mean_std([r["criteria_per_layer"].get(k) for r in mine]),
                       "spearman": s["layers"][k]} for k in s["layers"]]
        out.append({"method": s["method"], "aggregator": s["aggregator"], "train_frac": s["train_frac"],
                    "points": points})
    return out


def _avg(table: Mapping[str, Any], metric: str) -> float | None:
    return (table.get("average") or {}).get(metric)


def _settings(spec: BenchmarkSpec, runs: list[dict[str, Any]], held: Mapping[tuple, HeldOut]) -> list[dict[str, Any]]:
    """Per (method, aggregator, train_frac): mean/std over seeds, bootstraps, layer ablation."""
    out = []
    keys = list(dict.fromkeys((r["method"], r["aggregator"], r["train_frac"]) for r in runs))
    for method, agg, frac in keys:
        mine = [r for r in runs if (r["method"], r["aggregator"], r["train_frac"]) == (method, agg, frac)]
        aspects = [a for a in mine[0]["dataset"] if a != "average"]
        s: dict[str, Any] = {"method": method, "aggregator": agg, "train_frac": frac,
                             "method_options": dict(spec.method_options.get(method) or {}),
                             "seeds": [r["seed"] for r in mine]}
        s["dataset"] = {a: {m: mean_std([r["dataset"][a][m] for r in mine]) for m in METRICS}
                        for a in aspects + ["average"]}
        s["summary_level"] = {m: {a: mean_std([r["summary_level"][m][a]["value"] for r in mine])
                                  for a in aspects + ["average"]} for m in METRICS}
        s["ranking"] = {k: {a: mean_std([r["ranking"][k][a]["value"] for r in mine]) for a in aspects + ["average"]}
                        for k in ("exact_match", "kendall_per_document")}
        boot = []
        for r in mine:
            ho = held[(method, agg, frac, r["seed"])]
            entry: dict[str, Any] = {"seed": r["seed"], "average_spearman": bootstrap_ci(
                ho.y, ho.pred, ho.doc_ids, n_resamples=spec.resamples, seed=r["seed"])}
            base = held.get((BASELINE, None, frac, r["seed"]))
            if base is not None and method != BASELINE:
                if base.sample_ids != ho.sample_ids:  # same seed, same split: never expected
                    raise ConfigError(f"the direct and {method} runs of seed {r['seed']} have different test splits")
                entry["vs_direct"] = paired_bootstrap(ho.y, ho.pred, base.pred, ho.doc_ids,
                                                      n_resamples=spec.resamples, seed=r["seed"])
            boot.append(entry)
        s["bootstrap"] = boot
        if "layers" in mine[0]:  # a method with criteria layers: the layer ablation
            layers = sorted({k for r in mine for k in r["layers"]}, key=int)
            s["layers"] = {k: mean_std([_avg(r["layers"].get(k) or {}, "spearman") for r in mine]) for k in layers}
            names = sorted({k for r in mine for k in r["baselines"]})
            s["baselines"] = {k: mean_std([_avg(r["baselines"].get(k) or {}, "spearman") for r in mine])
                              for k in names}
        s["usage"] = {k: sum(int(r["usage"].get(k, 0)) for r in mine)
                      for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")}
        out.append(s)
    return out


def _pair_run_record(fitted: Any, ho: PairHeldOut, method: str, agg: str | None, frac: float,
                     seed: int) -> dict[str, Any]:
    from hdeval.metrics import pair_agreement as agreement

    m = fitted.metrics
    return {
        "method": method, "aggregator": agg, "train_frac": frac, "seed": seed,
        "fitted_aggregator": fitted.fitted_aggregator(),
        "n_train": m["split"]["train"], "n_test": m["split"]["test"],
        "usage": dict(m.get("usage") or {}),
        "agreement": {v: agreement(ho.human, pred, ab) for v, (pred, ab) in ho.predictions.items()},
    }


def _pair_settings(spec: BenchmarkSpec, runs: list[dict[str, Any]],
                   held: Mapping[tuple, PairHeldOut]) -> list[dict[str, Any]]:
    """Per (method, aggregator, train_frac): agreement mean/std over seeds and, per seed, the
    bootstrap over test documents (with the difference to dna-direct when it ran)."""
    out = []
    keys = list(dict.fromkeys((r["method"], r["aggregator"], r["train_frac"]) for r in runs))
    for method, agg, frac in keys:
        mine = [r for r in runs if (r["method"], r["aggregator"], r["train_frac"]) == (method, agg, frac)]
        variants = list(dict.fromkeys(v for r in mine for v in r["agreement"]))
        s: dict[str, Any] = {"method": method, "aggregator": agg, "train_frac": frac,
                             "method_options": dict(spec.method_options.get(method) or {}),
                             "seeds": [r["seed"] for r in mine]}
        s["agreement"] = {v: {k: mean_std([(r["agreement"].get(v) or {}).get(k) for r in mine])
                              for k in PAIR_STATISTICS} for v in variants}
        boot = []
        for r in mine:
            ho = held[(method, agg, frac, r["seed"])]
            y, p = pair_arrays(ho)
            entry: dict[str, Any] = {"seed": r["seed"], "agreement": {
                k: bootstrap_ci(y, p, ho.doc_ids, statistic=f, n_resamples=spec.resamples, seed=r["seed"])
                for k, f in PAIR_STATISTICS.items()}}
            base = held.get((PAIR_BASELINE, None, frac, r["seed"]))
            bp = None
            if base is not None and method != PAIR_BASELINE:
                if base.sample_ids != ho.sample_ids:  # same seed, same split: never expected
                    raise ConfigError(f"the {PAIR_BASELINE} and {method} runs of seed {r['seed']} have "
                                      "different test splits")
                _, bp = pair_arrays(base)
                entry[PAIR_VS] = {k: paired_bootstrap(y, p, bp, ho.doc_ids, statistic=f, n_resamples=spec.resamples,
                                                      seed=r["seed"]) for k, f in PAIR_STATISTICS.items()}
            if "learned" in ho.predictions:  # DnA's learned aggregation, on the same resamples
                _, lp = pair_arrays(ho, "learned")
                learned: dict[str, Any] = {"agreement": {
                    k: bootstrap_ci(y, lp, ho.doc_ids, statistic=f, n_resamples=spec.resamples, seed=r["seed"])
                    for k, f in PAIR_STATISTICS.items()}}
                if bp is not None:
                    learned[PAIR_VS] = {k: paired_bootstrap(y, lp, bp, ho.doc_ids, statistic=f,
                                                            n_resamples=spec.resamples, seed=r["seed"])
                                        for k, f in PAIR_STATISTICS.items()}
                entry["learned"] = learned
            boot.append(entry)
        s["bootstrap"] = boot
        s["usage"] = {k: sum(int(r["usage"].get(k, 0)) for r in mine)
                      for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")}
        out.append(s)
    return out
