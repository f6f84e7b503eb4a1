"""The labelling loop's state, without the web: the pool and its criterion scores (filled in the
background), which sample each rater sees next (:mod:`hdeval.learn.selection`), the labels
(:mod:`hdeval.app.labels`), and the panel's figures, re-fitted in the background every few labels.

Every method here is quick (a pick, a write); the slow work (scoring, re-fits) runs in threads
that take a snapshot and publish their result under the lock.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hdeval.app.labels import LabelStore, content_hash
from hdeval.core.errors import ConfigError, DataError, HdevalError
from hdeval.core.types import PairSample, Sample, Task
from hdeval.data.labels_db import PAIR_ASPECT, Rating, majority_choice

DEFAULT_DOUBLE_SHARE = 0.10
DEFAULT_REFIT_EVERY = 5
SECOND_RATING_REASON = (
    "a second opinion: another person labelled this one, and agreement between people "
    "is measured on the samples two people rate"
)
UNDO_REASON = "you undid your label of this sample: label it again"
# agreement steps the panel estimates the labels for (the next one above the current figure)
STEPS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class Shown:
    """The sample a rater is asked about, and why it was picked."""

    index: int
    sample: Sample | PairSample
    reason: str
    strategy: str


@dataclass
class Fit:
    """The panel's figures of one re-fit."""

    n_labels: int
    agreement: float | None
    low: float | None
    high: float | None
    reason: str | None
    seconds: float
    aggregator: str | None = None  # the kind the re-fit kept (pointwise: as train's auto would)


@dataclass
class ScoringState:
    criteria: list[str] = field(default_factory=list)
    scored: int = 0
    total: int = 0
    stage: str = "waiting"
    error: str | None = None
    done: bool = False


def check_options(strategy: str | None, double_share: float, selection: Any = None) -> None:
    """The session's options, checked before anything is opened or written."""
    if selection is None:
        from hdeval.learn import selection
    if strategy is not None and strategy not in selection.STRATEGIES:
        raise ConfigError(f"--strategy {strategy!r}: choose one of {', '.join(selection.STRATEGIES)}")
    if not 0 <= double_share <= 1:
        raise ConfigError(f"--double-share must be between 0 and 1, got {double_share:g}")


class LabelSession:
    """One labelling run over one pool. ``selection``: the module with ``pick``, ``assess`` and
    ``labels_to_reach`` (:mod:`hdeval.learn.selection`; a test may hand another)."""

    def __init__(
        self,
        task: Task,
        samples: Sequence[Sample | PairSample],
        store: LabelStore,
        *,
        strategy: str | None = None,
        double_share: float = DEFAULT_DOUBLE_SHARE,
        refit_every: int = DEFAULT_REFIT_EVERY,
        seed: int = 0,
        selection: Any = None,
    ) -> None:
        if selection is None:
            from hdeval.learn import selection
        check_options(strategy, double_share, selection)
        self.task, self.samples, self.store, self.selection = task, list(samples), store, selection
        # the strategy picks from the first label on: before a model exists the model-based ones
        # pick a diverse sample, random stays random (a default session's labels are then a fair
        # sample, which `hdeval estimate` takes without sampling probabilities)
        self.strategy = strategy or selection.DEFAULT
        self.double_share, self.refit_every, self.seed = double_share, max(1, refit_every), seed
        self.index = {s.id: i for i, s in enumerate(self.samples)}
        self.hashes = [content_hash(s) for s in self.samples]
        self.groups = np.array([s.doc_id for s in self.samples], dtype=object)
        # a pairwise task is labelled with one choice per pair (its data's ``label``), not per aspect
        self.pairwise = task.shape == "pairwise"
        self.aspects = [PAIR_ASPECT] if self.pairwise else list(task.aspect_keys)
        self.X = np.full((len(self.samples), 0), np.nan)
        self.scored = np.zeros(len(self.samples), dtype=bool)
        self.scoring = ScoringState(total=len(self.samples))
        self._lock = threading.RLock()
        self._assigned: dict[str, Shown] = {}
        self._ratings: dict[tuple[str, str, str], Rating] = {}
        self._skipped: set[tuple[str, str]] = set()
        self.changed = store.changed(self.samples)
        self.fits: list[Fit] = []
        self._fitting = False
        self._fit_wanted = False
        self._reload()

    # what the store holds, in memory
    def _reload(self) -> None:
        self._ratings = self.store.current()
        self._skipped = self.store.skipped()

    def _valid(self, r: Rating) -> bool:
        i = self.index.get(r.sample_id)
        return i is not None and self.hashes[i] == r.content_hash

    def labelled(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows of the pool with standing labels on their present content, their mean label per
        aspect: NaN where no one rated it; a pair: the majority choice), in the order of their
        first standing label."""
        sums: dict[int, dict[str, list[float]]] = {}
        first: dict[int, int] = {}
        for r in self._ratings.values():
            if self._valid(r):
                i = self.index[r.sample_id]
                sums.setdefault(i, {}).setdefault(r.aspect, []).append(r.value)
                first[i] = min(first.get(i, r.seq), r.seq)
        # in the order they were first labelled, as `data export-labels` writes them: the grouped
        # CV behind the panel's figure then sees the rows `train` reads, in the same order
        rows = np.array(sorted(sums, key=first.__getitem__), dtype=int)
        combine = majority_choice if self.pairwise else np.mean  # the rules `data export-labels` writes
        y = np.array(
            [[float(combine(sums[i][a])) if a in sums[i] else math.nan for a in self.aspects] for i in rows]
        ).reshape(len(rows), len(self.aspects))
        return rows, y

    def raters_of(self, sample_id: str) -> set[str]:
        return {r.rater for r in self._ratings.values() if r.sample_id == sample_id and self._valid(r)}

    # scores, from the background scorer
    def set_criteria(self, criteria: Sequence[str]) -> None:
        with self._lock:
            self.scoring.criteria = list(criteria)
            self.X = np.full((len(self.samples), len(criteria)), np.nan)

    def add_scores(self, rows: Sequence[int], values: np.ndarray) -> None:
        with self._lock:
            self.X[np.asarray(rows, dtype=int)] = values
            self.scored[np.asarray(rows, dtype=int)] = True
            self.scoring.scored = int(self.scored.sum())
        self._maybe_refit()

    # what a rater sees next
    def next_for(self, rater: str) -> Shown | None:
        with self._lock:
            shown = self._assigned.get(rater)
            if shown is not None and rater not in self.raters_of(shown.sample.id):
                return shown
            shown = self._second_rating(rater) or self._pick(rater)
            if shown is not None:
                self._assigned[rater] = shown
            else:
                self._assigned.pop(rater, None)
            return shown

    def _double(self, sample_id: str) -> bool:
        digest = hashlib.sha256(f"{self.seed}:{sample_id}".encode("utf-8", "surrogatepass")).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.double_share

    def _busy(self, rater: str) -> set[int]:
        return {s.index for who, s in self._assigned.items() if who != rater}

    def _second_rating(self, rater: str) -> Shown | None:
        if self.double_share <= 0:
            return None
        busy = self._busy(rater)
        by_sample: dict[str, set[str]] = {}
        first: dict[str, int] = {}
        for r in self._ratings.values():
            if self._valid(r):
                by_sample.setdefault(r.sample_id, set()).add(r.rater)
                first[r.sample_id] = min(first.get(r.sample_id, r.seq), r.seq)
        for sid in sorted(by_sample, key=first.__getitem__):
            who = by_sample[sid]
            i = self.index[sid]
            if (
                len(who) == 1
                and rater not in who
                and i not in busy
                and (sid, rater) not in self._skipped
                and self._double(sid)
            ):
                return Shown(i, self.samples[i], SECOND_RATING_REASON, "second rating")
        return None

    def _pick(self, rater: str) -> Shown | None:
        rows, y = self.labelled()
        exclude = set(np.flatnonzero(~self.scored).tolist()) | self._busy(rater)
        exclude |= {self.index[sid] for sid, who in self._skipped if who == rater and sid in self.index}
        if len(exclude | set(rows.tolist())) >= len(self.samples):
            return None
        strategy = self.strategy
        picks = self.selection.pick(
            self.X,
            rows,
            y,
            k=1,
            strategy=strategy,
            groups=self.groups,
            seed=self.seed + len(rows),
            exclude=sorted(exclude),
            pairwise=self.pairwise,
        )
        if not picks:
            return None
        p = picks[0]
        return Shown(int(p.index), self.samples[int(p.index)], p.reason, strategy)

    # what a rater does
    def label(
        self, rater: str, session: str, sample_id: str, values: Mapping[str, Any], note: str = ""
    ) -> None:
        with self._lock:
            sample = self._sample(sample_id)
            missing = [a for a in self.aspects if a not in values]
            if missing:
                raise DataError(f"rate every aspect: {', '.join(missing)} missing")
            shown = self._assigned.get(rater)
            why = shown if shown is not None and shown.sample.id == sample_id else None
            self.store.add(
                sample,
                dict(values),
                rater=rater,
                session=session,
                note=note,
                strategy=why.strategy if why else None,
                reason=why.reason if why else None,
            )
            self._reload()
            if why is not None:
                self._assigned.pop(rater, None)
        self._maybe_refit()

    def skip(self, rater: str, session: str, sample_id: str) -> None:
        with self._lock:
            self.store.skip(self._sample(sample_id), rater=rater, session=session)
            self._reload()
            self._assigned.pop(rater, None)

    def undo(self, rater: str, session: str) -> str | None:
        with self._lock:
            sid = self.store.undo(rater=rater, session=session)
            self._reload()
            if sid is not None and sid in self.index:
                i = self.index[sid]
                self._assigned[rater] = Shown(i, self.samples[i], UNDO_REASON, "undo")
        self._maybe_refit()
        return sid

    def _sample(self, sample_id: str) -> Sample | PairSample:
        i = self.index.get(sample_id)
        if i is None:
            raise DataError(f"no sample {sample_id!r} in the pool")
        return self.samples[i]

    # re-fits, in the background
    def _maybe_refit(self) -> None:
        with self._lock:
            n = len(self.labelled()[0])
            last = self.fits[-1].n_labels if self.fits else 0
            if n < 2 or abs(n - last) < self.refit_every and self.fits:
                return
            if self._fitting:
                self._fit_wanted = True
                return
            self._fitting = True
        threading.Thread(target=self._refit_loop, name="hdeval-refit", daemon=True).start()

    def _refit_loop(self) -> None:
        while True:
            try:
                self.refit()
            except Exception as exc:  # a failed fit is shown on the panel, never a dead page
                with self._lock:
                    self.fits.append(
                        Fit(len(self.labelled()[0]), None, None, None, f"re-fit failed: {exc}", 0.0)
                    )
            with self._lock:
                if not self._fit_wanted:
                    self._fitting = False
                    return
                self._fit_wanted = False

    def refit(self) -> Fit:
        """Assess the evaluator on the labels so far (grouped CV), and record it on the curve."""
        with self._lock:
            rows, y = self.labelled()
            keep = self.scored[rows]
            X, y, groups = self.X[rows[keep]].copy(), y[keep], self.groups[rows[keep]]
            criteria = list(self.scoring.criteria)
        start = time.perf_counter()
        # pointwise: the aggregator train would build for these criteria, so the panel keeps the kind it would
        template = None if self.pairwise else self.selection.task_template(self.task, criteria, self.seed)
        a = self.selection.assess(X, y, groups, seed=self.seed, pairwise=self.pairwise, template=template)
        fit = Fit(
            int(a.n_labels), a.agreement, a.low, a.high, a.reason, time.perf_counter() - start, a.aggregator
        )
        with self._lock:
            self.fits.append(fit)
        return fit

    # the side panel
    def panel(self) -> dict[str, Any]:
        with self._lock:
            rows, _ = self.labelled()
            fits = list(self.fits)
            raters = sorted({r.rater for r in self._ratings.values()})
            scoring = self.scoring
            panel: dict[str, Any] = {
                "labelled": len(rows),
                "labels": sum(1 for r in self._ratings.values() if self._valid(r)),
                "raters": raters,
                "pool": len(self.samples),
                "scored": scoring.scored,
                "criteria": len(scoring.criteria),
                "scoring_stage": scoring.stage,
                "scoring_error": scoring.error,
                "changed": len(self.changed),
                "strategy": self.strategy,
                "fitting": self._fitting,
            }
            people = self._between_people()
        last = next((f for f in reversed(fits) if f.agreement is not None), None)
        curve = [(f.n_labels, f.agreement) for f in fits if f.agreement is not None]
        panel.update(
            {
                "fit": fits[-1] if fits else None,
                "last": last,
                "curve": curve,
                "people": people,
            }
        )
        panel["next_step"], panel["labels_needed"] = self._to_next_step(curve, last)
        return panel

    def _to_next_step(
        self, curve: list[tuple[int, float]], last: Fit | None
    ) -> tuple[float | None, int | None]:
        if last is None or last.agreement is None:
            return None, None
        step = next((s for s in STEPS if s > last.agreement + 1e-9), None)
        if step is None:
            return None, None
        needed = self.selection.labels_to_reach(curve, step)
        return step, None if needed is None else max(0, int(needed) - last.n_labels)

    def _between_people(self) -> dict[str, Any]:
        """Krippendorff's alpha per aspect (interval data; a pair's choice: nominal) over the
        samples two or more people rated; None where it cannot be told."""
        import krippendorff

        by: dict[str, dict[str, dict[str, float]]] = {}  # aspect -> rater -> sample -> value
        for r in self._ratings.values():
            if self._valid(r):
                by.setdefault(r.aspect, {}).setdefault(r.rater, {})[r.sample_id] = r.value
        level = "nominal" if self.pairwise else "interval"
        out: dict[str, Any] = {"aspects": {}, "shared": 0}
        for aspect in self.aspects:
            raters = by.get(aspect, {})
            units = sorted(
                {s for v in raters.values() for s in v if sum(s in w for w in raters.values()) >= 2}
            )
            out["shared"] = max(out["shared"], len(units))
            if len(units) < 2:
                out["aspects"][aspect] = None
                continue
            data = np.array([[v.get(s, np.nan) for s in units] for v in raters.values()], dtype=float)
            try:
                alpha = float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))
            except (ValueError, ZeroDivisionError):
                alpha = math.nan
            out["aspects"][aspect] = None if math.isnan(alpha) else alpha
        return out


# the background scorer
def score_in_background(
    session: LabelSession,
    prepare: Callable[[], Sequence[str]],
    score: Callable[[Sequence[Sample]], np.ndarray],
    *,
    chunk: int = 64,
    done: Callable[[ScoringState], None] | None = None,
    stop: threading.Event | None = None,
) -> threading.Thread:
    """Score the pool a chunk at a time in a seeded order, each chunk published as it is done,
    so the first picks start before the whole pool is scored. ``prepare`` returns the criterion
    keys (decomposing the task if needed); ``score(samples)`` a samples x criteria array (NaN
    where a reply was unusable). ``done`` is called with the final state; ``stop``, once set,
    ends the work after the chunk in progress (its replies are cached)."""

    def run() -> None:
        state = session.scoring
        try:
            state.stage = "preparing the criteria"
            session.set_criteria(prepare())
            order = np.random.default_rng(session.seed).permutation(len(session.samples))
            state.stage = "scoring the pool"
            start, size = 0, chunk
            while start < len(order):
                if stop is not None and stop.is_set():
                    state.stage = "stopped"
                    return
                rows = order[start : start + size]
                session.add_scores(rows, score([session.samples[i] for i in rows]))
                start, size = (
                    start + size,
                    min(size * 2, 1024),
                )  # small first chunks: the first picks come soon
            state.stage = "scored"
            state.done = True
        except HdevalError as exc:
            state.error, state.stage = str(exc), "failed"
        except Exception as exc:  # shown on the page and printed: the labels already given stay
            state.error, state.stage = f"{type(exc).__name__}: {exc}", "failed"
        if done is not None:
            done(state)

    thread = threading.Thread(target=run, name="hdeval-label-scoring", daemon=True)
    thread.start()
    return thread
