"""HD-Eval's layer loop (paper Algorithm 1): decompose, score, aggregate, prune; per layer.

Also its dry-run plan. The generic parts of a run (options, data, split, the LLM) are in
:mod:`hdeval.train`; this is what the method seam calls as HD-Eval's ``fit``.
"""

from __future__ import annotations

import dataclasses
import warnings
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from sklearn.base import clone

from hdeval.core.errors import DecompositionError, ScoringError
from hdeval.core.metrics import metric_table
from hdeval.core.progress import Progress
from hdeval.core.types import CriteriaTree, ScoreMatrix
from hdeval.core.urls import public_identity, public_url
from hdeval.judge.prompts import load_templates, sample_block
from hdeval.judge.scoring import score_criteria, score_requests
from hdeval.learn.aggregate import (
    CANDIDATES,
    FIXED_KINDS,
    Aggregator,
    choose_aggregator,
    default_jobs,
    fit_warnings,
    fold_ranked_spearman,
    one_standard_error,
)
from hdeval.learn.intervals import fitted_intervals
from hdeval.llm.backends.base import Backend
from hdeval.llm.cache.client import CachedBackend
from hdeval.llm.config import LLMConfig, shown_identity
from hdeval.methods.base import FitContext, run_record, score_table, usage_of
from hdeval.methods.hdeval.decompose import DECOMPOSE_MAX_TOKENS, decompose_nodes, decomposition_request
from hdeval.methods.hdeval.evaluator import Evaluator
from hdeval.methods.hdeval.prune import prune
from hdeval.methods.hdeval.summary import some_of
from hdeval.methods.jury import column, jury_scorer, jury_state, mean_matrix, split_column
from hdeval.methods.run import LayerPlan, backend_for, open_decompose_backend, prompt_chars


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
    one_se: dict[str, Any] = field(default_factory=dict)  # a simpler kind kept within one SE of the best

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_hdeval(ctx: FitContext) -> Evaluator:
    """HD-Eval's fit (the method seam calls this)."""
    from hdeval.methods.hdeval.scorer import hdeval_scorer

    scorer = hdeval_scorer(ctx)  # None: 1-5 digit scores; checked before any call
    config, prep, llm, spec, progress = ctx.config, ctx.prep, ctx.llm, ctx.llm_config, ctx.progress
    task, samples, split = prep.task, prep.samples, prep.split
    dec = llm if ctx.decompose_llm is None else ctx.decompose_llm  # the LLM that decomposes (--decompose-llm)
    default_jobs()  # a bad HDEVAL_JOBS fails here, before any LLM call
    templates = load_templates()
    score = score_criteria if scorer is None else scorer
    jury = ctx.jury  # a jury: every criterion scored by every judge, columns <judge>:<criterion>
    share = _share_budget
    if jury is not None:
        score = jury_scorer(jury, score, dec)
        share = lambda active, other, max_calls: jury.share_budget(active, [active])  # noqa: E731
    if scorer is not None:
        templates["pair"] = scorer.template
    ids = [s.id for s in samples]
    tr, te = positions(samples, split.train_ids), positions(samples, split.test_ids)
    aspects = list(task.aspect_keys)
    Y = np.array([[s.scores[a] for a in aspects] for s in samples])
    doc_groups = [samples[i].doc_id for i in tr]
    progress.message(
        f"task {task.name}: {len(samples)} samples from {prep.data_path} "
        f"({len(tr)} train, {len(te)} test), LLM {shown_identity(llm.identity)}"
        + (f", decomposing with {shown_identity(dec.identity)}" if dec is not llm else "")
        + (f"; a jury of {len(jury.judges)} judges: {', '.join(jury.names)}" if jury is not None else "")
    )
    given = prep.given
    depth = given.depth if given is not None else 1
    locked = given.locked if given is not None else frozenset()
    if given is not None:
        progress.message(_given_summary(given))
    matrix = ScoreMatrix.empty(ids)
    reports: list[LayerReport] = []
    expand: list[str] = []  # what pruning picked to decompose next
    # layer -> (columns its aggregator uses, the aggregator, out-of-fold training predictions)
    fitted: dict[int, tuple[int, Aggregator, np.ndarray]] = {}
    folds: dict[int, dict[str, Any]] = {}  # layer -> kind -> its CandidateCV
    rejections: list[dict[str, Any]] = []  # degenerate decomposition replies (the manifest's)
    stopped: list[str] = []  # why a layer after the first failed: the layers before it are kept
    for layer, tree, new in _until_failure(
        grow(
            config,
            progress,
            llm,
            dec,
            templates["decompose"],
            task,
            given,
            len(samples),
            expand,
            rejections,
            share,
        ),
        reports,
        stopped,
    ):
        n_judges = 1 if jury is None else len(jury.judges)
        progress.stage(
            f"layer {layer}: scoring {len(samples)} samples x {len(new)} criteria"
            + (f" x {n_judges} judges" if jury is not None else ""),
            len(samples) * len(new) * n_judges,
        )
        share(llm, dec, config.max_calls)
        m = score(llm, templates["score"], task, tree, new, samples, config.concurrency, progress)
        progress.end_stage()
        try:
            check_failures(m.failure_rate, m.failures, layer, config.max_failure_rate)
        except ScoringError as exc:
            if not reports:
                raise
            stopped.append(str(exc))
            tree = CriteriaTree(c for c in tree if c.layer < layer)
            break
        matrix = matrix.hstack(m)
        X = matrix.values
        # scikit-learn warnings (e.g. an MLP that did not converge) never reach the terminal
        # raw: they are recorded as notes in the layer report.
        with fit_warnings() as caught:
            asked = config.options.aggregator
            template = Aggregator.for_task(
                "lr" if asked == "auto" else asked,
                task,
                config.seed,
                aspect_columns=aspect_columns(
                    tree, matrix, aspects, *(() if jury is None else (lambda k: split_column(k)[1],))
                ),
            )
            # candidates for expansion: the last given layer's and later layers' unlocked criteria
            candidates = [c.key for c in new if c.key not in locked]
            if jury is not None:  # a criterion is a candidate through each judge's column of it
                candidates = [column(n, k) for k in candidates for n in jury.names]
            pruning = 2 <= layer < config.options.layers and layer >= depth and bool(candidates)
            chosen, cands, pick = choose_aggregator(template, X[tr], Y[tr], doc_groups, asked)
            template, kind, cv_pred = chosen.template, chosen.kind, chosen.predictions
            # selection fits every candidate kind: its warnings about models not kept (an nn
            # that did not converge while lr was chosen) say nothing about this evaluator
            caught[:] = kept_warnings(caught, kind)
            agg = clone(template).fit(X[tr], Y[tr])
            report = LayerReport(
                layer,
                [c.key for c in new],
                kind,
                # the figures the choice used: each fold's predictions standardised (CandidateCV)
                chosen.figures(Y[tr], aspects),
                metric_table(Y[te], agg.predict(X[te]), aspects),
                m.failure_rate,
                {c.kind: _finite(c.spearman) for c in cands},
                tuning=chosen.grid,
                params=_nn_params(template),
            )
            if pick is not None and pick.kept != pick.best:
                report.one_se = {"best": cands[pick.best].kind, "tolerance": round(pick.tolerance, 4)}
            folds[layer] = {c.kind: c for c in cands}
            if pruning:
                # a fixed mean weighs every criterion alike: which ones help is a fitted model's question
                judge = clone(template).set_params(kind="ridge") if kind in FIXED_KINDS else template
                pr = prune(
                    judge, X[tr], Y[tr], matrix.criterion_keys, candidates, doc_groups, config.options.top_k
                )
                selected = list(pr.selected)
                if jury is not None:  # a criterion is expanded once, however many judges found it
                    selected = list(dict.fromkeys(split_column(k)[1] for k in selected))
                report.importance, report.expand_next = pr.importance, selected
                report.positive_importance = pr.n_positive
                expand[:] = selected
        report.notes = warning_notes(caught)
        fitted[layer] = (X.shape[1], agg, cv_pred)
        reports.append(report)
        progress.message(_layer_summary(report, aspects))

    if stopped:
        progress.message(
            f"warning: {stopped[0]}; the evaluator keeps layers 1-{reports[-1].layer}, which were "
            "scored and fitted (every finished call is cached: rerun the same command to try the "
            "deeper layer again)"
        )
    # a jury's unfitted baselines read the judges' mean per criterion (PoLL's average pooling)
    pooled = matrix if jury is None else mean_matrix(matrix, jury.names)
    choice = choose_layer(reports, tree, pooled, Y, tr, aspects, depth, folds, doc_groups, config.seed)
    kept_layer = choice["kept_layer"]
    n_cols, agg, cv_pred = fitted[kept_layer]
    features = list(matrix.criterion_keys[:n_cols])
    jury_record = None
    if jury is not None:
        from hdeval.methods.hdeval.jury import jury_fit

        features, agg, cv_pred, jury_record = jury_fit(
            jury,
            config,
            matrix.values[:, :n_cols],
            features,
            agg,
            cv_pred,
            Y,
            tr,
            te,
            doc_groups,
            aspects,
            progress,
            test_docs=[samples[i].doc_id for i in te],
            seed=config.seed,
        )
        pruned = jury_record.pop("pruned_cv_spearman", None)
        if jury_record["dropped"]:
            # the judges kept are another evaluator than the one the layer was chosen with: its
            # baselines are compared with the figure of the one an artifact stores
            choice["pruned_cv_spearman"] = _finite(pruned)
            compare_baselines(choice, choice["pruned_cv_spearman"])
            before = before_pruning(jury_record["dropped"])
            for key in ("aggregator_reason", "simpler_was_better"):
                if choice.get(key):
                    choice[key] += before
    layer_metrics = {str(r.layer): r.test for r in reports}
    metrics = {
        "split": {"train": len(tr), "test": len(te)},
        "final": layer_metrics[str(kept_layer)],
        "selection": choice,
        "layers": layer_metrics,
        "cv_train": {str(r.layer): r.cv_train for r in reports},
        **dict(sorted(baselines(tree, pooled, Y, te, aspects).items())),
        "failure_rate": matrix.failure_rate,
        "usage": usage_of(llm, dec),
        **({"stopped": stopped[0]} if stopped else {}),
    }
    if dec is not llm:
        metrics["usage_decompose"] = usage_of(dec)
    if jury_record is not None:
        metrics["final"] = jury_record.pop("final")
        metrics["jury"] = jury_record
        metrics["usage"] = usage_of(*{id(c): c for c in [*jury.clients.values(), dec]}.values())
    Xk = matrix.columns(features)
    used = np.flatnonzero(agg.used_features())  # apply scores only these: the per-sample widths read them
    metrics["intervals"] = fitted_intervals(
        Y,
        cv_pred,
        tr,
        agg.predict(Xk[te]),
        te,
        aspects,
        [a.range for a in task.aspects],
        f"grouped cross-validation on the training split (layer {kept_layer}, by doc_id)",
        X=Xk[:, used],
        columns=[features[i] for i in used],
    )
    progress.message(_selection_summary(choice))
    if choice.get("simpler_was_better"):  # its own message: the CLI's summary then skips its twin
        progress.message(f"warning: {choice['simpler_was_better']}")
    # the intervals are judged once, in the summary train prints at the end
    progress.message(_baseline_summary(metrics))
    table = score_table(ids, matrix, split, Y, aspects)
    # the kept layer's aggregator reads the first columns (the matrix grows layer by layer);
    # the score table and the layer reports keep every explored criterion
    kept_tree = (
        tree if kept_layer == reports[-1].layer else CriteriaTree(c for c in tree if c.layer <= kept_layer)
    )
    cls: Any = Evaluator
    if jury is not None:
        from hdeval.methods.hdeval.jury import JuryEvaluator

        cls = JuryEvaluator
    ev = cls(
        task,
        kept_tree,
        agg,
        agg.kind,
        features,
        templates,
        spec,
        llm.identity,
        metrics,
        {
            **run_record(ctx),
            "layers": [r.to_dict() for r in reports],
            "data_file": str(prep.data_path),
            "decompose_llm": _decompose_record(config, spec, dec, llm),
            **({"tree_input": given.manifest()} if given is not None else {}),
            **({"decomposition_rejections": rejections} if rejections else {}),
            **({"jury": jury_state(jury, features)} if jury is not None else {}),
        },
        table,
    )
    if scorer is not None:
        ev.scorer = scorer
        position = scorer.position()
        ev.metrics["position_consistency"] = position["consistency"]
        ev.metrics["position_bias"] = position["bias"]
    return ev


def grow(
    config: Any,
    progress: Progress,
    llm: CachedBackend,
    dec: CachedBackend,
    template: Any,
    task: Any,
    given: Any,
    n: int,
    expand: Sequence[str],
    rejections: list[dict[str, Any]],
    share: Callable[[Any, Any, Any], None] | None = None,
) -> Iterator[tuple[int, CriteriaTree, list]]:
    """The layer loop of both shapes: (layer, tree, its criteria) for each layer to score, after
    decomposing what it needs. A --tree's layers are taken as given and expansion starts below
    its last one, never on a locked criterion; deeper layers expand what the caller last put in
    ``expand`` (pruning), and the loop ends when nothing is. ``n``: units per criterion."""
    tree = given.tree if given is not None else CriteriaTree.from_aspects(task.aspects)
    depth = given.depth if given is not None else 1
    locked = given.locked if given is not None else frozenset()
    for layer in range(1, config.options.layers + 1):
        progress.expect(_units_left(config, n, tree, layer, depth, locked, expand))
        if layer > 1:
            nodes = _to_decompose(tree, layer, depth, locked, expand)
            if not nodes and layer > depth:  # pruning found no criterion worth expanding
                return
            if nodes:
                progress.stage(f"layer {layer}: decomposing {len(nodes)} criteria", len(nodes))
                before = len(tree)
                (share or _share_budget)(dec, llm, config.max_calls)
                tree = decompose_nodes(
                    dec, template, task, tree, nodes, config.options.children, progress, rejections
                )
                progress.end_stage()
                if len(tree) == before and layer > depth:
                    return
        yield layer, tree, tree.layer(layer)


def _until_failure(layers: Iterator[Any], reports: Sequence[Any], stopped: list[str]) -> Iterator[Any]:
    """``layers``, until decomposing one after the first fails: why goes in ``stopped`` and the
    layers fitted so far stand (with none fitted yet, the failure is raised)."""
    try:
        yield from layers
    except DecompositionError as exc:
        if not reports:
            raise
        stopped.append(str(exc))


def positions(samples: Sequence[Any], ids: Sequence[str]) -> np.ndarray:
    pos = {s.id: i for i, s in enumerate(samples)}
    return np.array([pos[s] for s in ids], dtype=int)


# A deeper layer costs more LLM calls per sample and is kept only when its cross-validated
# training Spearman beats the shallower best by more than this (fold noise on ~100 rows).
LAYER_MARGIN = 0.01


def choose_layer(
    reports: Sequence[LayerReport],
    tree: CriteriaTree,
    matrix: ScoreMatrix,
    Y: np.ndarray,
    tr: np.ndarray,
    aspects: list[str],
    depth: int = 1,
    folds: dict[int, dict[str, Any]] | None = None,
    groups: Sequence[str] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """The evaluator to keep, decided on the training split only: each layer's grouped
    cross-validated average Spearman (of the aggregator its layer kept), and the unfitted
    baselines' figures on the same folds, each ranked alone, beside their in-sample ones.
    Test rows decide nothing here. A tree given with --tree is kept whole: only layers from its
    last one on compete. With ``folds`` (layer -> kind -> its CandidateCV), the layer is chosen by
    the one-standard-error rule (the shallowest within one SE, at least LAYER_MARGIN, of the best);
    without, by LAYER_MARGIN alone (``groups``: the training rows' documents, for the standard error)."""
    # the figure each layer's aggregator was chosen on, as recorded (cv_train's average is the same
    # figure rounded twice; it stands in for a report that records no choice)
    cv = {
        r.layer: r.selection_scores.get(r.aggregator, _finite(r.cv_train["average"]["spearman"]))
        for r in reports
    }
    eligible = [r for r in reports if r.layer >= depth] or list(reports[-1:])
    layers = [r.layer for r in eligible]
    kinds = {r.layer: r.aggregator for r in reports}
    if folds and all(r.layer in folds for r in eligible) and len(layers) > 1:
        pick = one_standard_error(
            [folds[r.layer][r.aggregator] for r in eligible], Y[tr], groups, LAYER_MARGIN, seed, levels=layers
        )
        best = layers[pick.kept]
        top = layers[pick.best]
        if best == top:
            reason = f"layer {best} has the best cross-validated training Spearman"
        else:
            reason = (
                f"layer {best}'s cross-validated training Spearman ({_fmt(cv[best]).strip()}) is within "
                f"one standard error ({pick.tolerance:.3f}) of the best, layer {top}'s "
                f"({_fmt(cv[top]).strip()}), and it needs fewer criteria"
            )
    else:
        best, reason = best_layer(
            cv, layers, "Spearman", "the only layer that could be kept", lambda x: _fmt(x).strip()
        )
    if len(layers) > 1 and all(cv[x] is None for x in layers):  # no "best" to speak of
        best = layers[0]
        reason = f"no layer has a cross-validated training Spearman: layer {best}, the shallowest, is kept"
    preds = baseline_predictions(tree, matrix, tr, aspects)
    train_sp = {k: metric_table(Y[tr], p, aspects)["average"]["spearman"] for k, p in preds.items()}
    # compared with the evaluator on its own figure: the same folds, each ranked alone (without
    # documents, as a direct call may have none, each row its own)
    docs = list(groups) if len(groups) == len(tr) else [str(i) for i in range(len(tr))]
    # rounded as the evaluator's figures are (_finite): compared unrounded with a rounded one, an
    # equal baseline could "beat" it by float noise
    cv_sp = {k: _finite(fold_ranked_spearman(p, Y[tr], docs, seed)) for k, p in preds.items()}
    named = {k: v for k, v in cv_sp.items() if v is not None}
    strongest = max(named, key=lambda k: named[k]) if named else None
    kept = next(r for r in reports if r.layer == best)
    out: dict[str, Any] = {
        "kept_layer": best,
        "kept_aggregator": kinds[best],
        "by": (
            "grouped cross-validation on the training split (average Spearman, the mean over held-out "
            "folds), the simplest candidate within one standard error of the best"
        ),
        "reason": reason,
        "aggregator_reason": aggregator_reason(kept),
        "cv_train_spearman": {str(k): v for k, v in cv.items()},
        "candidates_cv_spearman": {str(r.layer): dict(r.selection_scores) for r in reports},
        "baselines_train_spearman": train_sp,
        "baselines_cv_spearman": cv_sp,
        "strongest_baseline": strongest,
    }
    better = simpler_was_better(kept)
    if better:
        out["simpler_was_better"] = better
    return compare_baselines(out, cv[best])


def compare_baselines(choice: dict[str, Any], mine: float | None) -> dict[str, Any]:
    """``choice`` saying whether its strongest baseline beats the kept evaluator, whose
    cross-validated figure is ``mine``; a verdict made before (on another figure) is replaced."""
    choice.pop("baseline_beats_evaluator", None)
    choice.pop("baseline_not_kept", None)
    s = choice.get("strongest_baseline")
    theirs = choice["baselines_cv_spearman"].get(s) if s is not None else None
    if theirs is not None and mine is not None and theirs > mine:
        # a baseline is no fitted model an artifact stores: said, not silently dropped
        choice["baseline_beats_evaluator"] = True
        choice["baseline_not_kept"] = BASELINE_NOT_KEPT
    return choice


def aggregator_reason(r: LayerReport) -> str:
    """Why layer ``r`` kept its aggregator, in a phrase."""
    scores = r.selection_scores
    mine = _fmt(scores.get(r.aggregator)).strip()
    if len(scores) <= 1 or r.aggregator not in scores:
        return f"{r.aggregator}, as asked (--aggregator {r.aggregator})"
    if all(v is None for v in scores.values()):
        return f"{r.aggregator}, the simplest candidate: none has a cross-validated training Spearman"
    if r.one_se:
        best = r.one_se["best"]
        return (
            f"{r.aggregator} ({mine}) is the simplest candidate within one standard error "
            f"({r.one_se['tolerance']:.3f}) of the best, {best} ({_fmt(scores.get(best)).strip()})"
        )
    if simpler_was_better(r) or len(scores) < len(CANDIDATES):
        return f"{r.aggregator} ({mine}), as asked (--aggregator {r.aggregator})"
    return f"{r.aggregator} has the best cross-validated training Spearman ({mine})"


def simpler_was_better(r: LayerReport) -> str | None:
    """With one asked aggregator: a warning naming the simpler candidate that did better on
    cross-validation, with both figures; None when none did."""
    scores = {k: v for k, v in r.selection_scores.items() if v is not None}
    mine = scores.get(r.aggregator)
    if mine is None or len(r.selection_scores) >= len(CANDIDATES):
        return None
    better = {k: v for k, v in scores.items() if k != r.aggregator and v > mine}
    if not better:
        return None
    name = max(better, key=lambda k: better[k])
    return (
        f"--aggregator {r.aggregator} was kept as asked, but a simpler candidate did better on grouped "
        f"cross-validation over the training documents (layer {r.layer}): {name} {better[name]:.3f} "
        f"against {r.aggregator} {mine:.3f}; --aggregator auto would weigh them"
    )


def aspect_columns(
    tree: CriteriaTree,
    matrix: ScoreMatrix,
    aspects: Sequence[str],
    criterion: Callable[[str], str] = lambda k: k,
) -> list[list[int]]:
    """Per aspect, the matrix columns of its subtree, its own (layer-1) column first;
    ``criterion``: the criterion a column scores (a jury's ``<judge>:<criterion>``: every judge's)."""
    keys = [criterion(k) for k in matrix.criterion_keys]
    out = []
    for a in aspects:
        own = [i for i, k in enumerate(keys) if k == a]
        sub = [
            i
            for i, k in enumerate(keys)
            if k != a and k in tree and any(c.key == a for c in tree.ancestors(k))
        ]
        out.append(own + sub)
    return out


def _finite(x: float | None) -> float | None:
    return round(float(x), 4) if x is not None and np.isfinite(x) else None


def best_layer(
    cv: dict[int, float | None], layers: Sequence[int], what: str, only: str, show: Callable[[Any], str] = str
) -> tuple[int, str]:
    """(layer, why): the first of ``layers`` unless a deeper one's cross-validated training
    ``what`` beats the best so far by more than LAYER_MARGIN."""
    best = layers[0]
    for layer in layers[1:]:
        here, there = cv[layer], cv[best]
        if here is not None and (there is None or here > there + LAYER_MARGIN):
            best = layer
    deepest = layers[-1]
    if best == deepest:
        return best, f"layer {best} has the best cross-validated training {what}" if len(layers) > 1 else only
    return best, (
        f"layer {best}'s cross-validated training {what} ({show(cv[best])}) is not beaten by more "
        f"than {LAYER_MARGIN} by a deeper layer (layer {deepest}: {show(cv[deepest])})"
    )


# Why a stronger unfitted baseline is reported but not kept as the evaluator.
BASELINE_NOT_KEPT = (
    "a baseline is not kept as the evaluator: it is no fitted model (mean_subtree and mean_all_criteria "
    "average every criterion explored, on every layer; direct_layer1 takes the layer-1 scores as they "
    "are, uncalibrated); its figure (selection.baselines_cv_spearman) is on the same cross-validation "
    "folds as the candidates', the calibrated direct scores and means of each layer's criteria among "
    "them (selection.candidates_cv_spearman), and its held-out figure is next to the evaluator's"
)


def before_pruning(dropped: Sequence[str]) -> str:
    """What the aggregator's figures were measured on, once --prune-judges dropped judges: the
    candidates competed on every judge's columns, not on the kept jury's."""
    return (
        f" (figures of every judge's columns, before --prune-judges dropped {', '.join(dropped)}; "
        "the kept jury's is selection.pruned_cv_spearman)"
    )


def _kept_cv(choice: dict[str, Any]) -> float | None:
    """The kept evaluator's cross-validated figure: after --prune-judges, the pruned jury's."""
    if "pruned_cv_spearman" in choice:
        return choice["pruned_cv_spearman"]
    return choice["cv_train_spearman"][str(choice["kept_layer"])]


def _selection_summary(choice: dict[str, Any]) -> str:
    """What training says once the layer is chosen. The saved evaluator's summary then gives the
    aggregator's reason and every candidate's figure: they are not said twice."""
    s = choice.get("strongest_baseline")
    kind = f", aggregator {choice['kept_aggregator']}" if choice.get("kept_aggregator") else ""
    line = f"kept evaluator: layer {choice['kept_layer']}{kind} ({choice['reason']})"
    if s is not None:
        line += (
            f"\nstrongest simple baseline on the training split: {s.replace('_', ' ')} "
            f"(cross-validated spearman {_fmt(choice['baselines_cv_spearman'][s]).strip()})"
        )
        if choice.get("baseline_beats_evaluator"):
            line += (
                f"; it beats the kept evaluator's cross-validated figure ({_fmt(_kept_cv(choice)).strip()}), "
                "but a baseline "
                "is not kept as the evaluator (metrics.json's selection.baseline_not_kept says why)"
            )
    return line


def _to_decompose(
    tree: CriteriaTree, layer: int, depth: int, locked: frozenset[str], expand: Sequence[str]
) -> list:
    """Layer 2: the unlocked aspects without sub-criteria; deeper: pruning's picks below a --tree."""
    if layer == 2:
        return [c for c in tree.layer(1) if c.key not in locked and not tree.children(c.key)]
    if layer > depth:
        return [tree[k] for k in expand]
    return []


def _units_left(
    config: Any,
    n: int,
    tree: CriteriaTree,
    first: int,
    depth: int,
    locked: frozenset[str],
    expand: Sequence[str],
) -> int:
    """At most the progress units (the dry run's "requests") layers ``first`` on still need."""
    return sum(
        nodes + n * (len(known) + nodes * config.options.children)
        for _, nodes, known in _layer_sizes(config, tree, first, depth, locked, expand)
    )


def _layer_sizes(
    config: Any, tree: CriteriaTree, first: int, depth: int, locked: frozenset[str], expand: Sequence[str]
) -> Iterator[tuple[int, int, list]]:
    """(layer, at most the criteria decomposed before it, its criteria known now), layers ``first`` on."""
    candidates = 0  # criteria of the previous layer pruning may pick for expansion
    for layer in range(first, config.options.layers + 1):
        if layer == 2 or layer == first > 1:  # known now: the tree is as it is before ``first``
            nodes = len(_to_decompose(tree, layer, depth, locked, expand))
        elif layer > depth:  # at most --top-k picked by pruning
            nodes = min(config.options.top_k, candidates)
        else:
            nodes = 0
        if layer > depth and not nodes:
            return
        # the given tree's criteria on this layer are known
        known = tree.layer(layer) if layer <= depth else []
        yield layer, nodes, known
        candidates = sum(1 for c in known if c.key not in locked) + nodes * config.options.children


def check_failures(
    rate: float, failures: Sequence[Any], layer: int, threshold: float, what: str = "sample"
) -> None:
    if rate > threshold:
        ex = failures[0]
        raise ScoringError(
            f"layer {layer}: {rate:.0%} of criterion scores could not be read (threshold "
            f"{threshold:.0%}), e.g. {what} {ex.sample_id} on {ex.criterion_key}: {ex.reason}; "
            "the replies are cached; check the LLM or raise --max-failure-rate"
        )


def baselines(
    tree: CriteriaTree, matrix: ScoreMatrix, Y: np.ndarray, rows: np.ndarray, aspects: list[str]
) -> dict[str, dict]:
    """The unfitted baselines' figures on ``rows``: each aspect's own subtree mean (the stronger
    'w/o aggregator'), the plain mean of all criteria ('w/o aggregator'), and each aspect's own
    layer-1 score (G-Eval style)."""
    return {
        k: metric_table(Y[rows], p, aspects)
        for k, p in baseline_predictions(tree, matrix, rows, aspects).items()
    }


def baseline_predictions(
    tree: CriteriaTree, matrix: ScoreMatrix, rows: np.ndarray, aspects: Sequence[str]
) -> dict[str, np.ndarray]:
    """What each unfitted baseline of :func:`baselines` predicts on ``rows`` (rows x aspects)."""
    with warnings.catch_warnings():  # a row whose every cell failed has no mean: NaN, said nowhere else
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(matrix.values[rows], axis=1) if matrix.values.size else np.zeros(len(rows))
    return {
        "mean_subtree": subtree_means(tree, matrix, aspects)[rows],
        "mean_all_criteria": np.repeat(mean[:, None], len(aspects), axis=1),
        "direct_layer1": matrix.columns(list(aspects))[rows],
    }


def kept_warnings(caught: Sequence[warnings.WarningMessage], kind: str) -> list:
    """The warnings about the kept model: a ConvergenceWarning (an MLP's) only if ``kind`` is nn."""
    return [w for w in caught if kind == "nn" or w.category.__name__ != "ConvergenceWarning"]


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
        cols = [
            i
            for i, k in enumerate(keys)
            if k == a or (k in tree and any(c.key == a for c in tree.ancestors(k)))
        ]
        if cols:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
                out[:, j] = np.nanmean(matrix.values[:, cols], axis=1)
    return out


def _share_budget(active: CachedBackend, other: CachedBackend, max_calls: int | None) -> None:
    """One --max-calls for both LLMs: a stage's LLM may make what the other has not spent."""
    if max_calls is not None and active is not other:
        active.max_calls = max(0, max_calls - other.stats.calls)


def _decompose_record(config: Any, spec: LLMConfig, dec: CachedBackend, llm: CachedBackend) -> dict:
    """The decomposing LLM as the artifact records it: model, server and identity, no key."""
    if dec is llm:
        model, url = spec.model, spec.base_url
    else:
        model, url = config.options.decompose_llm or dec.identity, config.options.decompose_base_url
    return {
        "model": model,
        "base_url": public_url(url),
        "identity": public_identity(dec.identity, url),
        "same_as_scoring": dec is llm,
    }


def _given_summary(given: Any) -> str:
    """Which criteria came from the --tree file (shown before training and in the summary)."""
    keys = given.tree.keys
    shown = some_of([k + (" (locked)" if k in given.locked else "") for k in keys], 12)
    return (
        f"tree from {given.source}: {len(keys)} criteria on {given.depth} layer(s), "
        f"{len(given.locked)} locked: {shown}"
    )


def _fmt(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:5.3f}"


def _baseline_summary(metrics: dict[str, Any]) -> str:
    """The evaluator next to the baselines, the stronger 'w/o aggregator' one first."""

    def sp(key: str) -> str:
        return _fmt((metrics.get(key) or {}).get("average", {}).get("spearman"))

    return (
        f"held-out average spearman: kept evaluator {sp('final')} | baselines: own-subtree mean "
        f"{sp('mean_subtree')}, mean of all criteria {sp('mean_all_criteria')}, "
        f"direct layer-1 score {sp('direct_layer1')}"
    )


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
    return "\n".join(lines + pruning_lines(r))


def pruning_lines(r: Any) -> list[str]:
    """A layer summary's closing lines, pointwise or pairwise: what pruning chose and the notes."""
    lines = []
    if r.positive_importance is not None:
        n = len(r.importance)
        if r.expand_next:
            lines.append(
                f"  expand next: {', '.join(r.expand_next)} ({r.positive_importance} of {n} "
                "candidates had positive importance)"
            )
        else:
            lines.append(f"  expand next: none (no candidate of {n} had positive importance)")
    return lines + [f"  note: {note}" for note in r.notes]


def plan_hdeval(config: Any, prep: Any, backend: Backend | None = None) -> list[LayerPlan]:
    """HD-Eval's calls per layer, without calling the LLM (see :func:`hdeval.run.train.plan`).
    With ``--tree``, every layer of the given tree is known: its requests are counted exactly."""
    with backend_for(config, backend, offline=True) as llm:
        dec = open_decompose_backend(config, llm, offline=True)
        with closing(dec) if dec is not llm else nullcontext():
            return _plan(config, prep, llm, dec)


def _plan(config: Any, prep: Any, llm: CachedBackend, dec: CachedBackend) -> list[LayerPlan]:
    templates = load_templates()
    task, samples = prep.task, prep.samples
    given = prep.given
    tree = given.tree if given is not None else CriteriaTree.from_aspects(task.aspects)
    depth = given.depth if given is not None else 1
    locked = given.locked if given is not None else frozenset()
    n_distinct = len({sample_block(task, s) for s in samples})
    dec_reqs = [
        decomposition_request(templates["decompose"], task, tree, c, config.options.children)
        for c in tree.layer(1)
    ]
    dec_prompt = sum(prompt_chars(r) for r in dec_reqs) / len(dec_reqs) / 4
    plans: list[LayerPlan] = []
    per_prompt = 0.0
    for layer, nodes, known in _layer_sizes(config, tree, 1, depth, locked, ()):
        # the known criteria's requests are counted exactly
        reqs = score_requests(templates["score"], task, tree, known, samples) if known else []
        # Identical requests (samples with the same text) cost one call: count distinct keys.
        distinct = {llm.key(r): r for r in reqs}
        known_chars = sum(prompt_chars(r) for r in distinct.values())
        if distinct:
            per_prompt = known_chars / len(distinct) / 4
        n_new = nodes * config.options.children
        score = len(distinct) + n_new * n_distinct
        dec_p, dec_c = int(nodes * dec_prompt), nodes * DECOMPOSE_MAX_TOKENS // 4
        cached = sum(llm.is_cached(r) for r in distinct.values()) if distinct else None
        plans.append(
            LayerPlan(
                layer,
                nodes,
                score,
                cached,
                nodes > 0,
                # +40: the parent's lines in a new criterion's prompt
                int(per_prompt * len(distinct) + n_new * n_distinct * (per_prompt + 40) + nodes * dec_prompt),
                score * 2 + dec_c,
                decompose_prompt_tokens=dec_p,
                decompose_completion_tokens=dec_c,
                requests=nodes + len(reqs) + n_new * len(samples),
            )
        )
    return plans
