"""From aspect scores to a verdict: the weighted totals, the tie rule, and the aggregator
learned on the training split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hdeval.errors import ArtifactError
from hdeval.types import PAIR_LABELS


def decide(total_a: float, total_b: float, tie_margin: float = 0.0) -> str:
    """The higher total wins; totals within ``tie_margin`` of each other are a tie."""
    diff = total_a - total_b
    if abs(diff) <= tie_margin:
        return "tie"
    return "a" if diff > 0 else "b"


def weighted_totals(scores_a: Sequence[float], scores_b: Sequence[float],
                    weights: Sequence[float]) -> tuple[float, float]:
    """The external weighted sum of each response's aspect scores (weights sum to 1)."""
    w = np.asarray(weights, float)
    return float(np.dot(w, np.asarray(scores_a, float))), float(np.dot(w, np.asarray(scores_b, float)))


# ----------------------------------------------------------------------------- learned
@dataclass
class Learned:
    """A linear classifier on per-aspect score differences (A minus B), stored as numbers."""

    aspects: list[str]
    classes: list[str]
    coef: np.ndarray  # classes x aspects (one row for two classes: positive = classes[1])
    intercept: np.ndarray

    def decision(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, float) @ self.coef.T + self.intercept

    def predict(self, X: np.ndarray) -> list[str]:
        d = self.decision(X)
        if len(self.classes) == 2:
            return [self.classes[int(v > 0)] for v in d[:, 0]]
        return [self.classes[int(i)] for i in np.argmax(d, axis=1)]

    def predict_ab(self, X: np.ndarray) -> list[str]:
        """Forced to a or b (for the "without ties" figure)."""
        if "tie" not in self.classes:
            return self.predict(X)
        sides = [c for c in ("a", "b") if c in self.classes]
        if len(sides) == 1:  # a cross-validation fold that saw ties and one side only
            return [sides[0]] * len(np.asarray(X))
        d = self.decision(X)
        ia, ib = self.classes.index("a"), self.classes.index("b")
        return ["a" if row[ia] >= row[ib] else "b" for row in d]

    def to_dict(self) -> dict[str, Any]:
        return {"aspects": self.aspects, "classes": self.classes,
                "coef": self.coef.round(8).tolist(), "intercept": self.intercept.round(8).tolist()}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Learned":
        try:
            aspects = [str(a) for a in d["aspects"]]
            classes = [str(c) for c in d["classes"]]
            coef = np.array(d["coef"], dtype=float)
            intercept = np.array(d["intercept"], dtype=float)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed learned aggregator ({exc})") from None
        rows = 1 if len(classes) == 2 else len(classes)
        if (not set(classes) <= set(PAIR_LABELS) or not {"a", "b"} <= set(classes)
                or coef.shape != (rows, len(aspects))
                or intercept.shape != (rows,) or not np.all(np.isfinite(coef))
                or not np.all(np.isfinite(intercept))):
            raise ArtifactError(f"{where}: malformed learned aggregator (shapes or labels do not fit)")
        return cls(aspects, classes, coef, intercept)


def fit_learned(X: np.ndarray, y: Sequence[str], seed: int) -> Learned:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=2000, random_state=seed).fit(X, list(y))
    return Learned([], [str(c) for c in model.classes_], np.array(model.coef_, float),
                   np.array(model.intercept_, float))
