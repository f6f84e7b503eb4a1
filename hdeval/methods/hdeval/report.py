"""The evaluator report: ``report.json`` (every number) and a self-contained ``report.html``
(the same numbers, plus matplotlib plots embedded as base64 PNG data URIs; no scripts, no
external resources, so it opens offline and can be mailed around).

Computation lives in :mod:`hdeval.methods.hdeval.explain`; this module assembles, plots and writes.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import json
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from hdeval import __version__
from hdeval.errors import ArtifactError, ConfigError
from hdeval.methods.hdeval.explain import (
    MAX_SAMPLES, N_BACKGROUND, EfficiencyPoint, NodeImportance, ShapResult, efficiency_curve,
    importance_order, permutation_importances, score_table, shap_explain, split_rows, subsample,
    tree_importance,
)
from hdeval.metrics import metric_table
from hdeval.progress import Progress
from hdeval.methods.hdeval.prune import N_REPEATS

if TYPE_CHECKING:
    from hdeval.methods.hdeval.evaluator import Evaluator

REPORT_FORMAT = "hdeval-report"
REPORT_VERSION = 1
CURVE_POINTS = 20
TOP_BARS = 15  # criteria shown per bar chart / beeswarm; the rest are in report.json
LABEL_CHARS = 60

DEFINITIONS = {
    "permutation_importance": (
        "For one aspect, the mean drop in R² of the aggregator's (unclipped) prediction for that "
        "aspect on the held-out (test) split when one criterion's scores are shuffled across "
        "samples (sklearn permutation_importance); near 0 or negative = the aspect does not rely on it."
    ),
    "importance": "A tree node's own permutation importance, summed over all aspects.",
    "rolled_up_importance": (
        "A node's importance plus the importance of all its descendants (children, grandchildren, "
        "...): how much the aggregator relies on this criterion and everything decomposed from it."
    ),
    "shap": (
        "SHAP values explain the aggregator's unclipped pipeline output for an aspect: for every "
        "sample, base_value + sum of its SHAP values == prediction. The score apply reports is "
        "that prediction clipped to the aspect's range."
    ),
    "efficiency": (
        "Criteria are added in decreasing order of permutation importance measured on the "
        "training split (summed over aspects), so the order is not chosen on the held-out rows "
        "the curve is measured on; for each count an aggregator of the same kind is refitted on "
        "the training split and its clipped predictions are correlated with the held-out human scores."
    ),
}


# --------------------------------------------------------------------------- numbers
@dataclass
class Report:
    """Everything a report shows: ``data`` is what ``report.json`` holds; the rest is kept
    as objects for plotting."""

    data: dict[str, Any]
    nodes: list[NodeImportance]
    shap: dict[str, ShapResult]
    efficiency: list[EfficiencyPoint]


def build_report(
    ev: "Evaluator",
    *,
    max_samples: int = MAX_SAMPLES,
    n_background: int = N_BACKGROUND,
    n_repeats: int = N_REPEATS,
    curve_points: int | None = CURVE_POINTS,
    random_state: int = 0,
    progress: Progress | None = None,
) -> Report:
    """Compute every number of the report from the artifact's score table (``scores.csv``)
    and its aggregator. ``max_samples`` bounds the SHAP-explained held-out samples,
    ``n_background`` the background rows, ``curve_points`` the refits of the efficiency curve."""
    if max_samples < 1 or n_background < 1 or n_repeats < 1:
        raise ConfigError("--max-samples, --background and --repeats must be at least 1")
    if curve_points is not None and curve_points < 2:
        raise ConfigError("--curve-points must be at least 2")
    progress = progress or Progress()
    agg, keys, aspects = ev.aggregator, list(ev.feature_keys), list(ev.aggregator.aspects)
    table = score_table(ev)
    train, test = split_rows(ev, table, "train"), split_rows(ev, table, "test")
    if len(test.X) < 3 or len(train.X) < 2:
        raise ArtifactError(
            f"the artifact's score table has {len(train.X)} train and {len(test.X)} test rows; a report "
            "needs held-out rows (train with --test-frac > 0 and more samples)"
        )

    progress.message(f"permutation importance on {len(test.X)} held-out samples ({n_repeats} repeats)")
    perm = permutation_importances(agg, keys, test.X, test.Y, n_repeats, random_state)
    nodes = tree_importance(ev.tree, perm)

    sel = subsample(len(test.X), max_samples, random_state)
    bg = train.X[subsample(len(train.X), n_background, random_state)]
    progress.message(f"SHAP values of {len(sel)} held-out samples")
    shap_res = shap_explain(agg, keys, test.X[sel], [test.sample_ids[i] for i in sel], bg,
                            random_state=random_state)

    final = metric_table(test.Y, agg.predict(test.X), aspects)

    progress.message("criteria-efficiency curve: importance on the training split, then refits")
    train_perm = permutation_importances(agg, keys, train.X, train.Y, n_repeats, random_state)
    order_imp = {k: float(sum(p[k] for p in train_perm.values())) for k in keys}
    order = importance_order(order_imp, keys)
    curve = efficiency_curve(agg, keys, order, train, test, curve_points)

    m = ev.metrics or {}
    manifest = getattr(ev, "manifest_data", None) or {}
    data: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "format_version": REPORT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hdeval_version": __version__,
        "artifact": {
            "path": str(ev.path) if ev.path else None,
            "created": manifest.get("created"),
            "task": ev.task.name,
            "aspects": [{"key": a.key, "name": a.name, "range": [a.low, a.high]} for a in ev.task.aspects
                        if a.key in aspects],
            "aggregator": agg.kind,
            "llm": ev.llm_identity,
            "criteria": len(keys),
            "needed_criteria": len(ev.needed_criteria),
            "split": {"train": len(train.X), "test": len(test.X)},
            "warnings": list(ev.warnings),
        },
        "definitions": DEFINITIONS,
        "tree": [n.to_dict() for n in nodes],
        "permutation_importance": {
            "split": "test", "n_samples": len(test.X), "n_repeats": n_repeats,
            "random_state": random_state, "per_aspect": perm,
        },
        "shap": {
            "explainer": next(iter(shap_res.values())).explainer if shap_res else None,
            "split": "test",
            "n_samples": len(sel),
            "n_background": next(iter(shap_res.values())).n_background if shap_res else 0,
            "explains": "unclipped pipeline output: base_value + sum(values) == prediction",
            "feature_keys": keys,
            "per_aspect": {a: _shap_json(r) for a, r in shap_res.items()},
        },
        "correlations": {
            "split": "test",
            "layers": m.get("layers", {}),
            "direct_layer1": m.get("direct_layer1"),
            "mean_all_criteria": m.get("mean_all_criteria"),
            "final": m.get("final"),
            "final_recomputed": final,
        },
        "efficiency": {
            "order_by": "permutation importance on the train split, summed over aspects",
            "order": order,
            "order_importance": order_imp,
            "points": [{"n_criteria": p.n_criteria, "criteria": p.criteria, "correlations": p.correlations}
                       for p in curve],
        },
    }
    stored = m.get("final")
    if stored and not _same_table(stored, final):
        data["artifact"]["warnings"].append(
            "the held-out correlations recomputed from scores.csv differ from metrics.json "
            "(different library versions, or edited files)"
        )
    return Report(_clean(data), nodes, shap_res, curve)


def _shap_json(r: ShapResult) -> dict[str, Any]:
    return {
        "base_value": float(r.base_values[0]) if len(r.base_values) else None,
        "mean_abs": {k: float(v) for k, v in zip(r.feature_keys, r.mean_abs())},
        "sample_ids": list(r.sample_ids),
        "base_values": r.base_values.tolist(),
        "predictions": r.predictions.tolist(),
        "values": r.values.tolist(),
    }


def _same_table(a: Mapping[str, Any], b: Mapping[str, Any], tol: float = 1e-5) -> bool:
    for aspect, row in b.items():
        for metric, v in row.items():
            w = (a.get(aspect) or {}).get(metric)
            if (v is None) != (w is None) or (v is not None and abs(v - w) > tol):
                return False
    return True


def _clean(x: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


# --------------------------------------------------------------------------- plots
def _pyplot() -> Any:
    """pyplot on the Agg backend (no display needed). If the caller already imported pyplot
    (a notebook), its backend is left alone: switching would close the caller's figures."""
    if "matplotlib.pyplot" not in sys.modules:
        import matplotlib

        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _literal_text(plot: Callable[..., bytes]) -> Callable[..., bytes]:
    """Draw ``plot`` with mathtext off: criterion and aspect names are the user's (or the
    LLM's) text, and a name like ``price $x^$`` must show as written, not be parsed as TeX
    (an unbalanced one made matplotlib raise)."""

    @functools.wraps(plot)
    def draw(*args: Any, **kwargs: Any) -> bytes:
        with _pyplot().rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return draw


def _png(fig: Any) -> bytes:
    """The figure as PNG bytes; the figure is closed (pyplot keeps every open figure alive)."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


Labeler = Callable[[str], str]


def _labeler(ev: "Evaluator", limit: int | None = LABEL_CHARS) -> Labeler:
    """"key — name" labels; plots cut them at ``limit`` characters to keep the axes legible."""

    def label(key: str) -> str:
        name = ev.tree[key].name if key in ev.tree else ""
        text = f"{key} — {name}" if name and name != key else key
        return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"

    return label


@_literal_text
def _barh(values: Mapping[str, float], label: Labeler, title: str, xlabel: str, color: str) -> bytes:
    plt = _pyplot()
    items = sorted(values.items(), key=lambda kv: -kv[1])[:TOP_BARS]
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.32 * max(len(items), 1)))
    names = [label(k) for k, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    ax.barh(range(len(vals)), vals, color=color)
    ax.set_yticks(range(len(vals)), names, fontsize=10)
    ax.axvline(0, color="#555", lw=0.8)
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_title(title, fontsize=12)
    ax.tick_params(axis="x", labelsize=9)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


@_literal_text
def plot_correlations(corr: Mapping[str, Any], aspects: Sequence[str]) -> bytes:
    """Grouped bars: held-out Pearson and Spearman per aspect for each layer and the baselines."""
    plt = _pyplot()
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
            ax.bar(np.arange(len(cols)) + (s - (len(series) - 1) / 2) * width, vals, width,
                   label=name, color=cmap(s % 10))
        ax.axhline(0, color="#555", lw=0.8)
        ax.set_xticks(range(len(cols)), cols, fontsize=10, rotation=20, ha="right")
        ax.set_title(f"held-out {metric.capitalize()}", fontsize=12)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=9)
    axes[0].set_ylabel("correlation with human scores", fontsize=10)
    # Below the panels: inside, the legend would hide bars.
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=10, loc="lower center",
               ncol=min(len(series), 5), bbox_to_anchor=(0.5, -0.08), frameon=False)
    fig.tight_layout()
    return _png(fig)


@_literal_text
def plot_beeswarm(r: ShapResult, label: Labeler) -> bytes:
    """shap's summary (beeswarm) plot; colours are the raw criterion scores."""
    import shap

    plt = _pyplot()
    n = min(TOP_BARS, len(r.feature_keys))
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.36 * (n + 1)))
    expl = shap.Explanation(r.values, r.base_values, data=r.data,
                            feature_names=[label(k) for k in r.feature_keys])
    shap.plots.beeswarm(expl, max_display=n + 1 if len(r.feature_keys) > n else n, ax=ax, show=False,
                        plot_size=None, color_bar_label="criterion score")
    ax.set_title(f"{r.aspect}: SHAP values per held-out sample", fontsize=12)
    ax.set_xlabel(f"SHAP value (effect on the {r.aspect} prediction)", fontsize=10)
    return _png(fig)


@_literal_text
def plot_efficiency(points: Sequence[EfficiencyPoint], aspects: Sequence[str]) -> bytes:
    """Held-out correlation against the number of criteria kept."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ks = [p.n_criteria for p in points]

    def series(aspect: str, metric: str) -> list[float]:
        return [np.nan if p.correlations[aspect][metric] is None else p.correlations[aspect][metric]
                for p in points]

    for a in aspects:
        ax.plot(ks, series(a, "spearman"), lw=1, alpha=0.6, marker=".", label=f"{a} (Spearman)")
    ax.plot(ks, series("average", "spearman"), lw=2.5, color="black", marker="o", label="average Spearman")
    ax.plot(ks, series("average", "pearson"), lw=2, color="black", ls="--", label="average Pearson")
    ax.axhline(0, color="#555", lw=0.8)
    ax.set_xlabel("criteria kept, most important first (= LLM calls per sample)", fontsize=10)
    ax.set_ylabel("held-out correlation", fontsize=10)
    ax.set_title("Criteria efficiency", fontsize=12)
    ax.tick_params(labelsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- HTML
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
.how{background:#f3f6fa;border-left:4px solid #4a7ab5;padding:.5em .8em;margin:.6em 0 1em}
.warn{background:#fff4e5;border-left:4px solid #e69500;padding:.5em .8em}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child,.txt{text-align:left}th{background:#f0f0f0}
img{max-width:100%;height:auto;display:block;margin:.6em 0}
ul.tree{list-style:none;padding-left:1.2em;margin:.2em 0}ul.tree>li{margin:.35em 0}
.key{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:600}
.def{color:#555;font-size:.9em}.num{font-family:ui-monospace,Menlo,Consolas,monospace}
.bar{display:inline-block;height:.7em;background:#4a7ab5;vertical-align:middle;margin-left:.4em}
.bar.neg{background:#c0504d}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.1em 1em}dl.meta dt{font-weight:600}
dl.meta dd{margin:0}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _img(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" alt="{_e(alt)}">'


def _how(text: str) -> str:
    return f'<p class="how"><b>How to read it.</b> {text}</p>'


def _tree_html(nodes: Sequence[NodeImportance]) -> str:
    children: dict[str | None, list[NodeImportance]] = {}
    for n in nodes:
        children.setdefault(n.parent, []).append(n)
    top = max((abs(n.rolled_up) for n in nodes), default=0.0) or 1.0

    def render(parent: str | None) -> str:
        items = []
        for n in children.get(parent, []):
            width = int(round(120 * abs(n.rolled_up) / top))
            bar = f'<span class="bar{" neg" if n.rolled_up < 0 else ""}" style="width:{width}px"></span>'
            items.append(
                f'<li><span class="key">{_e(n.key)}</span> — {_e(n.name)} '
                f'<span class="num">(layer {n.layer}; importance {_f(n.importance)}, '
                f'rolled up {_f(n.rolled_up)})</span>{bar}<br><span class="def">{_e(n.definition)}</span>'
                + (render(n.key) if n.key in children else "") + "</li>"
            )
        return '<ul class="tree">' + "".join(items) + "</ul>"

    return render(None)


def _corr_table(corr: Mapping[str, Any], aspects: Sequence[str]) -> str:
    rows = [(f"layer {k}", v) for k, v in sorted(corr.get("layers", {}).items(), key=lambda kv: int(kv[0]))]
    rows += [("direct layer-1 score (baseline)", corr.get("direct_layer1")),
             ("mean of all criteria (baseline)", corr.get("mean_all_criteria")),
             ("final aggregator, recomputed now", corr.get("final_recomputed"))]
    cols = list(aspects) + ["average"]
    head = "<tr><th>held-out Pearson / Spearman</th>" + "".join(f"<th>{_e(c)}</th>" for c in cols) + "</tr>"
    body = []
    for name, table in rows:
        if not table:
            continue
        cells = "".join(
            f'<td class="num">{_f((table.get(c) or {}).get("pearson"))} / '
            f'{_f((table.get(c) or {}).get("spearman"))}</td>' for c in cols)
        body.append(f"<tr><td>{_e(name)}</td>{cells}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _efficiency_table(points: Sequence[EfficiencyPoint], label: Labeler) -> str:
    head = ("<tr><th>criteria kept</th><th class='txt'>added criteria</th><th>avg Pearson</th>"
            "<th>avg Spearman</th></tr>")
    body = []
    prev = 0
    for p in points:
        added = ", ".join(label(k) for k in p.criteria[prev:p.n_criteria])
        prev = p.n_criteria
        avg = p.correlations["average"]
        body.append(f'<tr><td class="num">{p.n_criteria}</td><td class="txt">{_e(added)}</td>'
                    f'<td class="num">{_f(avg["pearson"])}</td><td class="num">{_f(avg["spearman"])}</td></tr>')
    return f"<table>{head}{''.join(body)}</table>"


def render_html(ev: "Evaluator", report: Report) -> str:
    """The report as one HTML page; plots are embedded PNGs, so the page needs nothing else."""
    d = report.data
    art = d["artifact"]
    aspects = [a["key"] for a in art["aspects"]] or list(ev.aggregator.aspects)
    label = _labeler(ev)
    perm = d["permutation_importance"]
    sh = d["shap"]
    corr = d["correlations"]
    parts = [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        # Offline by construction: nothing may load except the embedded images and this style.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">",
        f"<meta name=\"viewport\" content=\"width=device-width\"><title>hdeval report: {_e(art['task'])} "
        f"({_e(art['aggregator'])})</title><style>{CSS}</style></head><body>",
        f"<h1>hdeval report: {_e(art['task'])}</h1>",
        '<dl class="meta">',
        f"<dt>artifact</dt><dd>{_e(art['path'])}</dd>",
        f"<dt>aggregator</dt><dd>{_e(art['aggregator'])}</dd>",
        f"<dt>LLM</dt><dd>{_e(art['llm'])}</dd>",
        f"<dt>criteria</dt><dd>{art['criteria']} in the tree, {art['needed_criteria']} used by the "
        f"aggregator (LLM calls per sample)</dd>",
        f"<dt>samples</dt><dd>{art['split']['train']} train, {art['split']['test']} held-out (test)</dd>",
        f"<dt>report</dt><dd>hdeval {_e(d['hdeval_version'])}, {_e(d['created'])}; every number is "
        "also in report.json</dd></dl>",
    ]
    for w in art["warnings"]:
        parts.append(f'<p class="warn">warning: {_e(w)}</p>')

    parts += [
        "<h2>Held-out correlation by layer</h2>",
        _how("Correlation of the evaluator's scores with human scores on the held-out samples, after "
             "each layer of criteria was added (the layer ablation), against two baselines: the LLM's "
             "direct score for the aspect and the plain mean of all criterion scores. Higher is better; "
             "a layer that does not raise the bars did not help."),
        _img(plot_correlations(corr, aspects), "held-out Pearson and Spearman per aspect and layer"),
        _corr_table(corr, aspects),
    ]

    parts += [
        "<h2>Criteria tree with importance</h2>",
        _how(f"Each criterion the LLM scores, nested under the criterion it was decomposed from. "
             f"<i>Importance</i>: {_e(DEFINITIONS['importance'])} <i>Rolled up</i>: "
             f"{_e(DEFINITIONS['rolled_up_importance'])} The bar shows the rolled-up value "
             "(red = negative)."),
        _tree_html(report.nodes),
    ]

    parts += [
        "<h2>Permutation importance per aspect</h2>",
        _how(f"{_e(DEFINITIONS['permutation_importance'])} Measured on {perm['n_samples']} held-out "
             f"samples, {perm['n_repeats']} shuffles each; the {TOP_BARS} most important criteria are drawn."),
    ]
    for a in aspects:
        parts.append(_img(_barh(perm["per_aspect"][a], label, f"{a}: permutation importance (held-out)",
                                "mean drop in R² when shuffled", "#4a7ab5"), f"permutation importance for {a}"))

    parts += [
        "<h2>SHAP per aspect</h2>",
        _how(f"Each dot is one held-out sample ({sh['n_samples']} explained, explainer: {_e(sh['explainer'])}"
             + (f", {sh['n_background']} background training rows" if sh["n_background"] else "")
             + "): how far that criterion's score moved the aspect's prediction away from the base value "
               "(the average prediction); colour is the criterion score (red high, blue low). The bar chart "
               "is the mean absolute SHAP value. "
             + _e(DEFINITIONS["shap"])),
    ]
    for a in aspects:
        r = report.shap[a]
        parts.append(f"<h3>{_e(a)} <span class=\"num\">(base value {_f(sh['per_aspect'][a]['base_value'])})"
                     "</span></h3>")
        parts.append(_img(plot_beeswarm(r, label), f"SHAP summary for {a}"))
        parts.append(_img(_barh(sh["per_aspect"][a]["mean_abs"], label, f"{a}: mean |SHAP|",
                                f"mean |SHAP value| (average effect on the {a} prediction)", "#c0504d"),
                          f"mean absolute SHAP for {a}"))

    parts += [
        "<h2>Criteria efficiency</h2>",
        _how("How many criteria (LLM calls per sample) can be dropped for how much loss: the x axis keeps "
             "the k most important criteria; the y axis is the held-out correlation of an aggregator "
             f"refitted with only those. {_e(DEFINITIONS['efficiency'])} Where the curve flattens, the "
             "remaining criteria add little."),
        _img(plot_efficiency(report.efficiency, aspects), "criteria efficiency curve"),
        _efficiency_table(report.efficiency, _labeler(ev, None)),
        "</body></html>",
    ]
    return "\n".join(parts)


@dataclass(frozen=True)
class ReportFiles:
    """Where :func:`write_report` wrote the report."""

    html: Path
    json: Path


def write_report(ev: "Evaluator", out_dir: str | Path | None = None, **options: Any) -> ReportFiles:
    """Build the report (see :func:`build_report` for ``options``) and write ``report.html``
    and ``report.json`` to ``out_dir`` (default: ``<artifact>/report``)."""
    if out_dir is None:
        if ev.path is None:
            raise ConfigError("give an output directory: this evaluator was not loaded from disk")
        out_dir = ev.path / "report"
    out = Path(out_dir)
    report = build_report(ev, **options)
    page = render_html(ev, report)
    try:
        out.mkdir(parents=True, exist_ok=True)
        jpath, hpath = out / "report.json", out / "report.html"
        jpath.write_text(json.dumps(report.data, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                         encoding="utf-8")
        hpath.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {out}: {exc.strerror or exc}") from exc
    return ReportFiles(hpath, jpath)
