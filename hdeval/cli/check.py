"""``hdeval check``: the CI gate, one line and an exit code (:mod:`hdeval.run.check`)."""

from __future__ import annotations

import sys
from typing import Any

import click

from hdeval.cli.artifacts import policy
from hdeval.cli.boundary import guarded
from hdeval.cli.options import llm_options
from hdeval.cli.progress import TerminalProgress


@click.command()
@click.argument("artifact", type=click.Path())
@click.option(
    "--data",
    required=True,
    type=click.Path(dir_okay=False),
    help="Human-rated samples the evaluator was not trained on (any format apply reads).",
)
@click.option(
    "--min-spearman",
    type=float,
    default=None,
    help="Pointwise: fail below this held-out Spearman, averaged over the aspects.",
)
@click.option(
    "--min-agreement",
    type=float,
    default=None,
    help="Pairwise: fail below this held-out agreement with the human labels (ties counted).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@llm_options
@guarded
def check(
    artifact: str, data: str, min_spearman: float | None, min_agreement: float | None, quiet: bool, **llm: Any
) -> None:
    """Fail (exit 1, one line) when an evaluator agrees with human ratings less than a threshold.

    Scores DATA as `hdeval apply` does (same prompts, LLM and cache: a rerun on the same data
    and LLM makes no call) and compares the rows the artifact was not trained on with their
    human scores or labels: a gate for CI when a prompt, a model or the data drifts. Exit 0
    when at or above the threshold, 1 below it, 2 for bad input.

    \b
    Example:
      hdeval check artifacts/my-eval --data gold.jsonl --min-spearman 0.5
      hdeval check artifacts/pairs-dna --data gold_pairs.jsonl --min-agreement 0.7
    """
    from hdeval.run.check import check_alignment

    progress = TerminalProgress(quiet)
    try:
        terms = policy()
        say = terms["notify"]  # warnings only: the counts apply prints are not this command's
        terms["notify"] = lambda line: say(line) if line.startswith("warning:") else None
        res = check_alignment(
            artifact,
            data,
            min_spearman=min_spearman,
            min_agreement=min_agreement,
            progress=progress,
            **llm,
            **terms,
        )
    finally:
        progress.close()
    click.echo(res.line, err=not res.passed)
    if not res.passed:
        sys.exit(1)
