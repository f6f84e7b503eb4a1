"""A simulated judge at the level of the criterion-score matrix: real human scores in, criterion
scores out, no LLM. For measuring statistics that learn from labels (learning curves, adaptive
intervals) on real label distributions, fast.

Per sample ``i`` and aspect ``a`` the judge reads ``z[i, a] + misread[i, a]``: ``z`` the human
score as a normal score (ranks), ``misread`` an error shared by every criterion of that aspect
(the judge misreads the sample on that aspect; no aggregation can remove it). Each criterion adds
a ``halo[i]`` shared by every criterion of the sample and its own noise; some criteria are pure
noise that carry only the halo (the aggregator can subtract it with them). A sample's difficulty
``kappa[i]`` (log-normal) scales its misreading and its noise: a hard sample is both misjudged
and judged inconsistently, which is what a per-sample interval can see. Criterion scores are
put on the judge's 1-5 scale. Layer 1 (the direct score) is one criterion per aspect.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import norm, rankdata


@dataclass(frozen=True)
class Judge:
    halo: float = 0.6  # sd of the per-sample halo, shared by every criterion
    misread: float = 1.1  # sd of the per-sample-and-aspect error shared by an aspect's criteria
    misread_shared: float = 0.6  # correlation of one sample's misreadings across its aspects
    noise: float = 0.9  # sd of each criterion's own noise
    sub_criteria: int = 4  # informative criteria per aspect below its direct criterion
    noise_criteria: int = 1  # pure-noise criteria per aspect (halo only)
    hardness: float = 0.5  # sd of log(kappa), the per-sample difficulty

    def describe(self) -> str:
        return (f"simulated judge: halo sd {self.halo:g}, aspect misreading sd {self.misread:g}, "
                f"shared across aspects at r={self.misread_shared:g}, criterion noise sd {self.noise:g}, {self.sub_criteria} informative + "
                f"{self.noise_criteria} pure-noise criteria per aspect, per-sample difficulty "
                f"log-sd {self.hardness:g}")


@dataclass(frozen=True)
class Human:
    scores: np.ndarray  # rows x aspects
    aspects: tuple[str, ...]
    groups: np.ndarray  # doc_id per row
    ranges: tuple[tuple[float, float], ...]


# the score ranges the data sets document (README of HDEVAL_DATA_DIR)
RANGES = {
    "sfhot": {"informativeness": (1, 6), "naturalness": (1, 6), "quality": (1, 6)},
    "topical_chat": {"naturalness": (1, 3), "coherence": (1, 3), "engagingness": (1, 3),
                     "groundedness": (0, 1), "understandability": (0, 1), "overall": (1, 5)},
}


def data_file(name: str) -> Path | None:
    base = os.environ.get("HDEVAL_DATA_DIR")
    path = Path(base) / f"{name}.jsonl" if base else None
    return path if path is not None and path.is_file() else None


def load_human(name: str) -> Human | None:
    """The human scores of data set ``name`` (sfhot, topical_chat) from ``HDEVAL_DATA_DIR``;
    None when the file is absent."""
    path = data_file(name)
    if path is None:
        return None
    aspects = tuple(RANGES[name])
    rows, groups = [], []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            rows.append([float(r["scores"][a]) for a in aspects])
            groups.append(str(r["doc_id"]))
    return Human(np.array(rows), aspects, np.array(groups, object), tuple(RANGES[name][a] for a in aspects))


def normal_scores(H: np.ndarray) -> np.ndarray:
    n = len(H)
    return np.column_stack([norm.ppf((rankdata(H[:, j]) - 0.5) / n) for j in range(H.shape[1])])


@dataclass(frozen=True)
class Sheet:
    """What :func:`criteria_sheet` drew: the scores and the parts they were built from."""

    scores: np.ndarray  # rows x columns on 1-5
    direct: list[int]  # the direct criterion's column per aspect
    kappa: np.ndarray  # each row's difficulty
    aspect: list[int]  # each column's aspect
    load: list[float]  # each column's load on its aspect's reading (0: pure noise)
    reading: np.ndarray  # rows x aspects: what the judge reads (the human score misread)
    halo: np.ndarray  # each row's halo


def criteria_sheet(H: np.ndarray, judge: Judge, seed: int = 0) -> Sheet:
    """The criterion scores of :func:`criteria` with the parts they were built from, so deeper
    criteria (:func:`children`) can share them."""
    rng = np.random.default_rng(seed)
    z = normal_scores(H)
    n, m = z.shape
    kappa = np.exp(judge.hardness * rng.normal(size=n) - judge.hardness ** 2 / 2)
    halo = judge.halo * rng.normal(size=n)
    cols, direct, aspect, load, readings = [], [], [], [], []
    common = rng.normal(size=n)  # the part of a sample's misreading all its aspects share
    rho = judge.misread_shared
    for a in range(m):
        miss = np.sqrt(rho) * common + np.sqrt(1 - rho) * rng.normal(size=n)
        reading = z[:, a] + judge.misread * kappa * miss
        readings.append(reading)
        direct.append(len(cols))
        loads = [1.0] + list(rng.uniform(0.4, 1.0, size=judge.sub_criteria)) + [0.0] * judge.noise_criteria
        for w in loads:
            cols.append(w * reading + halo + judge.noise * kappa * rng.normal(size=n))
            aspect.append(a)
            load.append(float(w))
    return Sheet(_on_scale(np.column_stack(cols)), direct, kappa, aspect, load, np.column_stack(readings), halo)


def _on_scale(X: np.ndarray) -> np.ndarray:
    return np.clip(3 + 1.2 * X / X.std(axis=0), 1, 5)


def criteria(H: np.ndarray, judge: Judge, seed: int = 0) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(criterion scores rows x columns on 1-5, the direct criterion's column per aspect, each
    row's difficulty). Columns per aspect: direct, informative sub-criteria, pure noise."""
    s = criteria_sheet(H, judge, seed)
    return s.scores, s.direct, s.kappa


def children(sheet: Sheet, judge: Judge, parents: list[int], per_parent: int = 3, seed: int = 0) -> np.ndarray:
    """The criteria a decomposition of each of ``parents`` (columns of ``sheet``) adds, ``per_parent``
    each: a child reads what its parent reads at most as strongly (a pure-noise criterion's
    children are pure noise too), with the same halo and its own noise. Rows x children, parent
    by parent."""
    rng = np.random.default_rng(seed)
    n = len(sheet.halo)
    cols = [
        sheet.load[c] * rng.uniform(0.7, 1.0) * sheet.reading[:, sheet.aspect[c]] + sheet.halo
        + judge.noise * sheet.kappa * rng.normal(size=n)
        for c in parents
        for _ in range(per_parent)
    ]
    return _on_scale(np.column_stack(cols)) if cols else np.zeros((n, 0))
