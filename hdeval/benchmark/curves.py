"""Learning curves: how good the evaluator gets with how many labels, per selection strategy.

A simulated labelling on a trained run's criterion scores (no LLM call): starting from no label,
a strategy of :mod:`hdeval.learn.selection` picks rows of the training split, whose human labels
are revealed only when picked; at each budget the aggregator is re-fitted on the labels so far
and scored on the held-out documents (pointwise: mean Spearman over aspects; pairwise: the share
of verdicts that agree, ties included). Repeated with different seeds; the full-label line is the
same aggregator fitted on every training row.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from sklearn.base import clone

from hdeval.core.errors import ConfigError
from hdeval.core.metrics import agreement_w_ties, average_spearman, label_codes
from hdeval.learn.aggregate import CANDIDATES, KINDS, Aggregator, choose_aggregator, fit_warnings
from hdeval.learn.classify import make_classifier
from hdeval.learn.selection import PAIR_LABELS, STRATEGIES, labels_to_reach, pick, task_template

#: Labels revealed per pick call: a person labels a handful before the evaluator is re-fitted.
BATCH = 5
#: Share of the full-label agreement a strategy must reach for "labels needed".
REACH = 0.95
#: What a curve can re-fit at each budget: one kind, or ``auto``, chosen among the candidates by
#: grouped cross-validation on the labels so far, as ``train`` and ``hdeval label`` choose it.
#: Pairwise runs re-fit one classifier kind (``auto``: lr).
CURVE_KINDS = CANDIDATES + ("auto",)


def has_target(full: Any) -> bool:
    """Whether :data:`REACH` of a full-label figure is something to reach: a number above 0 (a
    share of agreement at or below 0 is none)."""
    return isinstance(full, (int, float)) and math.isfinite(full) and full > 0


DEFAULT_BUDGETS = (10, 20, 50, 100, 200)
DEFAULT_SELECTION = ("random", "uncertainty", "hybrid")


@dataclass(frozen=True)
class CurveSpec:
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    strategies: tuple[str, ...] = DEFAULT_SELECTION
    repeats: int = 10
    aggregator: str = "lr"

    def validate(self) -> None:
        if not self.budgets or any(not isinstance(b, int) or b < 1 for b in self.budgets):
            raise ConfigError(f"--label-budget must be whole numbers >= 1, got {list(self.budgets)}")
        if list(self.budgets) != sorted(set(self.budgets)):
            raise ConfigError(f"--label-budget must rise, each budget once, got {list(self.budgets)}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            raise ConfigError(
                f"--selection: unknown {', '.join(bad) or '(none given)'}; choose from "
                f"{', '.join(STRATEGIES)}"
            )
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ConfigError(f"--repeats must be at least 1, got {self.repeats}")
        if self.aggregator not in CURVE_KINDS:
            raise ConfigError(
                f"learning curves re-fit an aggregator kind ({', '.join(CURVE_KINDS)}), got {self.aggregator!r}"
            )


def _fit_score(
    X: np.ndarray,
    Y: np.ndarray,
    rows: np.ndarray,
    test: np.ndarray,
    kind: str,
    seed: int,
    pairwise: bool,
    template: Aggregator,
    groups: Any,
) -> float:
    """Held-out figure of the aggregator fitted on ``rows`` (``auto``: the kind ``train``'s chooser
    keeps on them, by grouped cross-validation); NaN when it cannot be fitted yet."""
    y = Y[rows]
    if pairwise:
        labels = [PAIR_LABELS.get(float(v)) for v in y[:, 0]]
        if len(set(labels)) < 2:
            return float("nan")
        with fit_warnings():
            model = make_classifier(kind if kind in KINDS else "lr", seed).fit(X[rows], labels)
        pred = label_codes([str(p) for p in model.predict(X[test])])
        human = label_codes([PAIR_LABELS.get(float(v)) for v in Y[test, 0]])
        return agreement_w_ties(human, np.column_stack([pred, pred]))
    ok = np.isfinite(y).all(axis=1)
    if ok.sum() < 3:
        return float("nan")
    fit_rows = rows[ok]
    base = clone(template).set_params(random_state=seed)
    with fit_warnings():
        if kind == "auto":
            chosen = choose_aggregator(
                base, X[fit_rows], Y[fit_rows], [str(g) for g in groups[fit_rows]], n_jobs=1
            )
            agg = clone(chosen[0].template).fit(X[fit_rows], Y[fit_rows])
        else:
            agg = base.set_params(kind=kind).fit(X[fit_rows], Y[fit_rows])
    return average_spearman(Y[test], agg.predict(X[test]))


def simulate(
    X: Any,
    Y: Any,
    groups: Sequence[Any],
    train: Sequence[int],
    test: Sequence[int],
    spec: CurveSpec,
    *,
    pairwise: bool = False,
    ranges: Sequence[tuple[float, float]] | None = None,
    progress: Callable[[str], None] | None = None,
    template: Aggregator | None = None,
) -> dict[str, Any]:
    """The learning curves of one run: ``X`` criterion scores and ``Y`` human scores (pairwise:
    one column coded +1/0/-1) of every row, ``train``/``test`` its split; ``template``: the
    unfitted aggregator ``train`` would build (its aspects, ranges and each aspect's columns, which
    ``direct`` and ``aspect_mean`` read), else a plain one over ``ranges``. Returns the full-label
    figure, per strategy and budget the figure of every repeat, and per strategy the labels each
    repeat needed to reach :data:`REACH` of the full-label figure: ``needed``, the first budget
    whose figure reached it (None: none did), and ``estimated``, :func:`labels_to_reach` on the
    repeat's curve (which may extrapolate beyond the budgets)."""
    spec.validate()
    X, Y = np.asarray(X, float), np.asarray(Y, float)
    Y = Y.reshape(len(Y), -1)
    train, test = np.asarray(train, int), np.asarray(test, int)
    groups = np.asarray(groups, object)
    budgets = [b for b in spec.budgets if b <= len(train)]
    if not budgets:
        raise ConfigError(
            f"--label-budget: the training split has {len(train)} rows, fewer than the "
            f"smallest budget {min(spec.budgets)}"
        )
    if template is None:
        template = Aggregator("lr", ranges=ranges)
    full = _fit_score(X, Y, train, test, spec.aggregator, 0, pairwise, template, groups)
    pool = X[train]
    per: dict[str, dict[int, list[float]]] = {s: {b: [] for b in budgets} for s in spec.strategies}
    needed: dict[str, list[int | None]] = {s: [] for s in spec.strategies}
    estimated: dict[str, list[int | None]] = {s: [] for s in spec.strategies}
    for strategy in spec.strategies:
        for r in range(spec.repeats):
            if progress is not None:
                progress(f"learning curve: {strategy}, repeat {r + 1}/{spec.repeats}")
            chosen: list[int] = []  # rows of the pool, in the order picked
            curve = []
            for b in budgets:
                while len(chosen) < b:
                    k = min(BATCH, b - len(chosen))
                    got = pick(
                        pool,
                        chosen,
                        Y[train[chosen]] if chosen else np.zeros((0, Y.shape[1])),
                        k=k,
                        strategy=strategy,
                        groups=groups[train],
                        seed=1000 * r + len(chosen),
                        pairwise=pairwise,
                    )
                    chosen += [p.index for p in got]
                value = _fit_score(
                    X, Y, train[np.array(chosen)], test, spec.aggregator, r, pairwise, template, groups
                )
                per[strategy][b].append(value)
                curve.append((b, value))
            if not has_target(full):
                needed[strategy].append(None)
                estimated[strategy].append(None)
                continue
            target = REACH * full
            reached = [n for n, v in curve if math.isfinite(v) and v >= target]
            needed[strategy].append(min(reached) if reached else None)
            estimated[strategy].append(
                labels_to_reach([(n, v) for n, v in curve if math.isfinite(v)], target)
            )
    return {
        "full_label": full,
        "train_rows": int(len(train)),
        "test_rows": int(len(test)),
        "budgets": budgets,
        "repeats": spec.repeats,
        "aggregator": spec.aggregator,
        "metric": "agreement (ties included)" if pairwise else "average spearman",
        "curves": {s: {str(b): v for b, v in c.items()} for s, c in per.items()},
        "needed": needed,
        "estimated": estimated,
    }


def summarise(result: dict[str, Any], seed: int = 0, resamples: int = 2000) -> dict[str, Any]:
    """Per strategy and budget: mean and 5-95% range over repeats; per strategy the median labels
    needed to reach :data:`REACH` of full-label agreement, with a 90% bootstrap interval over
    repeats (a repeat that did not reach it within the budgets counts as more than the largest
    budget: such a median or bound is None), and the share of repeats that reached it."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"full_label": result["full_label"], "reach": REACH, "strategies": {}}
    for s, per_budget in result["curves"].items():
        points = {}
        for b, vals in per_budget.items():
            v = np.array([x for x in vals if x is not None and math.isfinite(x)])
            points[b] = {
                "mean": float(v.mean()) if len(v) else None,
                "low": float(np.quantile(v, 0.05)) if len(v) else None,
                "high": float(np.quantile(v, 0.95)) if len(v) else None,
            }
        need = np.array([np.inf if n is None else float(n) for n in result["needed"][s]])
        boot = np.median(rng.choice(need, size=(resamples, len(need)), replace=True), axis=1)
        lo, hi = np.quantile(boot, 0.05, method="lower"), np.quantile(boot, 0.95, method="higher")

        def finite(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        out["strategies"][s] = {
            "points": points,
            "labels_needed": finite(float(np.median(need))),
            "labels_needed_low": finite(lo),
            "labels_needed_high": finite(hi),
            "reached": float(np.mean(np.isfinite(need))),
        }
    return out


def run_matrix(
    fitted: Any, doc_of: Mapping[str, str], pairwise: bool
) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray, list]:
    """A trained learned run's criterion scores and human labels, read from its score table (no
    LLM call): (X, Y, groups, train rows, test rows, ranges or None). Pairwise: X the criterion
    differences A minus B, Y the label coded +1 (a), 0 (tie), -1 (b)."""
    from hdeval.benchmark.heldout import _score_table

    table = _score_table(fitted)
    keys = list(fitted.feature_keys)
    id_col = "pair_id" if pairwise else "sample_id"
    ids = [str(s) for s in table[id_col]]
    groups = [doc_of.get(s, s) for s in ids]
    split = table["split"].to_numpy()
    if pairwise:
        X = table[[f"{k}:a" for k in keys]].to_numpy(float) - table[[f"{k}:b" for k in keys]].to_numpy(float)
        code = {"a": 1.0, "tie": 0.0, "b": -1.0}
        Y = np.array([code.get(x, np.nan) if isinstance(x, str) else np.nan for x in table["human"]])[:, None]
        ranges = None
    else:
        aspects = list(fitted.task.aspect_keys)
        X = table[keys].to_numpy(float)
        Y = table[[f"human:{a}" for a in aspects]].to_numpy(float)
        ranges = [fitted.task.aspect(a).range for a in aspects]
    labelled = np.isfinite(Y).all(axis=1)
    train = np.flatnonzero((split == "train") & labelled)
    test = np.flatnonzero((split == "test") & labelled)
    return X, Y, groups, train, test, ranges


def learning_curves(
    runs: Sequence[tuple[str, float, int, Any, Mapping[str, str], str]],
    spec: CurveSpec,
    pairwise: bool,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """The curves of each learned run ``(setting name, train frac, seed, fitted, doc_of,
    aggregator)``: :func:`simulate` (re-fitting the run's own aggregator kind, ``auto`` choosing
    as ``train`` does) and :func:`summarise` of it, for results.json's ``learning_curves``."""
    out = []
    for name, frac, seed, fitted, doc_of, kind in runs:
        X, Y, groups, train, test, ranges = run_matrix(fitted, doc_of, pairwise)
        own = dataclasses.replace(spec, aggregator=kind if kind in CURVE_KINDS else spec.aggregator)
        template = None if pairwise else task_template(fitted.task, list(fitted.feature_keys), seed)
        res = simulate(
            X,
            Y,
            groups,
            train,
            test,
            own,
            pairwise=pairwise,
            ranges=ranges,
            progress=progress,
            template=template,
        )
        out.append(
            {"setting": name, "train_frac": frac, "seed": seed, **res, "summary": summarise(res, seed)}
        )
    return out


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def curve_tables(results: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """results.md's learning-curve tables: per run, the held-out figure per budget and strategy
    (mean and 5th-95th percentile over repeats) and the labels needed to reach 95% of full-label
    agreement (median over repeats with a 90% bootstrap interval)."""
    tables = []
    for run in results.get("learning_curves") or []:
        s, budgets = run["summary"], run["budgets"]
        full = run["full_label"]
        intro = (
            f"Learning curves of {run['setting']} (train frac {run['train_frac']:g}, seed {run['seed']}): "
            f"held-out {run['metric']} against labels used, labelling from none in the "
            f"{run['train_rows']}-row training pool ({run['aggregator']} aggregator re-fitted at each "
            f"budget, {run['repeats']} repeats, mean [5th-95th percentile]); with every training label: "
            f"{_num(full)}. "
        )
        target = has_target(full)
        intro += (
            f"Labels to 95% of it ({_num(REACH * full)}): the first budget that reached it, median over "
            f"repeats [90% CI]; '>{budgets[-1]}': not within the budgets."
            if target
            else "Labels to 95% of it: n/a, as the full-label figure is not above 0."
        )
        head = ["strategy", *[f"{b} labels" for b in budgets], "labels to 95%"]
        rows = []
        for strat, row in s["strategies"].items():
            cells = []
            for b in budgets:
                p = row["points"][str(b)]
                cells.append(
                    "n/a" if p["mean"] is None else f"{p['mean']:.3f} [{p['low']:.2f}, {p['high']:.2f}]"
                )

            def lab(x: float | None) -> str:
                return f">{budgets[-1]}" if x is None else f"{x:g}"  # noqa: B023 (called within this iteration)

            needed = (
                f"{lab(row['labels_needed'])} [{lab(row['labels_needed_low'])}, {lab(row['labels_needed_high'])}]"
                if target
                else "n/a"
            )
            rows.append([strat, *cells, needed])
        tables.append((intro, head, rows))
    return tables
