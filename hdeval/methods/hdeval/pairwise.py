"""HD-Eval on pairwise preference data (``hdeval train --method hdeval`` on a pairwise task;
docs/methods.md tells it whole): the tree is built as for pointwise tasks, each response is
scored alone on every criterion with the pointwise prompt (so no position bias to swap away),
and a classifier (:mod:`hdeval.learn.classify`) on score(A) - score(B) per criterion predicts the
human label; permutation importance picks the criteria to decompose next."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Sequence

import numpy as np
import pandas as pd

from hdeval.artifact.directory import ArtifactWriter
from hdeval.core.errors import ArtifactError, ConfigError, DataError
from hdeval.core.metrics import pair_agreement as agreement
from hdeval.core.progress import Progress
from hdeval.core.types import (
    PAIR_LABELS,
    CriteriaTree,
    Criterion,
    Failure,
    PairSample,
    Sample,
    ScoreMatrix,
    Task,
)
from hdeval.judge.prompts import Template, load_templates
from hdeval.judge.scoring import score_criteria
from hdeval.learn.aggregate import fit_warnings, used_features
from hdeval.learn.classify import (
    CLASSIFIERS,
    cv_predictions,
    heldout_importance,
    make_classifier,
    predict_labels,
    prune_importance,
    select_classifier,
)
from hdeval.llm.config import shown_identity
from hdeval.methods.aggregator_file import check_pipeline
from hdeval.methods.base import FitContext, ScoreResult, run_record, usage_of
from hdeval.methods.hdeval.evaluator import TreeEvaluator
from hdeval.methods.hdeval.loop import (
    LayerReport,
    _fmt,
    best_layer,
    check_failures,
    grow,
    kept_warnings,
    plan_hdeval,
    positions,
    pruning_lines,
    warning_notes,
)
from hdeval.methods.hdeval.state import PairwiseState
from hdeval.methods.metrics_file import ABSENT, LAYER_KEYS, REQUIRED, Agreement, Metrics, Number
from hdeval.methods.pair_report import write_pair_report

MODEL = "classifier.skops"
_EXTRA_KEYS = ("seed", "split", "config", "layers", "data_file", "decomposition_rejections")


# ----------------------------------------------------------------------------- scoring both sides
def side_samples(pairs: Sequence[PairSample]) -> list[Sample]:
    """Each response of each pair as a pointwise sample (the question fields, the response as
    ``output``), A then B per pair so a pair's prompts stay together. Ids ``<pair id>#a``/``#b``."""
    out = []
    for p in pairs:
        for side, text, system in (("a", p.output_a, p.system_a), ("b", p.output_b, p.system_b)):
            out.append(
                Sample(f"{p.id}#{side}", p.doc_id, {**dict(p.fields), "output": text}, {}, system, p.line)
            )
    return out


def score_sides(
    llm,
    template: Template,
    task: Task,
    tree: CriteriaTree,
    criteria: Sequence[Criterion],
    pairs: Sequence[PairSample],
    concurrency: int,
    progress: Progress | None,
) -> tuple[ScoreMatrix, ScoreMatrix]:
    """(scores of A, scores of B): pairs x criteria; a failed score is NaN with a Failure naming
    the pair and ``<criterion>:a`` or ``:b``."""
    ids = [p.id for p in pairs]
    m = score_criteria(llm, template, task, tree, criteria, side_samples(pairs), concurrency, progress)
    keys = [c.key for c in criteria]
    fails: dict[str, list[Failure]] = {"a": [], "b": []}
    for f in m.failures:
        pid, _, side = f.sample_id.rpartition("#")
        fails[side].append(Failure(pid, f"{f.criterion_key}:{side}", f.reason))
    return (
        ScoreMatrix(ids, keys, m.values[0::2], fails["a"]),
        ScoreMatrix(ids, keys, m.values[1::2], fails["b"]),
    )


def plan_pairwise(config, prep, backend=None) -> list:
    """The dry run: HD-Eval's plan over every response as a sample (2 per pair), so layer 1 is
    exact (identical responses once, cached ones shown) and later layers are upper bounds."""
    no_pairwise_scorer(config.options, prep.task)
    return plan_hdeval(config, dataclasses.replace(prep, samples=side_samples(prep.samples)), backend)


# ----------------------------------------------------------------------------- fit
def no_pairwise_scorer(options: Any, task: Task) -> None:
    """--scorer pairwise compares pointwise samples with comparison examples: not on pairs."""
    if options.scorer != "digit":
        raise ConfigError(
            f"--scorer pairwise does not apply to a pairwise task ({task.name}): HD-Eval "
            "scores both responses of each pair with the criterion prompt; leave --scorer out"
        )


def check_pairwise_options(ctx: FitContext) -> None:
    """What a pairwise HD-Eval run refuses before any LLM call."""
    no_pairwise_scorer(ctx.options, ctx.prep.task)
    given = ctx.options.given()
    for name in ("comparisons", "swap"):
        if name in given:
            raise ConfigError(
                f"--{name} is a PairEval option; HD-Eval on a pairwise task "
                f"({ctx.prep.task.name}) shows each response alone and does not take it"
            )
    labels = {ctx.prep.samples[i].label for i in positions(ctx.prep.samples, ctx.prep.split.train_ids)}
    if not {"a", "b"} <= labels:
        raise DataError(
            f"{ctx.prep.data_path}: the training split's labels are {sorted(labels)}; the "
            "classifier needs pairs labelled a and pairs labelled b (use more data or another --seed)"
        )


def run_pairwise(ctx: FitContext) -> "PairwiseTreeEvaluator":
    check_pairwise_options(ctx)
    config, prep, llm, progress = ctx.config, ctx.prep, ctx.llm, ctx.progress
    task, pairs, split = prep.task, list(prep.samples), prep.split
    templates = load_templates()
    ids = [p.id for p in pairs]
    tr, te = positions(pairs, split.train_ids), positions(pairs, split.test_ids)
    y = [p.label for p in pairs]
    ytr, yte = [y[i] for i in tr], [y[i] for i in te]
    groups = [pairs[i].doc_id for i in tr]
    progress.message(
        f"task {task.name}: {len(pairs)} pairs from {prep.data_path} ({len(tr)} train, {len(te)} test), "
        f"both responses scored per criterion, LLM {shown_identity(llm.identity)}"
    )
    side_a, side_b = ScoreMatrix.empty(ids), ScoreMatrix.empty(ids)
    reports: list[LayerReport] = []
    expand: list[str] = []
    fitted: dict[int, tuple[Any, str, int]] = {}  # layer -> (classifier, kind, columns it takes)
    rejections: list[dict[str, Any]] = []  # degenerate decomposition replies (the manifest's)
    # the ETA counts as plan_pairwise: the pointwise count over both responses of each pair
    for layer, tree, new in grow(
        config, progress, llm, llm, templates["decompose"], task, None, 2 * len(pairs), expand, rejections
    ):
        progress.stage(
            f"layer {layer}: scoring {len(pairs)} pairs x 2 responses x {len(new)} criteria",
            2 * len(pairs) * len(new),
        )
        sa, sb = score_sides(llm, templates["score"], task, tree, new, pairs, config.concurrency, progress)
        progress.end_stage()
        rate = _rate(sa, sb)
        check_failures(rate, sa.failures + sb.failures, layer, config.max_failure_rate, "pair")
        side_a, side_b = side_a.hstack(sa), side_b.hstack(sb)
        X = side_a.values - side_b.values
        with fit_warnings() as caught:
            selection: dict[str, float] = {}
            kind = config.options.aggregator
            if kind == "auto":
                kind, selection = select_classifier(X[tr], ytr, groups, config.seed)
            caught[:] = kept_warnings(caught, kind)  # only warnings about the kept classifier
            cv_pred, cv_ab = cv_predictions(kind, X[tr], ytr, groups, config.seed)
            model = make_classifier(kind, config.seed).fit(X[tr], ytr)
            pred, pred_ab = predict_labels(model, X[te])
            report = LayerReport(
                layer,
                [c.key for c in new],
                kind,
                agreement(ytr, cv_pred, cv_ab),
                agreement(yte, pred, pred_ab),
                rate,
                selection,
            )
            if 2 <= layer < config.options.layers:
                keys = side_a.criterion_keys
                cand = [keys.index(c.key) for c in new]
                imp = prune_importance(kind, X[tr], ytr, cand, groups, config.seed)
                report.importance = {c.key: round(float(v), 6) for c, v in zip(new, imp)}
                positive = [i for i in range(len(new)) if imp[i] > 0]
                order = sorted(positive, key=lambda i: (-imp[i], i))
                expand[:] = [new[i].key for i in order[: config.options.top_k]]
                report.expand_next, report.positive_importance = list(expand), len(positive)
        report.notes = warning_notes(caught)
        reports.append(report)
        fitted[layer] = (model, kind, X.shape[1])
        progress.message(_layer_summary(report))

    choice = choose_pair_layer(reports)
    kept = choice["kept_layer"]
    model, kind, n_cols = fitted[kept]
    progress.message(f"kept evaluator: layer {kept} ({choice['reason']})")
    X = (side_a.values - side_b.values)[:, :n_cols]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imp = heldout_importance(model, X[te], yte, config.seed)
    metrics: dict[str, Any] = {
        "method": "hdeval",
        "shape": "pairwise",
        "split": {"train": len(tr), "test": len(te)},
        "final": next(r.test for r in reports if r.layer == kept),
        "final_layer": kept,
        "selection": choice,
        "aggregator": kind,
        "classes": [str(c) for c in model.classes_],
        "layers": {str(r.layer): r.test for r in reports},
        "cv_train": {str(r.layer): r.cv_train for r in reports},
        "direct_layer1": _direct_layer1(side_a, side_b, task, te, yte),
        "importance": {k: round(float(v), 6) for k, v in zip(side_a.criterion_keys[:n_cols], imp)},
        "failure_rate": round(_rate(side_a, side_b), 6),
        "order_swap": order_swap(model, X[te]),
        "usage": usage_of(llm),
        "notes": (
            "agreement: 'w_ties' 3-way accuracy; 'wo_ties' on pairs whose human label is not a tie, "
            "the prediction forced to a or b; 'importance' is the drop in held-out agreement when a "
            "criterion's difference is shuffled"
        ),
    }
    progress.message(
        f"held-out agreement: evaluator w/o ties {metrics['final']['wo_ties']}, w/ ties {metrics['final']['w_ties']} "
        f"| baseline (equal-weight sum of layer-1 differences) w/o ties {metrics['direct_layer1']['wo_ties']}, "
        f"w/ ties {metrics['direct_layer1']['w_ties']}"
    )
    table = _score_table(ids, side_a, side_b, split, y)
    # a classifier has no nn grid to record
    layers = [{k: v for k, v in r.to_dict().items() if k not in ("tuning", "params")} for r in reports]
    extra = {
        **run_record(ctx),
        "layers": layers,
        "data_file": str(prep.data_path),
        **({"decomposition_rejections": rejections} if rejections else {}),
    }
    # the score table keeps every explored criterion; the kept classifier reads the first columns
    kept_tree = tree if kept == reports[-1].layer else CriteriaTree(c for c in tree if c.layer <= kept)
    return PairwiseTreeEvaluator(
        task,
        kept_tree,
        model,
        kind,
        side_a.criterion_keys[:n_cols],
        templates,
        ctx.llm_config,
        llm.identity,
        metrics,
        extra,
        table,
    )


def order_swap(model: Any, X: np.ndarray) -> dict[str, Any]:
    """How often the verdict changes when A and B swap places, on the test pairs. Each response
    is scored alone, so the swapped pair's features are the negated differences and both orders
    are judged without another call; a classifier with an intercept can still prefer a position."""
    mirror = {"a": "b", "b": "a", "tie": "tie"}
    if not len(X):
        return {"pairs": 0, "verdict_changes": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, _ = predict_labels(model, X)
        second, _ = predict_labels(model, -X)
    changed = sum(mirror[str(p)] != str(q) for p, q in zip(first, second))
    return {
        "pairs": int(len(X)),
        "verdict_changes": round(changed / len(X), 6),
        "how": "the test pairs with A and B swapped (negated differences): the share whose preferred "
        "response or tie changes",
    }


def choose_pair_layer(reports: Sequence[LayerReport]) -> dict[str, Any]:
    """The layer to keep, decided on the training split only, as for pointwise HD-Eval: the
    best grouped cross-validated 3-way agreement (with ties); a deeper layer costs more calls
    and must beat the shallower best by more than ``LAYER_MARGIN``. Test rows decide nothing."""
    cv = {r.layer: r.cv_train.get("w_ties") for r in reports}
    best, reason = best_layer(cv, [r.layer for r in reports], "agreement with ties", "the only layer")
    return {
        "kept_layer": best,
        "by": "grouped cross-validation on the training split (agreement with ties)",
        "reason": reason,
        "cv_train_w_ties": {str(k): v for k, v in cv.items()},
    }


def _rate(a: ScoreMatrix, b: ScoreMatrix) -> float:
    n = a.values.size + b.values.size
    return float(np.isnan(a.values).sum() + np.isnan(b.values).sum()) / n if n else 0.0


def _direct_layer1(
    a: ScoreMatrix, b: ScoreMatrix, task: Task, te: np.ndarray, yte: Sequence[str]
) -> dict[str, Any]:
    """Baseline: the plain sum of the layer-1 (aspect) differences; equal sums are a tie."""
    cols = [a.criterion_keys.index(k) for k in task.aspect_keys]
    d = np.nansum(a.values[te][:, cols] - b.values[te][:, cols], axis=1)
    pred = ["tie" if x == 0 else ("a" if x > 0 else "b") for x in d]
    return agreement(yte, pred, [None if p == "tie" else p for p in pred])


def _score_table(ids, a: ScoreMatrix, b: ScoreMatrix, split, y) -> pd.DataFrame:
    """``scores.csv``: pair id, split, every ``<criterion>:a``, every ``<criterion>:b``, human label."""
    split_of = {s: "train" for s in split.train_ids} | {s: "test" for s in split.test_ids}
    cols: dict[str, Any] = {"pair_id": list(ids), "split": [split_of[s] for s in ids]}
    for side, m in (("a", a), ("b", b)):
        cols |= {f"{k}:{side}": m.values[:, j] for j, k in enumerate(m.criterion_keys)}
    cols["human"] = list(y)
    return pd.DataFrame(cols)


def _layer_summary(r: LayerReport) -> str:
    lines = [
        f"layer {r.layer}: +{len(r.added)} criteria, classifier {r.aggregator}, failed scores "
        f"{r.failure_rate:.1%}, CV-train agreement w/o ties {_fmt(r.cv_train['wo_ties'])}",
        f"  test agreement w/o ties {_fmt(r.test['wo_ties'])}, w/ ties {_fmt(r.test['w_ties'])}",
    ]
    return "\n".join(lines + pruning_lines(r))


# ----------------------------------------------------------------------------- fitted
@dataclass
class PairHdevalResult(ScoreResult):
    """Predictions for pairs: ``predictions`` holds P(label) per class (columns ``p_<class>``);
    ``criteria`` the differences A - B per feature (NaN = unused or failed)."""

    labels: list[str] = field(default_factory=list)
    labels_ab: list[str] = field(default_factory=list)
    side_a: ScoreMatrix | None = None
    side_b: ScoreMatrix | None = None

    def agreement(self, samples: Sequence[PairSample]) -> dict[str, Any] | None:
        human = [s.label for s in samples]
        if all(h is None for h in human):
            return None
        return {"hdeval": agreement(human, self.labels, self.labels_ab)}


class PairwiseMetrics(Metrics):
    """Pairwise HD-Eval's ``metrics.json``: held-out agreement with the human choices of the kept
    layer, of every layer and of the one-criterion baseline; each criterion's importance."""

    final: Annotated[Agreement, REQUIRED]  # type: ignore[assignment]  # pairs: not correlations
    layers: Annotated[dict[str, Agreement], LAYER_KEYS] = ABSENT
    direct_layer1: Agreement = ABSENT
    importance: dict[str, Number] = ABSENT


class PairwiseTreeEvaluator(TreeEvaluator):
    """Criteria tree + a classifier on per-criterion score differences of two responses."""

    shape = "pairwise"
    fitted = "classifier"
    model_file = MODEL
    extra_keys = _EXTRA_KEYS
    State = PairwiseState

    @property
    def classes(self) -> list[str]:
        return [str(c) for c in self.model.classes_]

    def used_mask(self) -> Any:
        return used_features(self.model, len(self.feature_keys))

    def calls_per_sample(self) -> int:
        return 2 * len(self.needed_criteria)

    def metrics_model(self) -> type[Metrics]:
        return PairwiseMetrics

    def held_out_labels(self, test: Any) -> dict[str, tuple[list, list]]:
        """The classifier on the ``<criterion>:a`` minus ``<criterion>:b`` columns."""
        keys = list(self.feature_keys)
        diff = test[[f"{k}:a" for k in keys]].to_numpy(float) - test[[f"{k}:b" for k in keys]].to_numpy(float)
        labels, labels_ab = predict_labels(self.model, diff)
        return {"evaluator": (list(labels), list(labels_ab))}

    write_report = write_pair_report

    def banner(self) -> Any:
        from hdeval.report.pairs import hdeval_banner, pair_banner

        return pair_banner(self, hdeval_banner)

    def headline(self) -> dict[str, float | None]:
        final = self.metrics.get("final") or {}
        return {
            "held-out agreement w/o ties": final.get("wo_ties"),
            "held-out agreement w/ ties": final.get("w_ties"),
        }

    def scored_samples(self, items: Sequence[PairSample]) -> list[Sample]:
        return side_samples(items)  # both responses, ids <pair>#a / #b

    def score(
        self,
        samples: Sequence[PairSample],
        backend=None,
        cache_dir=None,
        concurrency: int | None = None,
        progress: Progress | None = None,
    ) -> PairHdevalResult:
        """Score both responses of new pairs on the criteria the classifier uses (cached), predict."""
        pairs = list(samples)
        if not pairs:
            raise DataError("no pairs to score")
        if not all(isinstance(p, PairSample) for p in pairs):
            raise DataError(
                "this HD-Eval evaluator was trained on pairs: it scores pairs (output_a / "
                "output_b), not single outputs"
            )
        (sa, sb), usage = self.score_needed(
            pairs,
            backend,
            cache_dir,
            concurrency,
            progress,
            f"{len(pairs)} pairs x 2 responses",
            2 * len(pairs),
            score_sides,
        )
        ids = [p.id for p in pairs]
        A, B = self.on_features(sa), self.on_features(sb)
        X = A - B
        labels, labels_ab = predict_labels(self.model, X)
        proba = self.model.predict_proba(X)
        return PairHdevalResult(
            ids,
            [f"p_{c}" for c in self.classes],
            proba,
            ScoreMatrix(ids, list(self.feature_keys), X, sa.failures + sb.failures),
            usage,
            labels=labels,
            labels_ab=labels_ab,
            side_a=ScoreMatrix(ids, list(self.feature_keys), A),
            side_b=ScoreMatrix(ids, list(self.feature_keys), B),
        )

    def output_rows(self, samples: Sequence[PairSample], result: PairHdevalResult) -> list[dict[str, Any]]:
        """One JSON line per pair: the prediction, class probabilities, and per criterion the
        classifier uses both responses' scores."""
        needed = self.needed_criteria
        fails: dict[str, list[dict[str, str]]] = {}
        for f in result.criteria.failures:
            fails.setdefault(f.sample_id, []).append({"criterion": f.criterion_key, "reason": f.reason})
        rows = []
        for i, p in enumerate(samples):
            row: dict[str, Any] = {
                "id": p.id,
                "doc_id": p.doc_id,
                "prediction": result.labels[i],
                "probabilities": {
                    c.removeprefix("p_"): round(float(x), 6)
                    for c, x in zip(result.aspects, result.predictions[i])
                },
                "criteria": {
                    k: {"a": _num(result.side_a.values[i, j]), "b": _num(result.side_b.values[i, j])}
                    for j, k in enumerate(self.feature_keys)
                    if k in needed
                },
            }
            if p.id in fails:
                row["failures"] = fails[p.id]
            if p.label is not None:
                row["human"] = p.label
            rows.append(row)
        return rows

    def summary_line(self) -> str:
        m = self.metrics
        f, d = m.get("final") or {}, m.get("direct_layer1") or {}
        return (
            f"final evaluator: layer {m.get('final_layer')}, classifier {self.kind}, {len(self.feature_keys)} "
            f"criteria; held-out agreement with human labels: w/o ties {f.get('wo_ties')}, w/ ties "
            f"{f.get('w_ties')} (equal-weight sum of the layer-1 differences: w/o ties {d.get('wo_ties')}, "
            f"w/ ties {d.get('w_ties')})" + _swap_text(m.get("order_swap"))
        )

    # ------------------------------------------------------------------ saving / loading
    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        own = {"kind": self.kind, "classes": self.classes}
        return self.write_files(out, self.model, {"shape": "pairwise", "classifier": own})

    @classmethod
    def check_section(cls, meta: dict, task: Task, mpath: Path) -> tuple[str, list[str]]:
        kind, classes = meta.get("kind"), meta.get("classes")
        if not isinstance(kind, str) or kind not in CLASSIFIERS:  # a list or object is no key
            raise ArtifactError(f"{mpath}: unknown classifier kind {kind!r}")
        if (
            not isinstance(classes, list)
            or not all(isinstance(c, str) for c in classes)
            or not set(classes) <= set(PAIR_LABELS)
            or not {"a", "b"} <= set(classes)
            or len(set(classes)) != len(classes)
        ):
            raise ArtifactError(f"{mpath}: classifier classes {classes!r} must be a, b and optionally tie")
        return kind, classes

    @classmethod
    def checked_model(cls, model: Any, section: tuple, n_features: int, where: Path) -> Any:
        kind, classes = section
        got = check_pipeline(
            model,
            "classifier",
            kind,
            n_features,
            where,
            "the classifier",
            "differences",
            lambda m, X: (m.predict_proba(X), [str(c) for c in m.classes_])[1],
        )
        if got != classes:
            raise ArtifactError(f"{where}: the classifier's classes {got} are not the manifest's {classes}")
        return model


# The name docs/python-api.md gave it before it said what it is; kept for code that uses it.
PairEvaluator = PairwiseTreeEvaluator


def _swap_text(swap: Any) -> str:
    if not isinstance(swap, dict) or swap.get("verdict_changes") is None:
        return ""
    return f"; verdict changes when A and B swap places: {swap['verdict_changes']:.1%} of {swap['pairs']} test pairs"


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 6)
