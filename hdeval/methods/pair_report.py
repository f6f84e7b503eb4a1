"""``hdeval report`` for artifacts that judge pairs: DnA (``--method dna``) and HD-Eval on a
pairwise task. Reads only what the artifact holds (no LLM, no refit) and returns the numbers
(``report.json``) and the same as readable lines (printed); ``report.html`` shows them with
plots, a verdict banner and the wrong verdicts (page layout in :mod:`hdeval.report`).

- DnA: the LLM's weight per aspect (the mean over instances; per proposed aspect name with
  dynamic aspects), and for learned aggregation its coefficients per aspect and each aspect's
  share of the absolute coefficients (every aspect is scored on the same 1-10 scale, so the
  shares compare with the LLM's weights); held-out agreement.
- HD-Eval on pairs: the criteria tree with each criterion's held-out permutation importance
  (the drop in agreement when its difference is shuffled) and rolled-up importance (itself plus
  its descendants), whether the classifier uses it; agreement per layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hdeval.errors import ConfigError
from hdeval.report import banner as verdicts
from hdeval.report import plots, render
from hdeval.report import samples as sample_view


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _agreement_line(name: str, a: dict[str, Any] | None) -> str:
    if not a:
        return f"  {name:<22} n/a"
    return f"  {name:<22} w/o ties {_f(a.get('wo_ties'))}  w/ ties {_f(a.get('w_ties'))}  (n {a.get('n')})"


def dna_report(ev: Any) -> tuple[dict[str, Any], list[str]]:
    m = ev.metrics
    s = ev.settings
    data: dict[str, Any] = {"method": "dna", "mode": s.mode, "aspect_source": s.aspect_source,
                            "llm_weights": m.get("mean_weights"), "test": m.get("test"),
                            "position_consistency": m.get("position_consistency")}
    lines = [f"DnA artifact {ev.path}: mode {s.mode}, aspects {s.aspect_source}, LLM {ev.llm_identity}"]
    weights = m.get("mean_weights")
    if weights:
        if s.dynamic:
            lines.append("LLM weights (mean over the instances that proposed the aspect):")
            for name, w in weights.items():
                lines.append(f"  {name:<28} {w['mean']:.3f}  ({w['instances']} instances)")
        else:
            lines.append("LLM weights per aspect (mean over instances):")
            for k in [k for k in ev.task.aspect_keys if k in weights]:
                lines.append(f"  {k:<28} {weights[k]:.3f}")
    learned = ev.learned
    if learned is not None:
        coef = np.abs(learned.coef).sum(axis=0)
        share = coef / coef.sum() if coef.sum() > 0 else coef
        rows = list(learned.classes[1:]) if len(learned.classes) == 2 else list(learned.classes)
        data["learned"] = {
            "classes": learned.classes,
            "coefficients": {c: dict(zip(learned.aspects, r.round(6).tolist())) for c, r in zip(rows, learned.coef)},
            "intercept": learned.intercept.round(6).tolist(),
            "weight_share": dict(zip(learned.aspects, share.round(6).tolist())),
        }
        lines.append("learned aggregation (logistic regression on per-aspect differences A - B):")
        lines.append(f"  {'aspect':<28} {'share':>6}  " + "  ".join(f"coef->{c:<5}" for c in rows))
        for j, a in enumerate(learned.aspects):
            llm = weights.get(a) if weights and not s.dynamic else None
            extra = f"   (LLM weight {llm:.3f})" if isinstance(llm, (int, float)) else ""
            lines.append(f"  {a:<28} {share[j]:6.3f}  " + "  ".join(f"{r[j]:+11.3f}" for r in learned.coef)
                         + extra)
        if len(learned.classes) == 2:
            lines.append(f"  (a positive coefficient pushes towards {learned.classes[1]!r})")
    elif isinstance(m.get("learned"), dict) and m["learned"].get("skipped"):
        data["learned"] = {"skipped": m["learned"]["skipped"]}
        lines.append(m["learned"]["skipped"])
    lines.append("held-out agreement with the human labels:")
    for key, a in (m.get("test") or {}).items():
        if isinstance(a, dict):
            lines.append(_agreement_line(key, a))
    if m.get("position_consistency") is not None:
        lines.append(f"  position consistency   {_f(m['position_consistency'])}")
    return data, lines


def pairwise_hdeval_report(ev: Any) -> tuple[dict[str, Any], list[str]]:
    m = ev.metrics
    imp = m.get("importance") or {}
    used = set(ev.needed_criteria)
    tree = ev.tree

    def rolled(key: str) -> float:
        return float(imp.get(key, 0.0)) + sum(rolled(c.key) for c in tree.children(key))

    nodes = []
    lines = [f"HD-Eval artifact {ev.path} on pairs: classifier {ev.kind} over score(A) - score(B), "
             f"{len(ev.feature_keys)} criteria, classes {', '.join(ev.classes)}, LLM {ev.llm_identity}",
             "criteria tree (importance = drop in held-out agreement when the criterion's difference is "
             "shuffled; rolled up = itself + descendants):",
             f"  {'criterion':<48} {'importance':>10} {'rolled up':>10}  used"]

    def walk(key: str, depth: int) -> None:
        c = tree[key]
        node = {"key": key, "name": c.name, "layer": c.layer, "parent": c.parent_key,
                "importance": imp.get(key), "rolled_up": round(rolled(key), 6), "used": key in used}
        nodes.append(node)
        label = ("  " * depth + key)[:48]
        lines.append(f"  {label:<48} {_f(node['importance']):>10} {node['rolled_up']:>10.3f}  "
                     f"{'yes' if node['used'] else 'no'}")
        for ch in tree.children(key):
            walk(ch.key, depth + 1)

    for root in tree.layer(1):
        walk(root.key, 0)
    lines.append("held-out agreement with the human labels per layer:")
    for layer, a in (m.get("layers") or {}).items():
        lines.append(_agreement_line(f"layer {layer}", a))
    lines.append(_agreement_line("layer-1 sum (baseline)", m.get("direct_layer1")))
    data = {"method": "hdeval", "shape": "pairwise", "classifier": ev.kind, "classes": ev.classes,
            "tree": nodes, "layers": m.get("layers"), "direct_layer1": m.get("direct_layer1")}
    return data, lines


def pair_report(ev: Any) -> tuple[dict[str, Any], list[str]]:
    if ev.method == "dna":
        return dna_report(ev)
    return pairwise_hdeval_report(ev)


PAIR_LABELS = ("a", "b", "tie")


def _table(ev: Any) -> Any:
    """The artifact's ``scores.csv`` (checked against the manifest's checksum when the artifact
    was loaded), or None when it holds none."""
    import pandas as pd

    path = Path(ev.path) / "scores.csv" if ev.path else None
    if path is None or not path.is_file():
        return None
    try:
        table = pd.read_csv(path, dtype={"pair_id": str, "split": str, "human": str, "prediction": str,
                                         "learned_prediction": str}, keep_default_na=False)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return table if {"pair_id", "split", "human"} <= set(table.columns) else None


def _scores(table: Any, columns: Sequence[str]) -> np.ndarray:
    import pandas as pd

    return np.column_stack([pd.to_numeric(table[c], errors="coerce").to_numpy(float) for c in columns]) \
        if columns else np.empty((len(table), 0))


def _differences(table: Any, keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per human label (a, b): the mean score difference A - B of each key on the held-out pairs."""
    out: dict[str, dict[str, float]] = {}
    test = table[table["split"] == "test"]
    diff = _scores(test, [f"{k}:a" for k in keys]) - _scores(test, [f"{k}:b" for k in keys])
    for label in ("a", "b"):
        rows = (test["human"] == label).to_numpy()
        if rows.any():
            out[label] = {k: float(np.nanmean(diff[rows, j])) for j, k in enumerate(keys)}
    return out


def _difference_plot(diffs: Mapping[str, Mapping[str, float]], what: str) -> bytes | None:
    if "a" not in diffs and "b" not in diffs:
        return None
    first = diffs.get("a") or diffs.get("b") or {}
    return plots.barh(first, f"Held-out score difference A − B per {what}", "pairs humans preferred A"
                      if "a" in diffs else "pairs humans preferred B", sort=False,
                      reference=diffs.get("b") if "a" in diffs else None, reference_label="pairs humans preferred B")


def _wrong(test: Any, predicted: Sequence[str]) -> list[int]:
    """Positions of held-out pairs whose verdict differs from the human label (failed ones too)."""
    human = list(test["human"])
    return [i for i, (h, p) in enumerate(zip(human, predicted)) if h in PAIR_LABELS and p != h]


def _pair_fields(ev: Any, pair: Any) -> list[tuple[str, str]]:
    if pair is None:
        return []
    clip = sample_view.clip
    out = [(f.label, clip(pair.fields.get(f.key), sample_view.MAX_FIELD_CHARS)) for f in ev.task.fields
           if f.key != "output"]
    return out + [("Response A", clip(pair.output_a, sample_view.MAX_FIELD_CHARS)),
                  ("Response B", clip(pair.output_b, sample_view.MAX_FIELD_CHARS))]


def _dna_page(ev: Any, data: dict[str, Any], data_file: Any, cache_dir: Any) -> str:
    m, s = ev.metrics, ev.settings
    test_m = {k: v for k, v in (m.get("test") or {}).items() if isinstance(v, dict)}
    b = verdicts.Banner()
    verdicts.llm_line(b, ev.llm_identity)
    split = m.get("split") or {}
    learned = ev.learned
    verdicts.split_line(b, split.get("train"), split.get("test"), len(learned.aspects) if learned is not None
                        else None, features="aspects (the learned aggregation's features)", rows="pairs")
    primary = m.get("primary") or "llm_weights"
    main = (test_m.get(primary) or {}).get("wo_ties")
    others = {f"{k} aggregation": v.get("wo_ties") for k, v in test_m.items() if k != primary}
    extra = m.get("baselines") if isinstance(m.get("baselines"), Mapping) else {}
    others |= {str(k): (v.get("wo_ties") if isinstance(v, Mapping) else v) for k, v in extra.items()}
    verdicts.baseline_line(b, main, others, "held-out agreement w/o ties")
    if m.get("position_consistency") is not None:
        pc = m["position_consistency"]
        b.add("position consistency", f"{pc:.3f} of the pairs get the same verdict with A and B swapped",
              warn=pc < 0.8)
    figs: list[tuple[str, bytes, str]] = []
    if test_m:
        figs.append(("Agreement with the human labels", plots.agreement_bars(
            {k.replace("_", " "): v for k, v in test_m.items()}, "Held-out agreement"),
            "Share of held-out pairs where the verdict matches the human label: without ties, on the pairs "
            "humans did not tie with the verdict forced to A or B; with ties, 3-way. 'llm weights' is DnA's "
            "weighted sum with the LLM's weights, 'learned' the logistic regression on aspect-score differences."))
        for k, v in test_m.items():
            if v.get("confusion"):
                figs.append((f"Confusion matrix ({k.replace('_', ' ')})", plots.confusion(
                    v["confusion"], f"{k.replace('_', ' ')}: human label × verdict"),
                    "Rows: the human label; columns: the verdict; the diagonal is agreement. 'failed' counts "
                    "pairs the LLM's replies gave no verdict for."))
    weights = m.get("mean_weights")
    if weights:
        vals = {k: (w["mean"] if isinstance(w, Mapping) else w) for k, w in weights.items()}
        share = (data.get("learned") or {}).get("weight_share") if not s.dynamic else None
        figs.append(("Weights", plots.barh(vals, "Aspect weights", "LLM weight (mean over instances)",
                                           reference=share, reference_label="learned share of |coefficients|"),
                     "The weight the LLM gave each aspect (mean over the instances), and, for the learned "
                     "aggregation, each aspect's share of its absolute coefficients; both sum to 1, so they compare."))
    table = _table(ev)
    samples, note = [], None
    if table is not None:
        keys = [c[:-2] for c in table.columns if c.endswith(":a") and f"{c[:-2]}:b" in table.columns]
        diff = _differences(table, keys)
        fig = _difference_plot(diff, "aspect")
        if fig:
            figs.append(("Per-aspect differences", fig, "The mean of score(A) − score(B) per aspect on the "
                         "held-out pairs, for the pairs humans preferred A and those they preferred B: an aspect "
                         "that separates the two groups is one the LLM's scores agree with humans on."))
        test = table[table["split"] == "test"].reset_index(drop=True)
        predicted = [p if p in PAIR_LABELS else "failed" for p in test.get("prediction", [""] * len(test))]
        wrong = _wrong(test, predicted)[:sample_view.TOP_SAMPLES]
        ids = [str(test["pair_id"][i]) for i in wrong]
        items = _read_pairs(ev, ids, sample_view.data_path(ev, data_file))
        note = ("raw replies are not shown in DnA reports yet; the per-aspect scores below are what the "
                "LLM's replies were read as")
        if items is None:
            note += "; the training data file is not available, so the pairs' text is not shown (--data)"
        A, B = _scores(test, [f"{k}:a" for k in keys]), _scores(test, [f"{k}:b" for k in keys])
        for i, pid in zip(wrong, ids):
            samples.append({"id": pid, "human": test["human"][i], "predicted": predicted[i],
                            "extra": ({"learned verdict": test["learned_prediction"][i]}
                                      if "learned_prediction" in test.columns else {}),
                            "fields": _pair_fields(ev, (items or {}).get(pid)),
                            "criteria": [{"label": k, "a": A[i, j], "b": B[i, j]} for j, k in enumerate(keys)]})
    elif ev.path:
        note = "the artifact holds no scores.csv: no per-pair view"
    if m.get("position_consistency") is not None:
        figs.append(("Position consistency", plots.share_bar(m["position_consistency"], "position consistency"),
                     "The share of pairs that get the same verdict when the LLM sees B before A (--swap)."))
    return render("pairs.html.j2", title=f"hdeval report: {ev.task.name} (DnA)", method=f"DnA, mode {s.mode}, "
                  f"aspects {s.aspect_source}", ev_path=str(ev.path), llm=ev.llm_identity, banner=b, figures=figs,
                  samples=samples, samples_note=note, reply_columns=False,
                  max_samples=sample_view.TOP_SAMPLES)


def _read_pairs(ev: Any, ids: Sequence[str], path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        from hdeval.data import read_pairs

        wanted = set(ids)
        return {p.id: p for p in read_pairs(path, ev.task) if p.id in wanted}
    except Exception:  # noqa: BLE001 - an unreadable file only costs this view its text
        return None


def _hdeval_page(ev: Any, data: dict[str, Any], data_file: Any, cache_dir: Any) -> str:
    from hdeval.classify import predict_labels

    m = ev.metrics
    b = verdicts.Banner()
    verdicts.llm_line(b, ev.llm_identity)
    split = m.get("split") or {}
    verdicts.split_line(b, split.get("train"), split.get("test"), len(ev.feature_keys), rows="pairs")
    verdicts.layer_line(b, m, list((m.get("layers") or {}).keys()))
    extra = m.get("baselines") if isinstance(m.get("baselines"), Mapping) else {}
    bases = {"equal-weight sum of the layer-1 differences": (m.get("direct_layer1") or {}).get("wo_ties")}
    bases |= {str(k): (v.get("wo_ties") if isinstance(v, Mapping) else v) for k, v in extra.items()}
    verdicts.baseline_line(b, (m.get("final") or {}).get("wo_ties"), bases, "held-out agreement w/o ties")
    figs: list[tuple[str, bytes, str]] = []
    layers = m.get("layers") or {}
    if layers:
        figs.append(("Agreement by layer", plots.layer_agreement(layers, m.get("direct_layer1"),
                                                                 "layer-1 sum"),
                     "Held-out agreement with the human labels after each layer of criteria was added, with and "
                     "without ties; dashed: the baseline that adds up the layer-1 score differences with equal weights."))
    series = {"evaluator": m.get("final")} if m.get("final") else {}
    if m.get("direct_layer1"):
        series["layer-1 sum (baseline)"] = m["direct_layer1"]
    if series:
        figs.append(("Agreement with the human labels", plots.agreement_bars(series, "Held-out agreement"),
                     "Share of held-out pairs where the verdict matches the human label: without ties, on the pairs "
                     "humans did not tie with the verdict forced to A or B; with ties, 3-way."))
    if (m.get("final") or {}).get("confusion"):
        figs.append(("Confusion matrix", plots.confusion(m["final"]["confusion"], "human label × verdict"),
                     "Rows: the human label; columns: the classifier's verdict; the diagonal is agreement."))
    imp = m.get("importance") or {}
    if imp:
        figs.append(("Criterion weights (importance)", plots.barh(
            {k: v for k, v in imp.items() if isinstance(v, (int, float))}, "Permutation importance per criterion",
            "drop in held-out agreement when shuffled"),
            "How much the classifier relies on each criterion's score difference: the drop in held-out "
            "agreement when it is shuffled across pairs (0 or below: not relied on)."))
    table = _table(ev)
    samples, note = [], None
    if table is not None:
        roots = [c.key for c in ev.tree.layer(1)]
        fig = _difference_plot(_differences(table, [k for k in roots if f"{k}:a" in table.columns]), "aspect")
        if fig:
            figs.append(("Per-aspect differences", fig, "The mean of score(A) − score(B) per layer-1 criterion "
                         "(the task's aspects) on the held-out pairs, for the pairs humans preferred A and those "
                         "they preferred B."))
        test = table[table["split"] == "test"].reset_index(drop=True)
        keys = list(ev.feature_keys)
        A, B = _scores(test, [f"{k}:a" for k in keys]), _scores(test, [f"{k}:b" for k in keys])
        predicted, _ = predict_labels(ev.model, A - B)
        wrong = _wrong(test, predicted)[:sample_view.TOP_SAMPLES]
        ids = [str(test["pair_id"][i]) for i in wrong]
        replies, items = sample_view.score_replies(ev, ids, keys, sample_view.data_path(ev, data_file),
                                                   cache_dir, pairs=True)
        note = replies.note
        for i, pid in zip(wrong, ids):
            samples.append({"id": pid, "human": test["human"][i], "predicted": predicted[i], "extra": {},
                            "fields": _pair_fields(ev, items.get(pid)),
                            "criteria": [{"label": k, "a": A[i, j], "b": B[i, j],
                                          "reply_a": replies.texts.get((f"{pid}#a", k)),
                                          "reply_b": replies.texts.get((f"{pid}#b", k))}
                                         for j, k in enumerate(keys)]})
    return render("pairs.html.j2", title=f"hdeval report: {ev.task.name} (HD-Eval on pairs)",
                  method=f"HD-Eval on pairs, classifier {ev.kind}, {len(ev.feature_keys)} criteria",
                  ev_path=str(ev.path), llm=ev.llm_identity, banner=b, figures=figs, samples=samples,
                  samples_note=note, reply_columns=True, max_samples=sample_view.TOP_SAMPLES)


def write_pair_report(ev: Any, out_dir: str | Path | None = None, data: str | Path | None = None,
                      cache_dir: str | Path | None = None) -> tuple[Path, list[str]]:
    """Write ``report.json`` and ``report.html`` (default dir: ``<artifact>/report``); return the
    HTML path and the text lines. ``data`` and ``cache_dir`` find the wrong verdicts' text and
    the LLM's raw replies (default: the training data the manifest names, the default cache)."""
    data_json, lines = pair_report(ev)
    out = Path(out_dir) if out_dir else Path(ev.path) / "report"
    page = (_dna_page if ev.method == "dna" else _hdeval_page)(ev, data_json, data, cache_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(data_json, indent=1, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
        (out / "report.html").write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {out}: {exc.strerror or exc}") from exc
    return out / "report.html", lines
