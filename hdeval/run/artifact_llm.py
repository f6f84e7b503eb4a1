"""Which LLM and server an artifact is scored with, and the cached backend for it: the artifact's,
unless the user names another. An environment variable does not silently swap an artifact's LLM,
and a server named only by the artifact gets no key and no sample before the user agrees."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from hdeval.core.errors import ConfigError
from hdeval.llm.config import LLMConfig

Notify = Callable[[str], None]
log = logging.getLogger("hdeval")


def log_notify(text: str) -> None:
    """The default ``notify`` when the caller gives none: a warning on the ``hdeval`` logger (the
    library never prints; with no logging set up, Python shows it on stderr)."""
    log.warning(text)


def check_llm_options(**options: Any) -> LLMConfig:
    """``apply``'s LLM options by name (``llm`` the model; None: the configured default) as one
    LLMConfig, checked by its one validator before any file is read."""
    config = LLMConfig.from_options(model=options.pop("llm", None), **options)
    config.check()
    return config


def artifact_llm(
    ev,
    llm: str | None,
    base_url: str | None,
    *,
    llm_given: bool,
    base_url_given: bool,
    confirm: Callable[[str], bool] | None = None,
    notify: Notify = log_notify,
) -> tuple[str, str | None]:
    """The model and server to score with. ``llm_given``/``base_url_given``: the user named them
    (typed on the command line, or passed to the Python API), not an environment variable.
    ``confirm``: asks the user a yes/no question (None when no one can answer)."""
    if llm_given and llm:
        # another model: the server is whatever the user gave for it (option or environment)
        return llm, base_url
    if llm and llm != ev.llm.model:
        notify(
            f"note: ignoring HDEVAL_LLM={llm} from the environment: apply uses the artifact's LLM "
            f"({ev.llm.model}); pass --llm to use another"
        )
    if base_url and base_url_given:
        return ev.llm.model, base_url
    url = ev.llm.base_url
    if base_url and url and base_url.rstrip("/") == url.rstrip("/"):
        return ev.llm.model, url  # the user's environment names the artifact's server
    if base_url:
        notify(
            "note: ignoring HDEVAL_BASE_URL from the environment: apply uses the artifact's "
            "server; pass --base-url to use another"
        )
    if not url:
        return ev.llm.model, None
    what = "your samples and OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else "your samples"
    if confirm is not None:
        if confirm(f"the artifact asks to send {what} to {url}; do that?"):
            return ev.llm.model, url
        raise ConfigError(f"not sending anything to {url}; pass --base-url URL to choose the server")
    raise ConfigError(
        f"the artifact names the LLM server {url}: hdeval sends {what} there only if you say "
        f"so; pass --base-url {url} (or another server)"
    )


def open_artifact_llm(
    ev,
    *,
    llm_given: bool | None = None,
    base_url_given: bool | None = None,
    confirm: Callable[[str], bool] | None = None,
    notify: Notify = log_notify,
    **llm_options: Any,
):
    """The cached backend to score ``ev``'s samples with (the artifact's LLM, or the one given);
    warns on a mismatch. The caller closes it (``apply`` scores chunk after chunk with one).
    ``llm_given``/``base_url_given`` default to "passed and not None" (the Python API)."""
    from hdeval.core.urls import public_identity
    from hdeval.llm.backends.factory import DEFAULT_LOCAL_NOTICE
    from hdeval.llm.client import open_llm

    config = check_llm_options(**llm_options)
    model, url = artifact_llm(
        ev,
        config.model,
        config.base_url,
        llm_given=config.model is not None if llm_given is None else llm_given,
        base_url_given=config.base_url is not None if base_url_given is None else base_url_given,
        confirm=confirm,
        notify=notify,
    )
    if model == "local":
        notify(DEFAULT_LOCAL_NOTICE)
    backend = open_llm(config.replace(model=model, base_url=url))
    if public_identity(backend.identity, url) != ev.llm_identity:
        notify(
            f"warning: scoring with {public_identity(backend.identity, url)}, but the evaluator was "
            f"trained with {ev.llm_identity}; scores may not match its metrics"
        )
    return backend
