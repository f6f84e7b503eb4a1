"""A judge swap without new labels: an HD-Eval artifact's labelled rows scored by another LLM on
the same criteria, the same kind of aggregator refitted on the same training rows, and the change
on the same held-out rows, with a document-bootstrap interval."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from sklearn.base import clone

from hdeval.core.errors import ConfigError, DataError
from hdeval.core.metrics import average_spearman, metric_table
from hdeval.core.types import ScoreMatrix
from hdeval.judge.scoring import score_criteria
from hdeval.learn.aggregate import Aggregator, select_cv
from hdeval.learn.intervals import fitted_intervals
from hdeval.methods.base import score_table, usage_of
from hdeval.methods.hdeval.evaluator import Evaluator
from hdeval.methods.hdeval.loop import baselines

BOOTSTRAP = 2000
LEVEL = 0.95


def refit(
    ev: Any, samples: Sequence[Any], llm: Any, llm_config: Any, progress: Any = None, seed: int = 0
) -> tuple[Evaluator, dict[str, Any]]:
    """(the refitted evaluator, the change): ``ev``'s criteria scored by ``llm`` (a cached client,
    recorded as ``llm_config``) on the artifact's training and held-out rows found in ``samples``."""
    if type(ev) is not Evaluator or ev.scorer is not None:
        raise ConfigError(
            "refit takes a pointwise HD-Eval artifact scored with 1-5 digits (one LLM, no jury)"
        )
    split = (ev.run or {}).get("split") or {}
    train_ids, test_ids = list(split.get("train") or []), list(split.get("test") or [])
    by_id = {s.id: s for s in samples}
    missing = [i for i in train_ids + test_ids if i not in by_id]
    if missing or not train_ids or not test_ids:
        raise DataError(
            f"refit needs every labelled row of the artifact in --data: {len(missing)} of "
            f"{len(train_ids) + len(test_ids)} are missing (e.g. {missing[:1] or ['none recorded']})"
        )
    rows = [by_id[i] for i in train_ids + test_ids]
    aspects = list(ev.task.aspect_keys)
    if any(a not in s.scores for s in rows for a in aspects):
        raise DataError("refit needs the human scores of every labelled row: --data has rows without them")
    Y = np.array([[s.scores[a] for a in aspects] for s in rows], float)
    tr, te = np.arange(len(train_ids)), np.arange(len(train_ids), len(rows))
    crits = [ev.tree[k] for k in ev.feature_keys]
    if progress is not None:  # advance() alone drew a nameless stage of 0 units ("144/0 done")
        progress.stage(
            f"scoring {len(rows)} labelled samples x {len(crits)} criteria with {llm_config.model}",
            len(rows) * len(crits),
        )
    m = score_criteria(llm, ev.templates["score"], ev.task, ev.tree, crits, rows, None, progress)
    if progress is not None:
        progress.end_stage()
    X = m.values
    old = ev.aggregator.predict(_old_features(ev, rows))
    template = Aggregator.for_task(ev.aggregator.kind, ev.task, seed)
    groups = [rows[i].doc_id for i in tr]
    template, _, _, cv_pred = select_cv(template, X[tr], Y[tr], groups, (template.kind,))
    agg = clone(template).fit(X[tr], Y[tr])
    new = agg.predict(X[te])
    change = bootstrap_change(Y[te], old[te], new, [rows[i].doc_id for i in te], aspects, seed)
    final = metric_table(Y[te], new, aspects)
    tree_m = ScoreMatrix([s.id for s in rows], list(ev.feature_keys), X)
    layer = kept_layer(ev.metrics)
    metrics = {
        "split": {"train": len(tr), "test": len(te)},
        "final": final,
        # the criteria are the artifact's kept layer's: the refit is that layer, not layer 1
        "layers": {str(layer): final},
        "layer_choice": {
            "layer": layer,
            "reason": "the layer the refitted artifact kept, its criteria now scored by the new judge",
        },
        **dict(sorted(baselines(ev.tree, tree_m, Y, te, aspects).items())),
        "failure_rate": m.failure_rate,
        "usage": usage_of(llm),
        # the judge it replaced, as the loaded artifact names it (already without credentials)
        "refit": {**change, "from": ev.llm_identity},
    }
    used = np.flatnonzero(agg.used_features())
    metrics["intervals"] = fitted_intervals(
        Y,
        cv_pred,
        tr,
        new,
        te,
        aspects,
        [a.range for a in ev.task.aspects],
        "grouped cross-validation on the training split (refit, by doc_id)",
        X=X[:, used],
        columns=[ev.feature_keys[i] for i in used],
    )
    split_obj = _Split(train_ids, test_ids)
    table = score_table([s.id for s in rows], tree_m, split_obj, Y, aspects)
    extra = {
        **{k: v for k, v in ev.manifest_extra.items() if k != "layers"},
        **ev.run,
        "refit_from": {"identity": ev.llm_identity, "held_out": change},
    }
    out = Evaluator(
        ev.task,
        ev.tree,
        agg,
        agg.kind,
        ev.feature_keys,
        ev.templates,
        llm_config,
        llm.identity,
        metrics,
        extra,
        table,
    )
    return out, change


def kept_layer(metrics: dict[str, Any]) -> int:
    """The layer an HD-Eval artifact kept, as its metrics record it (a refit's included)."""
    sel, choice = metrics.get("selection"), metrics.get("layer_choice")
    for value in (
        sel.get("kept_layer") if isinstance(sel, dict) else None,
        choice.get("layer") if isinstance(choice, dict) else choice,
        metrics.get("final_layer"),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    trained = [int(k) for k in (metrics.get("layers") or {}) if str(k).isdigit()]
    return max(trained, default=1)


class _Split:
    def __init__(self, train: list[str], test: list[str]):
        self.train_ids, self.test_ids = train, test


def _old_features(ev: Any, rows: Sequence[Any]) -> np.ndarray:
    """The artifact's own criterion scores of ``rows``, from its score table (no LLM call)."""
    import pandas as pd

    table = ev.score_table
    if table is None:
        table = pd.read_csv(ev.path / "scores.csv", dtype={"sample_id": str})  # ids are text
    table = table.set_index("sample_id")
    return table.loc[[s.id for s in rows], list(ev.feature_keys)].to_numpy(float)


def bootstrap_change(
    Y: np.ndarray,
    old: np.ndarray,
    new: np.ndarray,
    docs: Sequence[str],
    aspects: Sequence[str],
    seed: int = 0,
) -> dict[str, Any]:
    """The held-out average Spearman, old and new, and the new minus the old with a percentile
    interval from resampling whole documents (rows of one document move together)."""

    def sp(pred: np.ndarray, idx: np.ndarray) -> float:
        return average_spearman(Y[idx], pred[idx])

    all_idx = np.arange(len(Y))
    before, after = sp(old, all_idx), sp(new, all_idx)
    uniq = sorted(set(docs))
    rows_of = {d: np.array([i for i, x in enumerate(docs) if x == d]) for d in uniq}
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(BOOTSTRAP):
        idx = np.concatenate([rows_of[uniq[j]] for j in rng.integers(0, len(uniq), len(uniq))])
        d = sp(new, idx) - sp(old, idx)
        if np.isfinite(d):
            diffs.append(d)
    lo, hi = np.quantile(diffs, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]) if diffs else (np.nan, np.nan)
    verdict = "worse" if hi < 0 else "better" if lo > 0 else "no clear change"
    return {
        "spearman_before": round(before, 6),
        "spearman_after": round(after, 6),
        "change": round(after - before, 6),
        "interval": [round(float(lo), 6), round(float(hi), 6)],
        "level": LEVEL,
        "documents": len(uniq),
        "verdict": verdict,
    }
