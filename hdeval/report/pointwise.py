"""The page of the pointwise HD-Eval report (``report.html``) and its plots: the numbers come
from :func:`hdeval.methods.hdeval.report.build_report` (with the per-sample view), handed in by
the method, which sits above this page: nothing here imports a method. ``ev`` is the fitted
pointwise evaluator (its task, tree and aggregator); the numbers' objects (``report.nodes``,
``report.shap``, ``report.efficiency``) are :mod:`hdeval.methods.hdeval.explain`'s."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdeval.learn.aggregate import numpy_global_rng
from hdeval.report import banner, fmt_num, render
from hdeval.report.banner import Banner
from hdeval.report.plots import integer_ticks, png, pyplot, styled
from hdeval.report.sections import Section

LABEL_CHARS = 60
TOP_BARS = 15  # criteria shown per bar chart / beeswarm; the rest are in report.json

Labeler = Callable[[str], str]


def labeler(ev: Any, limit: int | None = LABEL_CHARS) -> Labeler:
    """ "key — name" labels; plots cut them at ``limit`` characters to keep the axes legible."""

    def label(key: str) -> str:
        name = ev.tree[key].name if key in ev.tree else ""
        text = f"{key} — {name}" if name and name != key else key
        return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"

    return label


@styled
def _barh(values: Mapping[str, float], label: Labeler, title: str, xlabel: str, color: str) -> bytes:
    plt = pyplot()
    items = sorted(values.items(), key=lambda kv: -kv[1])[:TOP_BARS]
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.32 * max(len(items), 1)))
    names = [label(k) for k, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    ax.barh(range(len(vals)), vals, color=color)
    ax.set_yticks(range(len(vals)), names)
    ax.axvline(0, color="#555", lw=0.8)
    ax.set(xlabel=xlabel, title=title)
    ax.tick_params(axis="x", labelsize=9)
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


@styled
def plot_correlations(corr: Mapping[str, Any], aspects: Sequence[str]) -> bytes:
    """Grouped bars: held-out Pearson and Spearman per aspect for each layer and the baselines."""
    plt = pyplot()
    series = [(f"layer {k}", v) for k, v in sorted(corr.get("layers", {}).items(), key=lambda kv: int(kv[0]))]
    if corr.get("direct_layer1"):
        series.append(("direct layer-1 score", corr["direct_layer1"]))
    if corr.get("mean_all_criteria"):
        series.append(("mean of all criteria", corr["mean_all_criteria"]))
    cols = list(aspects) + ["average"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    width = 0.8 / max(len(series), 1)
    cmap = plt.get_cmap("tab10")
    for ax, metric in zip(axes, ("pearson", "spearman")):
        for s, (name, table) in enumerate(series):
            vals = [np.nan if (table.get(c) or {}).get(metric) is None else table[c][metric] for c in cols]
            ax.bar(
                np.arange(len(cols)) + (s - (len(series) - 1) / 2) * width,
                vals,
                width,
                label=name,
                color=cmap(s % 10),
            )
        ax.axhline(0, color="#555", lw=0.8)
        ax.set_xticks(range(len(cols)), cols, rotation=20, ha="right")
        ax.set_title(f"held-out {metric.capitalize()}")
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=9)
    axes[0].set_ylabel("correlation with human scores")
    # Below the panels: inside, the legend would hide bars.
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="lower center",
        ncol=min(len(series), 5),
        bbox_to_anchor=(0.5, -0.08),
    )
    return png(fig, tight=True)


@styled
def plot_beeswarm(r: Any, label: Labeler) -> bytes:
    """shap's summary (beeswarm) plot; colours are the raw criterion scores."""
    import shap

    plt = pyplot()
    n = min(TOP_BARS, len(r.feature_keys))
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.36 * (n + 1)))
    expl = shap.Explanation(
        r.values, r.base_values, data=r.data, feature_names=[label(k) for k in r.feature_keys]
    )
    # beeswarm shuffles the dots with NumPy's global generator: seeded, the same scores draw the
    # same picture
    with numpy_global_rng(seed=0):
        shap.plots.beeswarm(
            expl,
            max_display=n + 1 if len(r.feature_keys) > n else n,
            ax=ax,
            show=False,
            plot_size=None,
            color_bar_label="criterion score",
        )
    ax.set_title(f"{r.aspect}: SHAP values per held-out sample", fontsize=12)
    ax.set_xlabel(f"SHAP value (effect on the {r.aspect} prediction)", fontsize=10)
    return png(fig)


@styled
def plot_efficiency(points: Sequence[Any], aspects: Sequence[str]) -> bytes:
    """Held-out correlation against the number of criteria kept."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ks = [p.n_criteria for p in points]

    def series(aspect: str, metric: str) -> list[float]:
        return [
            np.nan if p.correlations[aspect][metric] is None else p.correlations[aspect][metric]
            for p in points
        ]

    for a in aspects:
        ax.plot(ks, series(a, "spearman"), lw=1, alpha=0.6, marker=".", label=f"{a} (Spearman)")
    ax.plot(ks, series("average", "spearman"), lw=2.5, color="black", marker="o", label="average Spearman")
    ax.plot(ks, series("average", "pearson"), lw=2, color="black", ls="--", label="average Pearson")
    ax.axhline(0, color="#555", lw=0.8)
    integer_ticks(ax, "x")
    ax.set(
        xlabel="criteria kept, most important first (= LLM calls per sample)",
        ylabel="held-out correlation",
        title="Criteria efficiency",
    )
    ax.tick_params(labelsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return png(fig, tight=True)


# --------------------------------------------------------------------------- HTML
def _corr_rows(corr: Mapping[str, Any], aspects: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    rows = [(f"layer {k}", v) for k, v in sorted(corr.get("layers", {}).items(), key=lambda kv: int(kv[0]))]
    rows += [
        ("direct layer-1 score (baseline)", corr.get("direct_layer1")),
        ("mean of all criteria (baseline)", corr.get("mean_all_criteria")),
        ("final aggregator, recomputed now", corr.get("final_recomputed")),
    ]
    cols = list(aspects) + ["average"]

    def cell(row: Any) -> str:
        row = row if isinstance(row, Mapping) else {}
        why = f" ({row['why']})" if isinstance(row.get("why"), str) else ""  # why a figure is null
        return f"{fmt_num(row.get('pearson'))} / {fmt_num(row.get('spearman'))}{why}"

    body = [[name] + [cell(table.get(c)) for c in cols] for name, table in rows if table]
    return ["held-out Pearson / Spearman", *cols], body


def _efficiency_rows(points: Sequence[Any], label: Labeler) -> list[list[str]]:
    body, prev = [], 0
    for p in points:
        added = ", ".join(label(k) for k in p.criteria[prev : p.n_criteria])
        prev = p.n_criteria
        avg = p.correlations["average"]
        body.append([str(p.n_criteria), added, fmt_num(avg["pearson"]), fmt_num(avg["spearman"])])
    return body


def verdict(ev: Any, data: Mapping[str, Any]) -> Banner:
    """The banner: LLM, split against the criteria, layer kept, strongest baseline."""
    art, m = data["artifact"], ev.metrics or {}
    b = Banner()
    banner.llm_line(b, art["llm"])
    banner.split_line(b, art["split"]["train"], art["split"]["test"], art["needed_criteria"])
    banner.layer_line(b, m, list((m.get("layers") or {}).keys()))
    banner.aggregator_line(b, m)
    names = {
        "direct_layer1": "direct layer-1 score",
        "mean_all_criteria": "mean of all criteria",
        "mean_subtree": "mean of each aspect's subtree",
    }
    extra = m.get("baselines") if isinstance(m.get("baselines"), Mapping) else {}
    tables = {names.get(k, k): m.get(k) for k in names} | {str(k): v for k, v in extra.items()}
    # a baseline another version records as one number is taken as its average Spearman
    avg = {
        k: (t.get("average") or {}).get("spearman") if isinstance(t, Mapping) else t
        for k, t in tables.items()
        if isinstance(t, (Mapping, int, float)) and not isinstance(t, bool)
    }
    final = ((data["correlations"].get("final_recomputed") or {}).get("average") or {}).get("spearman")
    banner.baseline_line(b, final, avg, "held-out average Spearman")
    _interval_lines(b, m)
    banner.outlook_lines(
        b,
        intervals=m.get("intervals"),
        ranges={a.key: (a.low, a.high) for a in ev.task.aspects},
        identity=art["llm"],
        evaluator=final,
        direct=avg.get("direct layer-1 score"),
        n_train=art["split"]["train"],
        n_features=art["needed_criteria"],
        n_test=art["split"]["test"],
        path=getattr(ev, "path", None) or "ARTIFACT",
    )
    return b


def _figure(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _interval_lines(b: Banner, m: Mapping[str, Any]) -> None:
    """Per aspect, how often the prediction intervals held the held-out labels, how many labels
    that rests on, and the human mean they give beside the evaluator's (read with care: the
    metrics come from an artifact)."""
    iv = m.get("intervals")
    test = iv.get("test") if isinstance(iv, Mapping) else None
    if not isinstance(test, Mapping) or not isinstance(test.get("coverage"), Mapping):
        return
    level = iv.get("level") if _figure(iv.get("level")) else None  # type: ignore[union-attr]
    labels, means = test.get("labels"), test.get("human_mean")
    for a, c in test["coverage"].items():
        if a == "average" or not _figure(c):
            continue
        n = labels.get(a) if isinstance(labels, Mapping) and _figure(labels.get(a)) else None
        text = (
            f"{a}: the {'' if level is None else f'{level:.0%} '}intervals held {c:.0%} of "
            f"{'the' if n is None else f'{n:g}'} held-out labels"
        )
        h = means.get(a) if isinstance(means, Mapping) else None
        if isinstance(h, Mapping) and all(
            _figure(h.get(k)) for k in ("estimate", "low", "high", "evaluator_mean")
        ):
            text += (
                f"; their human mean {h['estimate']:.2f} [{h['low']:.2f}, {h['high']:.2f}], the "
                f"evaluator's {h['evaluator_mean']:.2f} on the same rows"
            )
        b.add("interval coverage", text)


def render_html(
    ev: Any,
    report: Any,
    samples: Sequence[Mapping[str, Any]] = (),
    samples_note: str | None = None,
    sections: Sequence[Section] = (),
) -> str:
    """The report as one HTML page; plots are embedded PNGs, so the page needs nothing else.
    ``sections``: the evaluator's own, drawn after the held-out correlations."""
    d = report.data
    art = d["artifact"]
    aspects = [a["key"] for a in art["aspects"]] or list(ev.aggregator.aspects)
    label = labeler(ev)
    perm, sh, corr = d["permutation_importance"], d["shap"], d["correlations"]
    children: dict[str | None, list[Any]] = {}
    for n in report.nodes:
        children.setdefault(n.parent, []).append(n)
    top = max((abs(n.rolled_up) for n in report.nodes), default=0.0) or 1.0
    plots = {
        "correlations": plot_correlations(corr, aspects),
        "permutation": [
            (
                a,
                _barh(
                    perm["per_aspect"][a],
                    label,
                    f"{a}: permutation importance (held-out)",
                    "mean drop in R² when shuffled",
                    "#4a7ab5",
                ),
            )
            for a in aspects
        ],
        "shap": [
            (
                a,
                sh["per_aspect"][a]["base_value"],
                plot_beeswarm(report.shap[a], label),
                _barh(
                    sh["per_aspect"][a]["mean_abs"],
                    label,
                    f"{a}: mean |SHAP|",
                    f"mean |SHAP value| (average effect on the {a} prediction)",
                    "#c0504d",
                ),
            )
            for a in aspects
        ],
        "efficiency": plot_efficiency(report.efficiency, aspects),
    }
    shap_how = (
        f"Each dot is one held-out sample ({sh['n_samples']} explained, explainer: {sh['explainer']}"
        + (f", {sh['n_background']} background training rows" if sh["n_background"] else "")
        + "): how far that criterion's score moved the aspect's prediction away from the base value "
        "(the average prediction); colour is the criterion score (red high, blue low). The bar chart "
        "is the mean absolute SHAP value. " + d["definitions"]["shap"]
    )
    corr_head, corr_rows = _corr_rows(corr, aspects)
    return render(
        "hdeval.html.j2",
        art=art,
        banner=verdict(ev, d),
        version=d["hdeval_version"],
        created=d["created"],
        definitions=d["definitions"],
        plots=plots,
        corr_head=corr_head,
        corr_rows=corr_rows,
        children=children,
        bar_width=lambda v: int(round(120 * abs(v) / top)),
        perm=perm,
        top_bars=TOP_BARS,
        shap_how=shap_how,
        eff_rows=_efficiency_rows(report.efficiency, labeler(ev, None)),
        samples=list(samples),
        samples_note=samples_note,
        sections=list(sections),
    )
