"""Command line: parse options -> one library call -> output. All terminal I/O lives here, one
module per command group."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import click

from hdeval import __version__
from hdeval.cli.boundary import _redacted, guarded, run_command
from hdeval.cli.progress import TerminalProgress
from hdeval.core.errors import one_line_at_word

__all__ = ["TerminalProgress", "cli", "main", "run_command"]


class _Kit:
    """What a method's ``commands`` get from the CLI (:class:`hdeval.methods.base.CommandKit`)."""

    guarded = staticmethod(guarded)

    @staticmethod
    def check_output(path: Any, inputs: Any) -> None:
        from hdeval.run.output import check_output

        check_output(path, list(inputs))


class _Commands(click.Group):
    """The built-in commands, then the commands plug-in methods add: loaded only when a name is
    not a built-in one, or for the list in ``--help``; a broken plug-in is one warning line."""

    def _plugin_commands(self, ctx: click.Context) -> dict[str, click.Command]:
        # made once per invocation (--help lists them, then asks for each): each warning once
        if _PLUGIN_COMMANDS not in ctx.meta:
            ctx.meta[_PLUGIN_COMMANDS] = self._make_plugin_commands()
        return ctx.meta[_PLUGIN_COMMANDS]

    def _make_plugin_commands(self) -> dict[str, click.Command]:
        from hdeval.methods.registry import builtin_methods, methods

        builtin = {m.name for m in builtin_methods()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = [m for m in methods() if m.name not in builtin and m.commands is not None]
        for w in caught:
            click.echo(f"warning: {w.message}", err=True)
        out: dict[str, click.Command] = {}

        def warn(method: Any, text: str) -> None:
            click.echo(f"warning: method plug-in {method.name!r}: {one_line_at_word(text)}", err=True)

        for method in found:
            try:
                made = list(method.commands(_Kit()))
            except Exception as exc:  # a plug-in's own code: skipped, as a broken plug-in is
                warn(method, f"its commands could not be made ({type(exc).__name__}: {exc})")
                continue
            wrong = next((c for c in made if not isinstance(c, click.Command) or not c.name), None)
            if wrong is not None:  # a click command's name and help are read for --help
                what = (
                    "a click command without a name"
                    if isinstance(wrong, click.Command)
                    else type(wrong).__name__
                )
                warn(method, f"its commands could not be made (it gave {what}, not a named click command)")
                continue
            for command in made:
                if command.name in self.commands or command.name in out:
                    warn(
                        method, f"its command {command.name!r} is left out: hdeval has a command of that name"
                    )
                else:
                    out[command.name] = command
        return out

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self._plugin_commands(ctx)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        return self._plugin_commands(ctx).get(name)

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with _one_line_usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:  # the help to name when its options fail to parse (click gives no context)
            ctx.meta[_PARSING] = f"{ctx.command_path} {cmd.name}"
        return name, cmd, rest

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_usage_errors():  # a subcommand's options are parsed in here
            return super().invoke(ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command's summary is its first sentence, whole and wrapped (click's default cuts
        it at the terminal's width with "...", mid-sentence)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.short_help or _first_sentence(cmd.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


_PARSING = "hdeval.parsing"
_PLUGIN_COMMANDS = "hdeval.plugin_commands"


class _UsageLine(click.ClickException):
    """A usage error as one line, like every other refusal (click's own is three: usage, a hint
    and the error), naming the help to read; exit 2, as click's."""

    exit_code = 2

    def __init__(self, message: str, help_command: str) -> None:
        super().__init__(message)
        self.help_command = help_command

    def show(self, file: Any = None) -> None:
        text = " ".join(self.format_message().split())
        click.echo(f"error: {_redacted(text)} (see '{self.help_command} -h')", err=True)


@contextlib.contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # the help page itself, not an error line
    except click.UsageError as exc:
        current = click.get_current_context(silent=True)
        fallback = current.meta.get(_PARSING, current.command_path) if current is not None else "hdeval"
        where = exc.ctx.command_path if exc.ctx is not None else fallback
        raise _UsageLine(exc.format_message(), where) from exc


def _first_sentence(text: str) -> str:
    import inspect
    import re

    para = " ".join(inspect.cleandoc(text).split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", para, maxsplit=1)[0]


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
    from hdeval.cli.label import export_labels, label
    from hdeval.cli.ppi_estimate import estimate
    from hdeval.cli.refit import refit
    from hdeval.cli.report import explain, report
    from hdeval.cli.train import train
    from hdeval.cli.view import view
    from hdeval.methods.registry import builtin_methods

    for command in (
        train,
        apply,
        merge_shards,
        report,
        explain,
        methods_cmd,
        tasks_cmd,
        data,
        cache,
        benchmark,
        estimate,
        label,
        view,
        init,
        check,
        refit,
    ):
        cli.add_command(command)
    data.add_command(export_labels)
    for method in builtin_methods():  # the commands a built-in method adds (hdeval paireval ...)
        for command in method.commands(_Kit()) if method.commands is not None else ():
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="hdeval")


if __name__ == "__main__":
    main()
