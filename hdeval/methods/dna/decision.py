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


def learn_tie_margin(diffs: Sequence[float], human: Sequence[str]) -> tuple[float, dict[str, Any]]:
    """The tie margin with the highest agreement with ties on labelled training pairs.

    ``diffs``: total A minus total B of each training pair with a verdict; ``human``: their
    labels. The candidates are 0 and every observed ``|diff|`` (agreement only changes there);
    on a draw the smallest wins, so without human ties the margin stays 0.
    """
    d = np.abs(np.asarray(diffs, float))
    h = np.asarray(list(human), dtype=object)
    sides = np.where(np.asarray(diffs, float) > 0, "a", "b")
    candidates = np.unique(np.concatenate([[0.0], d]))
    # a pair within the margin is predicted a tie, else its side (the two hit counts below)
    side_hit = sides == h
    tie_hit = h == "tie"
    hits = np.array([int(np.sum(np.where(d <= m, tie_hit, side_hit))) for m in candidates])
    best = int(np.argmax(hits))  # the first maximum: the smallest margin
    n = len(d)
    info = {"value": float(candidates[best]), "from": "training split",
            "how": "the candidate with the highest agreement with ties on the training pairs (the smallest "
                   "on a draw); candidates: 0 and each training pair's |total A - total B|",
            "candidates": len(candidates), "pairs": n, "human_ties": int(np.sum(tie_hit)),
            "train_w_ties": round(hits[best] / n, 6) if n else None,
            "train_w_ties_at_0": round(hits[0] / n, 6) if n else None}
    return float(candidates[best]), info


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
