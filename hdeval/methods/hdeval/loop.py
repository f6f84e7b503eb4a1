"""HD-Eval's layer loop (paper Algorithm 1): decompose, score, aggregate, prune; per layer.

Also its dry-run plan. The generic parts of a run (options, data, split, the LLM) are in
:mod:`hdeval.train`; this is what the method seam calls as HD-Eval's ``fit``.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from sklearn.base import clone

from hdeval.aggregate import Aggregator, cross_val_predictions, default_jobs, select_cv, tune_cv
from hdeval.backends.base import Backend
from hdeval.cache import CachedBackend
from hdeval.config import LLMConfig
from hdeval.errors import ScoringError
from hdeval.methods.base import FitContext, score_table
from hdeval.methods.hdeval.decompose import DECOMPOSE_MAX_TOKENS, decompose_nodes, decomposition_request
from hdeval.methods.hdeval.evaluator import Evaluator
from hdeval.methods.hdeval.prune import prune
from hdeval.metrics import metric_table
from hdeval.progress import Progress
from hdeval.prompts import load_templates, sample_block
from hdeval.scoring import score_criteria, score_requests
from hdeval.train import LayerPlan, Prepared, TrainConfig, open_backend, prompt_chars
from hdeval.types import CriteriaTree, ScoreMatrix


@dataclass
class LayerReport:
    layer: int
    added: list[str]
    aggregator: str
    cv_train: dict[str, Any]
    test: dict[str, Any]
    failure_rate: float
    selection_scores: dict[str, float] = field(default_factory=dict)
    importance: dict[str, float] = field(default_factory=dict)
    expand_next: list[str] = field(default_factory=list)
    tuning: dict[str, float] = field(default_factory=dict)  # nn: CV mean Spearman per grid point
    params: dict[str, Any] = field(default_factory=dict)  # nn: the chosen alpha and width
    positive_importance: int | None = None  # pruning: candidates with importance > 0
    notes: list[str] = field(default_factory=list)  # e.g. scikit-learn warnings, recorded here

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_hdeval(ctx: FitContext) -> Evaluator:
    """HD-Eval's fit (the method seam calls this)."""
    from hdeval.methods.paireval import hdeval_scorer

    scorer = hdeval_scorer(ctx)  # None: 1-5 digit scores; checked before any call
    ev = _run(ctx.config, ctx.prep, ctx.llm, ctx.llm_config, ctx.progress, scorer)
    if scorer is not None:
        ev.scorer = scorer
        position = scorer.position()
        ev.metrics["position_consistency"] = position["consistency"]
        ev.metrics["position_bias"] = position["bias"]
    return ev


def _run(
    config: TrainConfig, prep: Prepared, llm: CachedBackend, spec: LLMConfig, progress: Progress,
    scorer: Any = None,
) -> Evaluator:
    task, samples, split = prep.task, prep.samples, prep.split
    default_jobs()  # a bad HDEVAL_JOBS fails here, before any LLM call
    templates = load_templates()
    score = score_criteria if scorer is None else scorer
    if scorer is not None:
        templates["pair"] = scorer.template
    ids = [s.id for s in samples]
    pos = {s: i for i, s in enumerate(ids)}
    tr = np.array([pos[s] for s in split.train_ids])
    te = np.array([pos[s] for s in split.test_ids])
    aspects = list(task.aspect_keys)
    Y = np.array([[s.scores[a] for a in aspects] for s in samples])
    doc_groups = [samples[i].doc_id for i in tr]
    progress.message(
        f"task {task.name}: {len(samples)} samples from {prep.data_path} "
        f"({len(tr)} train, {len(te)} test), LLM {llm.identity}"
    )

    tree = CriteriaTree.from_aspects(task.aspects)
    matrix = ScoreMatrix.empty(ids)
    reports: list[LayerReport] = []
    layer_metrics: dict[str, Any] = {}
    expand: Sequence[str] = ()
    agg: Aggregator | None = None
    for layer in range(1, config.layers + 1):
        if layer > 1:
            nodes = tree.layer(1) if layer == 2 else [tree[k] for k in expand]
            if not nodes:  # pruning found no criterion worth expanding
                break
            progress.stage(f"layer {layer}: decomposing {len(nodes)} criteria", len(nodes))
            before = len(tree)
            tree = decompose_nodes(llm, templates["decompose"], task, tree, nodes, config.children, progress)
            progress.end_stage()
            if len(tree) == before:
                break
        new = tree.layer(layer)
        progress.stage(
            f"layer {layer}: scoring {len(samples)} samples x {len(new)} criteria", len(samples) * len(new)
        )
        m = score(llm, templates["score"], task, tree, new, samples, config.concurrency, progress)
        progress.end_stage()
        _check_failures(m, layer, config.max_failure_rate)
        matrix = matrix.hstack(m)
        X = matrix.values
        # scikit-learn warnings (e.g. an MLP that did not converge) never reach the terminal
        # raw: they are recorded as notes in the layer report.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            selection: dict[str, float] = {}
            tuning: dict[str, float] = {}
            kind = config.aggregator
            template = Aggregator.for_task("lr" if kind == "auto" else kind, task, config.seed)
            # model selection already cross-validated the chosen template: reuse its predictions
            if kind == "auto":
                template, selection, tuning, cv_pred = select_cv(template, X[tr], Y[tr], doc_groups)
            elif kind == "nn":
                template, _, tuning, cv_pred = tune_cv(template, X[tr], Y[tr], doc_groups)
            else:
                cv_pred = cross_val_predictions(template, X[tr], Y[tr], doc_groups)
            kind = template.kind
            agg = clone(template).fit(X[tr], Y[tr])
            test = metric_table(Y[te], agg.predict(X[te]), aspects)
            report = LayerReport(
                layer, [c.key for c in new], kind, metric_table(Y[tr], cv_pred, aspects), test,
                m.failure_rate, selection, tuning=tuning, params=_nn_params(template),
            )
            if 2 <= layer < config.layers:
                pr = prune(template, X[tr], Y[tr], matrix.criterion_keys, [c.key for c in new],
                           doc_groups, config.top_k)
                report.importance, report.expand_next = pr.importance, list(pr.selected)
                report.positive_importance = pr.n_positive
                expand = pr.selected
        report.notes = warning_notes(caught)
        reports.append(report)
        layer_metrics[str(layer)] = test
        progress.message(_layer_summary(report, aspects))

    assert agg is not None
    metrics = {
        "split": {"train": len(tr), "test": len(te)},
        "final": layer_metrics[str(reports[-1].layer)],
        "layers": layer_metrics,
        "cv_train": {str(r.layer): r.cv_train for r in reports},
        "direct_layer1": _direct_layer1(matrix, Y[te], te, aspects),
        "mean_all_criteria": _mean_all(matrix, Y[te], te, aspects),
        "mean_subtree": _mean_subtree(tree, matrix, Y[te], te, aspects),
        "failure_rate": matrix.failure_rate,
        "usage": _usage(llm),
    }
    progress.message(_baseline_summary(metrics))
    table = score_table(ids, matrix, split, Y, aspects)
    return Evaluator(
        task, tree, agg, matrix.criterion_keys, templates, spec, llm.identity, metrics,
        {
            "seed": config.seed,
            "split": split.to_dict(),
            "config": {k: v for k, v in config.public().items() if k not in ("cache_dir",)},
            "layers": [r.to_dict() for r in reports],
            "data_file": str(prep.data_path),
        },
        table,
    )


def _check_failures(m: ScoreMatrix, layer: int, threshold: float) -> None:
    rate = m.failure_rate
    if rate > threshold:
        ex = m.failures[0]
        raise ScoringError(
            f"layer {layer}: {rate:.0%} of criterion scores could not be read (threshold "
            f"{threshold:.0%}), e.g. sample {ex.sample_id} on {ex.criterion_key}: {ex.reason}; "
            "the replies are cached; check the LLM or raise --max-failure-rate"
        )


def _direct_layer1(matrix: ScoreMatrix, y: np.ndarray, te: np.ndarray, aspects: list[str]) -> dict:
    """G-Eval-style baseline: each aspect's own layer-1 score, no aggregator."""
    pred = matrix.columns(aspects)[te]
    return metric_table(y, pred, aspects)


def _mean_all(matrix: ScoreMatrix, y: np.ndarray, te: np.ndarray, aspects: list[str]) -> dict:
    """'w/o aggregator' baseline: the plain mean of all criterion scores."""
    with np.errstate(all="ignore"):
        mean = np.nanmean(matrix.values[te], axis=1) if matrix.values.size else np.zeros(len(te))
    return metric_table(y, np.repeat(mean[:, None], len(aspects), axis=1), aspects)


def warning_notes(caught: Sequence[warnings.WarningMessage]) -> list[str]:
    """Recorded warnings as short notes: one per distinct (category, message), with a count."""
    counts: dict[str, int] = {}
    for w in caught:
        text = f"{w.category.__name__}: {' '.join(str(w.message).split())}"
        counts[text] = counts.get(text, 0) + 1
    return [t if n == 1 else f"{t} ({n} times)" for t, n in counts.items()]


def _nn_params(agg: Aggregator) -> dict[str, Any]:
    if agg.kind != "nn":
        return {}
    return {"alpha": agg.alpha, "hidden_layer_sizes": list(agg.hidden_layer_sizes)}


def subtree_means(tree: CriteriaTree, matrix: ScoreMatrix, aspects: Sequence[str]) -> np.ndarray:
    """Per aspect, the mean of its own subtree's scores (the aspect and all its descendants
    that were scored), NaN ignored: samples x aspects."""
    keys = list(matrix.criterion_keys)
    out = np.full((matrix.values.shape[0], len(aspects)), np.nan)
    for j, a in enumerate(aspects):
        cols = [i for i, k in enumerate(keys)
                if k == a or (k in tree and any(c.key == a for c in tree.ancestors(k)))]
        if cols:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
                out[:, j] = np.nanmean(matrix.values[:, cols], axis=1)
    return out


def _mean_subtree(tree: CriteriaTree, matrix: ScoreMatrix, y: np.ndarray, te: np.ndarray,
                  aspects: list[str]) -> dict:
    """The stronger 'w/o aggregator' baseline: each aspect predicted by its own subtree mean."""
    return metric_table(y, subtree_means(tree, matrix, aspects)[te], aspects)


def _usage(llm: CachedBackend) -> dict[str, int]:
    s = llm.stats
    return {"calls": s.calls, "cache_hits": s.hits, "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens}


def _fmt(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:5.3f}"


def _baseline_summary(metrics: dict[str, Any]) -> str:
    """The evaluator next to the baselines, the stronger 'w/o aggregator' one first."""
    def sp(key: str) -> str:
        return _fmt((metrics.get(key) or {}).get("average", {}).get("spearman"))

    return (f"held-out average spearman: evaluator {sp('final')} | baselines: own-subtree mean "
            f"{sp('mean_subtree')}, mean of all criteria {sp('mean_all_criteria')}, "
            f"direct layer-1 score {sp('direct_layer1')}")


def _layer_summary(r: LayerReport, aspects: list[str]) -> str:
    lines = [
        f"layer {r.layer}: +{len(r.added)} criteria, aggregator {r.aggregator}, "
        f"failed scores {r.failure_rate:.1%}, CV-train spearman {_fmt(r.cv_train['average']['spearman'])}"
    ]
    if r.params:
        hidden = "x".join(str(h) for h in r.params["hidden_layer_sizes"])
        lines.append(f"  nn chosen by grouped CV: alpha {r.params['alpha']:g}, hidden layers {hidden}")
    for a in aspects + ["average"]:
        t = r.test[a]
        lines.append(f"  {a:<18} test pearson {_fmt(t['pearson'])}  spearman {_fmt(t['spearman'])}")
    if r.positive_importance is not None:
        n = len(r.importance)
        if r.expand_next:
            lines.append(f"  expand next: {', '.join(r.expand_next)} ({r.positive_importance} of {n} "
                         "candidates had positive importance)")
        else:
            lines.append(f"  expand next: none (no candidate of {n} had positive importance)")
    for note in r.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def plan_hdeval(config: TrainConfig, prep: Prepared, backend: Backend | None = None) -> list[LayerPlan]:
    """HD-Eval's calls per layer, without calling the LLM (see :func:`hdeval.train.plan`)."""
    llm = open_backend(config, backend, offline=True)
    try:
        templates = load_templates()
        task, samples = prep.task, prep.samples
        tree = CriteriaTree.from_aspects(task.aspects)
        l1 = score_requests(templates["score"], task, tree, tree.layer(1), samples)
        # Identical requests (samples with the same text) cost one call: count distinct keys.
        distinct = {llm.key(r): r for r in l1}
        n_distinct = len({sample_block(task, s) for s in samples})
        per_prompt = sum(prompt_chars(r) for r in distinct.values()) / max(1, len(distinct)) / 4
        plans = [LayerPlan(1, 0, len(distinct), sum(llm.is_cached(r) for r in distinct.values()), False,
                           int(per_prompt * len(distinct)), len(distinct) * 2)]
        dec = [decomposition_request(templates["decompose"], task, tree, c, config.children)
               for c in tree.layer(1)]
        dec_prompt = sum(prompt_chars(r) for r in dec) / len(dec) / 4
        n_prev = len(tree.layer(1))
        last = 1 if config.method == "direct" else config.layers  # direct: layer 1's requests only
        for layer in range(2, last + 1):
            nodes = n_prev if layer == 2 else min(config.top_k, n_prev)
            n_new = nodes * config.children
            score = n_new * n_distinct
            plans.append(LayerPlan(
                layer, nodes, score, None, True,
                int(score * (per_prompt + 40) + nodes * dec_prompt),  # +40: the parent's lines
                score * 2 + nodes * DECOMPOSE_MAX_TOKENS // 4,
            ))
            n_prev = n_new
        return plans
    finally:
        llm.close()
