"""``hdeval train``: options -> TrainConfig -> one library call -> artifact + summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from hdeval.cli.artifacts import _notice_local, _resolved
from hdeval.cli.boundary import guarded
from hdeval.cli.options import ModelOption, batch_option, chosen_method_options, llm_options, method_options
from hdeval.cli.progress import TerminalProgress, _end_open_line
from hdeval.core.errors import ConfigError, HdevalError
from hdeval.llm.config import BASE_URL_NEEDS_LLM, shown_identity

_RUN = "hdeval.run.train:TrainConfig"  # the run settings' model: their defaults and help


@click.command()
@click.option("--task", required=True, help="Built-in task (see `hdeval tasks`) or path to a task .toml.")
@click.option(
    "--data",
    type=click.Path(dir_okay=False),
    default=None,
    help="Samples: JSONL, a CSV, TSV, JSON or Parquet table (through the task's [columns]), or "
    "hdeval label's labels.db. Default: <task>.jsonl in HDEVAL_DATA_DIR or the per-user data dir.",
)
@click.option("--aspects", default=None, help="Comma-separated subset of the task's aspects.")
@click.option(
    "--preset",
    default=None,
    help="A task's named setting, e.g. paper (the aspects the HD-Eval paper reports).",
)
@click.option("--seed", cls=ModelOption, model=_RUN, type=int)
@click.option("--test-frac", cls=ModelOption, model=_RUN, type=float)
@click.option("--train-frac", cls=ModelOption, model=_RUN, type=float)
@click.option(
    "--limit",
    default=None,
    type=int,
    help="Use about N samples for a quick run: whole documents until at least N.",
)
@click.option("--max-failure-rate", cls=ModelOption, model=_RUN, type=float)
@click.option(
    "--out",
    "-o",
    default=None,
    type=click.Path(file_okay=False),
    help="Artifact directory. Default: artifacts/<task>-<aggregator>.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing artifact at --out that holds only what hdeval wrote there (never "
    "a directory that is not an artifact).",
)
@click.option("--dry-run", is_flag=True, help="Print calls, cache hits, tokens and cost; call no LLM.")
@click.option("--price-in", default=None, type=float, help="With --dry-run: price per 1M prompt tokens.")
@click.option("--price-out", default=None, type=float, help="With --dry-run: price per 1M completion tokens.")
@click.option(
    "--decompose-price-in",
    default=None,
    type=float,
    help="With --dry-run: price per 1M prompt tokens of --decompose-llm (default: --price-in).",
)
@click.option(
    "--decompose-price-out",
    default=None,
    type=float,
    help="With --dry-run: price per 1M completion tokens of --decompose-llm (default: --price-out).",
)
@click.option(
    "--export-requests",
    "export_file",
    default=None,
    metavar="REQUESTS.jsonl",
    type=click.Path(dir_okay=False),
    help="Pay for nothing: write the next stage's requests not cached yet as OpenAI batch-format "
    "JSONL (custom_id = the cache key) for any engine that reads it, then stop. Import the "
    "answers with `hdeval cache import RESULTS --requests REQUESTS.jsonl` and rerun the same "
    "command: it goes on to the next stage, and once every stage is cached it trains and saves "
    "the artifact. OpenAI-compatible backends (--llm MODEL, --base-url URL).",
)
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Start a run on the embedded model estimated at over an hour without asking.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option(
    "--offline",
    is_flag=True,
    envvar="HDEVAL_OFFLINE",
    help="Never download a built-in task's data (by default it is fetched on first use).",
)
@click.option(
    "--jury",
    default=None,
    type=click.Path(dir_okay=False),
    help="A jury TOML file: one [[judge]] table per judge (name, llm, and optionally base_url, "
    "api_key_env, price_in, price_out); every criterion is scored by every judge "
    "(HD-Eval, pointwise; docs/juries.md).",
)
@click.option(
    "--prune-judges",
    is_flag=True,
    help="With a jury: drop a judge whose columns add nothing on grouped cross-validation, so "
    "apply does not call it.",
)
@method_options
@lambda f: llm_options(f, jury=True)
@batch_option
@guarded
def train(
    dry_run: bool,
    out: str | None,
    force: bool,
    export_file: str | None,
    yes: bool,
    quiet: bool,
    offline: bool,
    **options: Any,
) -> None:
    """Train an evaluator: decompose criteria, score samples, fit the aggregator, save the artifact.

    \b
    Example:
      hdeval train --task summeval --layers 3 --llm gpt-4o-mini
      hdeval train --task my_task.toml --data my.jsonl --llm fake --limit 64
      hdeval train --task summeval --tree my_tree.json --layers 3 --decompose-llm gpt-4o
      hdeval train --task summeval --llm M --base-url URL --export-requests requests.jsonl
    """
    _check_paths(options)  # a mistyped task file, said before the scientific libraries load
    from hdeval.run.output import run_inputs

    # what the run reads (or writes, as the cache) must not lie inside the artifact's folder
    inputs = {
        **run_inputs(options, "task", "data", "cache_dir", "tree", "jury"),
        "--export-requests": export_file,
    }
    if out and not dry_run:  # a refused -o, found before the scientific libraries load
        from hdeval.artifact.directory import check_destination
        from hdeval.run.output import refuse_in_cache, refuse_inputs_inside

        refuse_in_cache(out, options.get("cache_dir"), "-o")
        refuse_inputs_inside(out, inputs)
        check_destination(out, force=force)
    from hdeval.cli.data import fetch_missing_task_data
    from hdeval.run.train import TrainConfig, plan
    from hdeval.run.train import train as run_train

    prices = [options.pop(k) for k in ("price_in", "price_out", "decompose_price_in", "decompose_price_out")]
    llms = tuple(options.pop("llm") or ())
    options["llm"], options["judges"] = (llms[0] if llms else None), llms[1:]
    chosen_method_options(options)
    config = TrainConfig.from_options(**options)
    if config.jury:  # the file names the judges: the first is the run's LLM (notices, the artifact)
        config = config.replace(llm=config.jury_judges()[0].llm)
    if config.base_url is not None and config.llm is None:  # not --llm local, nor a dry run's default
        raise ConfigError(BASE_URL_NEEDS_LLM)
    if config.data is None:
        fetch_missing_task_data(config.task, offline=offline)
    if dry_run and export_file is not None:
        raise ConfigError("--export-requests writes requests, --dry-run only counts them: drop one")
    if dry_run:
        if _resolved(config.llm) is None:
            from hdeval.llm.backends.factory import DEFAULT_OPENAI_MODEL

            # Counting calls and tokens needs no LLM; price the default one.
            click.echo(
                f"note: no LLM configured; estimating for {DEFAULT_OPENAI_MODEL} "
                "(the default with OPENAI_API_KEY); pass --llm to estimate another",
                err=True,
            )
            config = config.replace(llm=DEFAULT_OPENAI_MODEL)
        prep, plans, identity = plan(config)
        _print_plan(prep, plans, identity, config.batch, *prices)
        for line in _jury_plan_lines(config, plans):
            click.echo(line)
        click.echo(_estimate(config, plans, identity)[1])
        return
    if not out:  # -o itself was checked first thing
        _check_default_outputs(config, force, inputs)  # before any LLM call: never after paying for them
    if export_file is not None:
        from hdeval.run.output import check_output

        check_output(
            export_file,
            [config.data, config.task, getattr(config.options, "tree", None)],
            option="--export-requests",
            cache_dir=config.cache_dir,
        )
    progress = TerminalProgress(quiet)
    if "local" in (_resolved(config.llm), (config.options.second_llm_given() or ("",))[0]):
        _notice_local("local")  # once, for the scoring or the second LLM
    if not yes and export_file is None:
        _ask_before_a_long_local_run(config)
    from hdeval.llm.request_files import RequestsExported

    started = time.monotonic()
    try:
        ev = run_train(config, progress=progress, export_requests=export_file)
    except RequestsExported as done:
        progress.close()
        _end_open_line()  # a progress line redrawn on a terminal ends first
        stage, where = progress.label, f" --cache-dir {config.cache_dir}" if config.cache_dir else ""
        click.echo(
            f"{stage + ': ' if stage else ''}wrote {done.count} requests not cached yet to {done.path}; "
            f"answer them with any engine that reads the OpenAI batch format, then `hdeval cache import "
            f"RESULTS.jsonl --requests {done.path}{where}` and rerun this same train command: it goes on "
            "to the next stage (and, once every stage is cached, trains and saves the artifact)",
            err=True,
        )
        return
    _record_rate(config, ev, time.monotonic() - started)
    path = Path(out) if out else Path("artifacts") / f"{ev.task.name}-{ev.artifact_suffix()}"
    try:
        ev.save(path, force=force)
    except HdevalError as exc:
        raise type(exc)(f"{exc} (every LLM reply of this run is cached: rerunning costs no calls)") from None
    u = ev.metrics.get("usage")  # optional, as each count in it: a plug-in may count none
    u = u if isinstance(u, dict) else {}
    counts = [f"LLM calls made: {u['calls']}"] if "calls" in u else []
    counts += [f"cache hits: {u['cache_hits']}"] if counts and "cache_hits" in u else []
    if counts and "prompt_tokens" in u and "completion_tokens" in u:
        counts.append(f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion")
    if counts:
        click.echo(", ".join(counts), err=True)
    for line, to_err in ev.summary_lines(path):  # the method's own summary of what was trained
        if not (to_err and line in progress.shown):  # a warning the run already showed (shown again with -q)
            click.echo(line, err=to_err)


def _check_paths(options: dict) -> None:
    """The task (a built-in name or a file), checked in milliseconds."""
    from hdeval.data.tasks import load_task

    load_task(options["task"])


def _estimate(config, plans, identity: str) -> tuple[float | None, str]:
    from hdeval.llm.client import resolved
    from hdeval.llm.eta import estimate_plan
    from hdeval.run.train import llm_config

    spec = resolved(llm_config(config))
    return estimate_plan(plans, identity, spec, config.cache_dir)


def _ask_before_a_long_local_run(config) -> None:
    """A many-hour run on the embedded model is rarely meant: ask (no terminal: refuse) first."""
    from hdeval.llm.eta import LONG_RUN_SECONDS, is_embedded
    from hdeval.run.train import plan

    if not is_embedded(_resolved(config.llm)):
        return
    try:
        _prep, plans, identity = plan(config)
    except ConfigError:
        return  # a method the dry run cannot count yet: nothing to estimate from (it says so on --dry-run)
    seconds, line = _estimate(config, plans, identity)
    if seconds is None or seconds <= LONG_RUN_SECONDS:
        return
    what = f"this run on the embedded model is {line.split(': ', 1)[-1]}"
    if sys.stdin.isatty():
        if click.confirm(f"{what}. Start it?", default=False, err=True):
            return
        raise ConfigError("not started (a smaller run: --limit N, --layers 2; a faster LLM: --llm)")
    raise ConfigError(
        f"{what}; pass --yes to start it anyway, or make it smaller (--limit N, --layers 2) "
        "or faster (--llm with a server)"
    )


def _record_rate(config, ev, seconds: float) -> None:
    from hdeval.llm.eta import record_rate, scoring_identity
    from hdeval.run.train import offline_identity

    usage = (ev.metrics or {}).get("usage") or {}
    if usage.get("calls", 0) and not config.batch:  # a batch run's time is the queue's, not the LLM's
        try:
            identity = scoring_identity(offline_identity(config, None))
        except HdevalError:
            return
        record_rate(config.cache_dir, identity, usage["calls"], usage.get("prompt_tokens", 0), seconds)


def _check_default_outputs(config, force: bool, inputs: dict[str, str | None]) -> None:
    """Without --out, refuse before any call every default the run may pick that save would refuse."""
    from hdeval.artifact.directory import check_destination
    from hdeval.data.tasks import load_task
    from hdeval.methods.registry import get_method
    from hdeval.run.output import refuse_inputs_inside

    name = load_task(config.task).name
    method = get_method(config.method)
    kinds = method.artifact_suffixes(config) if method.artifact_suffixes else (config.method,)
    for kind in kinds:
        default = Path("artifacts") / f"{name}-{kind}"
        refuse_inputs_inside(default, inputs, "the artifact directory")
        check_destination(default, force=force)


def _jury_plan_lines(config, plans) -> list[str]:
    """A jury's dry run: each judge's scoring calls and, with its prices, its cost."""
    judges = config.jury_judges()
    out = []
    for j, calls in zip(judges, getattr(plans, "judge_calls", ()) or ()):
        n, p, c = calls
        cost = (
            ""
            if j.price_in is None and j.price_out is None
            else (
                f", estimated cost at most {p / 1e6 * (j.price_in or 0) + c / 1e6 * (j.price_out or 0):.2f}"
            )
        )
        out.append(
            f"judge {j.name} ({j.llm}): <= {n} scoring calls, ~{p} prompt + ~{c} completion tokens{cost}"
        )
    return out


def _destination(shown: str) -> str:
    """Who a run would call, in words: a server and its URL, this machine, or nobody."""
    kind, _, rest = shown.partition(":")
    if kind == "fake":
        return "nobody: the fake LLM answers offline"
    if kind == "openai":
        model, _, url = rest.partition("@")
        paid = " (OpenAI's API: paid per token)" if "api.openai.com" in url else ""
        return f"model {model} at {url}{paid}"
    return f"the model {shown} on this machine"


def _print_plan(
    prep,
    plans,
    identity: str,
    batch: bool,
    price_in: float | None,
    price_out: float | None,
    dec_in: float | None,
    dec_out: float | None,
) -> None:
    click.echo(
        f"dry run for task {prep.task.name}: {len(prep.samples)} samples "
        f"({len(prep.split.train_ids)} train, {len(prep.split.test_ids)} test), LLM {shown_identity(identity)}"
    )
    click.echo(f"calls would go to: {_destination(shown_identity(identity))}")
    staged = any(p.stage for p in plans)  # a method with named stages (dna), not criteria layers
    if staged:
        width = max(len(p.stage) for p in plans)
        click.echo(f"{'stage':<{width}}  {'calls':>9}  cached  est.prompt-tok  est.completion-tok")
    else:
        click.echo("layer  decompose  score-calls  cached  est.prompt-tok  est.completion-tok  requests")
    for p in plans:
        cached = "?" if p.cached is None else str(p.cached)
        bound = "<=" if p.upper_bound else "  "
        if staged:  # an upper bound here: a stage that runs only if an earlier one calls for it
            click.echo(
                f"{p.stage:<{width}}  {bound}{p.decompose_calls + p.score_calls:>7}  {cached:>6}  "
                f"{p.prompt_tokens:>14}  {p.completion_tokens:>18}"
            )
        else:
            requests = "?" if p.requests is None else str(p.requests)
            click.echo(
                f"{p.layer:>5}  {p.decompose_calls:>9}  {bound}{p.score_calls:>9}  {cached:>6}  "
                f"{p.prompt_tokens:>14}  {p.completion_tokens:>18}  {bound}{requests:>8}"
            )
    tot_p, tot_c = sum(p.prompt_tokens for p in plans), sum(p.completion_tokens for p in plans)
    if any(p.requests is not None for p in plans):
        # the progress bar counts requests; the LLM is paid per distinct one (a call)
        click.echo(
            "requests: decompositions + one scoring request per sample and criterion, as the progress "
            "counts them; identical requests (samples with the same text) share one call"
        )
    calls = sum(p.decompose_calls + p.score_calls for p in plans)
    known_cached = sum(p.cached or 0 for p in plans)
    click.echo(
        f"total: <= {calls} LLM calls ({known_cached} already cached), "
        f"~{tot_p} prompt + ~{tot_c} completion tokens (estimated from characters)"
    )
    if dec_in is None and dec_out is None:
        if price_in is not None or price_out is not None:
            cost = tot_p / 1e6 * (price_in or 0) + tot_c / 1e6 * (price_out or 0)
            click.echo(
                f"estimated cost: at most {cost:.2f} (at {price_in or 0}/{price_out or 0} per 1M tokens)"
            )
            if batch:
                # the Batch API bills half the per-token price; the few decomposition calls of
                # layers 2+ are not batched, so this is a lower bound on a batched run's cost
                dec_calls = sum(p.decompose_calls for p in plans)
                note = (
                    f"; the {dec_calls} decomposition calls are sent normally, at the full price"
                    if dec_calls
                    else ""
                )
                click.echo(f"with --batch: about {cost / 2:.2f} (the Batch API's half price per token{note})")
        return
    # the decomposing LLM priced apart: its tokens at its prices, the rest at the scoring ones
    dec_in = price_in if dec_in is None else dec_in
    dec_out = price_out if dec_out is None else dec_out
    dec_p = sum(p.decompose_prompt_tokens for p in plans)
    dec_c = sum(p.decompose_completion_tokens for p in plans)
    score_cost = (tot_p - dec_p) / 1e6 * (price_in or 0) + (tot_c - dec_c) / 1e6 * (price_out or 0)
    dec_cost = dec_p / 1e6 * (dec_in or 0) + dec_c / 1e6 * (dec_out or 0)
    click.echo(
        f"estimated cost: at most {score_cost + dec_cost:.2f}: scoring {score_cost:.2f} (at "
        f"{price_in or 0}/{price_out or 0} per 1M tokens), decomposition {dec_cost:.2f} (at "
        f"{dec_in or 0}/{dec_out or 0} per 1M tokens)"
    )
    if batch:
        click.echo(
            f"with --batch: about {score_cost / 2 + dec_cost:.2f} (scoring at the Batch API's half price; "
            "decomposition calls are sent normally, at the full price)"
        )
