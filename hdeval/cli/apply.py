"""``hdeval apply``: score new samples with any method's artifact."""

from __future__ import annotations

import json

import click

from hdeval.cli.common import (
    _check_llm_options, _input_tasks, _output_format, _write_output, batch_option, llm_options,
    load_artifact, run_command, score_with_artifact,
)
from hdeval.errors import ConfigError

@click.command()
@click.argument("artifact", type=click.Path())
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path())
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Where to write the scores: .jsonl, .csv or .parquet (by extension); - for JSONL on stdout.")
@click.option("--quiet", "-q", is_flag=True)
@click.option("--explain", is_flag=True,
              help="Add, per sample and aspect, the top contributing criteria with SHAP values.")
@click.option("--top", default=3, show_default=True, type=int, help="With --explain: criteria per aspect.")
@llm_options
@batch_option
def apply(artifact: str, input_file: str, output: str, quiet: bool, explain: bool, top: int,
          llm: str | None, base_url: str | None,
          concurrency: int, timeout: float, max_retries: int, cache_dir: str | None,
          max_calls: int | None, batch: bool) -> None:
    """Score new samples with a trained evaluator (same criteria, prompts and LLM; cached).

    \b
    Example:
      hdeval apply artifacts/summeval-nn new.jsonl -o scored.jsonl
      hdeval apply artifacts/summeval-nn new.jsonl -o - | jq .scores
    """
    from hdeval.data import read_task_samples

    def go() -> None:
        _check_llm_options(concurrency=concurrency, timeout=timeout, max_retries=max_retries, max_calls=max_calls)
        fmt = _output_format(output)
        to_stdout = output == "-"
        ev = load_artifact(artifact)
        if explain and ev.method != "hdeval":
            raise ConfigError(f"--explain reads HD-Eval artifacts; {artifact} was made by method {ev.method!r}")
        if explain and ev.task.shape == "pairwise":
            raise ConfigError(f"--explain reads pointwise HD-Eval artifacts; {artifact} judges pairs (its "
                              "criteria and their importance: hdeval report)")
        samples = read_task_samples(input_file, ev.task, require_labels=False)
        other = sorted(_input_tasks(input_file) - {ev.task.name})
        if other:
            click.echo(f"warning: {input_file} holds samples of task {', '.join(other)}, but the artifact was "
                       f"trained on task {ev.task.name}; its scores will mean little there", err=True)
        needed = ev.columns_needed()
        if ev.method == "hdeval":
            per = ev.calls_per_sample() if hasattr(ev, "calls_per_sample") else len(needed)  # pairs: 2 per criterion
            click.echo(f"{len(samples)} samples, {len(needed)} of {len(ev.feature_keys)} criteria used by the "
                       f"aggregator: {per} LLM calls per sample", err=True)
        else:
            click.echo(f"{len(samples)} samples; method {ev.method}: {len(needed)} LLM-filled column(s) "
                       "per sample", err=True)
        res = score_with_artifact(ev, samples, llm=llm, base_url=base_url, timeout=timeout,
                                  max_retries=max_retries, cache_dir=cache_dir, max_calls=max_calls,
                                  concurrency=concurrency, quiet=quiet, batch=bool(batch))
        rows = ev.output_rows(samples, res)
        if explain:
            from hdeval.methods.hdeval.explain import explain_samples

            for row, expl in zip(rows, explain_samples(ev, res, top=top)):
                row["explanation"] = expl
        _write_output(output, fmt, rows)
        u = res.usage
        click.echo(f"LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}, tokens: "
                   f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion", err=True)
        agreement = res.agreement(samples) if hasattr(res, "agreement") else None
        if agreement:
            click.echo(f"agreement with the human labels in the input: {json.dumps(agreement)}", err=to_stdout)
        corr = res.correlations(samples)
        if corr is not None:
            click.echo("correlation with the human scores in the input:", err=to_stdout)
            for a, row in corr.items():
                click.echo(f"  {a:<18} pearson {row['pearson']}  spearman {row['spearman']}  kendall {row['kendall']}",
                           err=to_stdout)
        click.echo(f"wrote {len(rows)} scored samples to {'stdout' if to_stdout else output}", err=to_stdout)

    run_command(go)


