"""``hdeval estimate``: the human mean of a set of rows with a defensible interval, from the
evaluator's scores on every row and human labels on a few (PPI++). The work is
:mod:`hdeval.run.ppi_rows`; this module turns options into one call and prints the table."""

from __future__ import annotations

import functools
import json
from typing import Any

import click

from hdeval.cli.artifacts import policy
from hdeval.cli.boundary import guarded
from hdeval.cli.options import llm_options
from hdeval.cli.progress import TerminalProgress


def _num(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(records: list[dict], alpha: float) -> list[str]:
    level = f"{1 - alpha:.0%}"
    out = [
        (
            f"{'aspect':<18} {'group':<14} {'labels':>13}  {'PPI++ estimate [' + level + ']':<27} "
            f"{'classical (labels only)':<27} {'evaluator':>9}  {'+labels':>7}"
        ),
        f"{'':<18} {'':<14} {'':>13}  {'':<27} {'':<27} {'(biased)':>9}  {'(eff.)':>7}",
    ]
    for r in records:
        if r["kind"] != "mean":
            continue
        head = f"{r['aspect']:<18} {r['group']:<14} {r['n_labelled']:>6}/{r['n']:<6}"
        if r["estimate"] is None:
            out.append(f"{head}  {'no estimate: ' + r['reason']:<55} {_num(r['evaluator_mean']):>9}")
            continue
        ppi = f"{_num(r['estimate'])} [{_num(r['low'])}, {_num(r['high'])}]"
        classical = f"{_num(r['classical'])} [{_num(r['classical_low'])}, {_num(r['classical_high'])}]"
        out.append(
            f"{head}  {ppi:<27} {classical:<27} {_num(r['evaluator_mean']):>9}  {r['labels_gained']:>+7.0f}"
        )
        more = r["more_labels"]
        margin = f"±{r['margin']:g}"
        out.append(
            f"{'':<18} {'':<14} {'':>13}  "
            + (
                f"already within {margin}"
                if more == 0
                else f"label about {more} more to reach {margin}"
                if more is not None
                else f"{margin} is out of reach by labelling these {r['n']} rows"
            )
        )
    diffs = [r for r in records if r["kind"] == "difference" and r["estimate"] is not None]
    if diffs:
        out.append(
            f"differences from group {diffs[0]['baseline']} ({level} intervals; the groups' rows are disjoint):"
        )
        for r in diffs:
            out.append(
                f"  {r['aspect']:<18} {r['group']} - {r['baseline']}: {r['estimate']:+.3f} "
                f"[{r['low']:+.3f}, {r['high']:+.3f}]  classical {r['classical']:+.3f} "
                f"[{r['classical_low']:+.3f}, {r['classical_high']:+.3f}]"
            )
    # an aspect whose baseline has no estimate has no differences: one line says why
    unbased = {r["aspect"]: r for r in records if r["kind"] == "difference" and r["estimate"] is None}
    for a, r in unbased.items():
        out.append(f"no {a} differences from group {r['baseline']}: {r['reason']}")
    return out


@click.command("estimate")
@click.argument("artifact", type=click.Path())
@click.option(
    "--data",
    "data",
    required=True,
    type=click.Path(dir_okay=False),
    metavar="ROWS.jsonl",
    help="The rows: an `hdeval apply` output of ARTIFACT (read as is: no LLM), or samples in the "
    "task's format, scored first (cached). Rows with human scores (`scores` in a sample, `human` "
    "in an apply output) are the labels; they must be a uniform random sample of the rows, or "
    "each carry `sampling_prob`. An apply output keeps no `meta`, `selection` or `sampling_prob` "
    "of the samples: give the samples file when --by or the labels need them.",
)
@click.option(
    "--by",
    default=None,
    metavar="FIELD",
    help="One estimate per value of FIELD (looked up in `meta`, then at the top level: e.g. system), "
    "and each group's difference from --baseline.",
)
@click.option(
    "--baseline",
    default=None,
    metavar="GROUP",
    help="With --by: the group the others are compared with (default: the first by name).",
)
@click.option(
    "--alpha",
    default=0.1,
    show_default=True,
    type=float,
    help="Error level: the intervals cover the human mean with probability 1 - alpha.",
)
@click.option(
    "--margin",
    default=None,
    type=float,
    metavar="X",
    help="The half-width `label about N more to reach ±X` aims at (default: half the current one).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object per line: per aspect and group (kind mean), per difference (kind difference).",
)
@click.option("--quiet", "-q", is_flag=True)
@llm_options
@guarded
def estimate(
    artifact: str,
    data: str,
    by: str | None,
    baseline: str | None,
    alpha: float,
    margin: float | None,
    as_json: bool,
    quiet: bool,
    **llm: Any,
) -> None:
    """Estimate the human mean of a set of rows, with an interval, from a few human labels.

    The evaluator scores every row; the labelled rows correct its bias (prediction-powered
    inference, PPI++). Per aspect (and group) it prints the estimate with its interval, the
    classical interval from the labels alone, the evaluator's own mean (biased), how many labels
    the evaluator is worth, and how many more labels reach a narrower interval. A pairwise task
    estimates the win rate of A over B. Rows in the artifact's training split are left out.

    \b
    Example:
      hdeval apply artifacts/summeval-nn rows.jsonl -o scored.jsonl
      hdeval estimate artifacts/summeval-nn --data scored.jsonl --by system
      hdeval estimate artifacts/summeval-nn --data rows.jsonl --json
    """
    from hdeval.run.apply import apply_file
    from hdeval.run.ppi_rows import estimate_file

    note = functools.partial(click.echo, err=True)

    def score(ev: Any, rows: str, output: str) -> None:
        progress = TerminalProgress(quiet)
        try:
            res = apply_file(ev, rows, output, progress=progress, **llm, **policy())
        finally:
            progress.close()
        u = res.usage
        note(
            f"scored {res.rows} rows: LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}"
        )

    res = estimate_file(artifact, data, by=by, alpha=alpha, margin=margin, baseline=baseline, score=score)
    for line in res.notes:
        note(line)
    if as_json:
        for r in res.records:
            click.echo(json.dumps(r))
        return
    for line in _table(res.records, res.alpha):
        click.echo(line)
