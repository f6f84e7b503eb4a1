"""The methods hdeval knows, found once: the built-in packages and any plug-in that declares an
entry point in the group ``hdeval.methods`` (its value: a :class:`~hdeval.methods.base.Method`,
or a callable returning one or a list of them). Loading an artifact dispatches here on the
method its manifest names, so nothing below the methods needs to know them.

A plug-in that cannot be loaded (it raises at import, gives no Method, reuses a name) is skipped
with one :class:`PluginWarning` naming it: the built-in methods keep working. The CLI reads the
registry inside its error boundary only (``hdeval --help`` never loads a plug-in)."""

from __future__ import annotations

import warnings
from pathlib import Path

from hdeval.core.errors import ArtifactError, ConfigError, HdevalError, MethodError, one_line_at_word
from hdeval.methods.base import METHODS, METRICS, Fitted, Method, check_metrics, remember_scores
from hdeval.methods.options import Option, check_recorded_options, declaration_problem

ENTRY_POINT_GROUP = "hdeval.methods"
_loaded = False
_skipped: dict[str, str] = {}  # entry-point name -> why its plug-in was skipped


class PluginWarning(UserWarning):
    """A method plug-in was skipped: the message names it and says why, in one line."""


def builtin_methods() -> list[Method]:
    """The methods hdeval ships, without loading any plug-in (the CLI declares their option
    flags at import; a plug-in's options are given as ``-O NAME=VALUE``)."""
    # The packages hold registration only (implementations load when a method is used), so
    # `hdeval --help` stays light.
    from hdeval.methods import direct, dna, hdeval, paireval

    return [m for package in (direct, hdeval, paireval, dna) for m in package.METHODS]


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: a plug-in that asks for the registry while loading finds it
    _skipped.clear()
    METHODS.update({m.name: m for m in builtin_methods()})
    _load_plugins()


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            _add_plugin(ep)
        except ConfigError as exc:
            _skipped[ep.name] = str(exc)
            warnings.warn(str(exc), PluginWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning given by the function calling this at the first
    frame outside hdeval and pydantic (which calls TrainConfig's validators): the caller's line,
    whichever door of hdeval first loaded the registry."""
    import os
    import sys

    import pydantic

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hdeval/
    inside = (here + os.sep, os.path.dirname(os.path.abspath(pydantic.__file__)) + os.sep)
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _add_plugin(ep) -> None:
    """Register what entry point ``ep`` gives; a one-line ConfigError naming it if unusable."""
    try:
        found = ep.load()
        if callable(found) and not isinstance(found, Method):
            found = found()
    except Exception as exc:  # any error of a plug-in's own code, SyntaxError included
        # cut at a word, and late enough that the fix a message ends with is kept
        detail = one_line_at_word(f"{type(exc).__name__}: {exc}")
        raise ConfigError(
            f"method plug-in {ep.name!r} ({ep.value}) skipped: it could not be loaded ({detail})"
        ) from None
    methods = list(found) if isinstance(found, (list, tuple)) else [found]
    for method in methods:
        if not isinstance(method, Method):
            raise ConfigError(
                f"method plug-in {ep.name!r} ({ep.value}) skipped: it gave "
                f"{type(method).__name__}, not a hdeval.methods.base.Method"
            )
        if method.name in METHODS:
            raise ConfigError(
                f"method plug-in {ep.name!r} ({ep.value}) skipped: it reuses the method name {method.name!r}"
            )
        # found here, not when a run builds the options: a bad default would pass unchecked
        problem = declaration_problem(method.options)
        if problem:
            raise ConfigError(
                f"method plug-in {ep.name!r} ({ep.value}) skipped: method {method.name!r}: {problem}"
            )
    METHODS.update({m.name: m for m in methods})


def get_method(name: str) -> Method:
    _load()
    if name not in METHODS:
        if name in _skipped:  # asked for by name: say why it is not there, each time
            raise ConfigError(_skipped[name])
        raise ConfigError(f"unknown method {name!r}: choose from {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    _load()
    return sorted(METHODS)


def methods() -> list[Method]:
    """Every method, built-in ones first, in the order they were registered."""
    _load()
    return list(METHODS.values())


def all_options() -> dict[str, list[tuple[str, Option]]]:
    """Every method's option name -> (method, how that method declares it), for the CLI: one
    flag per name, whose help gives each method's own default."""
    _load()
    out: dict[str, list[tuple[str, Option]]] = {}
    for name in sorted(METHODS):
        for opt_name, opt in METHODS[name].options.specs().items():
            out.setdefault(opt_name, []).append((name, opt))
    return out


def load_artifact(path: str | Path) -> Fitted:
    """Open, verify and rebuild the fitted evaluator of whatever method wrote ``path``."""
    from hdeval.artifact.directory import MANIFEST, ArtifactReader, open_artifact, recover_artifact

    path = Path(path)
    recover_artifact(path)
    probe = ArtifactReader(path, {}, [])
    head = probe.json(MANIFEST) if (path / MANIFEST).is_file() else {}
    name = head.get("method", "hdeval") if isinstance(head, dict) else "hdeval"
    if not isinstance(name, str):
        raise ArtifactError(f"{path / MANIFEST}: 'method' is not a name")
    try:
        method = get_method(name)
    except HdevalError as exc:
        if name in _skipped:  # its plug-in is installed, and the reason it was skipped says why
            raise ArtifactError(f"{path}: {exc}") from None
        raise ArtifactError(
            f"{path}: {exc} (written by a newer hdeval, or by a method plug-in not installed here: "
            f"entry-point group {ENTRY_POINT_GROUP})"
        ) from None
    reader = open_artifact(path, editable=method.editable)
    check_recorded_options(method.options, reader.run.get("config"), str(path / MANIFEST), name)
    ev = method.load(reader)
    if not isinstance(ev, Fitted):
        got = "None" if ev is None else type(ev).__name__
        raise MethodError(f"method {name!r}: load returned {got}, not a Fitted")
    # what methods.base.loaded gives the built-in methods, for a plug-in whose load left it out
    if ev.path is None:
        ev.path = reader.path
    if not ev.warnings:
        ev.warnings = list(reader.warnings)
    if not ev.run:
        ev.run = reader.run
    if not ev.from_artifact_file:  # its recorded server is the file's word; its scores.csv kept on save
        remember_scores(ev, reader.path, reader.manifest.get("files"))
    # the metrics the shared code reads are checked whoever read them (docs/plugins.md)
    ev.metrics = check_metrics(ev.metrics, ev.metrics_model(), path / METRICS)
    return ev
