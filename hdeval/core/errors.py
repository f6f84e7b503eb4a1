"""Exceptions raised by the library. Only ``hdeval.cli`` turns them into messages and exit codes."""

from __future__ import annotations

from typing import Any, Callable


def one_line(text: Any, limit: int = 200) -> str:
    """``text`` with its white space folded, cut to ``limit`` characters: a part of a message."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line_at_word(text: Any, limit: int = 400) -> str:
    """``text`` with its white space folded and, past ``limit`` characters, cut at a word (" ..."):
    for a message whose end says the fix (a plug-in's, a library's warning), which a cut
    mid-word at :func:`one_line`'s 200 would lose."""
    import textwrap

    return textwrap.shorten(str(text), limit, placeholder=" ...")


def shown_name(name: Any) -> str:
    """A key or field name read from a file, as a message names it: as it is when printable, else
    its repr (a name from an untrusted file cannot add a line or a terminal code to the message)."""
    text = str(name)
    return text if text.isprintable() else repr(text)


# pydantic's error types -> what the value must be, in the words of the house's messages
_MUST = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "text",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def validation_line(exc: Any, flags: bool | Callable[[str], str] = False) -> str:
    """The first problem a pydantic ``ValidationError`` reports, as one line of the house's form,
    without the file (the caller names it): ``FIELD must be KIND, got VALUE``, ``FIELD is
    missing``, ``unknown field(s): A, B``. FIELD is the dotted path (``aspects.0.low``); with
    ``flags``, a top-level field is named as its command-line option (``--max-retries``), or as
    ``flags(name)`` names it (a plug-in's ``-O name``)."""
    errors = exc.errors()

    def name(loc: tuple) -> str:
        path = ".".join(shown_name(part) for part in loc)
        if not flags or len(loc) != 1:
            return path
        return flags(path) if callable(flags) else "--" + path.replace("_", "-")

    unknown = [name(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        return f"unknown {'option' if flags else 'field'}(s): {', '.join(unknown)}"
    first = errors[0]
    field, kind, ctx = name(first["loc"]), first["type"], first.get("ctx") or {}
    got = one_line(repr(first.get("input")), 60)
    if kind == "missing":
        return f"{field} is missing"
    if kind in _MUST:
        return f"{field} must be {_MUST[kind]}, got {got}"
    if kind == "literal_error":
        return f"{field} must be {ctx.get('expected')}, got {got}"
    msg = str(first["msg"]).removeprefix("Value error, ")  # a validator's ValueError: its own words
    return f"{field}: {msg[:1].lower() + msg[1:]}" if field else msg


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

    exit_code = 2  # a file the user wrote or edited, as a bad task or data file


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


class MethodError(HdevalError):
    """A method's own code (a plug-in's, mostly) broke the seam: its ``fit`` or ``write`` gave
    what hdeval cannot use or save; the message names the method and what it gave."""


class ArtifactError(HdevalError):
    """An artifact directory is missing files, was modified, or comes from an incompatible version."""

    exit_code = 2
