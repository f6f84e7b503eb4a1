"""Explanations of a trained evaluator: SHAP values, permutation importance over the criteria
tree, the criteria-efficiency curve, per-sample explanations. Pure computation (no printing or
plotting). Clipping to an aspect's range is not additive, so SHAP explains the *unclipped*
pipeline output (``base_value + sum(shap) == prediction``), the clipped score beside it. Trees
and the linear model are explained exactly on the imputed, standardised inputs (both act feature
by feature); ``nn`` by permutation on the raw scores over training rows. ``ev``, the fitted
pointwise evaluator, is typed ``Any``: evaluator.py sits above this module."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.base import clone

from hdeval.core.errors import ArtifactError, DataError
from hdeval.core.metrics import metric_table
from hdeval.core.types import CriteriaTree
from hdeval.learn.aggregate import SIMPLE_KINDS, Aggregator, numpy_global_rng
from hdeval.methods.base import check_top
from hdeval.methods.hdeval.prune import N_REPEATS, aspect_importance

if TYPE_CHECKING:
    from hdeval.methods.base import ScoreResult

#: The explainer used for each aggregator kind (see the module docstring).
EXPLAINERS = {
    "dt": "tree",
    "rf": "tree",
    "lr": "linear",
    "nn": "permutation",
    # the means and constrained linear models are LinearRegressions with fixed weights
    **{k: "linear" for k in SIMPLE_KINDS},
}
#: Background rows for the explainers that need one (the paper uses 100).
N_BACKGROUND = 100
#: SHAP-explained samples in a report.
MAX_SAMPLES = 200
#: Model evaluations per sample for the permutation explainer (shap's default).
MAX_EVALS = 500
SCORES_FILE = "scores.csv"


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class SplitRows:
    """The rows of one split of the artifact's score table."""

    sample_ids: list[str]
    X: np.ndarray  # samples x feature_keys: raw criterion scores, NaN = failed
    Y: np.ndarray  # samples x aspects: human scores


def score_table(ev: Any) -> pd.DataFrame:
    """The training-time score table (``scores.csv``): criterion scores and human scores of
    every train and test sample. Validated: every feature and ``human:<aspect>`` column must
    be present and numeric."""
    if ev.score_table is not None:
        table = ev.score_table
        where = "the evaluator's score table"
    else:
        if ev.path is None:
            raise ArtifactError("this evaluator has no training score table (scores.csv) to explain with")
        path = ev.path / SCORES_FILE
        where = str(path)
        if not path.is_file():
            raise ArtifactError(
                f"{path} is missing: reports and SHAP background data need the training scores; retrain"
            )
        try:
            table = pd.read_csv(path, dtype={"sample_id": str, "split": str})
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # pandas' parser errors are ValueErrors
            raise ArtifactError(f"{path}: unreadable ({exc})") from exc
    needed = ["sample_id", "split", *ev.feature_keys, *(f"human:{a}" for a in ev.aggregator.aspects)]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ArtifactError(
            f"{where} lacks column(s): {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    numeric = needed[2:]
    try:
        table[numeric].to_numpy(float)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: non-numeric score ({exc})") from exc
    return table


def split_rows(ev: Any, table: pd.DataFrame, split: str) -> SplitRows:
    """Criterion scores and human scores of the rows of ``split`` ("train" or "test")."""
    rows = table[table["split"] == split]
    X = rows[list(ev.feature_keys)].to_numpy(float)
    Y = rows[[f"human:{a}" for a in ev.aggregator.aspects]].to_numpy(float)
    if np.isnan(Y).any():
        raise ArtifactError(f"the {split} rows of the score table have missing human scores")
    return SplitRows([str(s) for s in rows["sample_id"]], X, Y)


def subsample(n: int, k: int | None, random_state: int = 0) -> np.ndarray:
    """Indices of ``k`` of ``n`` rows, drawn without replacement and kept in order (all when
    ``k`` is None or at least ``n``)."""
    if k is None or k >= n:
        return np.arange(n)
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(n, size=max(k, 1), replace=False))


# --------------------------------------------------------------------------- SHAP
@dataclass(frozen=True)
class ShapResult:
    """SHAP values of one aspect. ``base_values + values.sum(1) == predictions``."""

    aspect: str
    explainer: str  # "tree" | "linear" | "permutation"
    feature_keys: list[str]
    sample_ids: list[str]
    values: np.ndarray  # samples x features
    base_values: np.ndarray  # samples (constant for these explainers, kept per sample anyway)
    predictions: np.ndarray  # unclipped pipeline output for the aspect
    data: np.ndarray  # raw criterion scores of the explained samples (NaN = missing)
    n_background: int  # background rows used (0 for the tree explainer)

    def mean_abs(self) -> np.ndarray:
        """Mean |SHAP| per feature: how far, on average, a criterion moves the prediction."""
        return np.abs(self.values).mean(axis=0) if len(self.values) else np.zeros(len(self.feature_keys))


def explainer_for(kind: str, method: str = "auto") -> str:
    """The explainer used for an aggregator kind; ``method="permutation"`` forces the
    model-agnostic one (useful to cross-check the exact explainers)."""
    if method == "auto":
        if kind not in EXPLAINERS:
            raise ArtifactError(f"no SHAP explainer for aggregator kind {kind!r}")
        return EXPLAINERS[kind]
    if method not in ("tree", "linear", "permutation"):
        raise ValueError(f"unknown SHAP method {method!r}")
    return method


def shap_explain(
    aggregator: Aggregator,
    feature_keys: Sequence[str],
    X: np.ndarray,
    sample_ids: Sequence[str],
    background: np.ndarray | None = None,
    *,
    method: str = "auto",
    max_evals: int = MAX_EVALS,
    random_state: int = 0,
) -> dict[str, ShapResult]:
    """SHAP values of every aspect for the rows ``X`` (raw criterion scores, NaN allowed).
    ``background`` (training rows, already subsampled) is required by the linear and permutation
    explainers. Aspects that share a multi-output pipeline are explained in one pass."""
    import shap  # heavy import, only when explaining

    X = np.asarray(X, float)
    kind = explainer_for(aggregator.kind, method)
    if kind != "tree" and (background is None or len(background) == 0):
        raise ArtifactError(
            "SHAP for this aggregator needs background rows (training scores); none available"
        )
    out: dict[str, ShapResult] = {}
    for group, pipe in zip(aggregator.groups, aggregator.models_):
        prep, model = pipe[:-1], pipe.named_steps["model"]
        if kind == "tree":
            expl = shap.TreeExplainer(model)(prep.transform(X))
            n_bg = 0
        elif kind == "linear":
            Zb = prep.transform(np.asarray(background, float))
            masker = shap.maskers.Independent(Zb, max_samples=len(Zb))
            expl = shap.LinearExplainer(model, masker)(prep.transform(X))
            n_bg = len(Zb)
        else:
            bg = np.asarray(background, float)

            def f(A: np.ndarray, pipe: Any = pipe) -> np.ndarray:
                return np.asarray(pipe.predict(A)).reshape(len(A), -1)

            masker = shap.maskers.Independent(bg, max_samples=len(bg))
            # 2M+1 evaluations make one forward+backward permutation; never ask for fewer.
            evals = max(max_evals, 2 * X.shape[1] + 1)
            # it seeds NumPy's global generator (np.random.seed) and shuffles with it
            with numpy_global_rng():
                explainer = shap.Explainer(f, masker, algorithm="permutation", seed=random_state)
                expl = explainer(X, max_evals=evals, silent=True)  # silent: library code never prints
            n_bg = len(bg)
        values = np.asarray(expl.values, float).reshape(len(X), X.shape[1], -1)
        base = np.asarray(expl.base_values, float).reshape(len(X), -1)
        pred = np.asarray(pipe.predict(X)).reshape(len(X), -1)  # unclipped
        for j, aspect in enumerate(group):
            out[aspect] = ShapResult(
                aspect,
                kind,
                list(feature_keys),
                list(sample_ids),
                values[:, :, j],
                base[:, j],
                pred[:, j],
                X,
                n_bg,
            )
    return {a: out[a] for a in aggregator.aspects}


# --------------------------------------------------------------------------- importance
def permutation_importances(
    aggregator: Aggregator,
    feature_keys: Sequence[str],
    X: np.ndarray,
    Y: np.ndarray,
    n_repeats: int = N_REPEATS,
    random_state: int = 0,
) -> dict[str, dict[str, float]]:
    """Per aspect, each criterion's permutation importance (mean drop in R^2 of the aspect's
    unclipped pipeline output): the measure training prunes with, keyed by criterion."""
    imp = aspect_importance(aggregator, X, Y, n_repeats, random_state)
    return {a: {k: float(v) for k, v in zip(feature_keys, imp[a])} for a in aggregator.aspects}


@dataclass(frozen=True)
class NodeImportance:
    """A criteria-tree node: ``importance``, its own permutation importance summed over the
    aspects; ``rolled_up``, that plus every descendant's (how much the aggregator relies on it
    and everything decomposed from it)."""

    key: str
    name: str
    definition: str
    layer: int
    parent: str | None
    importance: float
    rolled_up: float
    per_aspect: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {("rolled_up_importance" if k == "rolled_up" else k): v for k, v in asdict(self).items()}


def tree_importance(
    tree: CriteriaTree, per_aspect: Mapping[str, Mapping[str, float]]
) -> list[NodeImportance]:
    """Every tree node (tree order) with its own and rolled-up importance (see
    :class:`NodeImportance`). A node the aggregator has no column for counts as 0."""
    own = {c.key: float(sum(imp.get(c.key, 0.0) for imp in per_aspect.values())) for c in tree}
    rolled = dict(own)
    # Deepest layer first, so each child's total is final before it is added to its parent.
    for c in sorted(tree, key=lambda c: -c.layer):
        if c.parent_key is not None:
            rolled[c.parent_key] += rolled[c.key]
    return [
        NodeImportance(
            c.key,
            c.name,
            c.definition,
            c.layer,
            c.parent_key,
            own[c.key],
            rolled[c.key],
            {a: float(imp.get(c.key, 0.0)) for a, imp in per_aspect.items()},
        )
        for c in tree
    ]


# --------------------------------------------------------------------------- efficiency
@dataclass(frozen=True)
class EfficiencyPoint:
    """Held-out correlations of an aggregator refitted on the ``n_criteria`` most important
    criteria (``criteria``). ``n_criteria`` is also the LLM calls per sample it needs."""

    n_criteria: int
    criteria: list[str]
    correlations: dict[str, dict[str, float | None]]


def curve_sizes(n: int, max_points: int | None) -> list[int]:
    """Numbers of criteria to evaluate: every 1..n, or ``max_points`` of them spread evenly
    (always including 1 and n)."""
    if max_points is None or max_points >= n:
        return list(range(1, n + 1))
    pts = np.unique(np.round(np.linspace(1, n, max(max_points, 2))).astype(int))
    return [int(p) for p in pts]


def efficiency_curve(
    aggregator: Aggregator,
    feature_keys: Sequence[str],
    order: Sequence[str],
    train: SplitRows,
    test: SplitRows,
    max_points: int | None = None,
) -> list[EfficiencyPoint]:
    """Criteria efficiency (paper 4.3): for k = 1..n, an aggregator of the same kind refitted
    on the training split's first k criteria of ``order``, and its held-out correlations
    (clipped, as ``apply`` reports). Kept columns stay in feature order, so the point with every
    criterion is exactly the trained aggregator."""
    pos = {k: i for i, k in enumerate(feature_keys)}
    points = []
    for k in curve_sizes(len(order), max_points):
        keep = sorted(pos[c] for c in order[:k])
        agg = clone(aggregator)
        if aggregator.aspect_columns is not None:  # each aspect's columns, renumbered among the kept
            new = {c: i for i, c in enumerate(keep)}
            agg.set_params(
                aspect_columns=[[new[c] for c in cols if c in new] for cols in aggregator.aspect_columns]
            )
        agg = agg.fit(train.X[:, keep], train.Y)
        pred = agg.predict(test.X[:, keep])
        points.append(EfficiencyPoint(k, list(order[:k]), metric_table(test.Y, pred, aggregator.aspects)))
    return points


# --------------------------------------------------------------------------- per sample
def background_rows(ev: Any, n_background: int = N_BACKGROUND, random_state: int = 0) -> np.ndarray | None:
    """Up to ``n_background`` training rows of the score table, or None when the explainer of
    this aggregator needs none (trees)."""
    if explainer_for(ev.aggregator.kind) == "tree":
        return None
    train = split_rows(ev, score_table(ev), "train")
    if len(train.X) == 0:
        raise ArtifactError("the artifact's score table has no training rows to use as SHAP background")
    return train.X[subsample(len(train.X), n_background, random_state)]


def _num(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def explain_samples(
    evaluator: Any,
    result: "ScoreResult",
    top: int = 3,
    *,
    n_background: int = N_BACKGROUND,
    random_state: int = 0,
) -> list[dict[str, Any]]:
    """Per-sample explanations of :meth:`Evaluator.score` output, one dict per sample in
    result order::

        {aspect: {"prediction": float,          # unclipped pipeline output = base + sum(SHAP)
                  "clipped_prediction": float,   # the score apply reports (clipped to range)
                  "base_value": float,           # expected output over the background
                  "top": [{"criterion": key, "name": name, "shap": v,
                           "score": criterion score or None}, ...],  # largest |SHAP| first
                  "other_shap": float}}          # sum of the SHAP values not in "top"

    The background for the linear and permutation explainers is (up to ``n_background``)
    training rows of the artifact's ``scores.csv``.
    """
    check_top(top)
    m = result.criteria
    keys = list(evaluator.feature_keys)
    missing = [k for k in keys if k not in m.criterion_keys]
    if missing:
        raise DataError(f"the scores to explain lack criteria the aggregator uses: {', '.join(missing[:5])}")
    X = m.values[:, [m.criterion_keys.index(k) for k in keys]]
    if len(X) == 0:
        return []
    bg = background_rows(evaluator, n_background, random_state)
    shap_res = shap_explain(evaluator.aggregator, keys, X, result.sample_ids, bg, random_state=random_state)
    clipped = {a: result.predictions[:, j] for j, a in enumerate(result.aspects)}
    out: list[dict[str, Any]] = []
    for i in range(len(X)):
        row: dict[str, Any] = {}
        for a, r in shap_res.items():
            v = r.values[i]
            order = sorted(range(len(keys)), key=lambda j: (-abs(v[j]), j))
            chosen = order[:top]
            row[a] = {
                "prediction": float(r.predictions[i]),
                "clipped_prediction": float(clipped[a][i]) if a in clipped else None,
                "base_value": float(r.base_values[i]),
                "top": [
                    {
                        "criterion": keys[j],
                        "name": evaluator.tree[keys[j]].name if keys[j] in evaluator.tree else keys[j],
                        "shap": float(v[j]),
                        "score": _num(X[i, j]),
                    }
                    for j in chosen
                ],
                "other_shap": float(sum(v[j] for j in order[top:])),
            }
        out.append(row)
    return out
