"""Command line: parse options -> one library call -> output. All terminal I/O lives here, one
module per command group."""

from __future__ import annotations

import click

from hdeval import __version__
from hdeval.cli.boundary import run_command
from hdeval.cli.progress import TerminalProgress

__all__ = ["TerminalProgress", "cli", "main", "run_command"]


class _Group(click.Group):
    """The root group: each command's summary is its first sentence, whole and wrapped (click's
    default cuts it at the terminal's width with "...", mid-sentence)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.short_help or _first_sentence(cmd.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _first_sentence(text: str) -> str:
    import inspect
    import re

    para = " ".join(inspect.cleandoc(text).split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", para, maxsplit=1)[0]


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hdeval")
def cli() -> None:
    """hdeval: train aligned LLM evaluators from human ratings (HD-Eval, PairEval, DnA)."""


def _register() -> None:  # a function: the names would shadow the modules cli.apply, cli.train, ...
    from hdeval.cli.admin import cache, methods_cmd, tasks_cmd
    from hdeval.cli.apply import apply, merge_shards
    from hdeval.cli.benchmark import benchmark
    from hdeval.cli.check import check
    from hdeval.cli.data import data
    from hdeval.cli.init import init
    from hdeval.cli.paireval import paireval
    from hdeval.cli.report import explain, report
    from hdeval.cli.train import train

    for command in (train, apply, merge_shards, report, explain, methods_cmd, tasks_cmd, data, cache, paireval,
                    benchmark, init, check):
        cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="hdeval")


if __name__ == "__main__":
    main()
