"""A fitted aggregator read back from an artifact: the types its skops file may hold and the
checks that it is the model the manifest describes (shared by every method that learns one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hdeval.aggregate import KINDS, make_regressor
from hdeval.errors import ArtifactError

# Types the aggregator file may contain beyond what skops trusts by default; anything
# else in the file is refused before a byte of it is turned into objects.
TRUSTED_TYPES = (
    "numpy.dtype",
    "sklearn.tree._tree.Tree",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
)
# kind -> the class name of the model its pipeline ends in
ESTIMATORS = {k: type(make_regressor(k).named_steps["model"]).__name__ for k in KINDS}


def check_models(models: Any, kind: str, groups: list[list[str]], n_features: int, where: Path) -> None:
    """One fitted pipeline per aspect group, of the recorded kind, with the right widths."""
    from sklearn.pipeline import Pipeline

    if not isinstance(models, list) or len(models) != len(groups):
        raise ArtifactError(f"{where}: holds {type(models).__name__} instead of one model per aspect group "
                            f"({len(groups)})")
    for g, m in zip(groups, models):
        if not isinstance(m, Pipeline) or "model" not in m.named_steps:
            raise ArtifactError(f"{where}: the model for {', '.join(g)} is not an hdeval pipeline")
        est = m.named_steps["model"]
        if type(est).__name__ != ESTIMATORS[kind]:
            raise ArtifactError(f"{where}: the model for {', '.join(g)} is a {type(est).__name__}, "
                                f"but the manifest says aggregator {kind!r}")
        width = getattr(m, "n_features_in_", None)
        if width != n_features:
            raise ArtifactError(f"{where}: the model for {', '.join(g)} takes {width} criterion scores, "
                                f"but the manifest lists {n_features} features")
        try:
            out = np.asarray(m.predict(np.zeros((1, n_features)))).reshape(1, -1)
        except Exception as exc:  # any failure of an unusable model
            raise ArtifactError(f"{where}: the model for {', '.join(g)} cannot predict ({exc})") from None
        if out.shape[1] != len(g):
            raise ArtifactError(f"{where}: the model for {', '.join(g)} predicts {out.shape[1]} value(s) "
                                f"for {len(g)} aspect(s)")
