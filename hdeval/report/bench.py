"""``report.html`` of ``hdeval benchmark``: the results.md tables as styled HTML tables, the
plots (every plotted number is in results.json) and the verdict banner, in the reports' style."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from hdeval.report import banner as verdicts
from hdeval.report import render
from hdeval.report.plots import COLORS, integer_ticks, png, pyplot, styled


def setting_name(s: Mapping[str, Any]) -> str:
    """A setting's name in tables and legends: the method, and its aggregator when it has one."""
    return s["method"] if s["aggregator"] is None else f"{s['method']}-{s['aggregator']}"


def pair_curves(results: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """The pairwise plots' lines: (label, setting, agreement variant) per setting and variant
    (DnA's learned aggregation is a line of its own, "dna (learned)")."""
    return [
        (setting_name(s) + ("" if variant == "evaluator" else f" ({variant})"), s, variant)
        for s in results["settings"]
        for variant in s["agreement"]
    ]


def _finish(ax: Any, xlabel: str | None, ylabel: str, grid_axis: str = "both") -> None:
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis=grid_axis, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _curve(
    ax: Any, pts: Sequence[tuple[float, Mapping[str, Any]]], label: str, color: Any, marker: str = "o"
) -> None:
    """Means with std error bars over x; points without a mean are left out."""
    pts = [(x, d) for x, d in pts if d["mean"] is not None]
    if pts:
        ax.errorbar(
            [x for x, _ in pts],
            [d["mean"] for _, d in pts],
            yerr=[d["std"] for _, d in pts],
            marker=marker,
            capsize=3,
            label=label,
            color=color,
        )


def _bars(
    ax: Any, ticks: Sequence[str], bars: Sequence[tuple[str, Any, Sequence[Mapping[str, Any]]]]
) -> None:
    """Grouped bars: per (label, colour, a mean/std per tick), error bars the std."""
    width = 0.8 / max(1, len(bars))
    for k, (label, color, d) in enumerate(bars):
        ax.bar(
            np.arange(len(ticks)) + k * width,
            [x["mean"] or 0 for x in d],
            width,
            yerr=[x["std"] or 0 for x in d],
            capsize=3,
            label=label,
            color=color,
        )
    ax.set_xticks(np.arange(len(ticks)) + width * (len(bars) - 1) / 2, ticks)


@styled
def _pair_plots(results: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """Both agreements per method at the largest training fraction, and their data-efficiency curve."""
    plt = pyplot()
    out = []
    curves = pair_curves(results)
    kinds = (("wo_ties", "w/o ties"), ("w_ties", "w/ ties"))
    top = max(s["train_frac"] for s in results["settings"])
    chosen = [(label, s, v) for label, s, v in curves if s["train_frac"] == top]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(chosen) + 2), 3.6))
    bars = [
        (label, COLORS[k % len(COLORS)], [s["agreement"][v][key] for key, _ in kinds])
        for k, (label, s, v) in enumerate(chosen)
    ]
    _bars(ax, [t for _, t in kinds], bars)
    _finish(ax, None, "held-out agreement", "y")
    out.append(
        (
            f"Agreement with the human labels at training fraction {top:g} (error bars: std over seeds)",
            png(fig),
        )
    )
    if len({s["train_frac"] for s in results["settings"]}) > 1:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
        for ax, (key, title) in zip(axes, kinds):
            for k, label in enumerate(dict.fromkeys(label for label, _, _ in curves)):
                pts = [(s["train_frac"], s["agreement"][v][key]) for lb, s, v in curves if lb == label]
                _curve(ax, sorted(pts, key=lambda t: t[0]), label, COLORS[k % len(COLORS)])
            ax.set(title=title, xlabel="training fraction")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("held-out agreement")
        axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        out.append(("Data efficiency (agreement, mean ± std over seeds)", png(fig)))
    return out


@styled
def _point_plots(results: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    plt = pyplot()
    out = []
    settings = list(results["settings"])
    aspects = list(results["aspects"])
    names = list(dict.fromkeys(setting_name(s) for s in settings))
    color = {n: COLORS[k % len(COLORS)] for k, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in names:
        _curve(
            ax,
            sorted(
                (s["train_frac"], s["dataset"]["average"]["spearman"])
                for s in settings
                if setting_name(s) == name
            ),
            name,
            color[name],
        )
    _finish(ax, "training fraction", "held-out average Spearman")
    out.append(("Data efficiency (mean ± std over seeds)", png(fig)))
    top = max(s["train_frac"] for s in settings)
    chosen = [s for s in settings if s["train_frac"] == top]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(aspects) * max(1, len(chosen)) / 2), 3.6))
    _bars(
        ax,
        aspects,
        [
            (setting_name(s), color[setting_name(s)], [s["dataset"][a]["spearman"] for a in aspects])
            for s in chosen
        ],
    )
    _finish(ax, None, "held-out Spearman", "y")
    out.append((f"Per aspect at training fraction {top:g} (error bars: std over seeds)", png(fig)))
    abl = [s for s in chosen if s.get("layers")]
    if abl:  # layers are counts
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for s in abl:
            ks = sorted(s["layers"], key=int)
            ax.errorbar(
                [int(k) for k in ks],
                [s["layers"][k]["mean"] or 0 for k in ks],
                yerr=[s["layers"][k]["std"] or 0 for k in ks],
                marker="o",
                capsize=3,
                label=setting_name(s),
                color=color[setting_name(s)],
            )
        integer_ticks(ax, "x")
        _finish(ax, "layers used (1-k)", "held-out average Spearman")
        out.append((f"Layer ablation at training fraction {top:g}", png(fig)))
    # criteria efficiency: Spearman against the criteria used, HD-Eval per layer, direct one point
    eff = [
        (
            ln,
            [
                (p["criteria"]["mean"], p["spearman"])
                for p in ln["points"]
                if p["criteria"]["mean"] is not None and p["spearman"]["mean"] is not None
            ],
        )
        for ln in results.get("criteria_efficiency") or []
        if ln["train_frac"] == top
    ]
    if any(pts for _, pts in eff):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for ln, pts in eff:
            _curve(ax, pts, setting_name(ln), color.get(setting_name(ln)), "o" if len(pts) > 1 else "s")
        integer_ticks(ax, "x")
        _finish(ax, "criteria used", "held-out average Spearman")
        out.append(
            (
                f"Criteria efficiency at training fraction {top:g} (HD-Eval: a point per layer; "
                "direct: the aspects)",
                png(fig),
            )
        )
    return out


@styled
def _learning_curve_plots(results: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """Per run with learning curves: held-out agreement against labels used, one line per
    strategy (band: 5th-95th percentile over repeats), the full-label figure dashed."""
    plt = pyplot()
    out = []
    for run in results.get("learning_curves") or []:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        budgets = [int(b) for b in run["budgets"]]
        for k, (strat, row) in enumerate(run["summary"]["strategies"].items()):
            pts = [(b, row["points"][str(b)]) for b in budgets if row["points"][str(b)]["mean"] is not None]
            if not pts:
                continue
            color = COLORS[k % len(COLORS)]
            ax.plot([b for b, _ in pts], [p["mean"] for _, p in pts], marker="o", label=strat, color=color)
            ax.fill_between(
                [b for b, _ in pts],
                [p["low"] for _, p in pts],
                [p["high"] for _, p in pts],
                color=color,
                alpha=0.15,
            )
        if run["full_label"] is not None:
            ax.axhline(
                run["full_label"],
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"all {run['train_rows']} labels",
            )
        ax.set_xscale("log")
        ax.set_xticks(budgets, [str(b) for b in budgets])
        _finish(ax, "labels used", f"held-out {run['metric']}")
        out.append(
            (
                f"Learning curves: {run['setting']}, train frac {run['train_frac']:g}, seed {run['seed']} "
                f"({run['repeats']} repeats; band: 5th-95th percentile)",
                png(fig),
            )
        )
    return out


def verdict(results: Mapping[str, Any]) -> verdicts.Banner:
    """The banner: the LLM, the split against the features, the strongest baseline."""
    b = verdicts.Banner()
    pairwise = results.get("shape") == "pairwise"
    measure = "agreement w/o ties" if pairwise else "average Spearman"
    options = (results.get("spec") or {}).get("options") or {}
    verdicts.llm_line(b, options.get("llm") or "default")
    runs = list(results.get("runs") or [])
    if runs:
        top = max(r["train_frac"] for r in runs)
        mine = [r for r in runs if r["train_frac"] == top]
        features = max((r.get("criteria") or 0 for r in mine), default=0) or None
        verdicts.split_line(
            b,
            min(r["n_train"] for r in mine),
            min(r["n_test"] for r in mine),
            features,
            rows="pairs" if pairwise else "rows",
        )
    for w in results.get("warnings") or []:
        b.add("test documents", w, warn=True)
    baseline = "dna-direct" if pairwise else "direct"
    top_settings = [
        s
        for s in results.get("settings") or []
        if s["train_frac"] == max(x["train_frac"] for x in results["settings"])
    ]

    def score(s: Mapping[str, Any]) -> float | None:
        d = (
            (s["agreement"].get("evaluator") or {}).get("wo_ties")
            if pairwise
            else s["dataset"]["average"]["spearman"]
        )
        return (d or {}).get("mean")

    base = {setting_name(s): score(s) for s in top_settings if s["method"] == baseline}
    others = {
        setting_name(s): score(s) for s in top_settings if s["method"] != baseline and score(s) is not None
    }
    if others:
        best = max(others, key=lambda k: others[k])
        known = {k: v for k, v in base.items() if v is not None}
        top_base = max(known, key=lambda k: known[k]) if known else None
        if top_base is not None and known[top_base] >= others[best]:  # never a tick beside "does not beat it"
            b.add(
                "best method",
                f"{top_base} (the baseline): {measure} {known[top_base]:.3f}; no trained method "
                f"beats it (the best, {best}: {others[best]:.3f})",
                warn=True,
            )
        else:
            b.add("best method", f"{best}: {measure} {others[best]:.3f}")
        verdicts.baseline_line(b, others[best], base, f"held-out {measure}")
    return b


def render_html(results: Mapping[str, Any], title: str, tables: Sequence[Any]) -> str:
    """A self-contained page: banner, the caller's tables (results.md's) as HTML tables, the plots.
    The tables come in from the benchmark, which sits above the reports."""
    plots = _pair_plots if results.get("shape") == "pairwise" else _point_plots
    return render(
        "benchmark.html.j2",
        title=f"hdeval {title[0].lower()}{title[1:]}",
        banner=verdict(results),
        tables=tables,
        figures=plots(results) + _learning_curve_plots(results),
        definitions=results.get("definitions") or {},
    )
