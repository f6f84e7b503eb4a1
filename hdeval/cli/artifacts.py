"""What commands that score with an artifact share: loading it (showing its warnings), the LLM it
is scored with (asking on a terminal before using a server only the artifact names), notices."""

from __future__ import annotations

import sys
from typing import Any

import click

from hdeval.cli.progress import TerminalProgress
from hdeval.core.errors import HdevalError


def _notice_local(model: str | None) -> None:
    from hdeval.llm.backends.factory import DEFAULT_LOCAL_NOTICE

    if model == "local":
        click.echo(DEFAULT_LOCAL_NOTICE, err=True)


def _resolved(llm: str | None) -> str | None:
    from hdeval.llm.backends.factory import resolve_llm

    try:
        return resolve_llm(llm)
    except HdevalError:
        return None


def load_artifact(path: str):
    """Load an artifact of any method and show its warnings (e.g. an edited tree.json)."""
    from hdeval.methods.registry import load_artifact as load

    ev = load(path)
    for w in ev.warnings:
        click.echo(f"warning: {w}", err=True)
    return ev


def _stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def policy() -> dict:
    """The artifact-LLM policy's terms on the command line: whether --llm/--base-url were typed (not
    taken from the environment); the question, asked on a terminal only (else the library refuses)."""
    from click.core import ParameterSource

    ctx, typed = click.get_current_context(silent=True), ParameterSource.COMMANDLINE
    llm, url = (ctx is None or ctx.get_parameter_source(n) == typed for n in ("llm", "base_url"))
    ask = (lambda question: click.confirm(question, default=False, err=True)) if _stdin_is_tty() else None
    return dict(
        llm_given=llm, base_url_given=url, confirm=ask, notify=lambda text: click.echo(text, err=True)
    )


def score_with_artifact(ev, samples, *, quiet: bool, **llm_options: Any):
    """Score samples with the artifact's LLM (or the one given), cached; warn on a mismatch."""
    from hdeval.run.artifact_llm import open_artifact_llm

    backend = open_artifact_llm(ev, **llm_options, **policy())
    progress = TerminalProgress(quiet)
    try:
        return ev.score(samples, backend=backend, concurrency=llm_options["concurrency"], progress=progress)
    finally:
        progress.close()
        backend.close()
