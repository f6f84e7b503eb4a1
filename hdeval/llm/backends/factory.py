"""Named backend factories. Each imports its SDK only when used."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from hdeval.core.errors import ConfigError
from hdeval.llm.backends.base import Backend
from hdeval.llm.config import (  # the names' checks live with the settings they check; importable here too
    BUILTIN_LLMS,  # noqa: F401
    DEFAULT_CONCURRENCY,
    DIALECT_ENV,
    HDEVAL_LLM_EMPTY,
    did_you_mean,  # noqa: F401
    edits,  # noqa: F401
    llm_problem,
    typo_refusal,  # noqa: F401
)

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


def resolve_llm(explicit: str | None, env: Mapping[str, str] | None = None) -> str:
    """Default LLM resolution: ``--llm``/``HDEVAL_LLM``; else OpenAI when ``OPENAI_API_KEY`` is
    set; else the embedded local model when the ``local`` extra is installed; else an error."""
    env = os.environ if env is None else env
    if explicit is not None:  # "" is what --llm "$LLM" gives with LLM unset: never the default
        if not explicit.strip():
            raise ConfigError(str(llm_problem(explicit, None)))  # says it is empty
        return explicit
    if "HDEVAL_LLM" in env:
        if not env["HDEVAL_LLM"].strip():
            raise ConfigError(HDEVAL_LLM_EMPTY)
        return env["HDEVAL_LLM"]
    if env.get("OPENAI_API_KEY"):
        return DEFAULT_OPENAI_MODEL
    # the runtime is enough: the model is fetched on first use (hdeval.llm.backends.model_file)
    if any(importlib.util.find_spec(m) is not None for m in LOCAL_RUNTIMES.values()):
        return "local"
    raise ConfigError(
        "no LLM configured: pass --llm MODEL (or set HDEVAL_LLM), "
        "or export OPENAI_API_KEY to use the OpenAI API, "
        "or install the embedded model with pip install 'hdeval[local]'"
    )


# the embedded runtimes, by preference: xllamacpp is prebuilt, llama-cpp-python compiles llama.cpp
LOCAL_RUNTIMES = {"xllamacpp": "xllamacpp", "llama-cpp-python": "llama_cpp"}
LOCAL_RUNTIME_ENV = "HDEVAL_LOCAL_RUNTIME"


def local_runtime(env: Mapping[str, str] | None = None) -> str:
    """The embedded runtime to use: ``$HDEVAL_LOCAL_RUNTIME`` if set, else the first one
    installed (xllamacpp, then llama-cpp-python)."""
    env = os.environ if env is None else env
    chosen = env.get(LOCAL_RUNTIME_ENV)
    if chosen:
        if chosen not in LOCAL_RUNTIMES:
            raise ConfigError(f"{LOCAL_RUNTIME_ENV}={chosen!r}: expected one of {', '.join(LOCAL_RUNTIMES)}")
        return chosen
    for name, module in LOCAL_RUNTIMES.items():
        if importlib.util.find_spec(module) is not None:
            return name
    raise ConfigError(
        "the local model needs a llama.cpp runtime: pip install -e '.[local]' (xllamacpp, "
        "prebuilt) or pip install -e '.[local-llamacpp]' (llama-cpp-python, compiles)"
    )


# (config, offline) -> Backend; each imports its SDK itself, so an unused backend costs nothing
Factory = Callable[[Any, bool], Backend]


@dataclass(frozen=True)
class BackendEntry:
    name: str
    matches: Callable[[str], bool]  # does this backend serve the model string?
    factory: Factory
    runtime: str = ""  # the package it needs, named in the error when it is missing
    extra: str | None = None  # the pip extra that provides it


def _fake(config: Any, offline: bool) -> Backend:
    from hdeval.llm.backends.fake import FakeBackend

    return FakeBackend.from_spec(config.model)


def _local(config: Any, offline: bool) -> Backend:
    """The embedded model, on the runtime :func:`local_runtime` picks."""
    if local_runtime() == "xllamacpp":
        from hdeval.llm.backends.xllamacpp import XLlamaCppBackend

        return XLlamaCppBackend.from_spec(config.model)
    from hdeval.llm.backends.llama_cpp import LlamaCppBackend

    return LlamaCppBackend.from_spec(config.model)


def _openai(config: Any, offline: bool) -> Backend:
    from hdeval.llm.backends.openai_compat import OpenAICompatBackend

    problem = llm_problem(config.model, config.base_url)
    if problem:  # as the CLI refuses it, for a caller of the library (ev.score(llm="fakee"))
        raise ConfigError(problem)

    return OpenAICompatBackend(
        model=config.model,
        base_url=config.base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or ("dry-run-sends-nothing" if offline else None),
        timeout=config.timeout,
        max_retries=config.max_retries,
        dialect=getattr(config, "dialect", None) or os.environ.get(DIALECT_ENV) or "auto",
        detect=not offline,  # a dry run sends nothing
        concurrency=getattr(config, "concurrency", None) or DEFAULT_CONCURRENCY,
    )


# Checked in order; the last entry serves every other model name.
BACKENDS: list[BackendEntry] = [
    BackendEntry("fake", lambda m: m == "fake" or m.startswith("fake:"), _fake),
    BackendEntry(
        "local", lambda m: m == "local" or m.startswith("llamacpp:"), _local, "a llama.cpp runtime", "local"
    ),
    BackendEntry("openai", lambda m: True, _openai),
]


PROVIDER_GROUP = "hdeval.providers"  # plug-ins' entry points: a BackendEntry (or a callable returning them)
_plugins_loaded = False


def _load_providers() -> None:
    """Plug-in providers go before the last entry, which serves every other model name."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=PROVIDER_GROUP):
        try:
            found = ep.load()
            found = found() if callable(found) and not isinstance(found, BackendEntry) else found
        except Exception as exc:  # a broken plug-in names itself
            raise ConfigError(
                f"LLM provider plug-in {ep.name!r} ({ep.value}) could not be loaded: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        for entry in found if isinstance(found, (list, tuple)) else [found]:
            if not isinstance(entry, BackendEntry):
                raise ConfigError(
                    f"LLM provider plug-in {ep.name!r} ({ep.value}) gave "
                    f"{type(entry).__name__}, not a hdeval.llm.backends.factory.BackendEntry"
                )
            BACKENDS.insert(len(BACKENDS) - 1, entry)


def backend_entry(model: str) -> BackendEntry:
    _load_providers()
    return next(e for e in BACKENDS if e.matches(model))


def make_backend(spec: Any, offline: bool = False) -> Backend:
    """Build the backend ``spec.model`` names (``spec``: an :class:`~hdeval.llm.config.LLMConfig`
    or anything with its fields). ``offline``: it will only be asked for its identity and cache
    keys (``--dry-run``), so a missing API key is no error."""
    entry = backend_entry(spec.model)
    try:
        return entry.factory(spec, offline)
    except ImportError as exc:
        hint = f": pip install -e '.[{entry.extra}]'" if entry.extra else ""
        raise ConfigError(f"--llm {spec.model} needs {entry.runtime}{hint} ({exc})") from exc


# printed once when the bundled 135M model is used (here: printing it imports no llama.cpp)
DEFAULT_LOCAL_NOTICE = (
    "note: --llm local uses the bundled SmolLM2-135M model: it is for trying the pipeline, not "
    "for real judgments. Point hdeval at a stronger model with --llm llamacpp:/path/to/model.gguf, "
    "or at an OpenAI-compatible server with --llm MODEL --base-url URL."
)
