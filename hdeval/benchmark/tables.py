"""The tables results.md and report.html show, from results.json's content."""

from __future__ import annotations

from typing import Any, Mapping

from hdeval.benchmark.settings import PAIR_BASELINE, PAIR_VS
from hdeval.report import fmt_num as _f
from hdeval.report.bench import setting_name as _name


def _ms(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    return f"{d['mean']:.3f} ± {d['std']:.3f}" if d.get("n", 0) > 1 else f"{d['mean']:.3f}"


Table = tuple[str, list[str], list[list[str]]]  # (the sentence above it, header, rows)


def _over(results: Mapping[str, Any]) -> str:
    return f"{results['spec']['seeds']} seed(s), on the test rows every method of a seed scored"


def _pooled(results: Mapping[str, Any]) -> str:
    what = (
        "its test documents and its training (seeds' spread)"
        if results["spec"]["seeds"] > 1
        else "its test documents only (one seed shows no training variability: give --seeds 3 or more)"
    )
    return (
        "CI: 95% interval for the figure a new split of new data would give on average, covering "
        f"{what}; test documents drawn once for all seeds ({results['spec']['resamples']} "
        "resamples); Δ: the difference, taken the same way."
    )


def _ci(ci: Mapping[str, Any] | None) -> str:
    return f"[{_f(ci['low'])}, {_f(ci['high'])}]" if ci else ""


def _own(s: Mapping[str, Any], figure: str, key: str | None = None) -> str:
    """The figure on a method's own test rows (all it did not fail on) and their count."""
    own = s.get("own_rows") or {}
    d = own.get(figure)
    if d is not None and key is not None:
        d = (d.get("evaluator") or {}).get(key)
    if not d:
        return ""
    n = sorted(set(own.get("rows") or []))
    return f"{_ms(d)} ({'/'.join(str(x) for x in n)} rows)"


def _rows_cost(s: Mapping[str, Any]) -> list[str]:
    """failure rate, rows compared (per seed when they differ), requests and the new calls among them."""
    rows = s.get("rows") or {}
    n = sorted(set(rows.get("compared") or []))
    usage = s.get("usage")
    return [
        _ms(rows.get("failure_rate")) if rows.get("failure_rate") else "",
        "/".join(str(x) for x in n) if len(n) > 1 else (str(n[0]) if n else ""),
        f"{usage['requests']} ({usage['calls']})" if usage else "",
    ]


def benchmark_tables(results: Mapping[str, Any]) -> tuple[str, list[Table]]:
    """The title and the tables both results.md and report.html show (mean ± std over seeds)."""
    if results.get("shape") == "pairwise":
        return _pairwise_tables(results)
    aspects = list(results["aspects"])
    title = f"Benchmark: {results['task']} ({', '.join(aspects)})"
    intro = f"Held-out dataset-level Spearman, mean ± std over {_over(results)}. {_pooled(results)}"
    head = [
        "method",
        "train frac",
        *aspects,
        "average",
        "summary-level",
        "rank exact-match",
        "95% CI",
        "Δ vs direct [95% CI], p",
        "failed",
        "rows compared",
        "requests (new calls)",
        "average on its own rows",
    ]
    rows = []
    for s in results["settings"]:
        b = s["bootstrap"]
        ci = b["average_spearman"]
        rows.append(
            [
                _name(s),
                f"{s['train_frac']:g}",
                *[_ms(s["dataset"][a]["spearman"]) for a in aspects],
                _ms(s["dataset"]["average"]["spearman"]),
                _ms(s["summary_level"]["spearman"]["average"]),
                _ms(s["ranking"]["exact_match"]["average"]),
                _ci(ci),
                _delta(b.get("vs_direct")),
                *_rows_cost(s),
                _own(s, "average_spearman"),
            ]
        )
    tables: list[Table] = [(intro, head, rows)]
    ablation = [s for s in results["settings"] if s.get("layers")]
    if ablation:
        layer_keys = sorted({k for s in ablation for k in s["layers"]}, key=int)
        base_keys = sorted({k for s in ablation for k in s["baselines"]})
        tables.append(
            (
                "Layer ablation (held-out average Spearman; layers 1-k = without the later layers; "
                "from each artifact's metrics.json, on all its test rows) and 'w/o aggregator' baselines:",
                ["method", "train frac", *[f"layers 1-{k}" for k in layer_keys], *base_keys],
                [
                    [
                        _name(s),
                        f"{s['train_frac']:g}",
                        *[_ms(s["layers"].get(k)) for k in layer_keys],
                        *[_ms(s["baselines"].get(k)) for k in base_keys],
                    ]
                    for s in ablation
                ],
            )
        )
    if results.get("criteria_efficiency"):
        tables.append(
            (
                "Criteria efficiency (held-out average Spearman against the number of criteria the "
                "evaluator uses, on the rows compared, as above; HD-Eval: its layer-k proxy aggregator, "
                "direct: the aspects):",
                ["method", "train frac", "layer", "criteria", "average Spearman"],
                [
                    [
                        _name(line),
                        f"{line['train_frac']:g}",
                        "" if pt["layer"] is None else str(pt["layer"]),
                        _ms1(pt["criteria"]),
                        _ms(pt["spearman"]),
                    ]
                    for line in results["criteria_efficiency"]
                    for pt in line["points"]
                ],
            )
        )
    from hdeval.benchmark.curves import curve_tables

    return title, tables + curve_tables(results) + [_cost_table(results)]


def render_markdown(results: Mapping[str, Any]) -> str:
    """``results.md``: tables a person pastes into a paper (mean ± std over seeds)."""
    title, tables = benchmark_tables(results)
    lines = [f"# {title}"] + [f"\n**Warning:** {w}" for w in results.get("warnings") or []]
    for intro, head, rows in tables:
        lines += ["", intro, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _ms1(d: Mapping[str, Any] | None) -> str:
    """A count's mean ± std over seeds (no std when every seed agrees)."""
    if not d or d.get("mean") is None:
        return "n/a"
    return f"{d['mean']:g}" if not d.get("std") else f"{d['mean']:.1f} ± {d['std']:.1f}"


def _cost_table(results: Mapping[str, Any]) -> Table:
    return (
        "Cost per method (all runs): requests = what its runs asked the LLM, paid or from the cache (its "
        "cost from an empty cache); new calls = those this sweep paid for (cached calls are free):",
        ["method", "runs", "requests", "new LLM calls", "cache hits", "prompt tokens", "completion tokens"],
        [
            [
                str(m),
                str(c["runs"]),
                str(c.get("requests", c["calls"] + c["cache_hits"])),
                str(c["calls"]),
                str(c["cache_hits"]),
                str(c["prompt_tokens"]),
                str(c["completion_tokens"]),
            ]
            for m, c in results["cost"].items()
        ],
    )


def _delta(vs: Mapping[str, Any] | None) -> str:
    """The difference, its interval and p-value (below 0.001 printed as a bound; an older
    results.json's bootstrap p at the floor its resamples could reach, as that bound)."""
    if not vs or vs["difference"] is None:
        return ""
    p, floor = vs.get("p_value"), vs.get("p_floor")
    at_floor = p is not None and floor is not None and p <= floor + 1e-9
    if at_floor:
        shown = f"p ≤ {_f(floor)}"
    else:
        shown = "p < 0.001" if p is not None and p < 0.001 else f"p={_f(p)}"
    return f"{vs['difference']:+.3f} [{_f(vs['low'])}, {_f(vs['high'])}], " + shown


def _pairwise_tables(results: Mapping[str, Any]) -> tuple[str, list[Table]]:
    intro = (
        f"Held-out agreement with the human labels, mean ± std over {_over(results)}: w/o ties (the "
        "prediction forced to a or b, on pairs humans did not tie) and w/ ties (3-way); 'learned' is "
        "DnA's logistic regression on aspect-score differences next to its LLM weights; 'majority' "
        f"gives every pair the training split's most frequent label. {_pooled(results)}"
    )
    head = [
        "method",
        "train frac",
        "w/o ties",
        "95% CI",
        "w/ ties",
        "95% CI",
        f"Δ w/o ties vs {PAIR_BASELINE} [95% CI], p",
        f"Δ w/ ties vs {PAIR_BASELINE} [95% CI], p",
        "failed",
        "rows compared",
        "requests (new calls)",
        "w/ ties on its own rows",
    ]
    rows = []
    for s in [*results.get("reference", []), *results["settings"]]:
        b = s["bootstrap"]
        for variant, boot in (("evaluator", b), ("learned", b.get("learned"))):
            ag = s["agreement"].get(variant)
            if not ag or not boot:
                continue
            ci, vs = boot["agreement"], boot.get(PAIR_VS) or {}
            name = _name(s) + ("" if variant == "evaluator" else " (learned)")
            rows.append(
                [
                    name,
                    f"{s['train_frac']:g}",
                    _ms(ag.get("wo_ties")),
                    _ci(ci.get("wo_ties")),
                    _ms(ag.get("w_ties")),
                    _ci(ci.get("w_ties")),
                    _delta(vs.get("wo_ties")),
                    _delta(vs.get("w_ties")),
                    *(_rows_cost(s) if variant == "evaluator" else ["", "", ""]),
                    _own(s, "agreement", "w_ties") if variant == "evaluator" else "",
                ]
            )
    from hdeval.benchmark.curves import curve_tables

    return f"Benchmark: {results['task']} (pairwise)", [
        (intro, head, rows),
        *curve_tables(results),
        _cost_table(results),
    ]
