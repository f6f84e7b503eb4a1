"""The one way a run gets its LLM: ``open_llm(config) -> CachedBackend``."""

from __future__ import annotations

import os

from hdeval.core.errors import ConfigError
from hdeval.core.paths import default_cache_dir
from hdeval.llm.backends.base import Backend
from hdeval.llm.backends.factory import make_backend, resolve_llm
from hdeval.llm.cache.client import CachedBackend
from hdeval.llm.config import BASE_URL_NEEDS_LLM, LLMConfig


def resolved(config: LLMConfig) -> LLMConfig:
    """The same config with ``model`` resolved to a concrete name (``--llm``, ``HDEVAL_LLM``,
    an API key, the embedded model). A server with no model named for it is refused: the default
    (the embedded model, or gpt-4o-mini) would ignore it or ask it for a model it may not run."""
    if config.model is None and config.base_url is not None and not os.environ.get("HDEVAL_LLM"):
        raise ConfigError(BASE_URL_NEEDS_LLM)
    return config.replace(model=resolve_llm(config.model))


def open_llm(config: LLMConfig, backend: Backend | None = None, offline: bool = False) -> CachedBackend:
    """The cached backend ``config`` names (its model resolved if unset); close it when done
    (that also closes the backend made here, never an injected one).

    ``backend`` injects an LLM (still cached and budgeted; a :class:`CachedBackend` is returned as
    it is). ``offline``: it will only be asked for identities and keys (``--dry-run``), so a
    missing API key is no error. ``config.batch``: misses go through the OpenAI Batch API.
    """
    if isinstance(backend, CachedBackend):
        return backend
    config.check()
    owns = backend is None
    if owns:
        backend = make_backend(resolved(config), offline=offline)
    try:
        cache_dir = config.cache_dir if config.cache_dir is not None else default_cache_dir()
        strategy = None
        if config.batch:
            from hdeval.llm.backends.batch import BatchStrategy, check_batch

            check_batch(backend, config.model)
            if not offline:  # a dry run submits nothing
                strategy = BatchStrategy(backend, cache_dir, config)
        return CachedBackend(
            backend,
            cache_dir,
            config.max_calls,
            concurrency=config.concurrency,
            batch=strategy,
            owns_inner=owns,
        )
    except BaseException:
        if owns and hasattr(backend, "close"):  # e.g. a cache dir that cannot be opened: free the model
            backend.close()
        raise
