"""The names the command modules share, from the modules that hold them (one job each):
:mod:`.boundary` (the error boundary), :mod:`.progress` (terminal progress), :mod:`.options`
(the options declared once) and :mod:`.artifacts` (loading and scoring with an artifact)."""

from hdeval.cli.artifacts import (
    _confirm, _from_command_line, _notice_local, _resolved, _stdin_is_tty, load_artifact, score_with_artifact,
)
from hdeval.cli.boundary import INTERRUPTED, TERMINATED, Terminated, run_command
from hdeval.cli.options import batch_option, llm_options, method_options
from hdeval.cli.progress import (
    DEFAULT_PROGRESS_INTERVAL, PROGRESS_INTERVAL_ENV, TICKER_THREAD, TerminalProgress, progress_interval,
)

__all__ = [
    "DEFAULT_PROGRESS_INTERVAL", "INTERRUPTED", "PROGRESS_INTERVAL_ENV", "TERMINATED", "TICKER_THREAD",
    "Terminated", "TerminalProgress", "_confirm", "_from_command_line", "_notice_local", "_resolved",
    "_stdin_is_tty", "batch_option", "llm_options", "load_artifact", "method_options", "progress_interval",
    "run_command", "score_with_artifact",
]
