"""``hdeval report`` and ``hdeval explain``: readable explanations of a trained evaluator (the numbers
come from the evaluator's ``Reports`` and ``Explains`` capabilities)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

from hdeval.cli.artifacts import load_artifact, score_with_artifact
from hdeval.cli.boundary import guarded
from hdeval.cli.options import llm_options
from hdeval.cli.progress import TerminalProgress
from hdeval.core.errors import ArtifactError, ConfigError, DataError
from hdeval.methods.base import Explains, Reports, explain_refusal, report_refusal


@click.command()
@click.argument("artifact", type=click.Path())
@click.option(
    "--out",
    "-o",
    default=None,
    type=click.Path(file_okay=False),
    help="Directory for report.html and report.json. Default: ARTIFACT/report.",
)
@click.option(
    "--max-samples",
    default=200,
    show_default=True,
    type=int,
    help="Held-out samples explained with SHAP (bounds the cost).",
)
@click.option(
    "--background",
    default=100,
    show_default=True,
    type=int,
    help="Training rows used as SHAP background (lr/nn aggregators).",
)
@click.option(
    "--repeats", default=5, show_default=True, type=int, help="Shuffles per permutation importance."
)
@click.option(
    "--curve-points",
    default=20,
    show_default=True,
    type=int,
    help="Refits for the criteria-efficiency curve (criteria counts spread evenly).",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Sampling and shuffling randomness.")
@click.option(
    "--data",
    default=None,
    type=click.Path(dir_okay=False),
    help="The training data, for the per-sample view's text and raw replies (a file that cannot "
    "be read is an error). Default: the file the artifact was trained on, if it is still there.",
)
@click.option(
    "--cache-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The LLM reply cache the training used (read, never written), for the raw replies. "
    "Default: HDEVAL_CACHE_DIR or the per-user cache.",
)
@click.option(
    "--base-url",
    envvar="HDEVAL_BASE_URL",
    default=None,
    help="The server's URL as training was given it, with its query (Azure's ?api-version=...), which "
    "the artifact does not keep: lets the per-sample view find the raw replies. Never written.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace a report.html or report.json in --out that hdeval report did not write (one it "
    "wrote, and any in ARTIFACT/report, is replaced without it).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@guarded
def report(
    artifact: str,
    out: str | None,
    max_samples: int,
    background: int,
    repeats: int,
    curve_points: int,
    seed: int,
    data: str | None,
    cache_dir: str | None,
    base_url: str | None,
    force: bool,
    quiet: bool,
) -> None:
    """Write an HTML + JSON report: a verdict banner, held-out correlation (pairs: agreement)
    per layer, criteria tree with importance, permutation importance, SHAP per aspect,
    criteria-efficiency curve, and the samples the evaluator got most wrong with the LLM's
    raw replies. Prints the page as a file:// URL to open in a browser.

    \b
    Example:
      hdeval report artifacts/summeval-rf            # -> artifacts/summeval-rf/report/report.html
      hdeval report artifacts/summeval-nn -o out/ --max-samples 100
    """
    from hdeval.report import check_report_output, file_url
    from hdeval.run.output import refuse_in_cache

    if out:
        refuse_in_cache(out, cache_dir, "-o")
    # before anything is computed: a report.html of the user's in -o is replaced only with
    # --force; ARTIFACT/report is hdeval's own folder (it goes with the artifact on train --force)
    own = Path(artifact) / "report"
    if not Path(artifact).is_dir():  # said as loading it says, not as a report folder it cannot make
        from hdeval.core.errors import ArtifactError

        raise ArtifactError(f"{artifact} is not an artifact directory")
    target = Path(out) if out else own
    check_report_output(target, force=force or os.path.abspath(target) == os.path.abspath(own))
    if data is not None:  # given by name: a file that cannot be read is an error, not a note
        from hdeval.data.samples import check_readable

        check_readable(data)
    ev = load_artifact(artifact)
    task = ev.task
    if not isinstance(ev, Reports):
        raise ConfigError(report_refusal(ev, artifact))
    if data is not None:
        from hdeval.report.samples import check_data

        check_data(data, task)
    _refuse_symlinked_output(ev.path, Path(out) if out else ev.path / "report")
    if base_url:  # the full URL of the server the artifact names, in memory only
        from hdeval.core.urls import public_url

        named = (getattr(ev.llm, "base_url", None) or "").rstrip("/")
        if (public_url(base_url.strip()) or "").rstrip("/") != named:
            raise ConfigError(
                f"--base-url names another server than the artifact's ({named or 'none'}): give "
                "the URL its training run was given"
            )
        ev.llm = ev.llm.replace(base_url=base_url.strip())
    page, numbers, lines = ev.write_report(
        out,
        progress=TerminalProgress(quiet),
        max_samples=max_samples,
        n_background=background,
        n_repeats=repeats,
        curve_points=curve_points,
        random_state=seed,
        data=data,
        cache_dir=cache_dir,
    )
    for line in lines:
        click.echo(line)
    click.echo(f"report written to {page} (numbers in {numbers})")
    click.echo(f"open: {file_url(page)}")


def _refuse_symlinked_output(artifact: Path, out: Path) -> None:
    """The report must not be written through a symbolic link: not its files, and not any
    directory between the artifact and the output when the output lies inside the artifact
    (a hostile artifact could point ``report`` anywhere)."""
    for name in ("report.html", "report.json"):
        if (out / name).is_symlink():
            raise ArtifactError(f"refusing to write the report: {out / name} is a symbolic link")
    base = Path(os.path.abspath(artifact))
    target = Path(os.path.abspath(out))
    if target == base or base not in target.parents:
        return
    step = base
    for part in target.relative_to(base).parts:
        step = step / part
        if step.is_symlink():
            raise ArtifactError(
                f"refusing to write the report: {step} inside the artifact is a symbolic link"
            )


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--sample", "sample_id", required=True, help="Id of the sample to explain.")
@click.option("--data", required=True, type=click.Path(dir_okay=False), help="JSONL file holding the sample.")
@click.option(
    "--top",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Criteria shown per aspect (at least 1).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@llm_options
@guarded
def explain(artifact: str, sample_id: str, data: str, top: int, quiet: bool, **llm_options: Any) -> None:
    """Explain one sample's scores: per aspect the prediction, the base value and the
    criteria that moved it most (SHAP values), with their criterion scores.

    \b
    Example:
      hdeval explain artifacts/summeval-rf --sample summeval-0042 --data new.jsonl
    """
    from hdeval.data.samples import read_samples

    ev = load_artifact(artifact)
    if not isinstance(ev, Explains):
        raise ConfigError(explain_refusal(ev, artifact, "hdeval explain"))
    samples = [s for s in read_samples(data, ev.task, require_scores=False) if s.id == sample_id]
    if not samples:
        raise DataError(f"no sample with id {sample_id!r} in {data}")
    res = score_with_artifact(ev, samples[:1], quiet=quiet, **llm_options)
    expl = ev.explain(res, top=top)[0]
    _print_explanation(ev, samples[0], res, expl)


def _print_explanation(ev: Any, sample: Any, res: Any, expl: dict[str, Any]) -> None:
    """Per aspect: prediction, base value, top criteria with SHAP and score, then the rest."""
    click.echo(f"sample {sample.id}  (artifact {ev.path}, {ev.explain_heading()}, LLM {ev.llm_identity})")
    failed = {f.criterion_key: f.reason for f in res.criteria.failures}
    for aspect, e in expl.items():
        a = ev.task.aspect(aspect)
        line = f"\n{aspect}: predicted {e['clipped_prediction']:.3f} (range {a.low:g}-{a.high:g})"
        if not math.isclose(e["clipped_prediction"], e["prediction"], abs_tol=1e-9):
            line += f", unclipped {e['prediction']:.3f}"
        if aspect in sample.scores:
            line += f"; human {sample.scores[aspect]:g}"
        click.echo(line)
        click.echo(f"  base value (average prediction)     {e['base_value']:8.3f}")
        width = max([len(t["criterion"]) for t in e["top"]] + [30])
        click.echo(f"  {'criterion':<{width}}  {'score':>6}  {'SHAP':>7}  name")
        for t in e["top"]:
            score = (
                "failed" if t["criterion"] in failed else ("-" if t["score"] is None else f"{t['score']:.2f}")
            )
            click.echo(f"  {t['criterion']:<{width}}  {score:>6}  {t['shap']:>+7.3f}  {t['name']}")
        n_other = len(ev.explained_columns()) - len(e["top"])
        if n_other > 0:
            click.echo(f"  {f'({n_other} other criteria)':<{width}}  {'':>6}  {e['other_shap']:>+7.3f}")
        click.echo(
            f"  = base {e['base_value']:.3f} + SHAP {e['prediction'] - e['base_value']:+.3f}"
            f" = {e['prediction']:.3f}"
        )
    if failed:
        click.echo(
            f"\n{len(failed)} criterion score(s) could not be read and were imputed "
            "with the training median: " + ", ".join(sorted(failed))
        )
