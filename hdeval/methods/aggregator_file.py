"""A fitted aggregator read back from an artifact: the types its skops file may hold and the
checks that it is the model the manifest describes (shared by every method that learns one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from hdeval.core.errors import ArtifactError
from hdeval.learn.aggregate import CANDIDATES, make_regressor
from hdeval.learn.classify import CLASSIFIERS

# Types the aggregator file may contain beyond what skops trusts by default; anything
# else in the file is refused before a byte of it is turned into objects.
TRUSTED_TYPES = (
    "numpy.dtype",
    "sklearn.tree._tree.Tree",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
)
# kind -> the class name of the model its pipeline ends in
ESTIMATORS = {k: type(make_regressor(k).named_steps["model"]).__name__ for k in CANDIDATES}


def check_pipeline(
    m: Any,
    fitted: str,
    kind: str,
    n_features: int,
    where: Path,
    what: str,
    inputs: str,
    probe: Callable[[Any, np.ndarray], Any],
) -> Any:
    """``m`` is an hdeval pipeline ending in the ``fitted`` (aggregator or classifier) model of ``kind``,
    taking ``n_features`` ``inputs``; ``probe(m, a row of zeros)``, its answer (any failure: the
    model cannot predict)."""
    from sklearn.pipeline import Pipeline

    if not isinstance(m, Pipeline) or "model" not in m.named_steps:
        raise ArtifactError(f"{where}: {what} is not an hdeval pipeline")
    est = type(m.named_steps["model"]).__name__
    if est != (ESTIMATORS if fitted == "aggregator" else CLASSIFIERS)[kind]:
        raise ArtifactError(f"{where}: {what} is a {est}, but the manifest says {fitted} {kind!r}")
    width = getattr(m, "n_features_in_", None)
    if width != n_features:
        raise ArtifactError(
            f"{where}: {what} takes {width} {inputs}, but the manifest lists {n_features} features"
        )
    try:
        return probe(m, np.zeros((1, n_features)))
    except Exception as exc:  # any failure of an unusable model
        raise ArtifactError(f"{where}: {what} cannot predict ({exc})") from None


def check_models(models: Any, kind: str, groups: list[list[str]], n_features: int, where: Path) -> None:
    """One fitted pipeline per aspect group, of the recorded kind, with the right widths."""
    if not isinstance(models, list) or len(models) != len(groups):
        raise ArtifactError(
            f"{where}: holds {type(models).__name__} instead of one model per aspect group ({len(groups)})"
        )
    for g, m in zip(groups, models):
        out = check_pipeline(
            m,
            "aggregator",
            kind,
            n_features,
            where,
            f"the model for {', '.join(g)}",
            "criterion scores",
            lambda m, X: np.asarray(m.predict(X)).reshape(1, -1),
        )
        if out.shape[1] != len(g):
            raise ArtifactError(
                f"{where}: the model for {', '.join(g)} predicts {out.shape[1]} value(s) "
                f"for {len(g)} aspect(s)"
            )
