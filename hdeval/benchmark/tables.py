"""The tables results.md and report.html show, from results.json's content."""

from __future__ import annotations

from typing import Any, Mapping

from hdeval.benchmark.settings import PAIR_BASELINE, PAIR_VS


def _f(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ms(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    return f"{d['mean']:.3f} ± {d['std']:.3f}" if d.get("n", 0) > 1 else f"{d['mean']:.3f}"


def _name(s: Mapping[str, Any]) -> str:
    return s["method"] if s["aggregator"] is None else f"{s['method']}-{s['aggregator']}"


Table = tuple[str, list[str], list[list[str]]]  # (the sentence above it, header, rows)


def benchmark_tables(results: Mapping[str, Any]) -> tuple[str, list[Table]]:
    """The title and the tables both results.md and report.html show (mean ± std over seeds)."""
    if results.get("shape") == "pairwise":
        return _pairwise_tables(results)
    aspects = list(results["aspects"])
    seeds = results["spec"]["seeds"]
    title = f"Benchmark: {results['task']} ({', '.join(aspects)})"
    intro = (f"Held-out dataset-level Spearman, mean ± std over {seeds} seed(s); CI: 95% paired bootstrap "
             f"over documents ({results['spec']['resamples']} resamples) on seed 0's test split.")
    head = ["method", "train frac", *aspects, "average", "summary-level", "rank exact-match", "95% CI",
            "Δ vs direct [95% CI], p", "calls"]
    rows = []
    for s in results["settings"]:
        b = s["bootstrap"][0]
        ci = b["average_spearman"]
        rows.append([_name(s), f"{s['train_frac']:g}", *[_ms(s["dataset"][a]["spearman"]) for a in aspects],
                     _ms(s["dataset"]["average"]["spearman"]), _ms(s["summary_level"]["spearman"]["average"]),
                     _ms(s["ranking"]["exact_match"]["average"]), f"[{_f(ci['low'])}, {_f(ci['high'])}]",
                     _delta(b.get("vs_direct")), str(s["usage"]["calls"])])
    tables: list[Table] = [(intro, head, rows)]
    ablation = [s for s in results["settings"] if s.get("layers")]
    if ablation:
        layer_keys = sorted({k for s in ablation for k in s["layers"]}, key=int)
        base_keys = sorted({k for s in ablation for k in s["baselines"]})
        tables.append(("Layer ablation (held-out average Spearman; layers 1-k = without the later layers) and "
                       "'w/o aggregator' baselines:",
                       ["method", "train frac", *[f"layers 1-{k}" for k in layer_keys], *base_keys],
                       [[_name(s), f"{s['train_frac']:g}", *[_ms(s["layers"].get(k)) for k in layer_keys],
                         *[_ms(s["baselines"].get(k)) for k in base_keys]] for s in ablation]))
    if results.get("criteria_efficiency"):
        tables.append(("Criteria efficiency (held-out average Spearman against the number of criteria the "
                       "evaluator uses; HD-Eval: its layer-k proxy aggregator, direct: the aspects):",
                       ["method", "train frac", "layer", "criteria", "average Spearman"],
                       [[_name(line), f"{line['train_frac']:g}", "" if pt["layer"] is None else str(pt["layer"]),
                         _ms1(pt["criteria"]), _ms(pt["spearman"])]
                        for line in results["criteria_efficiency"] for pt in line["points"]]))
    return title, tables + [_cost_table(results)]


def render_markdown(results: Mapping[str, Any]) -> str:
    """``results.md``: tables a person pastes into a paper (mean ± std over seeds)."""
    title, tables = benchmark_tables(results)
    lines = [f"# {title}"]
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
    return ("Cost per method (all runs; cached calls are free):",
            ["method", "runs", "LLM calls", "cache hits", "prompt tokens", "completion tokens"],
            [[str(m), str(c["runs"]), str(c["calls"]), str(c["cache_hits"]), str(c["prompt_tokens"]),
              str(c["completion_tokens"])] for m, c in results["cost"].items()])


def _delta(vs: Mapping[str, Any] | None) -> str:
    return (f"{vs['difference']:+.3f} [{_f(vs['low'])}, {_f(vs['high'])}], p={_f(vs['p_value'])}"
            if vs and vs["difference"] is not None else "")


def _pairwise_tables(results: Mapping[str, Any]) -> tuple[str, list[Table]]:
    seeds = results["spec"]["seeds"]
    intro = (f"Held-out agreement with the human labels, mean ± std over {seeds} seed(s): w/o ties (the "
             "prediction forced to a or b, on pairs humans did not tie) and w/ ties (3-way); 'learned' is "
             "DnA's logistic regression on aspect-score differences next to its LLM weights. CI: 95% "
             f"bootstrap over documents ({results['spec']['resamples']} resamples) on seed 0's test split.")
    base = PAIR_VS
    head = ["method", "train frac", "w/o ties", "w/ ties", "learned w/o ties", "learned w/ ties",
            "95% CI w/o ties", f"Δ w/o ties vs {PAIR_BASELINE} [95% CI], p",
            f"learned Δ w/o ties vs {PAIR_BASELINE} [95% CI], p", "calls"]
    rows = []
    for s in results["settings"]:
        b = s["bootstrap"][0]
        ci = b["agreement"]["wo_ties"]
        vs = (b.get(base) or {}).get("wo_ties")
        lvs = ((b.get("learned") or {}).get(base) or {}).get("wo_ties")
        ev, learned = s["agreement"].get("evaluator") or {}, s["agreement"].get("learned") or {}
        rows.append([_name(s), f"{s['train_frac']:g}", _ms(ev.get("wo_ties")), _ms(ev.get("w_ties")),
                     _ms(learned.get("wo_ties")) if learned else "", _ms(learned.get("w_ties")) if learned else "",
                     f"[{_f(ci['low'])}, {_f(ci['high'])}]", _delta(vs), _delta(lvs), str(s["usage"]["calls"])])
    return f"Benchmark: {results['task']} (pairwise)", [(intro, head, rows), _cost_table(results)]
