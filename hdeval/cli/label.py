"""``hdeval label`` (the labelling app) and ``hdeval data export-labels``: options -> one library
call -> printed lines. The app itself is :mod:`hdeval.app`."""

from __future__ import annotations

import functools
import threading
import webbrowser

import click

from hdeval.cli.boundary import guarded
from hdeval.cli.options import llm_options, server_options

# Ctrl-C is how the server is stopped: say what was kept
_stopped = functools.partial(
    guarded,
    interrupted="stopped: every label the page acknowledged is in the labels file, "
    "every finished LLM call in the cache; rerun the same command to go on",
)


@click.command("label")
@click.option("--task", required=True, help="Built-in task (see `hdeval tasks`) or path to a task .toml.")
@click.option(
    "--data",
    required=True,
    type=click.Path(dir_okay=False),
    help="The pool: samples JSONL to label (they need no scores).",
)
@click.option(
    "--labels",
    required=True,
    type=click.Path(dir_okay=False),
    help="labels.db: where the labels go (SQLite, append-only; created if missing).",
)
@click.option(
    "--artifact",
    default=None,
    type=click.Path(file_okay=False),
    help="Score the pool on this HD-Eval artifact's criteria. Default: the task's aspects and their "
    "first decomposition, as `train --layers 2` makes them.",
)
@server_options(port=8765)
@click.option(
    "--strategy",
    default=None,
    help="How the next sample is picked (random is the control). Default: hdeval's measured default.",
)
@click.option(
    "--double-share",
    default=0.10,
    show_default=True,
    type=float,
    help="Share of samples that go to a second rater (agreement between people).",
)
@click.option(
    "--refit-every", default=5, show_default=True, type=int, help="Re-fit after this many new labels."
)
@click.option("--seed", default=0, show_default=True, type=int)
@llm_options
@_stopped
def label(
    task,
    data,
    labels,
    artifact,
    host,
    port,
    open_browser,
    strategy,
    double_share,
    refit_every,
    seed,
    llm,
    base_url,
    concurrency,
    timeout,
    max_retries,
    cache_dir,
    max_calls,
) -> None:
    """Label samples in a local web page: it asks for the samples that teach the evaluator most and
    re-fits as you go. Labels are stored in LABELS as you give them. A pairwise task is labelled
    with one choice per pair: A, B or tie (keys a, b, t)."""
    from hdeval.app.launch import prepare
    from hdeval.llm.config import LLMConfig

    config = LLMConfig.from_options(
        model=llm,
        base_url=base_url,
        concurrency=concurrency,
        timeout=timeout,
        max_retries=max_retries,
        cache_dir=cache_dir,
        max_calls=max_calls,
    )
    app = prepare(
        task=task,
        data=data,
        labels=labels,
        llm=config,
        artifact=artifact,
        host=host,
        port=port,
        strategy=strategy,
        double_share=double_share,
        refit_every=refit_every,
        seed=seed,
        notify=lambda line: click.echo(line, err=True),
    )
    try:
        app.start_scoring(concurrency)
        what = "pairs" if app.session.pairwise else "samples"
        click.echo(
            f"labelling {app.session.task.name}: {len(app.session.samples)} {what} in the pool, labels in "
            f"{labels}",
            err=True,
        )
        click.echo(f"open {app.url}", err=True)
        click.echo(app.url)
        if open_browser:
            threading.Timer(0.5, webbrowser.open, (app.url,)).start()
        app.serve()
    finally:
        app.close()


@click.command("export-labels")
@click.argument("labels_db", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSONL to write: the labelled samples in the format train, benchmark and apply read.",
)
@click.option(
    "--raw", is_flag=True, help="Write every row of the labels file instead (labels, undos, skips)."
)
@click.option("--force", is_flag=True, help="Overwrite an existing --out.")
@guarded
def export_labels(labels_db, out, raw, force) -> None:
    """Write the labels of LABELS_DB as samples (scores: the mean over raters; a pair's label: the
    majority choice, a tie when two choices are equally frequent) or raw rows."""
    from hdeval.app.labels import export_labels as export

    n = export(labels_db, out, force=force, raw=raw)
    click.echo(f"wrote {n} {'rows' if raw else 'labelled samples'} to {out}", err=True)
