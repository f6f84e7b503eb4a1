"""The report's sections about the judges. A jury's: the learned jury against each judge alone
and the jury mean on the held-out documents, with intervals; how the judges agree and how their
errors correlate; each judge's calls, tokens, cost and importance. A refitted artifact's: the
judge swap, before and after. Every figure is read from the artifact's ``metrics.json`` (written
by :func:`hdeval.methods.hdeval.jury.jury_fit` and :func:`hdeval.methods.hdeval.refit.refit`) and
shown as recorded; the artifact is untrusted, so whatever is missing or malformed shows as "n/a"."""

from __future__ import annotations

from typing import Any, Mapping

from hdeval.report import fmt_num
from hdeval.report.plots import interval_dots
from hdeval.report.sections import Section, Table

MAJORITY = (
    "A majority vote pools choices (which of two answers is better); a jury here scores pointwise "
    "1-5 digits, whose pooling without labels is the mean above. Pairwise data take no jury yet."
)


def _get(x: Any, *path: str) -> Any:
    for p in path:
        x = x.get(p) if isinstance(x, Mapping) else None
    return x


def _names(x: Any) -> list[str]:
    return [n for n in x if isinstance(n, str)] if isinstance(x, list) else []


def _band(entry: Any) -> str:
    lo, hi = _get(entry, "low"), _get(entry, "high")
    if fmt_num(lo) == "n/a" or fmt_num(hi) == "n/a":
        return "n/a"
    return f"[{fmt_num(lo)}, {fmt_num(hi)}]"


def _signed(x: Any) -> str:
    s = fmt_num(x)
    return s if s == "n/a" or s.startswith("-") else "+" + s


def _difference(d: Any) -> str:
    """The learned jury minus an evaluator with its interval, as "+0.034 [+0.010, +0.060]"."""
    est, band = _signed(_get(d, "difference")), _band(d)
    return est if band == "n/a" else f"{est} {band}"


def _figure(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x else None


def evaluators(rec: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """(label, path under ``baselines`` and ``intervals``) of every evaluator the jury compares,
    the learned jury first."""
    dropped = set(_names(rec.get("dropped")))
    out: list[tuple[str, tuple[str, ...]]] = [
        ("learned jury", ("learned",)),
        ("jury mean (PoLL's average pooling)", ("jury_mean",)),
    ]
    judges = _get(rec, "baselines", "judges")
    for n in _names(list(judges)) if isinstance(judges, Mapping) else []:
        tag = " (dropped by --prune-judges)" if n in dropped else ""
        out.append((f"{n} alone, direct{tag}", ("judges", n, "direct")))
        out.append((f"{n} alone, HD-Eval{tag}", ("judges", n, "hdeval")))
    return out


def jury_sections(ev: Any) -> tuple[dict[str, Any], list[Section]]:
    """report.json's ``jury`` (the record as metrics.json holds it) and the page's sections."""
    rec = (ev.metrics or {}).get("jury")
    if not isinstance(rec, Mapping):
        return {}, []
    aspects = list(ev.aggregator.aspects)
    base, iv = rec.get("baselines"), rec.get("intervals")
    rows, per_aspect, dots = [], [], []
    for label, path in evaluators(rec):
        table, entry = _get(base, *path), _get(iv, *path)
        sp = _get(table, "average", "spearman")
        diff = _get(entry, "learned_minus")
        rows.append(
            [
                label,
                fmt_num(_get(table, "average", "pearson")),
                fmt_num(sp),
                _band(entry),
                "" if path == ("learned",) else _difference(diff),
            ]
        )
        per_aspect.append([label] + [fmt_num(_get(table, a, "spearman")) for a in aspects])
        dots.append((label, _figure(sp), _figure(_get(entry, "low")), _figure(_get(entry, "high"))))
    level = _figure(_get(iv, "level"))
    pct = f"{level:.0%}" if level is not None else "95%"
    docs = _figure(_get(iv, "documents"))
    resamples = _figure(_get(iv, "resamples"))
    how_iv = (
        f"{pct} intervals from {resamples:g} resamples of the {docs:g} held-out documents (a "
        "document's rows move together); the difference's interval comes from the same resamples, "
        "so it is narrower than the two figures' intervals suggest."
        if docs is not None and resamples is not None
        else "This artifact records no intervals (trained by an earlier version)."
    )
    best = max(
        (r for r in zip(evaluators(rec), dots) if r[0][1][0] == "judges" and r[1][1] is not None),
        key=lambda r: r[1][1],  # type: ignore[arg-type, return-value]
        default=None,
    )
    lines = []
    learned = _figure(_get(base, "learned", "average", "spearman"))
    if best is not None and learned is not None:
        (label, path), _ = best
        diff = _get(iv, *path, "learned_minus")
        lines.append(
            f"The learned jury's held-out average Spearman is {fmt_num(learned)}; the best single "
            f"judge here, {label}, has {fmt_num(best[1][1])}; the learned jury minus it: "
            f"{_difference(diff)}."
        )
    comparison = Section(
        "Jury: the learned jury against each judge alone and the jury mean",
        "Held-out correlation with the human scores, averaged over the aspects. The learned jury "
        "is the aggregator over every (judge, criterion) column of the judges the artifact keeps "
        "(all of them unless --prune-judges dropped some); a judge alone, direct: its own "
        "aspect scores as they are; a judge alone, HD-Eval: the same kind of aggregator fitted on "
        "its own columns only; the jury mean: the mean of the judges' aspect scores (no labels "
        "used). " + how_iv + " " + MAJORITY,
        lines=lines,
        plots=[
            (
                interval_dots(dots, "held-out average Spearman", "Held-out agreement with the humans"),
                "held-out average Spearman of each evaluator, with its interval",
            )
        ],
        tables=[
            Table(
                ["evaluator", "avg Pearson", "avg Spearman", f"{pct} interval", "learned jury minus it"],
                rows,
            ),
            Table(["held-out Spearman per aspect", *aspects], per_aspect, caption="per aspect"),
        ],
        anchor="jury",
    )

    names = _names(rec.get("judges"))
    alpha = rec.get("agreement_alpha")
    label = _label(ev)
    alpha_rows = [[label(c), fmt_num(a)] for c, a in alpha.items()] if isinstance(alpha, Mapping) else []
    errors = rec.get("error_correlation")
    err_rows = [[a] + [fmt_num(_get(errors, a, b)) for b in names] for a in names]
    eff = _figure(rec.get("effective_judges"))
    # a judge with no defined error (one score for every row) is not counted in the effective number
    undefined = [n for n in names if all(_figure(_get(errors, n, m)) is None for m in names if m != n)]
    counted = len(names) - len(undefined)
    relate = Section(
        "Jury: how the judges relate",
        "Agreement: Krippendorff's alpha (interval level) between the judges' scores of each "
        "criterion, over every row (1 = the judges agree exactly, 0 = no more than chance). Errors: "
        "each judge's aspect scores and the human scores, both standardised; a judge's error is "
        "their difference, pooled over the aspects; the table is the correlation of two judges' "
        "errors on the held-out rows. The human raters' own noise is part of every judge's error, "
        "so even judges with independent noise show correlated errors. Effective number: "
        "n / (1 + (n - 1) r), r the mean correlation between two judges' errors (clipped to 0..1): "
        "as many judges with independent errors would average away as much noise.",
        lines=[
            f"{counted} judges behave like {fmt_num(eff, 2)} independent ones."
            + (
                f" Not counted: {', '.join(undefined)}, whose errors are not defined (one score "
                "for every row)."
                if undefined
                else ""
            )
            if eff is not None
            else "The effective number of judges is not recorded (fewer than two judges, or too few rows)."
        ],
        tables=[
            Table(["criterion", "Krippendorff's alpha"], alpha_rows, caption="agreement between the judges"),
            Table(["judges' errors", *names], err_rows, caption="correlation of the judges' errors"),
        ],
    )

    kept, dropped = set(_names(rec.get("kept"))), set(_names(rec.get("dropped")))
    cost, imp = rec.get("cost"), rec.get("importance_cv_spearman")
    settings = {j.name: j for j in getattr(ev, "all_judges", lambda: [])()}
    judge_rows = []
    for n in names:
        j = settings.get(n)
        c = _get(cost, n)
        judge_rows.append(
            [
                n,
                j.llm if j is not None else "n/a",
                "kept" if n in kept else "dropped" if n in dropped else "not used",
                *(_count(_get(c, k)) for k in ("calls", "hits", "prompt_tokens", "completion_tokens")),
                "n/a (no price)" if _get(c, "cost") is None else fmt_num(_get(c, "cost"), 4),
                _signed(_get(imp, n)),
            ]
        )
    judges = Section(
        "Jury: each judge's cost and importance",
        "Calls, cache hits and tokens are this training run's; the cost is that of the new calls at "
        "the prices the jury file gave (none: no price). Importance: the grouped cross-validated "
        "Spearman on the training documents lost when the judge's columns are left out (near 0 or "
        "below: the others make up for it). Kept: the judges apply calls; --prune-judges drops a "
        "judge whose columns add nothing on cross-validation.",
        tables=[
            Table(
                [
                    "judge",
                    "model",
                    "in the artifact",
                    "calls",
                    "cache hits",
                    "prompt tokens",
                    "completion tokens",
                    "cost",
                    "importance (CV Spearman)",
                ],
                judge_rows,
                text_cols=(0, 1, 2),
            )
        ],
    )
    return {"jury": dict(rec)}, [comparison, relate, judges]


def _count(x: Any) -> str:
    f = _figure(x)
    return "n/a" if f is None else f"{f:,.0f}"


def _label(ev: Any) -> Any:
    def label(key: Any) -> str:
        key = str(key)
        name = ev.tree[key].name if key in ev.tree else ""
        return f"{key} — {name}" if name and name != key else key

    return label


def refit_sections(ev: Any) -> tuple[dict[str, Any], list[Any]]:
    """The report's section of a refitted artifact: the judge it replaced, the held-out figure
    before and after, and the change with its interval (as ``metrics.json``'s ``refit`` holds it;
    the artifact is untrusted: what is malformed shows as "n/a")."""
    rec = (ev.metrics or {}).get("refit")
    if not isinstance(rec, dict):
        return {}, []
    iv = rec.get("interval")
    lo, hi = iv if isinstance(iv, list) and len(iv) == 2 else [None, None]
    level = rec.get("level")
    pct = f"{level:.0%}" if isinstance(level, float) else "95%"
    before = rec.get("from") if isinstance(rec.get("from"), str) else "n/a"
    verdict = rec.get("verdict") if rec.get("verdict") in ("worse", "better", "no clear change") else "n/a"
    docs = rec.get("documents")
    section = Section(
        "Judge swap (hdeval refit)",
        "This artifact was refitted from another one: its labelled rows scored by a new judge on the "
        "same criteria, the same kind of aggregator fitted on the same training rows. The change is "
        f"the held-out average Spearman after minus before, with a {pct} interval from resampling "
        f"whole held-out documents ({docs if isinstance(docs, int) else 'n/a'}); worse: the interval "
        "lies below zero.",
        lines=[f"The new judge is {verdict} than {before}."],
        tables=[
            Table(
                ["judge", "held-out avg Spearman"],
                [
                    [f"before: {before}", fmt_num(rec.get("spearman_before"))],
                    [f"after: {ev.llm_identity}", fmt_num(rec.get("spearman_after"))],
                    [
                        f"change ({pct} interval)",
                        f"{fmt_num(rec.get('change'))} [{fmt_num(lo)}, {fmt_num(hi)}]",
                    ],
                ],
            )
        ],
        anchor="refit",
    )
    return {"refit": rec}, [section]
