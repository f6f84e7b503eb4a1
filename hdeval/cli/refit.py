"""``hdeval refit``: an HD-Eval artifact's labelled rows scored by another LLM, refitted, the
held-out change with an interval."""

from __future__ import annotations

from typing import Any

import click

from hdeval.cli.boundary import guarded
from hdeval.cli.options import llm_options
from hdeval.cli.progress import TerminalProgress


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--data",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The samples JSONL the artifact was trained on: its training and held-out rows, with "
    "their human scores (no new label is needed).",
)
@click.option(
    "--out", "-o", required=True, type=click.Path(file_okay=False), help="The new artifact directory."
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing artifact at --out that holds only what hdeval wrote there.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="The refit's and the bootstrap's seed.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@llm_options
@guarded
def refit(artifact: str, data: str, out: str, force: bool, seed: int, quiet: bool, **llm: Any) -> None:
    """Swap the judge: score an HD-Eval artifact's labelled rows with another LLM on the same
    criteria, refit the same kind of aggregator on the same training rows, and report the
    held-out change with a 95% document-bootstrap interval.

    \b
    Example:
      hdeval refit artifacts/qa-fake --llm fake:logprobs=0 --data examples/qa.jsonl -o artifacts/qa-refit
    """
    from hdeval.artifact.directory import check_destination
    from hdeval.core.errors import ConfigError
    from hdeval.data.samples import read_task_samples
    from hdeval.llm.client import open_llm, resolved
    from hdeval.llm.config import LLMConfig, shown_identity
    from hdeval.methods.hdeval.refit import refit as run_refit
    from hdeval.methods.registry import load_artifact
    from hdeval.run.output import refuse_inputs_inside, run_inputs

    if not llm.get("llm"):
        raise ConfigError("refit needs --llm NEW: the judge to score the artifact's rows with")
    refuse_inputs_inside(out, run_inputs({"data": data, **llm}, "data", "cache_dir"))
    check_destination(out, force=force)
    ev = load_artifact(artifact)
    samples = read_task_samples(data, ev.task, require_labels=True)
    llm["model"] = llm.pop("llm")
    config = resolved(LLMConfig.from_options(**llm))
    progress = TerminalProgress(quiet)
    client = open_llm(config)
    try:
        new, change = run_refit(ev, samples, client, config, progress, seed)
    finally:
        client.close()
        progress.close()
    path = new.save(out, force=force)
    lo, hi = change["interval"]
    click.echo(
        f"held-out average spearman: {change['spearman_before']:.3f} with {ev.llm_identity}, "
        f"{change['spearman_after']:.3f} with {shown_identity(client.identity)}: change {change['change']:+.3f} "
        f"(95% interval {lo:+.3f} to {hi:+.3f}, {change['documents']} documents)"
    )
    if change["verdict"] == "worse":
        click.echo("the new judge is worse on the held-out rows: its interval lies below zero")
    elif change["verdict"] == "better":
        click.echo("the new judge is better on the held-out rows: its interval lies above zero")
    else:
        click.echo("no clear change: the interval holds zero")
    click.echo(f"artifact written to {path}")
