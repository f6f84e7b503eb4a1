"""The page of ``hdeval report`` for artifacts that judge pairs (DnA, HD-Eval on a pairwise
task): banner, plots and the wrong verdicts, from the artifact (and, for the per-pair view, the
training data and the reply cache, read-only). The numbers are :mod:`hdeval.methods.pair_report`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdeval.report import banner as verdicts
from hdeval.report import plots, render
from hdeval.report import samples as sample_view

PAIR_LABELS = ("a", "b", "tie")


def _table(ev: Any) -> Any:
    """The artifact's ``scores.csv`` (checksummed when the artifact was loaded), or None."""
    import pandas as pd

    path = Path(ev.path) / "scores.csv" if ev.path else None
    if path is None or not path.is_file():
        return None
    try:
        table = pd.read_csv(
            path,
            dtype={"pair_id": str, "split": str, "human": str, "prediction": str, "learned_prediction": str},
            keep_default_na=False,
        )
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return table if {"pair_id", "split", "human"} <= set(table.columns) else None


def _scores(table: Any, columns: Sequence[str]) -> np.ndarray:
    import pandas as pd

    return (
        np.column_stack([pd.to_numeric(table[c], errors="coerce").to_numpy(float) for c in columns])
        if columns
        else np.empty((len(table), 0))
    )


def _differences(table: Any, keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per human label (a, b): the mean score difference A - B of each key on the held-out pairs
    (NaN for a key every pair failed on, drawn as no bar)."""
    import pandas as pd

    test = table[table["split"] == "test"]
    diff = _scores(test, [f"{k}:a" for k in keys]) - _scores(test, [f"{k}:b" for k in keys])
    means = pd.DataFrame(diff, columns=list(keys)).groupby(test["human"].to_numpy()).mean()
    return {label: means.loc[label].to_dict() for label in ("a", "b") if label in means.index}


def _baselines(m: Mapping[str, Any]) -> dict[str, Any]:
    """The baselines an artifact's metrics record, each as its agreement w/o ties."""
    extra = m["baselines"] if isinstance(m.get("baselines"), Mapping) else {}
    return {str(k): (v.get("wo_ties") if isinstance(v, Mapping) else v) for k, v in extra.items()}


def _wrong_verdicts(
    ev: Any,
    test: Any,
    keys: Sequence[str],
    predicted: Sequence[str],
    data_file: Any,
    cache_dir: Any,
    noun: str,
    sides: Sequence[str],
) -> tuple[list[dict], str | None]:
    """Held-out pairs with a verdict not the human label's: scores, raw replies per ``sides``; a note."""
    wrong = [i for i, (h, p) in enumerate(zip(test["human"], predicted)) if h in PAIR_LABELS and p != h]
    ids = [str(test["pair_id"][i]) for i in wrong[: sample_view.TOP_SAMPLES]]
    replies, items = sample_view.score_replies(
        ev, ids, keys, sample_view.data_path(ev, data_file), cache_dir, noun=noun
    )
    A, B = _scores(test, [f"{k}:a" for k in keys]), _scores(test, [f"{k}:b" for k in keys])
    learned = "learned_prediction" in test.columns
    return [
        {
            "id": pid,
            "human": test["human"][i],
            "predicted": predicted[i],
            "extra": {"learned verdict": test["learned_prediction"][i]} if learned else {},
            "fields": _pair_fields(ev, items.get(pid)),
            "criteria": [
                {
                    "label": k,
                    "a": A[i, j],
                    "b": B[i, j],
                    "replies": [replies.texts.get((pid + side, k)) for side in sides],
                }
                for j, k in enumerate(keys)
            ],
        }
        for i, pid in zip(wrong, ids)
    ], replies.note


def _pair_fields(ev: Any, pair: Any) -> list[tuple[str, str]]:
    if pair is None:
        return []
    texts = [(f.label, pair.fields.get(f.key)) for f in ev.task.fields if f.key != "output"]
    texts += [("Response A", pair.output_a), ("Response B", pair.output_b)]
    return [(label, sample_view.clip(text, sample_view.MAX_FIELD_CHARS)) for label, text in texts]


_AGREEMENT_HOW = (
    "Share of held-out pairs where the verdict matches the human label: without ties, on the pairs "
    "humans did not tie with the verdict forced to A or B; with ties, 3-way."
)


def pair_banner(ev: Any, lines: Callable[[Any, verdicts.Banner], None]) -> verdicts.Banner:
    """The banner a pair evaluator's page draws on top: the LLM, then the method's ``lines``
    (:func:`dna_banner`, :func:`hdeval_banner`)."""
    b = verdicts.Banner()
    verdicts.llm_line(b, ev.llm_identity)
    lines(ev, b)
    return b


def dna_banner(ev: Any, b: verdicts.Banner) -> None:
    """DnA's banner lines, from its metrics alone."""
    m = ev.metrics
    test_m = {k: v for k, v in (m.get("test") or {}).items() if isinstance(v, dict)}
    split = m.get("split") or {}
    learned = ev.learned
    verdicts.split_line(
        b,
        split.get("train"),
        split.get("test"),
        len(learned.aspects) if learned is not None else None,
        features="aspects (the learned aggregation's features)",
        rows="pairs",
    )
    primary = m.get("primary") or "llm_weights"
    main = (test_m.get(primary) or {}).get("wo_ties")
    others = {f"{k} aggregation": v.get("wo_ties") for k, v in test_m.items() if k != primary}
    extra = _baselines(m)
    # DnA records no baseline of its own (dna-direct is another run); its other aggregation
    # is the comparison it holds
    verdicts.baseline_line(
        b,
        main,
        others | extra,
        "held-out agreement w/o ties",
        label="strongest baseline" if extra else "compared with",
    )
    if m.get("position_consistency") is not None:
        pc = m["position_consistency"]
        b.add(
            "position consistency",
            f"{pc:.3f} of the pairs get the same verdict with A and B swapped "
            f"(swap flip rate {1 - pc if m.get('swap_flip_rate') is None else m['swap_flip_rate']:.3f})",
            warn=pc < 0.8,
        )
    tm = m.get("tie_margin")
    if isinstance(tm, Mapping) and isinstance(tm.get("value"), (int, float)):
        b.add(
            "tie margin",
            f"totals within {tm['value']:.3g} are a tie: "
            + (
                f"learned on {tm.get('pairs')} training pairs"
                if tm.get("from") == "training split"
                else "given"
            ),
        )


def dna_parts(ev: Any, data: Mapping[str, Any], b: verdicts.Banner, figs: list) -> tuple[str, str]:
    """DnA's banner lines and figures; its page's title and method line."""
    m, s = ev.metrics, ev.settings
    test_m = {k: v for k, v in (m.get("test") or {}).items() if isinstance(v, dict)}
    dna_banner(ev, b)
    if test_m:
        figs.append(
            (
                "Agreement with the human labels",
                plots.agreement_bars(
                    {k.replace("_", " "): v for k, v in test_m.items()}, "Held-out agreement"
                ),
                _AGREEMENT_HOW
                + " 'llm weights' is DnA's weighted sum with the LLM's weights, 'learned' the logistic regression on "
                "aspect-score differences.",
            )
        )
        for k, v in test_m.items():
            if v.get("confusion"):
                figs.append(
                    (
                        f"Confusion matrix ({k.replace('_', ' ')})",
                        plots.confusion(v["confusion"], f"{k.replace('_', ' ')}: human label × verdict"),
                        "Rows: the human label; columns: the verdict; the diagonal is agreement. 'failed' counts "
                        "pairs the LLM's replies gave no verdict for.",
                    )
                )
    weights = m.get("mean_weights")
    if weights:
        vals = {k: (w["mean"] if isinstance(w, Mapping) else w) for k, w in weights.items()}
        share = (data.get("learned") or {}).get("weight_share") if not s.dynamic else None
        figs.append(
            (
                "Weights",
                plots.barh(
                    vals,
                    "Aspect weights",
                    "weight (sums to 1 over the aspects)",
                    label="LLM weight (mean over instances)",
                    reference=share,
                    reference_label="learned share of |coefficients|",
                ),
                "The weight the LLM gave each aspect (mean over the instances), and, for the learned "
                "aggregation, each aspect's share of its absolute coefficients; both sum to 1, so they compare.",
            )
        )
    return f"{ev.task.name} (DnA)", f"DnA, mode {s.mode}, aspects {s.aspect_source}"


def hdeval_banner(ev: Any, b: verdicts.Banner) -> None:
    """Pairwise HD-Eval's banner lines, from its metrics alone."""
    m = ev.metrics
    split = m.get("split") or {}
    verdicts.split_line(b, split.get("train"), split.get("test"), len(ev.feature_keys), rows="pairs")
    verdicts.layer_line(b, m, list((m.get("layers") or {}).keys()))
    bases = {"equal-weight sum of the layer-1 differences": (m.get("direct_layer1") or {}).get("wo_ties")}
    verdicts.baseline_line(
        b, (m.get("final") or {}).get("wo_ties"), bases | _baselines(m), "held-out agreement w/o ties"
    )


def hdeval_parts(ev: Any, data: Mapping[str, Any], b: verdicts.Banner, figs: list) -> tuple[str, str]:
    """Pairwise HD-Eval's banner lines and figures; its page's title and method line."""
    m = ev.metrics
    hdeval_banner(ev, b)
    layers = m.get("layers") or {}
    if layers:
        figs.append(
            (
                "Agreement by layer",
                plots.layer_agreement(layers, m.get("direct_layer1"), "layer-1 sum"),
                "Held-out agreement with the human labels after each layer of criteria was added, with and "
                "without ties; dashed: the baseline that adds up the layer-1 score differences with equal weights.",
            )
        )
    series = {"evaluator": m.get("final")} if m.get("final") else {}
    if m.get("direct_layer1"):
        series["layer-1 sum (baseline)"] = m["direct_layer1"]
    if series:
        figs.append(
            (
                "Agreement with the human labels",
                plots.agreement_bars(series, "Held-out agreement"),
                _AGREEMENT_HOW,
            )
        )
    if (m.get("final") or {}).get("confusion"):
        figs.append(
            (
                "Confusion matrix",
                plots.confusion(m["final"]["confusion"], "human label × verdict"),
                "Rows: the human label; columns: the classifier's verdict; the diagonal is agreement.",
            )
        )
    imp = m.get("importance") or {}
    if imp:
        figs.append(
            (
                "Criterion weights (importance)",
                plots.barh(
                    {k: v for k, v in imp.items() if isinstance(v, (int, float))},
                    "Permutation importance per criterion",
                    "drop in held-out agreement when shuffled",
                ),
                "How much the classifier relies on each criterion's score difference: the drop in held-out "
                "agreement when it is shuffled across pairs (0 or below: not relied on).",
            )
        )
    method = f"HD-Eval on pairs, classifier {ev.kind}, {len(ev.feature_keys)} criteria"
    return f"{ev.task.name} (HD-Eval on pairs)", method


def pair_page(
    ev: Any,
    data: dict[str, Any],
    data_file: Any,
    cache_dir: Any,
    parts: Callable[..., tuple[str, str]],
    llm_verdicts: bool,
) -> str:
    """The page of an artifact that judges pairs; the method says what differs: ``parts`` (its
    banner, figures, title and method line: :func:`dna_parts`, :func:`hdeval_parts`) and
    ``llm_verdicts`` (the LLM's own verdict per pair, in a ``prediction`` column, over per-aspect
    scores; else a classifier's over criterion scores of each response)."""
    from hdeval.learn.classify import predict_labels

    b = verdicts.Banner()
    verdicts.llm_line(b, ev.llm_identity)
    figs: list[tuple[str, bytes, str]] = []
    title, method = parts(ev, data, b, figs)
    table = _table(ev)
    samples, note = [], None
    if table is not None:
        pairs = [c[:-2] for c in table.columns if c.endswith(":a") and f"{c[:-2]}:b" in table.columns]
        roots = pairs if llm_verdicts else [c.key for c in ev.tree.layer(1) if f"{c.key}:a" in table.columns]
        diffs = _differences(table, roots)
        if "a" in diffs or "b" in diffs:
            figs.append(
                (
                    "Per-aspect differences",
                    plots.barh(
                        diffs.get("a") or diffs.get("b") or {},
                        "Held-out score difference A − B per aspect",
                        "mean score(A) − score(B)",
                        sort=False,
                        label="pairs humans preferred A" if "a" in diffs else "pairs humans preferred B",
                        reference=diffs.get("b") if "a" in diffs else None,
                        reference_label="pairs humans preferred B",
                    ),
                    "The mean of score(A) − score(B) per "
                    + ("aspect" if llm_verdicts else "layer-1 criterion (the task's aspects)")
                    + " on the held-out pairs, for the pairs humans preferred A and those they preferred B"
                    + (
                        ": an aspect that separates the two groups is one the LLM's scores agree with humans on."
                        if llm_verdicts
                        else "."
                    ),
                )
            )
        test = table[table["split"] == "test"].reset_index(drop=True)
        keys = pairs if llm_verdicts else list(ev.feature_keys)
        if llm_verdicts:
            predicted = [
                p if p in PAIR_LABELS else "failed" for p in test.get("prediction", [""] * len(test))
            ]
        else:
            A, B = _scores(test, [f"{k}:a" for k in keys]), _scores(test, [f"{k}:b" for k in keys])
            predicted = predict_labels(ev.model, A - B)[0]
        samples, note = _wrong_verdicts(
            ev,
            test,
            keys,
            predicted,
            data_file,
            cache_dir,
            *(("pairs", ("",)) if llm_verdicts else ("samples", ("#a", "#b"))),
        )
    elif ev.path and llm_verdicts:
        note = "the artifact holds no scores.csv: no per-pair view"
    if ev.metrics.get("position_consistency") is not None and llm_verdicts:
        figs.append(
            (
                "Position consistency",
                plots.share_bar(ev.metrics["position_consistency"], "position consistency"),
                "The share of pairs that get the same verdict when the LLM sees B before A (--swap).",
            )
        )
    return render(
        "pairs.html.j2",
        title=f"hdeval report: {title}",
        method=method,
        ev_path=str(ev.path),
        llm=ev.llm_identity,
        banner=b,
        figures=figs,
        samples=samples,
        samples_note=note,
        reply_columns=not llm_verdicts,
        max_samples=sample_view.TOP_SAMPLES,
    )
