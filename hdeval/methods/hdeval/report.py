"""The evaluator report: ``report.json`` (every number) and a self-contained ``report.html``.
Computation lives in :mod:`.explain`, the page and its plots in :mod:`hdeval.report.pointwise`;
this module assembles the numbers (and the per-sample view's) and writes both files. ``ev`` is
the fitted pointwise evaluator, which imports this module (not the reverse)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hdeval import __version__
from hdeval.core.errors import ArtifactError, ConfigError
from hdeval.core.metrics import metric_table
from hdeval.core.progress import Progress
from hdeval.methods.hdeval.explain import (
    MAX_SAMPLES,
    N_BACKGROUND,
    EfficiencyPoint,
    NodeImportance,
    ShapResult,
    efficiency_curve,
    permutation_importances,
    score_table,
    shap_explain,
    split_rows,
    subsample,
    tree_importance,
)
from hdeval.methods.hdeval.prune import N_REPEATS
from hdeval.report import REPORT_FORMAT
from hdeval.report import samples as sample_view

REPORT_VERSION = 1
CURVE_POINTS = 20

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


def banner_data(ev: Any) -> dict[str, Any]:
    """The fields of the report's numbers that its verdict banner reads (``artifact``'s LLM,
    split and criteria count, the held-out correlations recomputed from ``scores.csv``), from the
    score table alone: no SHAP, no refit, no plot."""
    table = score_table(ev)
    train, test = split_rows(ev, table, "train"), split_rows(ev, table, "test")
    final = (
        metric_table(test.Y, ev.aggregator.predict(test.X), list(ev.aggregator.aspects))
        if len(test.X)
        else None
    )
    return _clean(
        {
            "artifact": {
                "llm": ev.llm_identity,
                "needed_criteria": len(ev.needed_criteria),
                "split": {"train": len(train.X), "test": len(test.X)},
            },
            "correlations": {"final_recomputed": final},
        }
    )


def build_report(
    ev: Any,
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
    shap_res = shap_explain(
        agg, keys, test.X[sel], [test.sample_ids[i] for i in sel], bg, random_state=random_state
    )

    final = metric_table(test.Y, agg.predict(test.X), aspects)

    progress.message("criteria-efficiency curve: importance on the training split, then refits")
    train_perm = permutation_importances(agg, keys, train.X, train.Y, n_repeats, random_state)
    order_imp = {k: float(sum(p[k] for p in train_perm.values())) for k in keys}
    order = sorted(keys, key=lambda k: -order_imp[k])  # stable: ties keep the tree order
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
            "aspects": [
                {"key": a.key, "name": a.name, "range": [a.low, a.high]}
                for a in ev.task.aspects
                if a.key in aspects
            ],
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
            "split": "test",
            "n_samples": len(test.X),
            "n_repeats": n_repeats,
            "random_state": random_state,
            "per_aspect": perm,
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
            "selection": m.get("selection"),
        },
        # the calibration and its held-out coverage, as training recorded them
        "intervals": m.get("intervals"),
        "efficiency": {
            "order_by": "permutation importance on the train split, summed over aspects",
            "order": order,
            "order_importance": order_imp,
            "points": [
                {"n_criteria": p.n_criteria, "criteria": p.criteria, "correlations": p.correlations}
                for p in curve
            ],
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
            if metric == "why":  # words, not a figure: why the figures beside it are null
                if v != w:
                    return False
                continue
            if (v is None) != (w is None) or (v is not None and abs(v - w) > tol):
                return False
    return True


def _clean(x: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python numbers."""
    return json.loads(json.dumps(x, default=lambda o: o.item()), parse_constant=lambda _: None)


def disagreements(
    ev: Any,
    data: str | Path | None = None,
    cache_dir: str | Path | None = None,
    top: int = sample_view.TOP_SAMPLES,
) -> tuple[list[dict[str, Any]], str | None]:
    """The held-out samples furthest from the human scores, with their criterion scores and
    the LLM's raw replies (read-only from the cache, when it and the data are at hand)."""
    from hdeval.report.pointwise import labeler

    table = score_table(ev)
    test = split_rows(ev, table, "test")
    aspects = list(ev.aggregator.aspects)
    pred = np.asarray(ev.aggregator.predict(test.X), float)
    span = np.array([max(ev.task.aspect(a).high - ev.task.aspect(a).low, 1e-9) for a in aspects])
    err = np.nanmean(np.abs(pred - test.Y) / span, axis=1)
    order = [int(i) for i in np.argsort(-np.nan_to_num(err, nan=-1.0), kind="stable")[:top]]
    ids = [test.sample_ids[i] for i in order]
    criteria = list(ev.feature_keys)
    replies, items = sample_view.score_replies(ev, ids, criteria, sample_view.data_path(ev, data), cache_dir)
    label = labeler(ev)
    out = []
    for i in order:
        sid = test.sample_ids[i]
        sample = items.get(sid)
        fields = (
            [
                (f.label, sample_view.clip(sample.fields.get(f.key), sample_view.MAX_FIELD_CHARS))
                for f in ev.task.fields
            ]
            if sample is not None
            else []
        )
        out.append(
            {
                "id": sid,
                "error": float(err[i]),
                "fields": fields,
                "aspects": [
                    {"key": a, "human": float(test.Y[i, j]), "predicted": float(pred[i, j])}
                    for j, a in enumerate(aspects)
                ],
                "criteria": [
                    {
                        "key": k,
                        "label": label(k),
                        "score": float(test.X[i, j]),
                        "reply": replies.texts.get((sid, k)),
                    }
                    for j, k in enumerate(criteria)
                ],
            }
        )
    return out, replies.note


def write_report(
    ev: Any,
    out_dir: str | Path | None = None,
    *,
    data: str | Path | None = None,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> tuple[Path, Path]:
    """Build the report (see :func:`build_report` for ``options``) and write ``report.html``
    and ``report.json`` (their paths) to ``out_dir`` (default: ``<artifact>/report``). ``data`` and
    ``cache_dir`` find the samples' text and the LLM's raw replies for the per-sample view
    (default: the training data the manifest names, and the default cache)."""
    if out_dir is None:
        if ev.path is None:
            raise ConfigError("give an output directory: this evaluator was not loaded from disk")
        out_dir = ev.path / "report"
    out = Path(out_dir)
    from hdeval.methods.pair_report import write_report_files
    from hdeval.report.pointwise import render_html

    report = build_report(ev, **options)
    samples, note = disagreements(ev, data, cache_dir)
    # the evaluator's own sections (a jury's), their numbers in report.json under their keys
    numbers, sections = ev.report_sections()
    report.data.update(_clean(numbers))
    page = render_html(ev, report, samples, note, sections)
    return write_report_files(out, report.data, page, allow_nan=False)
