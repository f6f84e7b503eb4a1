"""HD-Eval with a jury: what the learned pooling is measured against (each judge alone, the
judges' mean), which judges it needs (``--prune-judges``), and the evaluator that scores new
samples with only those, each with its own settings."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from sklearn.base import clone

from hdeval.core.errors import ArtifactError
from hdeval.core.metrics import metric_table
from hdeval.core.types import ScoreMatrix
from hdeval.learn.aggregate import cv_candidates
from hdeval.methods.base import progress_stage, usage_of
from hdeval.methods.hdeval.evaluator import _EXTRA_KEYS, Evaluator, PointwiseMetrics
from hdeval.methods.hdeval.state import JuryState, PointwiseState
from hdeval.methods.jury import (
    Judge,
    agreement,
    column,
    error_correlation,
    judge_columns,
    open_jury,
    split_column,
)
from hdeval.methods.metrics_file import ABSENT, Correlations, Figure, Metrics, Table

# document resamples of the held-out figures' intervals; 1000 keep train's closing step under a
# second for a jury of three on a few hundred rows
RESAMPLES = 1000
LEVEL = 0.95
MIN_DOCUMENTS = 5  # fewer held-out documents: no interval


class Difference(Table):
    """The learned jury minus a baseline: the difference and its interval."""

    difference: Figure = None
    low: Figure = None
    high: Figure = None


class Interval(Table):
    """A held-out Spearman with its interval, and the learned jury minus it."""

    spearman: Figure = None
    low: Figure = None
    high: Figure = None
    learned_minus: Difference = ABSENT


class JuryBaselines(Table):
    judges: dict[str, dict[str, Correlations]] = ABSENT  # judge -> its columns -> figures
    jury_mean: Correlations = ABSENT
    learned: Correlations = ABSENT


class JuryIntervals(Table):
    level: Figure = None
    resamples: Figure = None
    documents: Figure = None
    learned: Interval = ABSENT
    jury_mean: Interval = ABSENT
    judges: dict[str, dict[str, Interval]] = ABSENT


class JuryFigures(Table):
    """What the jury's report reads besides (lists it checks where it reads them)."""

    baselines: JuryBaselines = ABSENT
    intervals: JuryIntervals = ABSENT
    agreement_alpha: dict[str, Figure] = ABSENT
    error_correlation: dict[str, dict[str, Figure]] = ABSENT
    effective_judges: Figure = None
    importance_cv_spearman: dict[str, Figure] = ABSENT
    cost: dict[str, dict[str, Figure]] = ABSENT


class JuryMetrics(PointwiseMetrics):
    """A jury's ``metrics.json``: pointwise HD-Eval's, and the jury's own figures."""

    jury: JuryFigures = ABSENT


# a judge is dropped when the others' columns alone do at least this well on grouped CV: less
# than this much cross-validated Spearman is fold noise on ~100 rows (the layer margin's reasoning)
PRUNE_MARGIN = 0.01


def _on(agg: Any, cols: Sequence[int]) -> Any:
    """An unfitted copy of ``agg`` for the columns ``cols`` of its matrix: the columns it reads
    per aspect renumbered, those left out dropped."""
    out = clone(agg)
    groups = getattr(agg, "aspect_columns", None)
    if groups is not None:
        where = {c: i for i, c in enumerate(cols)}
        out.set_params(aspect_columns=[[where[c] for c in g if c in where] for g in groups])
    return out


def _cv(agg: Any, X: Any, Y: Any, groups: Sequence[str], cols: Sequence[int]) -> Any:
    """``agg`` on the columns ``cols`` cross-validated as train's choice is (the same folds, each
    ranked alone; an nn re-tuned on them): its CandidateCV."""
    return cv_candidates(_on(agg, cols), X[:, list(cols)], Y, groups, (agg.kind,))[0]


def _cv_spearman(
    agg: Any, X: Any, Y: Any, groups: Sequence[str], cols: Sequence[int]
) -> tuple[Any, float | None]:
    """(its out-of-fold predictions, its figure; None when it has none, ranking nothing)."""
    cand = _cv(agg, X, Y, groups, cols)
    return cand.predictions, float(cand.spearman) if np.isfinite(cand.spearman) else None


def jury_fit(
    jury: Any,
    config: Any,
    X: Any,
    features: list[str],
    agg: Any,
    cv_pred: Any,
    Y: Any,
    tr: Any,
    te: Any,
    groups: Sequence[str],
    aspects: Sequence[str],
    progress: Any,
    test_docs: Sequence[str] | None = None,
    seed: int = 0,
) -> tuple[list[str], Any, Any, dict[str, Any]]:
    """The kept layer's evaluator with a jury: (its features, aggregator and out-of-fold training
    predictions, after ``--prune-judges``), and the jury's record for metrics.json, figures on
    the held-out rows ``te`` (``test_docs``: their documents, which the intervals resample)."""
    names = jury.names
    every = list(features)
    Xtr, Ytr = X[tr], Y[tr]

    def cols(keep: Sequence[str]) -> list[int]:
        return sorted(i for n in keep for i in judge_columns(features, n))

    _, full_cv = _cv_spearman(agg, Xtr, Ytr, groups, range(X.shape[1]))
    importance: dict[str, float | None] = {}
    for n in names:
        rest = [m for m in names if m != n]
        if not rest:
            importance[n] = None
            continue
        _, without = _cv_spearman(agg, Xtr, Ytr, groups, cols(rest))
        importance[n] = round(full_cv - without, 6) if full_cv is not None and without is not None else None
    keep = list(names)
    dropped: list[str] = []
    if config.prune_judges:
        base = full_cv
        while len(keep) > 1:
            # the judge that adds least first; its removal must cost less than PRUNE_MARGIN
            ranked = sorted(keep, key=lambda n: importance[n] if importance[n] is not None else float("inf"))
            for n in ranked:
                rest = [m for m in keep if m != n]
                _, without = _cv_spearman(agg, Xtr, Ytr, groups, cols(rest))
                if without is not None and (base is None or without >= base - PRUNE_MARGIN):
                    keep, base = rest, without
                    dropped.append(n)
                    break
            else:
                break
        if dropped:
            progress.message(
                f"--prune-judges: dropped {', '.join(dropped)} (their columns add less than "
                f"{PRUNE_MARGIN} cross-validated Spearman); apply calls {', '.join(keep)}"
            )
    kept_cols = cols(keep)
    if dropped:
        cand = _cv(agg, Xtr, Ytr, groups, kept_cols)
        # the model the figure and the out-of-fold predictions are of (an nn: its grid point here)
        cv_pred, agg = cand.predictions, clone(cand.template).fit(Xtr[:, kept_cols], Ytr)
        features = [features[i] for i in kept_cols]
        Xk = X[:, kept_cols]
    else:
        Xk = X
    learned = agg.predict(Xk[te])
    final = metric_table(Y[te], learned, aspects)
    alone: dict[str, Any] = {}
    preds: dict[tuple[str, ...], Any] = {("learned",): learned}
    firsts = []
    matrix = ScoreMatrix([str(i) for i in range(len(X))], every, X)  # every judge's columns
    for n in names:
        own = judge_columns(matrix.criterion_keys, n)
        solo = _on(agg, own).fit(X[tr][:, own], Ytr)
        direct_idx = [matrix.criterion_keys.index(column(n, a)) for a in aspects]
        firsts.append(X[:, direct_idx])
        preds[("judges", n, "direct")] = X[te][:, direct_idx]
        preds[("judges", n, "hdeval")] = solo.predict(X[te][:, own])
        alone[n] = {
            "direct": metric_table(Y[te], preds[("judges", n, "direct")], aspects),
            "hdeval": metric_table(Y[te], preds[("judges", n, "hdeval")], aspects),
        }
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row every judge failed stays NaN
        pooled = np.nanmean(np.stack(firsts), axis=0)
    preds[("jury_mean",)] = pooled[te]
    errors, effective = error_correlation(matrix, names, Y, aspects, te)
    return (
        features,
        agg,
        cv_pred,
        {
            "final": final,
            "judges": [j.name for j in jury.judges],
            "kept": keep,
            "dropped": dropped,
            "pruned_cv_spearman": base if dropped else None,
            "baselines": {
                "judges": alone,
                "jury_mean": metric_table(Y[te], pooled[te], aspects),
                "learned": final,
            },
            "intervals": held_out_intervals(
                Y[te], preds, list(test_docs) if test_docs is not None else [str(i) for i in te], seed
            ),
            "agreement_alpha": agreement(matrix, names, np.arange(len(X))),
            "error_correlation": errors,
            "effective_judges": effective,
            "importance_cv_spearman": importance,
            "cost": jury.usage(),
        },
    )


def held_out_intervals(
    Y: Any, preds: Mapping[tuple[str, ...], Any], docs: Sequence[str], seed: int = 0
) -> dict[str, Any]:
    """Each evaluator's held-out average Spearman with a percentile interval, and the learned
    jury minus it with the interval of the difference, from the same resamples of whole held-out
    documents (a document's rows move together); a difference is taken on the cells both have.
    ``preds``: path in ``baselines`` -> held-out predictions; the result is nested the same way."""
    from hdeval.core.metrics import average_spearman

    keys = list(preds)
    arrays = [np.asarray(preds[k], float) for k in keys]  # once, not in each of the resamples
    ref = keys.index(("learned",))
    learned = arrays[ref]
    # the learned jury beside an evaluator that failed some cells (a judge's failed calls): on the
    # cells that evaluator has, so a difference compares the same rows
    paired = {
        i: np.where(np.isfinite(p), learned, np.nan)
        for i, p in enumerate(arrays)
        if i != ref and not np.isfinite(p)[np.isfinite(learned)].all()
    }
    uniq = sorted(set(docs))
    rows_of = [np.flatnonzero(np.asarray(docs) == d) for d in uniq]
    rng = np.random.default_rng(seed)
    draws = np.full((RESAMPLES, len(keys)), np.nan)
    paired_draws = {i: np.full(RESAMPLES, np.nan) for i in paired}
    for b in range(RESAMPLES):
        idx = np.concatenate([rows_of[j] for j in rng.integers(0, len(uniq), len(uniq))])
        draws[b] = [average_spearman(Y[idx], p[idx]) for p in arrays]
        for i, on in paired.items():
            paired_draws[i][b] = average_spearman(Y[idx], on[idx])
    tail = (1 - LEVEL) / 2

    def band(v: Any) -> dict[str, float | None]:
        v = v[np.isfinite(v)]
        if not len(v) or len(uniq) < MIN_DOCUMENTS:  # resampling one or two documents is no interval
            return {"low": None, "high": None}
        lo, hi = np.quantile(v, [tail, 1 - tail])
        return {"low": round(float(lo), 6), "high": round(float(hi), 6)}

    def r(x: float) -> float | None:
        return round(x, 6) if np.isfinite(x) else None

    out: dict[str, Any] = {"level": LEVEL, "resamples": RESAMPLES, "documents": len(uniq)}
    for i, k in enumerate(keys):
        est = average_spearman(Y, arrays[i])
        node = out
        for part in k[:-1]:
            node = node.setdefault(part, {})
        entry: dict[str, Any] = {"spearman": r(est), **band(draws[:, i])}
        if i != ref:
            mine = paired.get(i, learned)
            entry["learned_minus"] = {
                "difference": r(average_spearman(Y, mine) - est),
                **band(paired_draws.get(i, draws[:, ref]) - draws[:, i]),
            }
        node[k[-1]] = entry
    return out


def _count_in(backend: Any, clients: Any) -> None:
    """The judges' calls, hits and tokens added to the run's client, whose counts ``apply``
    reports (it never calls it itself for a jury)."""
    stats = getattr(backend, "stats", None)
    if stats is None:
        return
    for c in clients:
        if c is not backend:
            for name in ("calls", "hits", "prompt_tokens", "completion_tokens"):
                setattr(stats, name, getattr(stats, name) + getattr(c.stats, name))


class JuryEvaluator(Evaluator):
    """HD-Eval's evaluator over (judge, criterion) columns: scoring calls only the judges its
    columns need, each with its own model, server and key variable, on the run's cache."""

    extra_keys = (*_EXTRA_KEYS, "jury")
    State: ClassVar[type[PointwiseState]] = JuryState
    # judge name -> backend, instead of the LLMs the judges name (the Python API, tests)
    judge_backends: Mapping[str, Any] | None = None

    @classmethod
    def feature_criteria(cls, features: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(split_column(f)[1] for f in features))

    def all_judges(self) -> list[Judge]:
        state = self.manifest_extra.get("jury") or {}
        return [Judge(**j) for j in state.get("judges", [])]

    def kept_judges(self) -> list[Judge]:
        kept = (self.manifest_extra.get("jury") or {}).get("kept", [])
        return [j for j in self.all_judges() if j.name in kept]

    def report_sections(self) -> tuple[dict[str, Any], list[Any]]:
        from hdeval.methods.hdeval.jury_report import jury_sections

        return jury_sections(self)

    def metrics_model(self) -> type[Metrics]:
        return JuryMetrics

    def cost_line(self) -> str:
        names = ", ".join(j.name for j in self.kept_judges())
        return super().cost_line() + f" (judges called: {names})"

    def summary_lines(self, path: Any) -> list[tuple[str, bool]]:
        lines = super().summary_lines(path)
        rec = self.metrics.get("jury") or {}
        b = rec.get("baselines") or {}

        def sp(t: Any) -> str:
            v = ((t or {}).get("average") or {}).get("spearman")
            return "n/a" if v is None else f"{v:.3f}"

        parts = [
            f"{n} direct {sp(v.get('direct'))} hdeval {sp(v.get('hdeval'))}"
            for n, v in (b.get("judges") or {}).items()
        ]
        lines.insert(
            1,
            (
                f"jury, held-out spearman: learned {sp(b.get('learned'))} | jury mean "
                f"{sp(b.get('jury_mean'))} | " + "; ".join(parts),
                False,
            ),
        )
        if rec.get("effective_judges") is not None:
            lines.insert(
                2,
                (
                    f"jury: {len(rec.get('judges', []))} judges behave like "
                    f"{rec['effective_judges']:.2f} independent ones; kept: {', '.join(rec.get('kept', []))}",
                    False,
                ),
            )
        return lines

    def score_needed(
        self,
        items: Sequence[Any],
        backend: Any,
        cache_dir: Any,
        concurrency: int | None,
        progress: Any,
        what: str,
        units: int,
        score: Any,
    ) -> tuple[Any, Any]:
        from hdeval.llm.config import DEFAULT_CONCURRENCY, LLMConfig

        only: dict[str, list[Any]] = {}
        for key in self.needed_criteria:
            judge, crit = split_column(key)
            only.setdefault(judge, []).append(self.tree[crit])
        cache_dir = cache_dir if cache_dir is not None else getattr(backend, "cache_dir", None)
        base = LLMConfig(
            model="",
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            concurrency=concurrency or DEFAULT_CONCURRENCY,
            max_calls=getattr(backend, "max_calls", None),
        )
        judges = self.trusted_judges([j for j in self.kept_judges() if j.name in only], backend)
        jury = open_jury(judges, base, backends=self.judge_backends)
        try:
            n = sum(len(v) for v in only.values())
            with progress_stage(progress, f"scoring {what} x {n} (judge, criterion) columns", units * n):
                m = jury.score(
                    score,
                    self.templates["score"],
                    self.task,
                    self.tree,
                    [],
                    items,
                    concurrency,
                    progress,
                    only=only,
                )
            _count_in(backend, jury.clients.values())
            return m, usage_of(*jury.clients.values())
        finally:
            jury.close()

    def trusted_judges(self, judges: Sequence[Judge], backend: Any) -> list[Judge]:
        """The judges as an artifact, which is untrusted, may have them called: never with the
        key of a variable it names (the key comes as for any artifact: OPENAI_API_KEY), and only
        on the server ``apply`` was allowed to call (``backend``'s) or a built-in model."""
        import dataclasses

        from hdeval.core.errors import ConfigError
        from hdeval.core.urls import public_url

        if self.judge_backends is not None:
            return list(judges)
        inner = getattr(backend, "inner", backend)
        allowed = public_url(getattr(inner, "base_url", None)) if inner is not None else None
        out = []
        for j in judges:
            url = public_url(j.base_url)
            if url is not None and url.rstrip("/") != (allowed or "").rstrip("/"):
                raise ConfigError(
                    f"judge {j.name!r} of this jury artifact is served by {url}, which this run "
                    "was not allowed to call; score with its judges behind one server "
                    "(--base-url), or retrain"
                )
            out.append(dataclasses.replace(j, api_key_env=None, base_url=j.base_url and allowed))
        return out

    @classmethod
    def from_artifact(cls, art: Any) -> "JuryEvaluator":
        from pydantic import ValidationError

        from hdeval.methods.jury import judge_models

        ev = super().from_artifact(art)
        checked = cls.read_state(art)  # as in super().from_artifact: no error here
        assert isinstance(checked, JuryState)
        record = checked.jury
        where = art.path / "manifest.json"
        JudgeSpec, _ = judge_models()
        try:
            judges = [JudgeSpec.model_validate(j) for j in record.judges]
            kept = record.kept
            if not set(kept) <= {j.name for j in judges}:
                raise ValueError("'kept' names a judge that is not among 'judges'")
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else exc
            raise ArtifactError(f"{where}: malformed 'jury' ({first})") from None
        if not {split_column(f)[0] for f in ev.feature_keys} <= set(kept):
            raise ArtifactError(f"{where}: the aggregator's columns need a judge 'jury.kept' does not name")
        return ev
