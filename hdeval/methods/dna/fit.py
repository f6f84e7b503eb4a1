"""Training DnA: score every pair once, fit the learned aggregator on the training split, and
measure both on each split."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from hdeval.core.errors import ScoringError
from hdeval.core.metrics import pair_agreement as agreement
from hdeval.core.types import PairSample
from hdeval.methods.base import FitContext, fit_message, run_record, score_table, split_rows, usage_of
from hdeval.methods.dna.decision import bias_words, fit_learned, learn_tie_margin
from hdeval.methods.dna.fitted import DnaEvaluator
from hdeval.methods.dna.prompts import load_dna_templates
from hdeval.methods.dna.scoring import PairScoreResult, Probe, probe_ids, progress_units


def _split_metrics(
    res: PairScoreResult, pairs: Sequence[PairSample], idx: np.ndarray, primary: str
) -> dict[str, Any]:
    human = [pairs[i].label for i in idx]
    out = {primary: agreement(human, [res.labels[i] for i in idx], [res.labels_ab[i] for i in idx])}
    if res.learned_labels is not None:
        out["learned"] = agreement(
            human, [res.learned_labels[i] for i in idx], [res.learned_ab[i] for i in idx]
        )
    if res.consistent:
        out.update(_consistency([res.consistent[pairs[i].id] for i in idx if pairs[i].id in res.consistent]))
    return out


def _consistency(got: list[bool]) -> dict[str, float | None]:
    # swap_flip_rate: the share of pairs whose verdict (a, b or tie at the margin) changes with the order
    return {
        "position_consistency": round(sum(got) / len(got), 6) if got else None,
        "swap_flip_rate": round(1 - sum(got) / len(got), 6) if got else None,
    }


def _mean_weights(res: PairScoreResult, dynamic: bool, limit: int = 50) -> dict[str, Any]:
    sums: dict[str, list[float]] = {}
    for pid, w in res.weights.items():
        for spec, x in zip(res.pair_aspects[pid], w):
            sums.setdefault(spec.name.lower() if dynamic else spec.key, []).append(x)
    ranked = sorted(sums.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    if dynamic:
        return {k: {"mean": round(float(np.mean(v)), 6), "instances": len(v)} for k, v in ranked}
    return {k: round(float(np.mean(v)), 6) for k, v in ranked}


def _margin_words(info: dict[str, Any]) -> str:
    if info["from"] != "training split":
        return "given"
    if info.get("rule") == "margin 0" and info.get("learned_margin"):
        return (
            f"chosen on {info['pairs']} training pairs: the learned margin {info['learned_margin']:g} did not "
            f"beat margin 0 (cross-validated agreement with ties {info.get('cv_w_ties')} against "
            f"{info.get('cv_w_ties_at_0')} at 0)"
        )
    return (
        f"learned on {info['pairs']} training pairs: agreement with ties {info['train_w_ties']} "
        f"(cross-validated {info.get('cv_w_ties')}, at 0 {info.get('cv_w_ties_at_0')}) against "
        f"{info['train_w_ties_at_0']} at 0"
    )


def _probe(ctx: FitContext, found: dict[str, Any]) -> Probe:
    """Without --swap: a few training pairs judged in both orders say whether the judge favours
    the response it shows first; if it does, every pair is judged in both orders (as --swap),
    unless --no-swap was given, and a warning line says what was measured and what to do."""
    one_order = ctx.options.one_order_chosen

    def both_orders(record: dict[str, Any]) -> bool:
        found.update(record, action="none", warning=None)
        if not record["biased"]:
            return False
        if one_order:
            found["action"] = "warned"
            found["warning"] = (
                f"warning: {bias_words(record)}; with --no-swap each pair is judged in one order, so the "
                "verdicts lean towards the response shown first: --swap judges both orders and averages it away"
            )
        else:
            found["action"] = "swapped"
            found["warning"] = (
                f"warning: {bias_words(record)}; every pair is judged in both orders too, which averages it "
                "away (--swap does so from the start; --no-swap keeps one order)"
            )
        ctx.progress.message(found["warning"])
        return not one_order

    return Probe(frozenset(probe_ids(ctx.prep.split.train_ids, ctx.config.seed)), both_orders)


def fit(ctx: FitContext) -> DnaEvaluator:
    from hdeval.learn.aggregate import cv_folds

    settings = ctx.options.settings()
    task, pairs, split = ctx.prep.task, list(ctx.prep.samples), ctx.prep.split
    templates = load_dna_templates(settings.prompt_roles)
    fit_message(ctx, "pairs", f"dna mode {settings.mode}, ")
    ev = DnaEvaluator(task, templates, settings, ctx.llm_config, ctx.llm.identity, {})
    found: dict[str, Any] = {}
    probe = None if settings.swap or not split.train_ids else _probe(ctx, found)
    n_probed = 0 if probe is None else len(probe.ids)
    # the whole run's ETA: at most every stage the dry run lists
    ctx.progress.expect(
        progress_units(settings, len(pairs), len(task.aspects), n_probed, not ctx.options.one_order_chosen)
    )
    res = ev.score(
        pairs, backend=ctx.llm, concurrency=ctx.config.concurrency, progress=ctx.progress, probe=probe
    )
    if res.swapped and not settings.swap:  # the probe found a bias: the artifact judges both orders
        settings = dataclasses.replace(settings, swap=True)
        ev.settings = settings
    rate = res.failure_rate
    if rate > ctx.config.max_failure_rate:
        pid = next(p.id for p, lab in zip(pairs, res.labels) if lab is None)
        raise ScoringError(
            f"{rate:.0%} of pairs could not be judged (threshold {ctx.config.max_failure_rate:.0%}), "
            f"e.g. pair {pid}: {res.failures[pid][0]}; the replies are cached"
        )
    tr, te, _ = split_rows(ctx, [p.id for p in pairs], [])
    primary = "llm_weights" if settings.mode == "dna" else settings.mode.replace("-", "_")

    # -- the tie margin: the user's, else learned on the training split's verdicts
    if settings.tie_margin is None:
        got = [i for i in tr if res.labels[i] is not None and pairs[i].label is not None]
        margin, margin_info = learn_tie_margin(
            [res.predictions[i, 0] - res.predictions[i, 1] for i in got],
            [pairs[i].label for i in got],
            [pairs[i].doc_id for i in got],
            ctx.config.seed,
        )
        settings = dataclasses.replace(settings, tie_margin=margin, tie_margin_from="training split")
        ev.settings = settings
        res.apply_margin(margin)
    else:
        margin_info = {"value": settings.tie_margin, "from": "given", "how": "set with --tie-margin"}
    ctx.progress.message(f"tie margin {settings.tie_margin:g} ({_margin_words(margin_info)})")

    # -- learned aggregation on the training split (predefined aspects only)
    learned_info: dict[str, Any]
    if res.diffs is None:
        why = (
            "dynamic aspects differ per instance, so there is no fixed feature per aspect"
            if settings.dynamic
            else f"mode {settings.mode} has no aspect scores"
        )
        learned_info = {"skipped": f"learned aggregation is not defined here: {why}"}
    else:
        ok = ~np.isnan(res.diffs[tr]).any(axis=1)
        rows = tr[ok]
        y = [pairs[i].label for i in rows]
        if not {"a", "b"} <= set(y):
            learned_info = {"skipped": "the training split's usable pairs lack an a or a b label"}
        else:
            X = res.diffs[rows]
            model = fit_learned(X, y, ctx.config.seed)
            model.aspects = list(task.aspect_keys)
            ev.learned = model
            groups = [pairs[i].doc_id for i in rows]
            cv_pred: list[str | None] = [None] * len(rows)
            cv_ab: list[str | None] = [None] * len(rows)
            for a, b in cv_folds(groups, ctx.config.seed):
                if len(set(y[j] for j in a)) < 2:
                    continue
                fold = fit_learned(X[a], [y[j] for j in a], ctx.config.seed)
                for j, lab, lab_ab in zip(b, fold.predict(X[b]), fold.predict_ab(X[b])):
                    cv_pred[j], cv_ab[j] = lab, lab_ab
            coef = {
                c: dict(zip(model.aspects, row.round(6).tolist()))
                for c, row in zip(model.classes[1:] if len(model.classes) == 2 else model.classes, model.coef)
            }
            learned_info = {
                "model": "logistic regression on per-aspect score differences (A - B)",
                "classes": model.classes,
                "coefficients": coef,
                "intercept": model.intercept.round(6).tolist(),
                "trained_on": len(rows),
                "cv_train": agreement(y, cv_pred, cv_ab),
                "other_kinds": "only logistic regression is fitted (the other aggregator kinds are not)",
            }
            if len(model.classes) == 2:
                learned_info["note"] = f"coefficients push towards {model.classes[1]!r} when positive"
            res.learned_labels, res.learned_ab = model.labels(res.diffs)

    ev.metrics = {
        "method": "dna",
        "mode": settings.mode,
        "aspect_source": settings.aspect_source if settings.uses_aspects else None,
        "primary": primary,
        "split": {"train": len(split.train_ids), "test": len(split.test_ids)},
        "test": _split_metrics(res, pairs, te, primary),
        "train": _split_metrics(res, pairs, tr, primary),
        "learned": learned_info,
        "tie_margin": margin_info,
        "failure_rate": round(rate, 6),
        "failed_pairs": sum(1 for lab in res.labels if lab is None),
        "score_failures": len(res.criteria.failures),
        "usage": usage_of(ctx.llm),
        "notes": (
            "agreement is over pairs with a prediction (failed pairs are counted in 'failed'); "
            "'wo_ties' forces a or b and counts equal totals as a miss"
        ),
    }
    if settings.uses_aspects:
        ev.metrics["mean_weights"] = _mean_weights(res, settings.dynamic)
    if found:
        ev.metrics["position_probe"] = found
    if settings.swap:
        ev.metrics.update(_consistency(list(res.consistent.values())))
    else:
        ev.metrics["swap_flip_rate"] = None
        ev.metrics["swap_flip_note"] = (
            "each pair was judged in one order only; --swap judges both orders "
            "(twice the scoring calls) and measures the flip rate"
        )

    table = score_table(res.sample_ids, res.criteria, split, np.empty((len(pairs), 0)), [])
    table = table.rename(columns={"sample_id": "pair_id"})
    table["total_a"] = res.predictions[:, 0]
    table["total_b"] = res.predictions[:, 1]
    table["prediction"] = res.labels
    if res.learned_labels is not None:
        table["learned_prediction"] = res.learned_labels
        table["learned_prediction_ab"] = res.learned_ab  # forced to a or b: the w/o-ties figure
    table["human"] = [p.label for p in pairs]
    ev.score_table = table
    ev.run = run_record(ctx)
    return ev
