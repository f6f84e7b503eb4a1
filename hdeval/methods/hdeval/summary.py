"""What ``hdeval train`` prints about a pointwise HD-Eval evaluator once it is saved: the final
layer and aggregator, the criteria from a --tree file, the held-out figures against the direct
baseline, and sample-size warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hdeval.core.metrics import why_null


def summary_lines(ev: Any, path: Path) -> list[tuple[str, bool]]:
    """(text, to stderr) lines, in order."""
    out: list[tuple[str, bool]] = []
    m = ev.metrics
    layers = ev.manifest_extra.get("layers") or [{}]
    sel = m.get("selection") or {}
    final_layer = sel.get("kept_layer", layers[-1].get("layer", "?"))  # chosen on training data
    avg = m["final"]["average"]
    given = ev.manifest_extra.get("tree_input")
    reason = sel.get("reason")
    if reason and given and reason == "the only layer that could be kept":
        reason += ": a --tree file's layers are kept whole; a larger --layers builds a deeper one to compare"
    out.append(
        (
            f"final evaluator: layer {final_layer} of {len(layers)} built, aggregator {ev.aggregator.kind}, "
            f"{len(ev.feature_keys)} criteria" + (f" ({reason})" if reason else ""),
            False,
        )
    )
    scores = (sel.get("candidates_cv_spearman") or {}).get(str(final_layer)) or {}
    if sel.get("aggregator_reason"):
        out.append((f"aggregator: {sel['aggregator_reason']}", False))
    if len(scores) > 1:
        shown = ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in scores.items())
        out.append(
            (f"candidates, grouped CV spearman on the training split (layer {final_layer}): {shown}", False)
        )
    if sel.get("simpler_was_better"):
        out.append((f"warning: {sel['simpler_was_better']}", True))
    if given:
        out += _given_tree(given, ev.tree.keys)
    direct = (m.get("direct_layer1") or {}).get("average", {}).get("spearman")
    final = avg["spearman"]
    if direct is not None and final is not None:
        head = (
            f"held-out Spearman: trained {final:.3f} vs direct layer-1 score {direct:.3f} "
            f"(difference {final - direct:+.3f})"
        )
    else:
        head = f"held-out Spearman: trained {_num(final)}" + (
            f" vs direct layer-1 score {direct:.3f}" if direct is not None else ""
        )
    out.append(
        (
            f"{head}; pearson {_num(avg['pearson'])}, kendall {_num(avg['kendall'])} (average over aspects; "
            "1 is perfect agreement with the raters, 0 none)" + why_null(m["final"]),
            False,
        )
    )
    strongest = sel.get("strongest_baseline")
    if strongest and sel.get("baseline_beats_evaluator"):
        out.append(
            (
                f"note: the simple baseline {strongest.replace('_', ' ')} beats the kept evaluator on "
                "cross-validated training data; a baseline is not kept as the evaluator (metrics.json "
                "says why, with its held-out figure)",
                True,
            )
        )
    iv = m.get("intervals")
    too_wide = False
    if iv:
        from hdeval.report.banner import USABLE_WIDTH, interval_verdict

        ranges = {a.key: (a.low, a.high) for a in ev.task.aspects}
        too_wide = any(
            w is None or 2 * w > USABLE_WIDTH * (ranges[a][1] - ranges[a][0])
            for a, w in iv["half_width"].items()
            if a in ranges
        )
        t = iv.get("test") or {}
        cov = (t.get("coverage") or {}).get("average")
        held = f" (held-out coverage {cov:.0%} of {t.get('rows')} rows)" if cov is not None else ""
        out.append(
            (
                f"{iv['level']:.0%} prediction intervals: {interval_verdict(iv['half_width'], ranges)}{held}",
                False,
            )
        )
    n_train, n_test = m["split"]["train"], m["split"]["test"]
    n_crit = len(ev.feature_keys)
    if n_train < 2 * n_crit:
        out.append(
            (
                f"warning: {n_train} training samples for {n_crit} criteria: the aggregator may "
                "overfit; use more data (--limit, --train-frac) or fewer criteria (--layers, --top-k)",
                True,
            )
        )
    if n_test < 30:
        out.append(
            (
                f"warning: only {n_test} held-out samples: the correlations above are noisy "
                "(use more data or a larger --test-frac)",
                True,
            )
        )
    left = [
        r["criterion"]
        for r in ev.manifest_extra.get("decomposition_rejections") or []
        if isinstance(r, dict) and r.get("unexpanded")
    ]
    if left:
        out.append(
            (
                f"warning: {len(left)} criteria left unexpanded (every decomposition reply was degenerate): "
                f"{some_of([str(k) for k in left])}; the rejected replies are in the manifest's "
                "decomposition_rejections",
                True,
            )
        )
    from hdeval.report.banner import next_step

    out.append((f"artifact written to {path}", False))
    step = next_step(
        identity=ev.llm_identity,
        evaluator=final,
        direct=direct,
        n_train=n_train,
        n_features=n_crit,
        n_test=n_test,
        too_wide=too_wide,
        path=path,
    )
    out.append((f"next: hdeval report {path}", False))
    out.append((f"then: {step}", False))
    return out


def _num(x: Any) -> str:
    return "undefined" if x is None else f"{x:.3f}"


def _given_tree(given: dict, keys: list[str]) -> list[tuple[str, bool]]:
    """Which criteria came from the --tree file (and which were locked), which were added."""
    from_file = set(given["criteria"])
    locked = set(given["locked"])
    added = [k for k in keys if k not in from_file]
    listed = some_of([k + (" (locked)" if k in locked else "") for k in given["criteria"]])
    return [
        (f"criteria from {given['file']} ({len(from_file)}, {len(locked)} locked): {listed}", False),
        (f"criteria added by decomposition: {len(added)}" + (f": {some_of(added)}" if added else ""), False),
    ]


def some_of(names: list[str], n: int = 20) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")


def interval_summary(iv: dict[str, Any]) -> str:
    """One line: the intervals' level, half-width and held-out coverage."""
    hw = ", ".join(
        f"{a} ±{w:.2f}" if w is not None else f"{a} unbounded" for a, w in iv["half_width"].items()
    )
    t = iv.get("test") or {}
    cov, width = (t.get("coverage") or {}).get("average"), (t.get("mean_width") or {}).get("average")
    held = (
        f"; held-out coverage {cov:.1%} of {t.get('rows')} rows, mean width {width:.2f}"
        if cov is not None and width is not None
        else ""
    )
    line = f"{iv['level']:.0%} prediction intervals (split conformal on training residuals): {hw}{held}"
    ad = (iv.get("adaptive") or {}).get("test") or {}
    if ad.get("coverage") is not None:  # apply uses these per-sample widths
        lift = ad.get("error_lift")
        line += (
            f"; per sample: held-out coverage {ad['coverage']:.1%}, mean width {ad['mean_width']:.0%} of the "
            f"range" + (f", the widest fifth's error {lift:.2f}x the rest's" if lift is not None else "")
        )
    return line
