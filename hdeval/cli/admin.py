"""``hdeval methods``, ``hdeval tasks`` and ``hdeval cache``: what is there, and the reply cache."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hdeval.cli.boundary import guarded
from hdeval.core.errors import one_line

_cache_dir = click.option(
    "--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False)
)


@click.command("methods")
@guarded
def methods_cmd() -> None:
    """List the methods `hdeval train --method` can build, with their own options (a plug-in's
    are given as `-O NAME=VALUE`, which every method takes)."""
    from hdeval.methods.registry import builtin_methods, get_method, method_names

    flags = {n for m in builtin_methods() for n in m.options.specs()}
    for name in method_names():
        m = get_method(name)
        click.echo(f"{name} ({'/'.join(m.shapes)} data): {m.summary}")
        for opt_name, opt in m.options.specs().items():
            shown = opt.shown_default()
            way = f"--{opt_name.replace('_', '-')}" if opt_name in flags else f"-O {opt_name}=VALUE"
            click.echo(f"  {way}{'' if shown is None else f' (default {shown})'}: {opt.help}")


@click.command("tasks")
@guarded
def tasks_cmd() -> None:
    """List the built-in tasks, their aspects and whether their data is found."""
    from hdeval.data.datasets import DATASETS
    from hdeval.data.samples import data_candidates
    from hdeval.data.tasks import builtin_tasks, load_task

    for name in builtin_tasks():
        task = load_task(name)
        found = next((p for p in data_candidates(task) if p.is_file()), None)
        # only the UniEval sets download: pointing the others at `data download` fails
        way = (
            f"set HDEVAL_DATA_DIR, pass --data, or run `hdeval data download {name}`"
            if name in DATASETS
            else "no download source: set HDEVAL_DATA_DIR or pass --data"
        )
        status = f"data: {found}" if found else f"data: not found ({way})"
        click.echo(f"{name} ({task.shape}): {task.description}")
        for a in task.aspects:
            click.echo(f"  - {a.key} [{a.low:g}-{a.high:g}]: {a.definition}")
        click.echo(f"  {status}")


@click.group()
def cache() -> None:
    """Inspect, check, repair or clear the LLM reply cache."""


@cache.command("stats")
@_cache_dir
@guarded
def cache_stats_cmd(cache_dir: str | None) -> None:
    """Show the number of cached replies and their size (reads only: works on a read-only copy)."""
    from hdeval.core.paths import default_cache_dir
    from hdeval.llm.cache.guard import read_stats

    st = read_stats(cache_dir or default_cache_dir())
    click.echo(f"cache {st['path']}: {st['entries']} entries, {int(st['bytes']) / 1e6:.2f} MB")


@cache.command("clear")
@_cache_dir
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@guarded
def cache_clear_cmd(cache_dir: str | None, yes: bool) -> None:
    """Delete every cached reply (they cost money to make again). Asks first; without a terminal,
    pass --yes. A folder that is not a cache is left as it is."""
    from hdeval.core.errors import ConfigError
    from hdeval.core.paths import default_cache_dir
    from hdeval.llm.cache.check import clear_cache, holds_cache
    from hdeval.llm.cache.guard import DBNAME, CacheCorrupted, read_stats

    path = Path(cache_dir or default_cache_dir())
    if not holds_cache(path):  # (a folder of something else: refused, left as it is)
        click.echo(f"no LLM reply cache in {path}: nothing to delete")
        return
    try:
        question = f"delete {read_stats(path)['entries']} cached LLM replies in {path}?"
    except CacheCorrupted:
        question = (
            f"{path / DBNAME} is corrupted (`hdeval cache repair` could keep its readable "
            f"entries); delete it?"
        )
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"{question[:-1]}: there is no terminal to ask; pass --yes to delete")
        try:
            sure = click.confirm(question, default=False)
        except click.Abort:  # Ctrl-C or Ctrl-D at the question
            click.echo("\nnothing deleted", err=True)
            sys.exit(1)
        if not sure:
            click.echo("nothing deleted")
            return
    n = clear_cache(path)
    if n < 0:
        click.echo(f"deleted the corrupted cache databases in {path}; the next run starts an empty cache")
    else:
        click.echo(f"deleted {n} cached replies from {path}")


@cache.command("check")
@_cache_dir
@guarded
def cache_check_cmd(cache_dir: str | None) -> None:
    """Read every entry: count readable, unreadable and foreign ones (writes nothing).

    Exits 1 when the database or any entry is unreadable, it holds entries hdeval never
    writes (e.g. pickled values), or SQLite objects the cache never creates (triggers, views,
    tables, indexes); `hdeval cache repair` keeps only the readable entries. A shared cache is
    trusted to hold true replies: a planted valid entry cannot be told from a real one.
    """
    from hdeval.core.paths import default_cache_dir
    from hdeval.llm.cache.check import check_cache
    from hdeval.llm.cache.guard import DBNAME, TABLE_DBNAME, on_read_only_storage

    path = Path(cache_dir or default_cache_dir())
    r = check_cache(path)  # diskcache's file, then the reply table's
    planted = [o if name == DBNAME else f"{name}: {o}" for name, found in r.planted.items() for o in found]
    db = path / next(iter(r.planted), DBNAME)
    click.echo(
        f"cache {path}: {r.readable} readable, {r.unreadable} unreadable, "
        f"{r.foreign} foreign (not written by hdeval) entries"
    )
    for e in r.examples:
        click.echo(f"  {e}")
    for obj in planted:
        click.echo(f"  {obj}: not created by the cache")
    if planted:
        click.echo(
            f"error: the database {db} holds {len(planted)} SQLite object(s) the cache never "
            f"creates ({planted[0]}{', ...' if len(planted) > 1 else ''}), which could rewrite or drop "
            f"replies; `hdeval cache repair --cache-dir {path}` copies the readable entries into a fresh "
            "database",
            err=True,
        )
    elif r.database_error is not None and on_read_only_storage(path):
        click.echo(
            f"error: cannot read the cache databases in {path} on read-only storage "
            f"({r.database_error}); check a writable copy of {path}",
            err=True,
        )
    elif r.database_error is not None:
        bad = path / (TABLE_DBNAME if r.database_error.startswith(TABLE_DBNAME) else DBNAME)
        click.echo(
            f"error: the database {bad} is damaged ({r.database_error}); "
            f"`hdeval cache repair --cache-dir {path}` keeps the readable entries",
            err=True,
        )
    elif not r.ok:
        click.echo(
            f"error: {r.unreadable + r.foreign} entries cannot be used (each is asked again "
            f"when needed); `hdeval cache repair --cache-dir {path}` keeps only the readable ones",
            err=True,
        )
    if not r.ok or planted:
        sys.exit(1)


@cache.command("repair")
@_cache_dir
@guarded
def cache_repair_cmd(cache_dir: str | None) -> None:
    """Copy every readable entry into a fresh cache; keep the old database aside.

    The old databases are renamed *.db.corrupt-<timestamp> (never deleted). A cache `hdeval cache
    check` finds nothing wrong with is left as it is. Run it while no other hdeval command uses
    this cache.
    """
    from hdeval.core.paths import default_cache_dir
    from hdeval.llm.cache.check import repair_cache

    r = repair_cache(cache_dir or default_cache_dir())
    if not r.kept_as:
        click.echo(
            f"nothing to repair in {r.path}: {r.readable} readable entries, none unreadable or foreign; "
            "the cache is left as it is"
        )
        return
    damaged = f" (the old database was damaged: {r.database_error})" if r.database_error else ""
    click.echo(
        f"repaired {r.path}: copied {r.readable} readable entries into a fresh cache; "
        f"left out {r.unreadable} unreadable and {r.foreign} foreign entries{damaged}"
    )
    click.echo(f"the old database is kept as {r.kept_as} (delete it when you no longer need it)")


@cache.command("import")
@click.argument("results", metavar="RESULTS.jsonl", type=click.Path(dir_okay=False))
@click.option(
    "--requests",
    "requests_file",
    required=True,
    metavar="REQUESTS.jsonl",
    type=click.Path(dir_okay=False),
    help="The request file `hdeval apply --export-requests` or `hdeval train --export-requests` "
    "wrote (its custom_ids are the only ones accepted).",
)
@click.option(
    "--skip-other-models",
    is_flag=True,
    help="Leave out (and count) results whose body.model is not the model their request asked, "
    "instead of refusing the file.",
)
@_cache_dir
@guarded
def cache_import_cmd(
    results: str, requests_file: str, cache_dir: str | None, skip_other_models: bool
) -> None:
    """Import an engine's answers to an exported request file into the cache.

    RESULTS.jsonl is in the OpenAI batch output format (one line per request:
    custom_id, response.status_code, response.body a chat completion), as vLLM's batch runner,
    Ray Data LLM or a provider's batch API write it. The whole file is checked first (a line
    that is not JSON, too long, of the wrong shape, or names a custom_id the request file does
    not hold or one already answered, or whose body.model is another model than its request's,
    is refused with its line number) and then written in one
    transaction: a bad file imports nothing. Rerun the same apply (or train) afterwards: it makes
    no calls for the imported requests.

    \b
    Example:
      hdeval apply ART new.jsonl --llm MODEL --base-url URL --export-requests requests.jsonl
      (answer requests.jsonl with any engine that reads the OpenAI batch format)
      hdeval cache import results.jsonl --requests requests.jsonl
      hdeval apply ART new.jsonl --llm MODEL --base-url URL -o scored.jsonl
    """
    from hdeval.core.paths import default_cache_dir
    from hdeval.llm.request_files import import_results

    where = cache_dir or default_cache_dir()
    report = import_results(results, requests_file, where, skip_other_models)
    click.echo(f"imported {report.imported} replies into the cache {where}", err=True)
    if report.other_model:
        first = next(iter(report.other_model.values()))
        click.echo(
            f"warning: {len(report.other_model)} result(s) answered by another model than their "
            f"request asked (first: {one_line(first)[:80]!r}) were left out; apply sends those to the LLM",
            err=True,
        )
    if report.failed:
        first = next(iter(report.failed.values()))
        click.echo(
            f"warning: {len(report.failed)} request(s) have an error instead of a reply (first: "
            f"{first}); apply sends those to the LLM, or export again",
            err=True,
        )
    if report.missing:
        click.echo(
            f"warning: {report.missing} request(s) of {requests_file} have no line in {results}; "
            "apply sends those to the LLM, or export again",
            err=True,
        )
