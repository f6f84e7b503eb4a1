"""``hdeval data``: get the built-in tasks' human-judgment data, see where it is, import your own.
Only terminal work lives here; the logic is in :mod:`hdeval.data.datasets`."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from hdeval.cli.boundary import guarded
from hdeval.cli.progress import _end_open_line, _set_line_open
from hdeval.core.errors import DataError, DownloadError
from hdeval.data import datasets
from hdeval.data.datasets import (
    DATASETS,
    DEFAULT_SOURCE_URL,
    DEFAULT_TIMEOUT,
    SOURCE_URL_ENV,
    ColumnMap,
    DownloadEvent,
    data_candidates,
    load_task,
)

# Downloads and imports write under temp names and rename at the end: an interrupt leaves nothing partial.
_errors_to_exit = functools.partial(
    guarded, interrupted="interrupted: no partial file was written; rerun to continue"
)


@click.group("data")
def data() -> None:
    """Get, inspect and import human-judgment data (JSONL in hdeval's sample schema)."""


class _Reporter:
    """Download progress on stderr: a byte counter on a terminal (its line left open), lines otherwise."""

    def __init__(self, announce: bool = True) -> None:
        self.tty = sys.stderr.isatty()
        self.announce = announce

    def __call__(self, ev: DownloadEvent) -> None:
        if ev.kind == "bytes":
            if self.tty:
                total = f" of {ev.total_bytes / 1e6:.1f}" if ev.total_bytes else ""
                click.echo(f"\r  {ev.done_bytes / 1e6:.1f}{total} MB", err=True, nl=False)
                _set_line_open(True)
            return
        _end_open_line()
        if ev.kind == "start" and self.announce:
            click.echo(f"{ev.dataset}: downloading {ev.url}", err=True)
        elif ev.kind == "warning":
            click.echo(f"warning: {ev.dataset}: {ev.message}", err=True)


def fetch_missing_task_data(task_name: str, offline: bool = False) -> None:
    """``train`` on a built-in task whose data file is nowhere: download it first, with a
    one-line notice (the same code path as ``hdeval data download``). ``offline``: refuse, and
    name the ways forward."""
    if task_name not in DATASETS:
        return
    task = load_task(task_name)
    if any(c.is_file() for c in data_candidates(task)):
        return
    from hdeval.core.paths import user_data_dir
    from hdeval.data.samples import missing_data_message

    if offline:
        raise DataError(missing_data_message(task, why="not downloading it (--offline)"))
    url = datasets.dataset_url(datasets.resolve_source_url(), task_name)
    click.echo(
        f"note: no data for {task_name} yet: downloading it once from {url} into "
        f"{user_data_dir()} (--offline refuses)",
        err=True,
    )
    reporter = _Reporter(announce=False)
    try:
        datasets.download_datasets([task_name], progress=reporter)
    except DownloadError as exc:
        raise DownloadError(missing_data_message(task, why=f"downloading it failed: {exc}")) from None
    finally:
        _end_open_line()


@data.command("download")
@click.argument("tasks", nargs=-1, type=click.Choice(list(DATASETS)))
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder to write <task>.jsonl into. Default: the per-user data dir that train searches.",
)
@click.option(
    "--source-url",
    envvar=SOURCE_URL_ENV,
    default=None,
    metavar="URL",
    help="Base URL in UniEval's reproduce/data/ layout (a mirror; file:// works too). "
    f"Env: {SOURCE_URL_ENV}. Default: {DEFAULT_SOURCE_URL}",
)
@click.option(
    "--strict-count/--no-strict-count",
    default=None,
    help="Fail unless each file has the official UniEval row count "
    "(summeval 1600, topical_chat 360, sfres 1181, sfhot 875). "
    "Default: on for the official source, off for a mirror (a different count is then "
    "accepted with a warning).",
)
@click.option("--force", is_flag=True, help="Download again even when a valid file is present.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for the server before giving up.",
)
@_errors_to_exit
def download_cmd(
    tasks: tuple[str, ...],
    dest: Path | None,
    source_url: str | None,
    strict_count: bool | None,
    force: bool,
    timeout: float,
) -> None:
    """Download the public human-judgment files and convert them for TASKS (default: all four).

    The files are the ones UniEval publishes (github.com/maszhongming/UniEval,
    reproduce/data/): SummEval, Topical-Chat (USR), SFRES and SFHOT. Each is converted to
    hdeval's sample schema, checked to load, and only then renamed into place, so an
    interrupted run leaves no partial file. A file that is already present and valid is
    kept and nothing is fetched (use --force to fetch again).

    Row counts: from the official source every file must have UniEval's row count. From a
    mirror (--source-url) a different count is accepted with a warning, since a mirror
    may hold a subset; pass --strict-count to require the official counts there too.

    UniEval's files carry the texts and the averaged scores. What the curated data in
    hdeval's shared/data adds from other sources (SFRES/SFHOT system labels, Topical-Chat
    per-annotator ratings, SummEval's eleven references) is left empty.
    """
    results = datasets.download_datasets(
        list(tasks),
        dest=dest,
        source_url=source_url,
        strict_count=strict_count,
        force=force,
        timeout=timeout,
        progress=_Reporter(),
    )
    for r in results:
        state = "downloaded" if r.downloaded else "already present"
        click.echo(f"{r.dataset}: {r.rows} rows, {state}: {r.path}")
        _note_search_path(r.dataset, r.path)


def _note_search_path(name: str, path: Path) -> None:
    """Say when train would not read ``path``: outside its search path, or shadowed by an earlier file."""
    task = load_task(name)
    cands = [c.resolve() for c in data_candidates(task)]
    if path.resolve() not in cands:
        click.echo(
            f"note: train does not look in {path.parent}; set HDEVAL_DATA_DIR={path.parent} "
            f"or pass --data {path}",
            err=True,
        )
        return
    from hdeval.data.samples import find_data

    used = find_data(task, None)
    if used.resolve() != path.resolve():
        click.echo(f"note: train will read {used} (searched first), not {path}", err=True)


@data.command("list")
@_errors_to_exit
def list_cmd() -> None:
    """Show, per built-in task, where its data file is looked for and what is there.

    Candidates are listed in search order; `train` reads the first one that exists.
    """
    for st in datasets.data_status():
        official = f"; official rows {st.official_rows}" if st.official_rows else ""
        click.echo(f"{st.task.name}: aspects {', '.join(st.task.aspect_keys)}{official}")
        used = st.used
        for c in st.candidates:
            if not c.present:
                state = "missing"
            elif c.problem:  # a file's first errors, shortened
                problem = c.problem if len(c.problem) <= 160 else c.problem[:157] + "..."
                state = "present, does not load: " + problem
            else:
                state = f"present, {c.rows} rows"
            click.echo(f"  {'*' if c is used else ' '} {c.path}  ({state})")
        if used is None and st.task.name in datasets.DATASETS:
            click.echo(f"    no file; run `hdeval data download {st.task.name}`")
        elif used is None:
            click.echo(
                f"    no file; no download source; set HDEVAL_DATA_DIR to a folder holding {st.task.data_file}"
            )
    click.echo("(* = the file train uses)")


@data.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--task", "task_name", required=True, help="Built-in task name or a task .toml path.")
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file to write (atomically; nothing is written on error).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "tsv", "json", "jsonl"]),
    default=None,
    help="Input format. Default: from the file extension.",
)
@click.option(
    "--id-col", default=None, help="Column with unique ids. Default: 'id' if present, else <task>-<row:05d>."
)
@click.option("--source-col", default=None, help="Column with the source/input text. Default: 'source'.")
@click.option(
    "--context-col", default=None, help="Column with extra context (e.g. a fact). Default: 'context'."
)
@click.option("--output-col", default=None, help="Column with the text under evaluation. Default: 'output'.")
@click.option("--reference-col", default=None, help="Column with a reference text. Default: 'reference'.")
@click.option(
    "--doc-col",
    default=None,
    help="Column grouping outputs of the same input. Default: 'doc_id', else a hash of the source text.",
)
@click.option(
    "--system-col", default=None, help="Column naming the system that wrote the output. Default: 'system'."
)
@click.option(
    "--score-col",
    "score_cols",
    multiple=True,
    metavar="ASPECT=COLUMN",
    help="Column holding an aspect's human score; repeatable. Default: the column named like the aspect.",
)
@click.option(
    "--unscored", is_flag=True, help="Import without human scores (data to score, not to train on)."
)
@click.option("--force", is_flag=True, help="Replace an existing -o file (refused without it).")
@_errors_to_exit
def import_cmd(
    file: Path,
    task_name: str,
    out: Path,
    fmt: str | None,
    id_col: str | None,
    source_col: str | None,
    context_col: str | None,
    output_col: str | None,
    reference_col: str | None,
    doc_col: str | None,
    system_col: str | None,
    score_cols: tuple[str, ...],
    unscored: bool,
    force: bool,
) -> None:
    """Convert FILE (CSV, TSV, JSON list or JSONL) into hdeval's sample schema for a task.

    Every row is checked before anything is written; problems are reported with their row
    number (1-based, header not counted; the file line too for CSV/JSONL). Text fields the
    task shows must be non-empty, and scores numeric and inside the task's range.
    """
    from hdeval.data.samples import jsonl_output
    from hdeval.run.output import check_output

    check_output(out, [file, task_name if task_name.endswith(".toml") else None], replace=force)
    jsonl_output(out)
    task = load_task(task_name)
    columns = ColumnMap(
        id=id_col,
        source=source_col,
        context=context_col,
        output=output_col,
        reference=reference_col,
        doc=doc_col,
        system=system_col,
        scores=datasets.parse_score_columns(score_cols, task),
    )
    rows = datasets.import_table(file, task, columns, fmt=fmt, unscored=unscored)
    n = datasets.write_samples(out, rows, task, unscored=unscored)
    docs = len({r["doc_id"] for r in rows})
    click.echo(f"imported {n} rows ({docs} doc_ids) for task {task.name}: {out}")
    have = datasets.scored_aspects(rows, task)
    if not unscored and len(have) < len(task.aspect_keys):
        absent = [a for a in task.aspect_keys if a not in have]
        click.echo(
            f"note: scores for {', '.join(have)} only (no column for {', '.join(absent)}); "
            f"train on this file with --aspects {','.join(have)}",
            err=True,
        )
