"""Exceptions raised by the library. Only ``hdeval.cli`` turns them into messages and exit codes."""

from __future__ import annotations

from typing import Any


def one_line(text: Any, limit: int = 200) -> str:
    """``text`` with its white space folded, cut to ``limit`` characters: a part of a message."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HdevalError(Exception):
    """Base class: a problem the user can fix, with a one-line message saying what and where."""

    exit_code = 1


class ConfigError(HdevalError):
    """An option, task file or artifact setting is wrong."""

    exit_code = 2


class DataError(HdevalError):
    """A data file is missing or a sample in it is malformed."""

    exit_code = 2


class PromptError(HdevalError):
    """A prompt template is missing or refers to an unknown placeholder."""


class BackendError(HdevalError):
    """The LLM could not be reached or kept failing after retries; every call that finished is
    already cached, so a rerun resumes."""

    exit_code = 3


class CacheError(HdevalError):
    """The LLM reply cache cannot be opened or written (corrupted, read-only, disk full); the
    message names the file and what to do, and nothing in it is deleted."""


class RequestRejected(BackendError):
    """The server could not answer this one request (too long, filtered, a reply past the size
    cap), while others may succeed: that cell's failure, not cached."""


class RetriesExhausted(BackendError):
    """One request kept failing through every retry: while others succeed, that cell's failure
    (not cached, so the next run asks again); a server failing request after request stops the run."""


class DownloadError(HdevalError):
    """A data file could not be fetched completely (HTTP error, unreachable, cut off); nothing is
    written, so running the command again is safe."""

    exit_code = 3


class DecompositionError(HdevalError):
    """The LLM kept returning unusable sub-criteria for one criterion."""


class ScoringError(HdevalError):
    """Too many criterion scores could not be parsed."""


class BudgetExceeded(HdevalError):
    """A run reached ``--max-calls`` before it was done; what finished is cached."""

    exit_code = 4


class ArtifactError(HdevalError):
    """An artifact directory is missing files, was modified, or comes from an incompatible version."""

    exit_code = 2
