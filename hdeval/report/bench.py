"""``report.html`` of ``hdeval benchmark``: the results.md tables as styled HTML tables, the
plots (every plotted number is in results.json) and the verdict banner, in the reports' style."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from hdeval.report import banner as verdicts
from hdeval.report import render
from hdeval.report.plots import COLORS, integer_ticks, png, pyplot, styled


def _name(s: Mapping[str, Any]) -> str:
    return s["method"] if s["aggregator"] is None else f"{s['method']}-{s['aggregator']}"


def pair_curves(results: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """The pairwise plots' lines: (label, setting, agreement variant) per setting and variant
    (DnA's learned aggregation is a line of its own, "dna (learned)")."""
    out = []
    for s in results["settings"]:
        for variant in s["agreement"]:
            out.append((_name(s) + ("" if variant == "evaluator" else f" ({variant})"), s, variant))
    return out


def _legend(ax: Any) -> None:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _pair_plots(results: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """Agreement w/o and w/ ties per method at the largest training fraction (error bars: std
    over seeds) and, with several training fractions, the data-efficiency curve of both."""
    plt = pyplot()
    out = []
    curves = pair_curves(results)
    kinds = (("wo_ties", "w/o ties"), ("w_ties", "w/ ties"))
    top = max(s["train_frac"] for s in results["settings"])
    chosen = [(label, s, v) for label, s, v in curves if s["train_frac"] == top]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(chosen) + 2), 3.6))
    width = 0.8 / max(1, len(chosen))
    for k, (label, s, v) in enumerate(chosen):
        d = [s["agreement"][v][key] for key, _ in kinds]
        ax.bar(np.arange(len(kinds)) + k * width, [x["mean"] or 0 for x in d], width,
               yerr=[x["std"] or 0 for x in d], capsize=3, label=label, color=COLORS[k % len(COLORS)])
    ax.set_xticks(np.arange(len(kinds)) + width * (len(chosen) - 1) / 2, [t for _, t in kinds])
    ax.set_ylabel("held-out agreement")
    ax.grid(axis="y", alpha=0.3)
    _legend(ax)
    out.append((f"Agreement with the human labels at training fraction {top:g} (error bars: std over seeds)",
                png(fig)))
    if len({s["train_frac"] for s in results["settings"]}) > 1:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
        for ax, (key, title) in zip(axes, kinds):
            for k, label in enumerate(dict.fromkeys(label for label, _, _ in curves)):
                pts = sorted(((s["train_frac"], s["agreement"][v][key]) for lb, s, v in curves if lb == label),
                             key=lambda t: t[0])
                pts = [(x, d) for x, d in pts if d["mean"] is not None]
                if pts:
                    ax.errorbar([x for x, _ in pts], [d["mean"] for _, d in pts], yerr=[d["std"] for _, d in pts],
                                marker="o", capsize=3, label=label, color=COLORS[k % len(COLORS)])
            ax.set_title(title)
            ax.set_xlabel("training fraction")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("held-out agreement")
        _legend(axes[1])
        out.append(("Data efficiency (agreement, mean ± std over seeds)", png(fig)))
    return out


def _point_plots(results: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    plt = pyplot()
    out = []
    settings = list(results["settings"])
    aspects = list(results["aspects"])
    names = list(dict.fromkeys(_name(s) for s in settings))
    color = {n: COLORS[k % len(COLORS)] for k, n in enumerate(names)}
    # data-efficiency curve
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in names:
        pts = sorted((s["train_frac"], s["dataset"]["average"]["spearman"]) for s in settings if _name(s) == name)
        pts = [(x, d) for x, d in pts if d["mean"] is not None]
        if pts:
            ax.errorbar([x for x, _ in pts], [d["mean"] for _, d in pts], yerr=[d["std"] for _, d in pts],
                        marker="o", capsize=3, label=name, color=color[name])
    ax.set_xlabel("training fraction")
    ax.set_ylabel("held-out average Spearman")
    ax.grid(alpha=0.3)
    _legend(ax)
    out.append(("Data efficiency (mean ± std over seeds)", png(fig)))
    # per-aspect bars at the largest training fraction
    top = max(s["train_frac"] for s in settings)
    chosen = [s for s in settings if s["train_frac"] == top]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(aspects) * max(1, len(chosen)) / 2), 3.6))
    width = 0.8 / max(1, len(chosen))
    for k, s in enumerate(chosen):
        d = [s["dataset"][a]["spearman"] for a in aspects]
        ax.bar(np.arange(len(aspects)) + k * width, [x["mean"] or 0 for x in d], width,
               yerr=[x["std"] or 0 for x in d], capsize=3, label=_name(s), color=color[_name(s)])
    ax.set_xticks(np.arange(len(aspects)) + width * (len(chosen) - 1) / 2, aspects)
    ax.set_ylabel("held-out Spearman")
    ax.grid(axis="y", alpha=0.3)
    _legend(ax)
    out.append((f"Per aspect at training fraction {top:g} (error bars: std over seeds)", png(fig)))
    # layer ablation: layers are counts
    abl = [s for s in chosen if s.get("layers")]
    if abl:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for s in abl:
            ks = sorted(s["layers"], key=int)
            ax.errorbar([int(k) for k in ks], [s["layers"][k]["mean"] or 0 for k in ks],
                        yerr=[s["layers"][k]["std"] or 0 for k in ks], marker="o", capsize=3, label=_name(s),
                        color=color[_name(s)])
        integer_ticks(ax, "x")
        ax.set_xlabel("layers used (1-k)")
        ax.set_ylabel("held-out average Spearman")
        ax.grid(alpha=0.3)
        _legend(ax)
        out.append((f"Layer ablation at training fraction {top:g}", png(fig)))
    # criteria efficiency: Spearman against the criteria used, HD-Eval per layer, direct one point
    chosen_eff = [ln for ln in results.get("criteria_efficiency") or [] if ln["train_frac"] == top]
    eff = [(ln, [p for p in ln["points"] if p["criteria"]["mean"] is not None
                 and p["spearman"]["mean"] is not None]) for ln in chosen_eff]
    if any(pts for _, pts in eff):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for ln, pts in eff:
            if pts:
                ax.errorbar([p["criteria"]["mean"] for p in pts], [p["spearman"]["mean"] for p in pts],
                            yerr=[p["spearman"]["std"] or 0 for p in pts], marker="o" if len(pts) > 1 else "s",
                            capsize=3, label=_name(ln), color=color.get(_name(ln)))
        integer_ticks(ax, "x")
        ax.set_xlabel("criteria used")
        ax.set_ylabel("held-out average Spearman")
        ax.grid(alpha=0.3)
        _legend(ax)
        out.append((f"Criteria efficiency at training fraction {top:g} (HD-Eval: a point per layer; "
                    "direct: the aspects)", png(fig)))
    return out


@styled
def _all_plots(results: Mapping[str, Any]) -> list[tuple[str, bytes]]:  # type: ignore[return-value]
    return _pair_plots(results) if results.get("shape") == "pairwise" else _point_plots(results)


def verdict(results: Mapping[str, Any]) -> verdicts.Banner:
    """The banner: the LLM, the split against the features, the strongest baseline."""
    b = verdicts.Banner()
    options = (results.get("spec") or {}).get("options") or {}
    verdicts.llm_line(b, options.get("llm") or "default")
    runs = list(results.get("runs") or [])
    if runs:
        top = max(r["train_frac"] for r in runs)
        mine = [r for r in runs if r["train_frac"] == top]
        features = max((r.get("criteria") or 0 for r in mine), default=0) or None
        verdicts.split_line(b, min(r["n_train"] for r in mine), min(r["n_test"] for r in mine), features,
                            rows="pairs" if results.get("shape") == "pairwise" else "rows")
    for w in results.get("warnings") or []:
        b.add("test documents", w, warn=True)
    pairwise = results.get("shape") == "pairwise"
    baseline = "dna-direct" if pairwise else "direct"
    top_settings = [s for s in results.get("settings") or []
                    if s["train_frac"] == max(x["train_frac"] for x in results["settings"])]

    def score(s: Mapping[str, Any]) -> float | None:
        d = (s["agreement"].get("evaluator") or {}).get("wo_ties") if pairwise else \
            s["dataset"]["average"]["spearman"]
        return (d or {}).get("mean")

    base = {_name(s): score(s) for s in top_settings if s["method"] == baseline}
    others = {_name(s): score(s) for s in top_settings if s["method"] != baseline and score(s) is not None}
    if others:
        best = max(others, key=lambda k: others[k])
        b.add("best method", f"{best}: " + ("agreement w/o ties" if pairwise else "average Spearman")
              + f" {others[best]:.3f}")
        verdicts.baseline_line(b, others[best], base, "held-out agreement w/o ties" if pairwise
                               else "held-out average Spearman")
    return b


def render_html(results: Mapping[str, Any], title: str, tables: Sequence[Any]) -> str:
    """A self-contained page: banner, the caller's tables (results.md's) as HTML tables, the plots.
    The tables come in from the benchmark, which sits above the reports."""
    return render("benchmark.html.j2", title=f"hdeval {title[0].lower()}{title[1:]}", banner=verdict(results),
                  tables=tables, figures=_all_plots(results), definitions=results.get("definitions") or {})
