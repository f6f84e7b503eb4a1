"""Per-run records and per-setting figures (mean/std over seeds, bootstraps, layer
ablation, criteria efficiency): the content of results.json's ``runs`` and ``settings``."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdeval.benchmark.heldout import PAIR_STATISTICS, HeldOut, PairHeldOut, pair_arrays
from hdeval.benchmark.spec import BenchmarkSpec
from hdeval.benchmark.statistics import (
    _num,
    group,
    mean_std,
    pooled_bootstrap_ci,
    pooled_paired_bootstrap,
    ranking_exact_match,
    summary_level_correlation,
)
from hdeval.core.errors import ConfigError
from hdeval.core.metrics import METRICS, metric_table, pair_agreement
from hdeval.methods.base import BenchmarkRecord

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
    "rows": "every figure is taken on the test rows every method of the same seed and training fraction "
    "scored ('compared'): a row with an empty LLM-filled cell or no prediction in any method's run "
    "is left out for all of them (whatever a method does with it: HD-Eval imputes, direct leaves "
    "it empty). failure_rate: a method's share of test rows it failed on. 'own_rows': the method's "
    "figure on all its own test rows (those it did not fail on, whatever other methods failed), "
    "with its failure rate, beside the compared-rows figure used for every comparison.",
    "bootstrap": "One estimate over all seeds (their mean) with a 95% interval for the figure a new split "
    "of new data of the same sizes gives on average: test_sd from the test documents of all seeds "
    "drawn once with replacement (each seed keeping the drawn documents among its test rows, the "
    "fitted evaluators fixed), training_sd from the spread between seeds less what their test sets "
    "explain, scaled for the training documents the seeds share; mean ± t quantile (Welch-"
    "Satterthwaite degrees of freedom, at least seeds - 1, the training part as uncertain as the spread "
    "between seeds) "
    "x the root of their summed squares. 'covers' says which parts "
    "it holds: with one seed the test documents only. The difference to the baseline method is "
    "taken the same way on the same drawn documents, with the two-sided p-value of the same t.",
    "usage": "requests: the LLM requests a setting's runs asked for, each paid or answered from the cache "
    "(what the method costs, whatever the cache held); calls: those this sweep paid for.",
    "reference": "majority class (pairwise): the training split's most frequent label for every test pair "
    "(forced to a or b: the more frequent of the two), on the same compared rows.",
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
    table["average"] = {
        "value": _num(np.mean(vals)) if vals else None,
        "documents": min((t["documents"] for t in table.values()), default=0),
    }
    return table


def compare_rows(held: Mapping[tuple, Any]) -> tuple[dict[tuple, Any], dict[tuple, dict[str, Any]]]:
    """The rows every method is compared on: per (train_frac, seed), the test rows no run of that
    split failed on. Returns each run's held-out predictions on those rows, and per run its
    ``rows`` record (test rows, failed, failure_rate, compared, documents compared)."""
    groups = group(held, lambda key: (key[2], key[3]))
    kept: dict[tuple, Any] = {}
    rows: dict[tuple, dict[str, Any]] = {}
    for (frac, seed), keys in groups.items():  # noqa: B007 (the key names the group)
        first = held[keys[0]]
        for k in keys[1:]:
            if held[k].sample_ids != first.sample_ids:  # same seed, same split: never expected
                raise ConfigError(
                    f"the {keys[0][0]} and {k[0]} runs of seed {seed} have different test splits"
                )
        keep = ~np.logical_or.reduce([held[k].failed for k in keys])
        for k in keys:
            kept[k] = held[k].rows(keep)
            n, bad = len(first.sample_ids), int(held[k].failed.sum())
            rows[k] = {
                "test": n,
                "failed": bad,
                "failure_rate": _num(bad / n) if n else None,
                "compared": int(keep.sum()),
                "documents_compared": len(set(kept[k].doc_ids)),
            }
    return kept, rows


def own_rows(ho: HeldOut | PairHeldOut) -> dict[str, Any]:
    """A run's figure on all its own test rows (every row it did not fail on, whatever the other
    methods failed), with its failure rate: next to the compared-rows figure, it shows how much
    a method's headline owes to the rows other methods failed on."""
    n = len(ho.sample_ids)
    ok = np.ones(n, bool) if ho.failed is None else ~ho.failed
    mine = ho.rows(ok)
    rec: dict[str, Any] = {"rows": int(ok.sum()), "failure_rate": _num((n - ok.sum()) / n) if n else None}
    if isinstance(mine, PairHeldOut):
        rec["agreement"] = {v: pair_agreement(mine.human, *ab) for v, ab in mine.predictions.items()}
    else:
        rec["dataset"] = metric_table(mine.y, mine.pred, mine.aspects)
    return rec


def usage(mine: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The LLM use of these runs summed: requests (calls paid + cache hits), then each count."""
    u = {
        k: sum(int(r["usage"].get(k, 0)) for r in mine)
        for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")
    }
    return {"requests": u["calls"] + u["cache_hits"], **u}


def layers_on_rows(fitted: Any, ho: HeldOut) -> dict[str, Any] | None:
    """Each HD-Eval layer's proxy aggregator (the layer's kept kind, refitted on the training
    rows of the first layers' criteria; the kept layer's is the evaluator itself) on the rows
    ``ho`` holds: the compared rows, so the criteria-efficiency points and the main table give
    the same evaluator the same figure. None for an evaluator without criteria layers."""
    from sklearn.base import clone

    from hdeval.learn.aggregate import Aggregator

    agg, table = getattr(fitted, "aggregator", None), getattr(fitted, "score_table", None)
    reports = (getattr(fitted, "manifest_extra", None) or {}).get("layers")
    if not isinstance(agg, Aggregator) or not reports or table is None or not agg.aspects:
        return None
    keys = [
        str(c) for c in table.columns if c not in ("sample_id", "split") and not str(c).startswith("human:")
    ]
    train = table[table["split"] == "train"]
    where = {str(s): i for i, s in enumerate(table["sample_id"])}
    test = table.iloc[[where[s] for s in ho.sample_ids]]
    y_train = train[[f"human:{a}" for a in agg.aspects]].to_numpy(float)
    kept = (fitted.metrics.get("selection") or {}).get("kept_layer")
    out, total = {}, 0
    for r in sorted(reports, key=lambda r: int(r["layer"])):
        total += len(r.get("added") or [])
        cols = keys[:total]
        if int(r["layer"]) == kept and list(fitted.feature_keys) == cols:
            model = agg
        else:
            columns = [
                [j for j, k in enumerate(cols) if k == a]
                + [j for j, k in enumerate(cols) if k.startswith(a + "/")]
                for a in agg.aspects
            ]
            params = dict(r.get("params") or {})
            if "hidden_layer_sizes" in params:
                params["hidden_layer_sizes"] = tuple(params["hidden_layer_sizes"])
            model = clone(agg).set_params(kind=r["aggregator"], aspect_columns=columns, **params)
            model.fit(train[cols].to_numpy(float), y_train)
        out[str(int(r["layer"]))] = metric_table(ho.y, model.predict(test[cols].to_numpy(float)), ho.aspects)
    return out


def _run_record(
    fitted: Any,
    ho: HeldOut | PairHeldOut,
    method: str,
    agg: str | None,
    frac: float,
    seed: int,
    rows: Mapping[str, Any],
    own: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    m = fitted.metrics
    rec = {
        "method": method,
        "aggregator": agg,
        "train_frac": frac,
        "seed": seed,
        "fitted_aggregator": fitted.fitted_aggregator(),
        "n_train": m["split"]["train"],
        "n_test": m["split"]["test"],
        "usage": dict(m.get("usage") or {}),
        "rows": dict(rows),
        **({"own_rows": dict(own)} if own is not None else {}),
    }
    if isinstance(ho, PairHeldOut):
        return {**rec, "agreement": {v: pair_agreement(ho.human, *ab) for v, ab in ho.predictions.items()}}
    rec.update(
        {
            "dataset": metric_table(ho.y, ho.pred, ho.aspects),
            "summary_level": {
                metric: _per_aspect(ho, summary_level_correlation, metric=metric) for metric in METRICS
            },
            "ranking": {
                "exact_match": _per_aspect(ho, ranking_exact_match),
                "kendall_per_document": _per_aspect(ho, summary_level_correlation, metric="kendall"),
            },
        },
        **(fitted.benchmark_record() if isinstance(fitted, BenchmarkRecord) else {}),
    )
    compared = layers_on_rows(fitted, ho)
    if compared is not None:
        rec["layers_compared"] = compared
    return rec


def criteria_efficiency(
    settings: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Held-out average Spearman against the number of criteria an evaluator uses: per HD-Eval
    setting a point per layer (its layer-k proxy aggregator; criteria and Spearman as mean/std
    over seeds) and per direct setting one reference point at its criteria count (the aspects)."""
    out = []
    by_setting = _by_setting(runs)
    for s in settings:
        if s["method"] != BASELINE and "layers" not in s:  # no criteria count to plot
            continue
        mine = by_setting[(s["method"], s["aggregator"], s["train_frac"])]
        if s["method"] == BASELINE:
            points = [
                {
                    "layer": None,
                    "criteria": mean_std([r["criteria"] for r in mine]),
                    "spearman": s["dataset"]["average"]["spearman"],
                }
            ]
        else:
            # on the compared rows, as the main table (older results: each artifact's own test rows)
            figures = s.get("layers_compared") or s["layers"]
            points = [
                {
                    "layer": int(k),
                    "criteria": mean_std([r["criteria_per_layer"].get(k) for r in mine]),
                    "spearman": figures[k],
                }
                for k in figures
            ]
        out.append(
            {
                "method": s["method"],
                "aggregator": s["aggregator"],
                "train_frac": s["train_frac"],
                "points": points,
            }
        )
    return out


def _avg(table: Mapping[str, Any], metric: str) -> float | None:
    return (table.get("average") or {}).get(metric)


def _by_setting(runs: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """(method, aggregator, train_frac) -> its runs (one per seed), in first-seen order."""
    return group(runs, lambda r: (r["method"], r["aggregator"], r["train_frac"]))


def _settings(
    spec: BenchmarkSpec, runs: list[dict[str, Any]], held: Mapping[tuple, Any], pairwise: bool
) -> list[dict[str, Any]]:
    """Per (method, aggregator, train_frac): figures over seeds, pooled bootstraps, layer ablation."""
    out = []
    for (method, agg, frac), mine in _by_setting(runs).items():
        seeds = [r["seed"] for r in mine]
        hos = [held[(method, agg, frac, seed)] for seed in seeds]
        s = {
            "method": method,
            "aggregator": agg,
            "train_frac": frac,
            "method_options": dict(spec.method_options.get(method) or {}),
            "seeds": seeds,
            **(_pair_figures if pairwise else _point_figures)(spec, method, frac, mine, hos, held),
            "rows": {
                "compared": [r["rows"]["compared"] for r in mine],
                "documents_compared": [r["rows"]["documents_compared"] for r in mine],
                "failure_rate": mean_std([r["rows"]["failure_rate"] for r in mine]),
            },
        }
        if all("own_rows" in r for r in mine):
            s["own_rows"] = {
                "rows": [r["own_rows"]["rows"] for r in mine],
                "failure_rate": mean_std([r["own_rows"]["failure_rate"] for r in mine]),
            }
            if pairwise:
                s["own_rows"]["agreement"] = {
                    v: {
                        k: mean_std([((r["own_rows"]["agreement"].get(v) or {}).get(k)) for r in mine])
                        for k in PAIR_STATISTICS
                    }
                    for v in s["agreement"]
                }
            else:
                s["own_rows"]["average_spearman"] = mean_std(
                    [_avg(r["own_rows"]["dataset"], "spearman") for r in mine]
                )
        if "layers" in mine[0]:  # a method with criteria layers: the layer ablation
            layers = sorted({k for r in mine for k in r["layers"]}, key=int)
            s["layers"] = {
                k: mean_std([_avg(r["layers"].get(k) or {}, "spearman") for r in mine]) for k in layers
            }
            if all("layers_compared" in r for r in mine):
                s["layers_compared"] = {
                    k: mean_std([_avg(r["layers_compared"].get(k) or {}, "spearman") for r in mine])
                    for k in layers
                }
            names = sorted({k for r in mine for k in r["baselines"]})
            s["baselines"] = {
                k: mean_std([_avg(r["baselines"].get(k) or {}, "spearman") for r in mine]) for k in names
            }
        s["usage"] = usage(mine)
        out.append(s)
    return out


def _point_figures(
    spec: BenchmarkSpec,
    method: str,
    frac: float,
    mine: list[dict[str, Any]],
    hos: Sequence[HeldOut],
    held: Mapping[tuple, Any],
) -> dict[str, Any]:
    aspects = [a for a in mine[0]["dataset"] if a != "average"] + ["average"]
    seeds = [r["seed"] for r in mine]
    trained = [r["n_train"] for r in mine]
    boot: dict[str, Any] = {
        "average_spearman": pooled_bootstrap_ci(
            [(ho.y, ho.pred, ho.doc_ids) for ho in hos], n_resamples=spec.resamples, train_sizes=trained
        )
    }
    bases = [held.get((BASELINE, None, frac, seed)) for seed in seeds]
    if method != BASELINE and all(b is not None for b in bases):
        boot["vs_direct"] = pooled_paired_bootstrap(
            [(ho.y, ho.pred, b.pred, ho.doc_ids) for ho, b in zip(hos, bases)],  # type: ignore[union-attr]
            n_resamples=spec.resamples,
            train_sizes=trained,
        )

    def over_seeds(figure: str, keys: Sequence[str]) -> dict[str, Any]:
        return {k: {a: mean_std([r[figure][k][a]["value"] for r in mine]) for a in aspects} for k in keys}

    return {
        "dataset": {a: {m: mean_std([r["dataset"][a][m] for r in mine]) for m in METRICS} for a in aspects},
        "summary_level": over_seeds("summary_level", METRICS),
        "ranking": over_seeds("ranking", ("exact_match", "kendall_per_document")),
        "bootstrap": boot,
    }


def _pair_boot(
    spec: BenchmarkSpec,
    hos: Sequence[PairHeldOut],
    trained: Sequence[int] | None,
    variant: str,
    bases: Sequence[PairHeldOut | None],
) -> dict[str, Any]:
    """Both agreements of ``variant`` pooled over seeds, and their differences to the baseline's."""
    arrays = [pair_arrays(ho, variant) for ho in hos]
    out: dict[str, Any] = {
        "agreement": {
            k: pooled_bootstrap_ci(
                [(y, p, ho.doc_ids) for (y, p), ho in zip(arrays, hos)],
                statistic=f,
                n_resamples=spec.resamples,
                train_sizes=trained,
                bounds=(0.0, 1.0),
            )
            for k, f in PAIR_STATISTICS.items()
        }
    }
    if bases and all(b is not None for b in bases):
        cases = [(y, p, pair_arrays(b)[1], ho.doc_ids) for (y, p), b, ho in zip(arrays, bases, hos)]
        out[PAIR_VS] = {
            k: pooled_paired_bootstrap(
                cases, statistic=f, n_resamples=spec.resamples, train_sizes=trained, bounds=(0.0, 1.0)
            )
            for k, f in PAIR_STATISTICS.items()
        }
    return out


def _pair_figures(
    spec: BenchmarkSpec,
    method: str,
    frac: float,
    mine: list[dict[str, Any]],
    hos: Sequence[PairHeldOut],
    held: Mapping[tuple, Any],
) -> dict[str, Any]:
    variants = list(dict.fromkeys(v for r in mine for v in r["agreement"]))
    seeds = [r["seed"] for r in mine]
    # the majority baseline has no training runs: its interval covers the test documents only
    trained = [r["n_train"] for r in mine] if all("n_train" in r for r in mine) else None
    bases = [] if method == PAIR_BASELINE else [held.get((PAIR_BASELINE, None, frac, seed)) for seed in seeds]
    boot = _pair_boot(spec, hos, trained, "evaluator", bases)
    if all("learned" in ho.predictions for ho in hos):  # DnA's learned aggregation, on the same resamples
        boot["learned"] = _pair_boot(spec, hos, trained, "learned", bases)
    return {
        "agreement": {
            v: {k: mean_std([(r["agreement"].get(v) or {}).get(k) for r in mine]) for k in PAIR_STATISTICS}
            for v in variants
        },
        "bootstrap": boot,
    }


def _majority(labels: Sequence[str | None], among: Sequence[str]) -> str | None:
    counts = Counter(x for x in labels if x in among)
    return max(among, key=counts.__getitem__) if counts else None  # ties: the earlier


def pair_references(
    spec: BenchmarkSpec, runs: list[dict[str, Any]], held: Mapping[tuple, PairHeldOut]
) -> list[dict[str, Any]]:
    """The majority-class baseline per training fraction: every test pair given the training
    split's most frequent label (forced to a or b: the more frequent of those two), scored as
    a method on the same compared rows and resamples."""
    out = []
    for frac in dict.fromkeys(r["train_frac"] for r in runs):
        seeds = list(dict.fromkeys(r["seed"] for r in runs if r["train_frac"] == frac))
        hos = []
        for seed in seeds:
            ho = next(h for k, h in held.items() if k[2] == frac and k[3] == seed)
            train = ho.train_human or []
            label, forced = _majority(train, ("a", "b", "tie")), _majority(train, ("a", "b"))
            hos.append(
                type(ho)(
                    ho.sample_ids,
                    ho.doc_ids,
                    ho.human,
                    {"evaluator": ([label] * len(ho.human), [forced] * len(ho.human))},
                )
            )
        mine = [
            {"seed": seed, "agreement": {"evaluator": pair_agreement(h.human, *h.predictions["evaluator"])}}
            for seed, h in zip(seeds, hos)
        ]
        out.append(
            {
                "method": "majority",
                "aggregator": None,
                "train_frac": frac,
                "seeds": seeds,
                **_pair_figures(spec, "majority", frac, mine, hos, {}),  # no baseline: held is empty
                "rows": {
                    "compared": [len(h.human) for h in hos],
                    "documents_compared": [len(set(h.doc_ids)) for h in hos],
                },
            }
        )
    return out
