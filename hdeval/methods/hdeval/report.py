"""The evaluator report: ``report.json`` (every number) and a self-contained ``report.html``
(the same numbers, plus matplotlib plots embedded as base64 PNG data URIs; no scripts, no
external resources, so it opens offline and can be mailed around).

Computation lives in :mod:`hdeval.methods.hdeval.explain`; the page's template, style and
plot helpers in :mod:`hdeval.report`; this module assembles, plots and writes.
"""

from __future__ import annotations

import json
import math
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
from hdeval.report import banner, fmt_num, render
from hdeval.report import samples as sample_view
from hdeval.report.banner import Banner
from hdeval.report.plots import integer_ticks, png, pyplot, styled
from hdeval.report.samples import TOP_SAMPLES
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
# The shared helpers; the old names stay because other modules imported them from here.
_pyplot, _png, _literal_text = pyplot, png, styled


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
    integer_ticks(ax, "x")
    ax.set_xlabel("criteria kept, most important first (= LLM calls per sample)", fontsize=10)
    ax.set_ylabel("held-out correlation", fontsize=10)
    ax.set_title("Criteria efficiency", fontsize=12)
    ax.tick_params(labelsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- HTML
def _corr_rows(corr: Mapping[str, Any], aspects: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    rows = [(f"layer {k}", v) for k, v in sorted(corr.get("layers", {}).items(), key=lambda kv: int(kv[0]))]
    rows += [("direct layer-1 score (baseline)", corr.get("direct_layer1")),
             ("mean of all criteria (baseline)", corr.get("mean_all_criteria")),
             ("final aggregator, recomputed now", corr.get("final_recomputed"))]
    cols = list(aspects) + ["average"]
    body = [[name] + [f"{fmt_num((table.get(c) or {}).get('pearson'))} / {fmt_num((table.get(c) or {}).get('spearman'))}"
                      for c in cols] for name, table in rows if table]
    return ["held-out Pearson / Spearman", *cols], body


def _efficiency_rows(points: Sequence[EfficiencyPoint], label: Labeler) -> list[list[str]]:
    body, prev = [], 0
    for p in points:
        added = ", ".join(label(k) for k in p.criteria[prev:p.n_criteria])
        prev = p.n_criteria
        avg = p.correlations["average"]
        body.append([str(p.n_criteria), added, fmt_num(avg["pearson"]), fmt_num(avg["spearman"])])
    return body


def verdict(ev: "Evaluator", data: Mapping[str, Any]) -> Banner:
    """The banner: LLM, split against the criteria, layer kept, strongest baseline."""
    art, m = data["artifact"], ev.metrics or {}
    b = Banner()
    banner.llm_line(b, art["llm"])
    banner.split_line(b, art["split"]["train"], art["split"]["test"], art["needed_criteria"])
    banner.layer_line(b, m, list((m.get("layers") or {}).keys()))
    names = {"direct_layer1": "direct layer-1 score", "mean_all_criteria": "mean of all criteria",
             "mean_subtree": "mean of each aspect's subtree"}
    extra = m.get("baselines") if isinstance(m.get("baselines"), Mapping) else {}
    tables = {names.get(k, k): m.get(k) for k in names} | {str(k): v for k, v in extra.items()}
    # a baseline another version records as one number is taken as its average Spearman
    avg = {k: (t.get("average") or {}).get("spearman") if isinstance(t, Mapping) else t for k, t in tables.items()
           if isinstance(t, (Mapping, int, float)) and not isinstance(t, bool)}
    final = ((data["correlations"].get("final_recomputed") or {}).get("average") or {}).get("spearman")
    banner.baseline_line(b, final, avg, "held-out average Spearman")
    return b


def disagreements(ev: "Evaluator", data: str | Path | None = None, cache_dir: str | Path | None = None,
                  top: int = TOP_SAMPLES) -> tuple[list[dict[str, Any]], str | None]:
    """The held-out samples furthest from the human scores, with their criterion scores and
    the LLM's raw replies (read-only from the cache, when it and the data are at hand)."""
    table = score_table(ev)
    test = split_rows(ev, table, "test")
    aspects = list(ev.aggregator.aspects)
    pred = np.asarray(ev.aggregator.predict(test.X), float)
    span = np.array([max(ev.task.aspect(a).high - ev.task.aspect(a).low, 1e-9) for a in aspects])
    err = np.nanmean(np.abs(pred - test.Y) / span, axis=1)
    order = [int(i) for i in np.argsort(-np.nan_to_num(err, nan=-1.0), kind="stable")[:top]]
    ids = [test.sample_ids[i] for i in order]
    criteria = list(ev.feature_keys)
    replies, items = sample_view.score_replies(ev, ids, criteria, sample_view.data_path(ev, data), cache_dir,
                                               pairs=False)
    label = _labeler(ev)
    out = []
    for i in order:
        sid = test.sample_ids[i]
        sample = items.get(sid)
        fields = [(f.label, sample_view.clip(sample.fields.get(f.key), sample_view.MAX_FIELD_CHARS))
                  for f in ev.task.fields] if sample is not None else []
        out.append({
            "id": sid, "error": float(err[i]), "fields": fields,
            "aspects": [{"key": a, "human": float(test.Y[i, j]), "predicted": float(pred[i, j])}
                        for j, a in enumerate(aspects)],
            "criteria": [{"key": k, "label": label(k), "score": float(test.X[i, j]),
                          "reply": replies.texts.get((sid, k))} for j, k in enumerate(criteria)],
        })
    return out, replies.note


def render_html(ev: "Evaluator", report: Report, samples: Sequence[Mapping[str, Any]] = (),
                samples_note: str | None = None) -> str:
    """The report as one HTML page; plots are embedded PNGs, so the page needs nothing else."""
    d = report.data
    art = d["artifact"]
    aspects = [a["key"] for a in art["aspects"]] or list(ev.aggregator.aspects)
    label = _labeler(ev)
    perm, sh, corr = d["permutation_importance"], d["shap"], d["correlations"]
    children: dict[str | None, list[NodeImportance]] = {}
    for n in report.nodes:
        children.setdefault(n.parent, []).append(n)
    top = max((abs(n.rolled_up) for n in report.nodes), default=0.0) or 1.0
    plots = {
        "correlations": plot_correlations(corr, aspects),
        "permutation": [(a, _barh(perm["per_aspect"][a], label, f"{a}: permutation importance (held-out)",
                                  "mean drop in R² when shuffled", "#4a7ab5")) for a in aspects],
        "shap": [(a, sh["per_aspect"][a]["base_value"], plot_beeswarm(report.shap[a], label),
                  _barh(sh["per_aspect"][a]["mean_abs"], label, f"{a}: mean |SHAP|",
                        f"mean |SHAP value| (average effect on the {a} prediction)", "#c0504d"))
                 for a in aspects],
        "efficiency": plot_efficiency(report.efficiency, aspects),
    }
    shap_how = (f"Each dot is one held-out sample ({sh['n_samples']} explained, explainer: {sh['explainer']}"
                + (f", {sh['n_background']} background training rows" if sh["n_background"] else "")
                + "): how far that criterion's score moved the aspect's prediction away from the base value "
                  "(the average prediction); colour is the criterion score (red high, blue low). The bar chart "
                  "is the mean absolute SHAP value. " + DEFINITIONS["shap"])
    corr_head, corr_rows = _corr_rows(corr, aspects)
    return render(
        "hdeval.html.j2", art=art, banner=verdict(ev, d), version=d["hdeval_version"], created=d["created"],
        definitions=DEFINITIONS, plots=plots, corr_head=corr_head, corr_rows=corr_rows, children=children,
        bar_width=lambda v: int(round(120 * abs(v) / top)), perm=perm, top_bars=TOP_BARS, shap_how=shap_how,
        eff_rows=_efficiency_rows(report.efficiency, _labeler(ev, None)), samples=list(samples),
        samples_note=samples_note,
    )


@dataclass(frozen=True)
class ReportFiles:
    """Where :func:`write_report` wrote the report."""

    html: Path
    json: Path


def write_report(ev: "Evaluator", out_dir: str | Path | None = None, *, data: str | Path | None = None,
                 cache_dir: str | Path | None = None, **options: Any) -> ReportFiles:
    """Build the report (see :func:`build_report` for ``options``) and write ``report.html``
    and ``report.json`` to ``out_dir`` (default: ``<artifact>/report``). ``data`` and
    ``cache_dir`` find the samples' text and the LLM's raw replies for the per-sample view
    (default: the training data the manifest names, and the default cache)."""
    if out_dir is None:
        if ev.path is None:
            raise ConfigError("give an output directory: this evaluator was not loaded from disk")
        out_dir = ev.path / "report"
    out = Path(out_dir)
    report = build_report(ev, **options)
    samples, note = disagreements(ev, data, cache_dir)
    page = render_html(ev, report, samples, note)
    try:
        out.mkdir(parents=True, exist_ok=True)
        jpath, hpath = out / "report.json", out / "report.html"
        jpath.write_text(json.dumps(report.data, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                         encoding="utf-8")
        hpath.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {out}: {exc.strerror or exc}") from exc
    return ReportFiles(hpath, jpath)
