"""The LLM settings (:class:`LLMConfig`), their defaults and their one validation, documented
once, here; :func:`hdeval.llm.client.open_llm` turns them into the one cached backend a run uses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from hdeval.core.errors import ConfigError
from hdeval.core.urls import public_url

# The defaults, in one place: the CLI's options and the Python API read them from here.
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 6
DEFAULT_CONCURRENCY = 8
# A request that takes longer than this is not coming: an "inf" or 1e10 timeout is a typo
MAX_TIMEOUT = 3600.0
MAX_RETRIES = 100
MAX_CONCURRENCY = 1024
# how an OpenAI-compatible server is told a request's answer constraint (hdeval.llm.backends.openai_compat)
DIALECTS = ("auto", "openai", "llama.cpp", "vllm")
DIALECT_ENV = "HDEVAL_LLM_DIALECT"


@dataclass(frozen=True)
class LLMConfig:
    """Which LLM answers (``model`` and ``base_url``, in the cache key), and how requests to it are
    made (the other fields). Unknown option names are rejected by :meth:`from_options`."""

    # ``fake`` (deterministic, offline; ``fake:garbage=0.2,logprobs=0`` for options), ``local`` (the
    # embedded default model, needs the ``local`` extra), ``llamacpp:/path/model.gguf``, or a model
    # name served by an OpenAI-compatible API. None: resolved by :func:`resolve_llm` (HDEVAL_LLM,
    # else OpenAI when OPENAI_API_KEY is set, else the local model when installed).
    model: str | None = None
    # OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), http://localhost:11434/v1 (Ollama).
    base_url: str | None = None
    timeout: float = (
        DEFAULT_TIMEOUT  # seconds per attempt of a request, retries each get their own (not in the key)
    )
    max_retries: int = DEFAULT_MAX_RETRIES  # retries on 429/5xx/timeouts (not part of the cache key)
    concurrency: int = DEFAULT_CONCURRENCY  # requests in flight
    cache_dir: str | None = None  # reply cache; None: HDEVAL_CACHE_DIR or the per-user cache dir
    max_calls: int | None = None  # stop cleanly before making more new (uncached) calls than this
    # send each scoring stage's uncached requests through the OpenAI Batch API (half the price,
    # results within 24 h; OpenAI-compatible backends only): see hdeval.llm.backends.batch
    batch: bool = False
    # how an OpenAI-compatible server is told a request's answer constraint: "auto" (asks the
    # server's /models), "openai", "llama.cpp" or "vllm"; None: $HDEVAL_LLM_DIALECT, else "auto"
    dialect: str | None = None

    @classmethod
    def from_options(cls, **options: Any) -> "LLMConfig":
        """Build from keyword options (e.g. the CLI's); an unknown name is a ConfigError."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown LLM option(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in options.items() if v is not None or k in ("model", "base_url")})

    def validate(self) -> None:
        """The one check of the LLM options (the CLI, the Python API and benchmark all build an
        LLMConfig): a one-line ConfigError naming the option."""
        checks = [
            (self.concurrency >= 1, f"--concurrency must be at least 1, got {self.concurrency}"),
            (
                self.concurrency <= MAX_CONCURRENCY,
                f"--concurrency must be at most {MAX_CONCURRENCY}, got {self.concurrency}",
            ),
            (
                0 < self.timeout <= MAX_TIMEOUT,  # NaN fails too
                f"--timeout must be above 0 and at most {MAX_TIMEOUT:g} seconds, got {self.timeout:g}",
            ),
            (self.max_retries >= 0, f"--max-retries must be 0 or more, got {self.max_retries}"),
            (
                self.max_retries <= MAX_RETRIES,
                f"--max-retries must be at most {MAX_RETRIES}, got {self.max_retries}",
            ),
            (
                self.max_calls is None or self.max_calls >= 0,
                f"--max-calls must be 0 or more, got {self.max_calls}",
            ),
            (
                self.dialect in (None, *DIALECTS),
                f"the LLM server dialect must be one of {', '.join(DIALECTS)}, got {self.dialect!r}",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)

    def replace(self, **changes: Any) -> "LLMConfig":
        return dataclasses.replace(self, **changes)

    def to_manifest(self) -> dict[str, Any]:
        """What an artifact records: the model and server, never a key or credentials."""
        return {"model": self.model, "base_url": public_url(self.base_url)}
