"""``hdeval report`` for artifacts that judge pairs: DnA (``--method dna``) and HD-Eval on a
pairwise task (what each shows: docs/methods.md). Reads only what the artifact holds (no LLM, no
refit) and returns the numbers (``report.json``) and the same as readable lines (printed);
``report.html`` shows them with plots (page layout in :mod:`hdeval.report`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hdeval.core.errors import ConfigError


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _agreement_line(name: str, a: dict[str, Any] | None) -> str:
    if not a:
        return f"  {name:<22} n/a"
    return f"  {name:<22} w/o ties {_f(a.get('wo_ties'))}  w/ ties {_f(a.get('w_ties'))}  (n {a.get('n')})"


def dna_report(ev: Any) -> tuple[dict[str, Any], list[str]]:
    m = ev.metrics
    s = ev.settings
    data: dict[str, Any] = {
        "method": "dna",
        "mode": s.mode,
        "aspect_source": s.aspect_source,
        "llm_weights": m.get("mean_weights"),
        "test": m.get("test"),
        "position_consistency": m.get("position_consistency"),
        "swap_flip_rate": m.get("swap_flip_rate"),
        "tie_margin": m.get("tie_margin"),
    }
    lines = [f"DnA artifact {ev.path}: mode {s.mode}, aspects {s.aspect_source}, LLM {ev.llm_identity}"]
    weights = m.get("mean_weights")
    if weights:
        if s.dynamic:
            lines.append("LLM weights (mean over the instances that proposed the aspect):")
            lines += [
                f"  {name:<28} {w['mean']:.3f}  ({w['instances']} instances)" for name, w in weights.items()
            ]
        else:
            lines.append("LLM weights per aspect (mean over instances):")
            lines += [f"  {k:<28} {weights[k]:.3f}" for k in ev.task.aspect_keys if k in weights]
    learned = ev.learned
    if learned is not None:
        coef = np.abs(learned.coef).sum(axis=0)
        share = coef / coef.sum() if coef.sum() > 0 else coef
        rows = list(learned.classes[1:]) if len(learned.classes) == 2 else list(learned.classes)
        data["learned"] = {
            "classes": learned.classes,
            "coefficients": {
                c: dict(zip(learned.aspects, r.round(6).tolist())) for c, r in zip(rows, learned.coef)
            },
            "intercept": learned.intercept.round(6).tolist(),
            "weight_share": dict(zip(learned.aspects, share.round(6).tolist())),
        }
        lines.append("learned aggregation (logistic regression on per-aspect differences A - B):")
        lines.append(f"  {'aspect':<28} {'share':>6}  " + "  ".join(f"coef->{c:<5}" for c in rows))
        for j, a in enumerate(learned.aspects):
            llm = weights.get(a) if weights and not s.dynamic else None
            extra = f"   (LLM weight {llm:.3f})" if isinstance(llm, (int, float)) else ""
            lines.append(
                f"  {a:<28} {share[j]:6.3f}  " + "  ".join(f"{r[j]:+11.3f}" for r in learned.coef) + extra
            )
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
    if m.get("swap_flip_rate") is not None:
        lines.append(
            f"  swap flip rate         {_f(m['swap_flip_rate'])}  (verdicts that change with the order shown)"
        )
    tm = m.get("tie_margin")
    if isinstance(tm, dict):
        how = (
            f"learned on {tm.get('pairs')} training pairs: agreement with ties {_f(tm.get('train_w_ties'))} "
            f"against {_f(tm.get('train_w_ties_at_0'))} at 0"
            if tm.get("from") == "training split"
            else "given"
        )
        lines.append(f"tie margin {tm.get('value')} ({how})")
    return data, lines


def pairwise_hdeval_report(ev: Any) -> tuple[dict[str, Any], list[str]]:
    m = ev.metrics
    imp = m.get("importance") or {}
    used = set(ev.needed_criteria)
    tree = ev.tree

    def rolled(key: str) -> float:
        return float(imp.get(key, 0.0)) + sum(rolled(c.key) for c in tree.children(key))

    nodes = []
    lines = [
        f"HD-Eval artifact {ev.path} on pairs: classifier {ev.kind} over score(A) - score(B), "
        f"{len(ev.feature_keys)} criteria, classes {', '.join(ev.classes)}, LLM {ev.llm_identity}",
        "criteria tree (importance = drop in held-out agreement when the criterion's difference is "
        "shuffled; rolled up = itself + descendants):",
        f"  {'criterion':<48} {'importance':>10} {'rolled up':>10}  used",
    ]

    def walk(key: str, depth: int) -> None:
        c = tree[key]
        node = {
            "key": key,
            "name": c.name,
            "layer": c.layer,
            "parent": c.parent_key,
            "importance": imp.get(key),
            "rolled_up": round(rolled(key), 6),
            "used": key in used,
        }
        nodes.append(node)
        label = ("  " * depth + key)[:48]
        lines.append(
            f"  {label:<48} {_f(node['importance']):>10} {node['rolled_up']:>10.3f}  "
            f"{'yes' if node['used'] else 'no'}"
        )
        for ch in tree.children(key):
            walk(ch.key, depth + 1)

    for root in tree.layer(1):
        walk(root.key, 0)
    lines.append("held-out agreement with the human labels per layer:")
    lines += [_agreement_line(f"layer {layer}", a) for layer, a in (m.get("layers") or {}).items()]
    lines.append(_agreement_line("layer-1 sum (baseline)", m.get("direct_layer1")))
    data = {
        "method": "hdeval",
        "shape": "pairwise",
        "classifier": ev.kind,
        "classes": ev.classes,
        "tree": nodes,
        "layers": m.get("layers"),
        "direct_layer1": m.get("direct_layer1"),
    }
    return data, lines


def write_pair_report(ev: Any, out: Any, progress: Any = None, **options: Any) -> tuple[Path, str, list[str]]:
    """The pair evaluators' ``write_report``: ``report.json`` and ``report.html`` written to
    ``out`` (default: ``<artifact>/report``); the HTML path, the numbers file's name and the text
    lines. Options ``data`` and ``cache_dir`` find the wrong verdicts' text and the LLM's raw
    replies (default: the training data the manifest names, the default cache)."""
    from hdeval.report.pairs import dna_parts, hdeval_parts, pair_page

    dna = ev.method == "dna"
    data_json, lines = (dna_report if dna else pairwise_hdeval_report)(ev)
    page = pair_page(
        ev,
        data_json,
        options.get("data"),
        options.get("cache_dir"),
        dna_parts if dna else hdeval_parts,
        llm_verdicts=dna,
    )
    out = Path(out) if out else Path(ev.path) / "report"
    return write_report_files(out, data_json, page)[0], "report.json", lines


def write_report_files(
    out: Path, numbers: dict[str, Any], page: str, allow_nan: bool = True
) -> tuple[Path, Path]:
    """``report.html`` and ``report.json`` written into ``out`` (made if missing); their paths.
    report.json opens with ``"format": "hdeval-report"``, by which ``hdeval report`` knows it."""
    from hdeval.report import REPORT_FORMAT

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(
            json.dumps(
                {"format": REPORT_FORMAT, **numbers}, indent=1, ensure_ascii=False, allow_nan=allow_nan
            )
            + "\n",
            encoding="utf-8",
        )
        (out / "report.html").write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {out}: {exc.strerror or exc}") from exc
    return out / "report.html", out / "report.json"
