"""The methods hdeval knows, found once: the built-in packages and any plug-in that declares an
entry point in the group ``hdeval.methods`` (its value: a :class:`~hdeval.methods.base.Method`,
or a callable returning one or a list of them). Loading an artifact dispatches here on the
method its manifest names, so nothing below the methods needs to know them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hdeval.errors import ArtifactError, ConfigError, HdevalError
from hdeval.methods.base import METHODS, Method
from hdeval.methods.options import Option, check_recorded_options

if TYPE_CHECKING:  # pragma: no cover
    from hdeval.methods.base import Fitted

ENTRY_POINT_GROUP = "hdeval.methods"
_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # The packages hold registration only (implementations load when a method is used), so
    # `hdeval --help` stays light.
    from hdeval.methods import direct, dna, hdeval, paireval

    METHODS.update({m.name: m for package in (direct, dna, hdeval, paireval) for m in package.METHODS})
    try:
        _load_plugins()
    except BaseException:
        # set early so a plug-in that asks for the registry while loading finds it; a plug-in that
        # fails must fail every lookup, not only the first
        _loaded = False
        raise


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = ep.load()
            if callable(found) and not isinstance(found, Method):
                found = found()
        except Exception as exc:  # a broken plug-in names itself, and the built-ins still work
            raise ConfigError(f"method plug-in {ep.name!r} ({ep.value}) could not be loaded: "
                              f"{type(exc).__name__}: {exc}") from None
        for method in (found if isinstance(found, (list, tuple)) else [found]):
            if not isinstance(method, Method):
                raise ConfigError(f"method plug-in {ep.name!r} ({ep.value}) gave {type(method).__name__}, "
                                  "not a hdeval.methods.base.Method")
            if method.name in METHODS:
                raise ConfigError(f"method plug-in {ep.name!r} ({ep.value}) reuses the method name {method.name!r}")
            METHODS[method.name] = method


def get_method(name: str) -> Method:
    _load()
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}: choose from {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    _load()
    return sorted(METHODS)


def all_options() -> dict[str, list[tuple[str, Option]]]:
    """Every method's option name -> (method, how that method declares it), for the CLI: one
    flag per name, whose help gives each method's own default."""
    _load()
    out: dict[str, list[tuple[str, Option]]] = {}
    for name in sorted(METHODS):
        for opt_name, opt in METHODS[name].options.specs().items():
            out.setdefault(opt_name, []).append((name, opt))
    return out


def load_artifact(path: str | Path) -> "Fitted":
    """Open, verify and rebuild the fitted evaluator of whatever method wrote ``path``."""
    from hdeval.artifact import MANIFEST, ArtifactReader, open_artifact, recover_artifact

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
        raise ArtifactError(f"{path}: {exc} (written by a newer hdeval?)") from None
    reader = open_artifact(path, editable=method.editable)
    check_recorded_options(method.options, reader.manifest.get("config"), str(path / MANIFEST), name)
    return method.load(reader)
