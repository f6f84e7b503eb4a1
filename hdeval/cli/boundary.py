"""The one error boundary of every command: library errors become one line and an exit code,
library warnings one summarised line each, Ctrl-C and SIGTERM one line saying what was kept."""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
import warnings
from typing import Any, Callable

import click

from hdeval.cli.progress import _end_open_line, _set_line_open, _stop_all_tickers
from hdeval.core.errors import HdevalError, one_line_at_word

INTERRUPTED = "interrupted: every finished LLM call is cached; rerun the same command to resume"
TERMINATED = "terminated (SIGTERM): every finished LLM call is cached; rerun the same command to resume"


def _count_warning(seen: dict, message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    # cut at a word, late enough to keep the fix a message ends with (a plug-in's, scikit-learn's)
    key = (category.__name__, one_line_at_word(text))
    seen[key] = seen.get(key, 0) + 1


def _show_warnings(seen: dict) -> None:
    """Python warnings from libraries (scikit-learn, ...): one summarised line each."""
    if seen:
        _end_open_line()
    for (category, text), n in seen.items():
        click.echo(f"warning: {text} ({category}{f', {n} times' if n > 1 else ''})", err=True)
    seen.clear()


class _WarningLines(logging.Handler):
    """The library's logged warnings (a long retry wait, a download) as ``warning:`` lines that
    end an open progress line first; without it Python's last-resort handler writes them onto it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
        except Exception:  # a bad format: what logging itself would print
            self.handleError(record)
            return
        _end_open_line()
        click.echo(f"warning: {_redacted(text)}", err=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM in the main thread: a KeyboardInterrupt, so every cleanup Ctrl-C gets runs for it too."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _redacted(text: str) -> str:
    """``text`` without the secrets this command knows of (the environment's keys and proxies,
    its ``--base-url``'s credentials and query): the last net under every message's own redaction."""
    from hdeval.core.redaction import Redactor

    ctx = click.get_current_context(silent=True)
    url = ctx.params.get("base_url") if ctx is not None else None
    return Redactor.from_env(url if isinstance(url, str) else None)(text)


def run_command(fn: Callable[[], Any], interrupted: str = INTERRUPTED) -> Any:
    """The one error boundary: library errors become one line on stderr and an exit code;
    library warnings one summarised line each (never raw); Ctrl-C and SIGTERM one line saying
    what was kept (``interrupted``; exit 130 and 143, as the shell reports)."""
    seen: dict = {}
    previous = None
    library = logging.getLogger("hdeval")
    lines = None if any(isinstance(h, _WarningLines) for h in library.handlers) else _WarningLines()
    if lines is not None:  # not again in a nested boundary: each warning once
        library.addHandler(lines)
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # count every one; show each once, below
            for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", quiet)  # hidden by Python's defaults too
            warnings.showwarning = functools.partial(_count_warning, seen)
            return fn()
    except HdevalError as exc:
        _stop_all_tickers()
        _show_warnings(seen)
        _end_open_line()
        click.echo(f"error: {_redacted(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _stop_all_tickers()
        terminated = isinstance(exc, Terminated)
        if previous is not None:  # a second SIGTERM from here on ends the process the usual way
            signal.signal(signal.SIGTERM, previous)
            previous = None
        _show_warnings(seen)
        _set_line_open(False)
        click.echo(f"\n{TERMINATED if terminated else interrupted}", err=True)
        sys.exit(128 + signal.SIGTERM if terminated else 130)
    finally:
        if lines is not None:
            library.removeHandler(lines)
        _stop_all_tickers()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _show_warnings(seen)


def guarded(fn: Callable[..., Any], interrupted: str = INTERRUPTED) -> Callable[..., Any]:
    """A command's callback run inside :func:`run_command` (the innermost decorator)."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        return run_command(lambda: fn(*args, **kwargs), interrupted)

    return command
