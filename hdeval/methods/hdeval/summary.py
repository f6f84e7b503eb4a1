"""What ``hdeval train`` prints about a pointwise HD-Eval evaluator once it is saved: the final
layer and aggregator, the criteria from a --tree file, the held-out figures against the direct
baseline, and sample-size warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hdeval.metrics import why_null


def summary_lines(ev: Any, path: Path) -> list[tuple[str, bool]]:
    """(text, to stderr) lines, in order."""
    out: list[tuple[str, bool]] = []
    m = ev.metrics
    layers = ev.manifest_extra.get("layers") or [{}]
    sel = m.get("selection") or {}
    final_layer = sel.get("kept_layer", layers[-1].get("layer", "?"))  # chosen on training data
    avg = m["final"]["average"]
    out.append((f"final evaluator: layer {final_layer} of {len(layers)} built, aggregator {ev.aggregator.kind}, "
                f"{len(ev.feature_keys)} criteria" + (f" ({sel['reason']})" if sel.get("reason") else ""), False))
    scores = (sel.get("candidates_cv_spearman") or {}).get(str(final_layer)) or {}
    if sel.get("aggregator_reason"):
        out.append((f"aggregator: {sel['aggregator_reason']}", False))
    if len(scores) > 1:
        shown = ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in scores.items())
        out.append((f"candidates, grouped CV spearman on the training split (layer {final_layer}): {shown}", False))
    if sel.get("simpler_was_better"):
        out.append((f"warning: {sel['simpler_was_better']}", True))
    given = ev.manifest_extra.get("tree_input")
    if given:
        out += _given_tree(given, ev.tree.keys)
    out.append((f"held-out average: pearson {avg['pearson']}, spearman {avg['spearman']}, "
                f"kendall {avg['kendall']}" + why_null(m["final"]), False))
    direct = (m.get("direct_layer1") or {}).get("average", {}).get("spearman")
    if direct is not None and avg["spearman"] is not None:
        diff = avg["spearman"] - direct
        out.append((f"direct baseline (layer-1 scores used as they are): held-out spearman {direct}; "
                    f"the trained evaluator is {diff:+.3f}", False))
    strongest = sel.get("strongest_baseline")
    if strongest and sel.get("baseline_beats_evaluator"):
        out.append((f"note: the simple baseline {strongest.replace('_', ' ')} beats the kept evaluator on "
                    f"cross-validated training data; {sel.get('baseline_not_kept', '')}", True))
    iv = m.get("intervals")
    if iv:
        out.append((interval_summary(iv), False))
    n_train, n_test = m["split"]["train"], m["split"]["test"]
    n_crit = len(ev.feature_keys)
    if n_train < 2 * n_crit:
        out.append((f"warning: {n_train} training samples for {n_crit} criteria: the aggregator may "
                    "overfit; use more data (--limit, --train-frac) or fewer criteria (--layers, --top-k)", True))
    if n_test < 30:
        out.append((f"warning: only {n_test} held-out samples: the correlations above are noisy "
                    "(use more data or a larger --test-frac)", True))
    left = [r["criterion"] for r in ev.manifest_extra.get("decomposition_rejections") or []
            if isinstance(r, dict) and r.get("unexpanded")]
    if left:
        out.append((f"warning: {len(left)} criteria left unexpanded (every decomposition reply was degenerate): "
                    f"{some_of([str(k) for k in left])}; the rejected replies are in the manifest's "
                    "decomposition_rejections", True))
    out.append((f"artifact written to {path}", False))
    out.append((f"next: hdeval report {path}", False))
    return out


def _given_tree(given: dict, keys: list[str]) -> list[tuple[str, bool]]:
    """Which criteria came from the --tree file (and which were locked), which were added."""
    from_file = set(given["criteria"])
    locked = set(given["locked"])
    added = [k for k in keys if k not in from_file]
    listed = some_of([k + (" (locked)" if k in locked else "") for k in given["criteria"]])
    return [(f"criteria from {given['file']} ({len(from_file)}, {len(locked)} locked): {listed}", False),
            (f"criteria added by decomposition: {len(added)}" + (f": {some_of(added)}" if added else ""),
             False)]


def some_of(names: list[str], n: int = 20) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")


def interval_summary(iv: dict[str, Any]) -> str:
    """One line: the intervals' level, half-width and held-out coverage."""
    hw = ", ".join(f"{a} ±{w:.2f}" if w is not None else f"{a} unbounded" for a, w in iv["half_width"].items())
    t = iv.get("test") or {}
    cov, width = (t.get("coverage") or {}).get("average"), (t.get("mean_width") or {}).get("average")
    held = (f"; held-out coverage {cov:.1%} of {t.get('rows')} rows, mean width {width:.2f}"
            if cov is not None and width is not None else "")
    line = f"{iv['level']:.0%} prediction intervals (split conformal on training residuals): {hw}{held}"
    ad = (iv.get("adaptive") or {}).get("test") or {}
    if ad.get("coverage") is not None:  # apply uses these per-sample widths
        lift = ad.get("error_lift")
        line += (f"; per sample: held-out coverage {ad['coverage']:.1%}, mean width {ad['mean_width']:.0%} of the "
                 f"range" + (f", the widest fifth's error {lift:.2f}x the rest's" if lift is not None else ""))
    return line
