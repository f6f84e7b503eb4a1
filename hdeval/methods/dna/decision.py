"""From aspect scores to a verdict: the weighted totals, the tie rule, and the aggregator
learned on the training split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hdeval.core.errors import ArtifactError
from hdeval.core.types import PAIR_LABELS


def decide(total_a: float, total_b: float, tie_margin: float = 0.0) -> str:
    """The higher total wins; totals within ``tie_margin`` of each other are a tie. A learned
    margin is some training pair's |diff|: a relative tolerance keeps that pair a tie however the
    BLAS in use orders the weighted sum's additions."""
    diff = total_a - total_b
    if abs(diff) <= tie_margin * (1 + 1e-9):
        return "tie"
    return "a" if diff > 0 else "b"


def _margin_rule(diffs: np.ndarray, human: np.ndarray, seed: int) -> float:
    """The margin below which a multinomial logistic regression of the human label's relation to
    the judge (tie, the judge's side, the other side) on |diff| rates a tie likelier than the
    judge's side; snapped down to the largest of 0 and the pairs' |diff| below that crossing.

    Why a fitted curve and not the best of every candidate: with one candidate per training pair
    the best one chases that split's noise (its training agreement overstates held-out agreement);
    a curve with two parameters per class cannot."""
    from sklearn.linear_model import LogisticRegression

    d = np.abs(diffs)
    rel = np.where(human == "tie", "tie", np.where(np.where(diffs > 0, "a", "b") == human, "right", "wrong"))
    if not np.any(rel == "tie"):
        return 0.0  # without human ties any margin can only lose
    if len(set(rel.tolist())) < 2:
        return float(d.max())  # every training pair is a human tie
    candidates = np.unique(np.concatenate([[0.0], d]))
    model = LogisticRegression(max_iter=2000, random_state=seed).fit(d[:, None], rel)
    proba = model.predict_proba(candidates[:, None])
    classes = [str(c) for c in model.classes_]
    p_right = proba[:, classes.index("right")] if "right" in classes else np.zeros(len(candidates))
    tie = proba[:, classes.index("tie")] > p_right
    # the margin is one threshold: the run of candidates from 0 predicted tie
    run = len(tie) if tie.all() else int(np.argmin(tie))
    return float(candidates[run - 1]) if run else 0.0


def _hits(diffs: np.ndarray, human: np.ndarray, margin: float) -> np.ndarray:
    """Whether each pair's verdict at ``margin`` matches its human label."""
    sides = np.where(diffs > 0, "a", "b")
    return np.where(np.abs(diffs) <= margin, human == "tie", sides == human)


def learn_tie_margin(
    diffs: Sequence[float], human: Sequence[str], groups: Sequence[str] | None = None, seed: int = 0
) -> tuple[float, dict[str, Any]]:
    """The tie margin learned from each training pair's total A minus total B and human label:
    ``_margin_rule``'s, if on folds grouped by document its agreement with ties beats margin 0's
    and on the training pairs it is no worse than margin 0's; else 0 (no learned ties)."""
    from hdeval.learn.aggregate import cv_folds

    dv = np.asarray(diffs, float)
    h = np.asarray(list(human), dtype=object)
    n = len(dv)
    learned = _margin_rule(dv, h, seed) if n else 0.0
    cv_hits: list[bool] = []
    cv_zero: list[bool] = []
    folds = (
        cv_folds(list(groups) if groups is not None else [str(i) for i in range(n)], seed) if n >= 4 else []
    )
    for a, b in folds:
        cv_hits.extend(_hits(dv[b], h[b], _margin_rule(dv[a], h[a], seed)).tolist())
        cv_zero.extend(_hits(dv[b], h[b], 0.0).tolist())
    train_rule = float(np.mean(_hits(dv, h, learned))) if n else 0.0
    train_zero = float(np.mean(_hits(dv, h, 0.0))) if n else 0.0
    # a learned margin must earn its ties: better than none on held-out folds, no worse on training
    # (too few pairs for folds: the training pairs decide alone)
    earns = (
        (np.mean(cv_hits) >= np.mean(cv_zero) and train_rule >= train_zero)
        if cv_hits
        else train_rule > train_zero
    )
    margin = learned if earns else 0.0
    info = {
        "value": margin,
        "from": "training split",
        "rule": "logistic crossing" if earns else "margin 0",
        "learned_margin": learned,
        "chosen_by": (
            "grouped cross-validation on the training split: the rule's margin is kept only when its "
            "agreement with ties beats margin 0's on the held-out folds and is no worse on the "
            "training pairs; else margin 0"
        ),
        "how": "the widest margin below which a logistic regression of the human label on |total A - total B| "
        "(tie, the judge's side, the other side) rates a tie likelier than the judge's side, fitted on "
        "the training pairs; snapped down to 0 or a training pair's |total A - total B|. 'cv_w_ties' is "
        "that rule's agreement with ties on grouped cross-validation folds of the training split",
        "candidates": int(len(np.unique(np.concatenate([[0.0], np.abs(dv)])))),
        "pairs": n,
        "human_ties": int(np.sum(h == "tie")),
        "train_w_ties": round(float(np.mean(_hits(dv, h, margin))), 6) if n else None,
        "train_w_ties_at_0": round(float(np.mean(_hits(dv, h, 0.0))), 6) if n else None,
        "cv_w_ties": round(float(np.mean(cv_hits)), 6) if cv_hits else None,
        "cv_w_ties_at_0": round(float(np.mean(cv_zero)), 6) if cv_zero else None,
        "cv_folds": len(folds),
    }
    return margin, info


BIAS_P = 0.05  # a first-position advantage with a two-sided p-value below this is acted on


def p_text(p: float) -> str:
    """A p-value as a line shows it: ``p < 0.001`` below that (0 included), else ``p = 0.012``."""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def position_bias(order_totals: Sequence[tuple[float, float, float, float]]) -> dict[str, Any]:
    """How the order a pair is shown in moves its verdict, from pairs judged in both orders:
    each pair's (total A, total B) with A shown first, then with B shown first.

    A judge that adds ``x`` to whatever it shows first gives (A - B) + x in the first order and
    (A - B) - x in the second: half the difference is the first position's advantage, whose mean
    a one-sample t-test checks against 0. The flip rate (verdicts at margin 0 that change with the
    order) cannot decide alone: a fair but noisy judge flips verdicts too, in both directions."""
    from scipy.stats import ttest_1samp

    rows = np.array([t for t in order_totals if np.all(np.isfinite(t))], float).reshape(-1, 4)
    # rounded: weighted sums of the same scores differ in their last bits, which is no spread
    edge = np.round(((rows[:, 0] - rows[:, 1]) - (rows[:, 2] - rows[:, 3])) / 2, 9)
    flips = [decide(fa, fb) != decide(ra, rb) for fa, fb, ra, rb in rows]
    p: float | None = None
    if len(edge) > 1:
        if np.ptp(edge) > 0:
            p = float(ttest_1samp(edge, 0.0).pvalue)
        else:  # every pair the same advantage: none at all, or one beyond doubt
            p = 1.0 if not edge.any() else 0.0
    return {
        "pairs": int(len(edge)),
        "first_position_advantage": round(float(edge.mean()), 6) if len(edge) else None,
        "p_value": None if p is None else round(p, 6),
        "flip_rate": round(float(np.mean(flips)), 6) if flips else None,
        "biased": p is not None and p < BIAS_P,
        "threshold": f"p < {BIAS_P}",
        "test": "one-sample t-test of the first-shown response's advantage in total points "
        "(half of (A - B) shown first minus (A - B) shown second) against 0",
    }


def bias_words(probe: dict[str, Any]) -> str:
    """The measured bias in words (for a warning line)."""
    return (
        f"position bias: the response shown first gets {probe['first_position_advantage']:+.2f} points on "
        f"average ({p_text(probe['p_value'])}; the verdict changed with the order on "
        f"{probe['flip_rate']:.0%} of {probe['pairs']} training pairs judged in both orders)"
    )


def weighted_totals(
    scores_a: Sequence[float] | np.ndarray,
    scores_b: Sequence[float] | np.ndarray,
    weights: Sequence[float] | np.ndarray,
) -> tuple[float, float]:
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

    def labels(self, diffs: np.ndarray) -> tuple[list[str | None], list[str | None]]:
        """(prediction, forced to a or b) per pair; None where a difference is missing."""
        ok = ~np.isnan(diffs).any(axis=1)
        lab: list[str | None] = [None] * len(diffs)
        lab_ab: list[str | None] = [None] * len(diffs)
        if ok.any():
            for i, a, b in zip(np.flatnonzero(ok), self.predict(diffs[ok]), self.predict_ab(diffs[ok])):
                lab[i], lab_ab[i] = a, b
        return lab, lab_ab

    def to_dict(self) -> dict[str, Any]:
        return {
            "aspects": self.aspects,
            "classes": self.classes,
            "coef": self.coef.round(8).tolist(),
            "intercept": self.intercept.round(8).tolist(),
        }

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
        if (
            not set(classes) <= set(PAIR_LABELS)
            or not {"a", "b"} <= set(classes)
            or coef.shape != (rows, len(aspects))
            or intercept.shape != (rows,)
            or not np.all(np.isfinite(coef))
            or not np.all(np.isfinite(intercept))
        ):
            raise ArtifactError(f"{where}: malformed learned aggregator (shapes or labels do not fit)")
        return cls(aspects, classes, coef, intercept)


def fit_learned(X: np.ndarray, y: Sequence[str], seed: int) -> Learned:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=2000, random_state=seed).fit(X, list(y))
    return Learned(
        [], [str(c) for c in model.classes_], np.array(model.coef_, float), np.array(model.intercept_, float)
    )
