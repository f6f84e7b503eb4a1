"""``hdeval apply``: score new samples with any method's artifact, a chunk at a time
(``--shard K/N`` for one of N processes); ``hdeval merge-shards``: join the shards' outputs.
The work is :mod:`hdeval.run`; this module turns options into one call and prints the result."""

from __future__ import annotations

import functools
import json
from typing import Any

import click

from hdeval.cli.artifacts import policy
from hdeval.cli.boundary import guarded
from hdeval.cli.options import batch_option, llm_options
from hdeval.cli.progress import TerminalProgress
from hdeval.core.errors import ConfigError


@click.command()
@click.argument("artifact", type=click.Path())
@click.argument("input_file", metavar="INPUT", type=click.Path())
@click.option(
    "--output",
    "-o",
    default=None,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where to write the scores: .jsonl, .csv or .parquet (by extension); - for JSONL on stdout. "
    "Written a chunk at a time to a temporary file beside it and renamed into place at the "
    "end (parquet holds the scored rows in memory until then).",
)
@click.option(
    "--shard",
    default=None,
    metavar="K/N",
    help="Score only shard K of N (by a stable hash of each sample's id, the same on every "
    "machine); rows carry a 'shard' field and the last line is a closing record (row count, "
    "the input's and the artifact's sha256); join the N outputs with `hdeval merge-shards`, "
    "which checks them. Needs -o FILE.jsonl or -o -.",
)
@click.option(
    "--export-requests",
    "export_file",
    default=None,
    metavar="REQUESTS.jsonl",
    type=click.Path(dir_okay=False),
    help="Score nothing: write the requests not cached yet as OpenAI batch-format JSONL "
    "(custom_id = the cache key) for any engine that reads it (vLLM's batch runner, Ray "
    "Data LLM, a provider's batch API), then exit. Import the answers with `hdeval cache "
    "import RESULTS --requests REQUESTS.jsonl` and rerun: no calls for them. "
    "OpenAI-compatible backends (--llm MODEL, --base-url URL).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing --output or --export-requests file (refused without it).",
)
@click.option(
    "--keep-columns",
    is_flag=True,
    help="Also write each input row's own columns (as read, ahead of the scores; one named like an "
    "output field as input.NAME), so the output shows what was scored.",
)
@click.option("--quiet", "-q", is_flag=True)
@click.option(
    "--explain",
    is_flag=True,
    help="Add, per sample and aspect, the top contributing criteria with SHAP values.",
)
@click.option(
    "--top",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="With --explain: criteria per aspect (at least 1).",
)
@click.option(
    "--max-failure-rate",
    default=0.2,
    show_default=True,
    type=float,
    help="Fail, writing nothing, when a larger share of the LLM-filled scores cannot be read "
    "(requests refused, replies too large or not understood).",
)
@click.option(
    "--max-interval-width",
    default=0.5,
    show_default=True,
    type=float,
    help="Flag a row needs_human when an aspect's prediction interval (the artifact's calibrated "
    "level, 90% by default) is wider than this share of the aspect's score range, or when "
    "one of its LLM scores could not be read.",
)
@llm_options
@batch_option
@guarded
def apply(
    artifact: str,
    input_file: str,
    output: str | None,
    shard: str | None,
    export_file: str | None,
    force: bool,
    keep_columns: bool,
    quiet: bool,
    explain: bool,
    top: int,
    max_failure_rate: float,
    max_interval_width: float,
    **llm_options: Any,
) -> None:
    """Score new samples with a trained evaluator (same criteria, prompts and LLM; cached).

    INPUT is JSONL, or by its extension CSV, TSV, JSON (a list of objects) or Parquet (with
    pyarrow installed), its columns mapped to fields as the task's [columns] says (recorded in
    the artifact; `hdeval init` writes it), else by their names; rows without an id get one
    from their texts, the same as an identical training row's.

    The input is validated first (every bad line reported, nothing paid for), then read, scored
    and written 1,000 samples at a time: memory does not grow with the input. An apply that
    fails or is stopped leaves no output file (nor a folder made for it) and leaves an existing
    one untouched; the LLM
    calls it finished are cached, so rerunning it resumes.

    \b
    Example:
      hdeval apply artifacts/summeval-nn new.jsonl -o scored.jsonl
      hdeval apply artifacts/summeval-nn new.jsonl -o - | jq .scores
      hdeval apply artifacts/my-eval new.csv -o scored.csv --keep-columns
      hdeval apply artifacts/summeval-nn new.jsonl --shard 1/2 -o part1.jsonl   # machine 1
      hdeval apply artifacts/summeval-nn new.jsonl --shard 2/2 -o part2.jsonl   # machine 2
      hdeval merge-shards scored.jsonl part1.jsonl part2.jsonl
      hdeval apply artifacts/summeval-nn new.jsonl --llm M --base-url URL --export-requests requests.jsonl
    """
    from hdeval.run.apply import apply_file

    note, say = functools.partial(click.echo, err=True), functools.partial(click.echo, err=output == "-")
    if export_file is not None:
        from hdeval.run.export_requests import export_apply_requests

        del llm_options["max_calls"]  # exporting pays for nothing
        batch = llm_options.pop("batch")
        for given, name in (
            (output, "--output"),
            (explain or None, "--explain"),
            (batch or None, "--batch"),
            (keep_columns or None, "--keep-columns"),
        ):
            if given is not None:
                raise ConfigError(f"--export-requests scores nothing: drop {name}")
        n = export_apply_requests(
            artifact, input_file, export_file, shard=shard, replace=force, **llm_options, **policy()
        )
        if not n:
            return note(
                f"every request is cached: nothing to export ({export_file} is empty); run apply with -o"
            )
        where = f" --cache-dir {llm_options['cache_dir']}" if llm_options["cache_dir"] else ""
        return note(
            f"wrote {n} requests not cached yet to {export_file}; answer them with any engine that reads "
            f"the OpenAI batch format, then `hdeval cache import RESULTS.jsonl --requests {export_file}"
            f"{where}` and rerun apply (a method whose later stage depends on these replies exports "
            "that stage on the next --export-requests)"
        )
    if output is None:
        raise ConfigError("apply needs --output FILE (or -o - for stdout), or --export-requests FILE")
    progress = TerminalProgress(quiet)
    try:
        res = apply_file(
            artifact,
            input_file,
            output,
            shard=shard,
            explain=explain,
            top=top,
            max_failure_rate=max_failure_rate,
            max_interval_width=max_interval_width,
            progress=progress,
            replace=force,
            keep_columns=keep_columns,
            **llm_options,
            **policy(),
        )
    finally:
        progress.close()
    u = res.usage
    note(
        f"LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}, tokens: "
        f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion"
    )
    note(
        f"failed LLM-filled scores: {res.failed} of {res.cells} ({res.failure_rate:.1%}; "
        f"threshold {max_failure_rate:.0%})"
    )
    t = res.trust
    apart = " (rows not in the artifact's training split)" if t.get("in_training") else ""
    training = (
        f"TRAINING ROWS ONLY ({t.get('in_training')} rows the evaluator was fitted on; "
        "not a held-out figure):"
    )
    if res.agreement:
        say(f"agreement with the human labels in the input{apart}: {json.dumps(res.agreement)}")
    if t.get("agreement_training"):
        say(f"{training} agreement {json.dumps(t['agreement_training'])}")
    for title, table in (
        (f"correlation with the human scores in the input{apart}:", res.correlations),
        (training, t.get("correlations_training")),
    ):
        if table:
            say(title)
            for a, row in table.items():
                say(
                    f"  {a:<18} pearson {row['pearson']}  spearman {row['spearman']}  kendall {row['kendall']}"
                )
    if t.get("interval_level") is not None:
        say(
            f"{t['interval_level']:.0%} prediction intervals written (lower/upper); needs_human: "
            f"{t['needs_human']} of {t['rows']} rows (interval wider than {t['max_interval_width']:g} "
            "of the score range, or an unread LLM score)"
        )
    for a, h in (t.get("human_mean") or {}).items():
        coverage = (
            ""
            if h["interval_coverage"] is None
            else f"; {h['interval_coverage']:.0%} of those "
            f"{h['interval_labels']} labels inside their prediction interval"
        )
        say(
            f"human mean of {a}{apart}: {h['estimate']:.3f} [{h['low']:.3f}, {h['high']:.3f}] "
            f"({h['level']:.0%}, PPI++ from {h['n_labelled']} labels over {h['n']} rows; the evaluator alone: "
            f"{h['evaluator_mean']:.3f}, biased){coverage}"
        )
    if t.get("human_mean"):
        say(
            "  (valid when the labelled rows are a random sample of the input; `hdeval estimate` for groups "
            "and sampling probabilities)"
        )
    say(f"wrote {res.rows} scored samples to {'stdout' if output == '-' else output}")


@click.command("merge-shards")
@click.argument("output", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("shards", nargs=-1, required=True, type=click.Path(dir_okay=False))
@guarded
def merge_shards(output: str, shards: tuple[str, ...]) -> None:
    """Join the outputs of `hdeval apply --shard K/N` (K = 1..N, one file each) into OUTPUT.

    Rows come out in the order of the input file (each row recorded its input line), without
    the 'shard' field: the same rows an unsharded apply writes. OUTPUT is .jsonl, .csv or
    .parquet (by extension) or - for JSONL on stdout, written atomically. Refused, writing
    nothing: a shard missing or given twice, files of different N, an id in two files, a row
    not written by apply --shard, a file without its closing record (empty, cut short, not a
    regular file) or whose row count differs from it, shards of different inputs or artifacts.

    \b
    Example:
      hdeval merge-shards scored.jsonl part1.jsonl part2.jsonl part3.jsonl
    """

    from hdeval.run.shards import merge_shards as merge

    rows, n = merge(output, shards)
    click.echo(f"merged {rows} rows of {n} shard(s) into {'stdout' if output == '-' else output}", err=True)
