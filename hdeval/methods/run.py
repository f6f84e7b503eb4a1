"""What a method needs from a run besides its own code: the run's LLMs opened from its options,
and the shape of a dry-run plan (:class:`LayerPlan`, one row per layer or stage)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from hdeval.core.errors import ConfigError, HdevalError
from hdeval.llm.backends.base import Backend
from hdeval.llm.cache.client import CachedBackend
from hdeval.llm.client import open_llm
from hdeval.llm.config import LLMConfig


def llm_config(config: Any) -> LLMConfig:
    """The run's LLM settings as the one typed config every command uses: its model and server,
    and its request settings (:class:`~hdeval.llm.config.LLMSettings`) as they are."""
    return LLMConfig(model=config.llm, base_url=config.base_url, **config.llm_settings())


def open_backend(config: Any, backend: Backend | None = None, offline: bool = False) -> CachedBackend:
    """The cached backend for a run; ``backend`` lets tests and the API inject their own."""
    return open_llm(llm_config(config), backend, offline)


@contextmanager
def backend_for(
    config: Any, backend: Backend | None = None, offline: bool = False
) -> Iterator[CachedBackend]:
    """:func:`open_backend` for the block, closed after it unless it is ``backend`` itself: an
    injected :class:`CachedBackend` comes back as it is and stays its caller's to close."""
    llm = open_backend(config, backend, offline)
    try:
        yield llm
    finally:
        if llm is not backend:
            llm.close()


def decompose_llm_config(config: Any) -> LLMConfig | None:
    """The settings of the second LLM the method's options name (HD-Eval's ``--decompose-llm``),
    or None: the scoring LLM does that job. Same cache dir and budget settings; its own identity,
    so its own cache keys."""
    second = config.options.second_llm_given()
    if second is None:
        return None
    model, url, _ = second
    settings = {**config.llm_settings(), "batch": False}  # the decomposing calls are never batched
    return LLMConfig(model=model, base_url=url, **settings)


def open_decompose_backend(
    config: Any, llm: CachedBackend, backend: Backend | None = None, offline: bool = False
) -> CachedBackend:
    """The cached backend that decomposes: ``llm`` itself unless ``--decompose-llm`` (or an
    injected ``backend``) names another. Opened before any call, so a decompose LLM that cannot
    be opened (no key, no model file, no runtime) stops the run before anything is paid for."""
    dc = decompose_llm_config(config)
    if dc is None and backend is None:
        return llm
    try:
        return open_llm(dc or llm_config(config), backend, offline)
    except HdevalError as exc:
        where = (config.options.second_llm_given() or (None, None, "--decompose-llm"))[2]
        raise ConfigError(f"{where} {dc.model if dc else getattr(backend, 'identity', '')}: {exc}") from None


@dataclass
class LayerPlan:
    layer: int
    decompose_calls: int
    score_calls: int
    cached: int | None  # None when the requests are not known before earlier layers run
    upper_bound: bool
    prompt_tokens: int  # all of the layer's calls (decomposition included)
    completion_tokens: int
    stage: str = ""  # a method whose steps are not criteria layers names them (dna)
    decompose_prompt_tokens: int = 0  # of which decomposition (priced apart: --decompose-llm)
    decompose_completion_tokens: int = 0
    # what the progress counts: decompositions + one scoring request per sample and criterion
    # (identical requests, samples with the same text, share one call: score_calls can be fewer)
    requests: int | None = None


def prompt_chars(req) -> int:
    """Characters of a request's messages (token estimates are chars / 4)."""
    return sum(len(m.content) for m in req.messages)


def exact_plan(
    llm: CachedBackend,
    reqs: list,
    completion_tokens: int,
    layer: int = 1,
    stage: str = "",
    requests: int | None = None,
) -> LayerPlan:
    """The dry-run row of requests all known before the run: identical ones cost one call."""
    distinct = {llm.key(r): r for r in reqs}
    return LayerPlan(
        layer,
        0,
        len(distinct),
        sum(llm.is_cached(r) for r in distinct.values()),
        False,
        sum(prompt_chars(r) for r in distinct.values()) // 4,
        len(distinct) * completion_tokens,
        stage=stage,
        requests=requests,
    )


def plan_known(
    config: Any, backend: Backend | None, reqs: list, completion_tokens: int, requests: int | None = None
) -> list[LayerPlan]:
    """The dry run of a method whose every request is known before the run: one exact row."""
    with backend_for(config, backend, offline=True) as llm:
        return [exact_plan(llm, reqs, completion_tokens, requests=requests)]


def fit_exporting(method: Any, ctx: Any, path: Any) -> Any:
    """``train --export-requests FILE``: fit with the LLMs exporting the first uncached stage's
    requests (:class:`~hdeval.llm.request_files.RequestsExported`) instead of calling them."""
    from hdeval.llm.request_files import exporting_stages

    config = ctx.config
    for given, flag in ((config.batch, "--batch"), (config.max_calls is not None, "--max-calls")):
        if given:  # both would let the run pay for something
            raise ConfigError(f"--export-requests pays for nothing: drop {flag}")
    with exporting_stages(path, [ctx.llm, ctx.decompose_llm or ctx.llm]):
        return method.fit(ctx)
