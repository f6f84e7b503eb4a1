"""``hdeval benchmark``: a sweep of training runs from one cache -> results.json, results.md, report.html."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from hdeval.cli.artifacts import _notice_local, _resolved
from hdeval.cli.boundary import guarded
from hdeval.cli.options import llm_options
from hdeval.cli.progress import TerminalProgress


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@click.command()
@click.option("--task", required=True, help="Built-in task (see `hdeval tasks`) or path to a task .toml.")
@click.option(
    "--data",
    type=click.Path(dir_okay=False),
    default=None,
    help="Samples: JSONL, a CSV, TSV, JSON or Parquet table (through the task's [columns]), or "
    "hdeval label's labels.db. Default: <task>.jsonl in HDEVAL_DATA_DIR or the per-user data dir.",
)
@click.option(
    "--methods",
    default="direct,hdeval",
    show_default=True,
    help="Comma-separated methods (`hdeval methods`, plug-ins included) and variants: direct, "
    "direct-yesno, hdeval, paireval (PairEval and direct-yesno need a dialogue task: a history "
    "besides the response); on a pairwise task: dna, dna-direct (DnA's --dna-mode direct "
    "baseline), hdeval.",
)
@click.option(
    "--aggregators",
    default="lr",
    show_default=True,
    help="Comma-separated aggregators of hdeval and paireval, each a row of the tables: mean, "
    "direct, aspect_mean, shrink, nnls, ridge, lr, dt, nn, rf, auto.",
)
@click.option("--seeds", default=1, show_default=True, type=int, help="Runs per setting (seeds 0..N-1).")
@click.option("--train-fracs", default="0.5", show_default=True, help="Comma-separated training fractions.")
@click.option("--test-frac", default=0.5, show_default=True, type=float, help="Share of samples held out.")
@click.option("--preset", default=None, help="A task's named setting, e.g. paper.")
@click.option("--aspects", default=None, help="Comma-separated subset of the task's aspects.")
@click.option("--layers", default=3, show_default=True, type=int, help="Depth of HD-Eval's criteria tree.")
@click.option("--children", default=4, show_default=True, type=int, help="Max sub-criteria per criterion.")
@click.option(
    "--top-k", default=4, show_default=True, type=int, help="Criteria expanded per layer from layer 3."
)
@click.option(
    "--limit",
    default=None,
    type=int,
    help="Use about N samples per run: whole documents until at least N (never part of one).",
)
@click.option(
    "--method-option",
    "method_option",
    multiple=True,
    metavar="METHOD.NAME=VALUE",
    help="A method's option for its runs (repeatable), e.g. paireval.comparisons=3, "
    "dna.tie_margin=0.5; `hdeval train --help` lists each method's options.",
)
@click.option("--resamples", default=1000, show_default=True, type=int, help="Bootstrap resamples.")
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory: results.json, results.md, report.html.",
)
@click.option("--force", is_flag=True, help="Replace a previous benchmark's results in --out.")
@click.option(
    "--keep-artifacts",
    is_flag=True,
    help="Also save each run's trained evaluator under --out/runs/<setting>-seed<k>/.",
)
@click.option(
    "--label-budget",
    "label_budget",
    default=None,
    metavar="N,N,...",
    help="Learning curves: simulate labelling the training split from no label, re-fit the "
    "learned methods' aggregator at each of these label counts and score the held-out "
    "documents (no LLM call beyond the runs'), e.g. 10,20,50,100,200.",
)
@click.option(
    "--selection",
    default=None,
    help="With --label-budget: the selection strategies to compare (random, uncertainty, "
    "diversity, hybrid). Default: random,uncertainty,hybrid.",
)
@click.option(
    "--repeats",
    default=None,
    type=int,
    help="With --label-budget: simulated labellings per strategy (different seeds). Default: 10.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option(
    "--offline",
    is_flag=True,
    envvar="HDEVAL_OFFLINE",
    help="Never download a built-in task's data (by default it is fetched on first use).",
)
@llm_options
@guarded
def benchmark(
    task: str,
    methods: str,
    aggregators: str,
    seeds: int,
    train_fracs: str,
    resamples: int,
    method_option: tuple[str, ...],
    out: str,
    force: bool,
    keep_artifacts: bool,
    quiet: bool,
    offline: bool,
    label_budget: str | None,
    selection: str | None,
    repeats: int | None,
    **options: Any,
) -> None:
    """Train every combination of methods, aggregators, seeds and training fractions (one shared
    LLM cache: a repeated sweep makes no calls) and compare them on the held-out split.

    \b
    Example:
      hdeval benchmark --task sfhot --methods direct,hdeval --aggregators lr,nn --seeds 3 \\
          --train-fracs 0.1,0.5 --llm fake -o bench/
    """
    from hdeval.benchmark.output import check_output_dir, write_benchmark
    from hdeval.benchmark.spec import BenchmarkSpec, check_shapes, parse_method_options
    from hdeval.benchmark.sweep import run_benchmark
    from hdeval.cli.data import fetch_missing_task_data
    from hdeval.core.errors import ConfigError

    try:
        fracs = tuple(float(f) for f in _csv(train_fracs))
    except ValueError:
        raise ConfigError(f"--train-fracs must be comma-separated numbers, got {train_fracs!r}") from None
    given = {k: v for k, v in options.items() if v is not None}
    spec = BenchmarkSpec(
        task,
        _csv(methods),
        _csv(aggregators),
        seeds,
        fracs,
        resamples,
        given,
        parse_method_options(method_option),
    )
    spec.validate()
    shape = check_shapes(spec)
    curves = None
    if label_budget is None and (selection is not None or repeats is not None):
        raise ConfigError("--selection and --repeats set up learning curves: give --label-budget too")
    if label_budget is not None:
        from hdeval.benchmark.curves import DEFAULT_SELECTION, CurveSpec

        selection = selection if selection is not None else ",".join(DEFAULT_SELECTION)
        repeats = repeats if repeats is not None else 10

        try:
            budgets = tuple(int(b) for b in _csv(label_budget))
        except ValueError:
            raise ConfigError(
                f"--label-budget must be comma-separated whole numbers, got {label_budget!r}"
            ) from None
        curves = CurveSpec(budgets, _csv(selection), repeats, spec.aggregators[0])  # each run re-fits its own
        curves.validate()
        if not {"hdeval", "paireval"} & set(spec.methods):
            raise ConfigError(
                "--label-budget re-fits a learned aggregator: add hdeval or paireval to --methods"
            )
    from hdeval.run.output import refuse_inputs_inside, run_inputs

    # before any LLM call: a cache inside a new -o would make it a directory no benchmark is written to
    refuse_inputs_inside(out, run_inputs({"task": task, **options}, "task", "data", "cache_dir"))
    check_output_dir(out, force, spec.artifact_names() if keep_artifacts else ())
    if options.get("data") is None:
        fetch_missing_task_data(task, offline=offline)
    progress = TerminalProgress(quiet)
    _notice_local(_resolved(options.get("llm")))
    artifacts: dict[str, Any] | None = {} if keep_artifacts else None
    runs: list[Any] = []

    def keep_learned(key: Any, fitted: Any, doc_of: Any) -> None:
        method, agg, frac, seed = key
        if curves is not None and agg is not None and hasattr(fitted, "feature_keys"):
            runs.append((f"{method}-{agg}", frac, seed, fitted, doc_of, agg))

    results = run_benchmark(spec, progress=progress, artifacts=artifacts, on_run=keep_learned)
    if curves is not None:
        from hdeval.benchmark.curves import learning_curves

        results["learning_curves"] = learning_curves(runs, curves, shape == "pairwise", progress.message)
    write_benchmark(results, out, force=force, artifacts=artifacts)
    for m, c in results["cost"].items():
        click.echo(
            f"{m}: {c['runs']} run(s), LLM requests: {c['requests']} (new calls made: {c['calls']}, "
            f"cache hits: {c['cache_hits']}), tokens: {c['prompt_tokens']} prompt + "
            f"{c['completion_tokens']} completion",
            err=True,
        )
    for w in results.get("warnings") or []:
        click.echo(f"warning: {w}", err=True)
    for s in results["settings"]:
        pairwise = results.get("shape") == "pairwise"
        avg = s["agreement"]["evaluator"]["wo_ties"] if pairwise else s["dataset"]["average"]["spearman"]
        name = s["method"] if s["aggregator"] is None else f"{s['method']}-{s['aggregator']}"
        mean = "n/a" if avg["mean"] is None else f"{avg['mean']:.3f} ± {avg['std']:.3f}"
        what = "held-out agreement w/o ties" if pairwise else "held-out average spearman"
        click.echo(f"{name:<12} train-frac {s['train_frac']:<5g} {what} {mean}")
    for run in results.get("learning_curves") or []:
        from hdeval.benchmark.curves import has_target

        full = run["summary"].get("full_label")
        if not has_target(full):
            shown = "none" if full is None else f"{full:.3f}"
            click.echo(
                f"{run['setting']} seed {run['seed']}: no labels-to-95% figure: the full-label "
                f"agreement ({shown}) is not above 0"
            )
            continue
        for strat, row in run["summary"]["strategies"].items():
            need = row["labels_needed"]
            click.echo(
                f"{run['setting']} seed {run['seed']}: {strat} reaches 95% of full-label agreement with "
                f"{'more than ' + str(run['budgets'][-1]) if need is None else f'{need:g}'} labels "
                "(median over repeats)"
            )
    kept = f", {len(artifacts)} run artifact(s) in runs/" if artifacts else ""
    click.echo(f"benchmark written to {out} (results.json, results.md, report.html{kept})")
    from hdeval.report import file_url

    click.echo(f"open: {file_url(Path(out) / 'report.html')}")
