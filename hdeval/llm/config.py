"""The LLM settings (:class:`LLMConfig`), their defaults and their one validation, documented
once, here; :func:`hdeval.llm.client.open_llm` turns them into the one cached backend a run uses."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hdeval.core import urls
from hdeval.core.errors import ConfigError, validation_line
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


#: the names that never go to a server: a name a typo away from one is refused, not sent to OpenAI
BUILTIN_LLMS = ("fake", "local")
# the built-ins named with something after a colon: fake:OPTIONS, llamacpp:/path/model.gguf
_PREFIXES = ("fake", "llamacpp")


def edits(a: str, b: str) -> int:
    """Levenshtein distance (the names compared are a few characters long)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _near(name: str, builtin: str) -> bool:
    return edits(name, builtin) <= (1 if len(builtin) <= 4 else 2)


def did_you_mean(llm: str | None, base_url: str | None) -> str | None:
    """The built-in ``llm`` was meant as, when it would go to OpenAI as a model of that name
    instead: a typo of one (``fak``, ``locl``), one in another case or with spaces around it
    (``FAKE``, ``"fake "``), or such a prefix (``Fake:garbage=0.1``). None with ``base_url``: a
    server's own model name."""
    if not llm or base_url or not llm.strip():
        return None
    head, colon, tail = llm.partition(":")
    if colon:
        name = head.strip().lower()
        close = [p for p in _PREFIXES if head != p and _near(name, p)]
        return f"{close[0]}:{tail}" if close else None
    if any(c in llm for c in "/@"):
        return None
    name = llm.strip().lower()
    close = [b for b in BUILTIN_LLMS if llm != b and _near(name, b)]
    return close[0] if close else None


def typo_refusal(llm: str, guess: str) -> str:
    """Why a name a typo away from a built-in is not sent to OpenAI (the CLI's and the library's)."""
    return (
        f"{llm!r} is no built-in LLM and would be sent to OpenAI as a model name: did you mean "
        f"{guess!r}? (a server's model of that name: give --base-url)"
    )


def llm_problem(llm: str | None, base_url: str | None, what: str = "--llm") -> str | None:
    """Why the model name ``llm`` is refused (empty, or a built-in's typo bound for OpenAI), as one
    line naming ``what`` gave it; None when it is not."""
    if llm is None:
        return None
    if not llm.strip():
        return f"{what} is empty: give a model name (fake, local, gpt-4o-mini, ...)"
    guess = did_you_mean(llm, base_url)
    if guess:
        return f"{what} {typo_refusal(llm, guess)}"
    head, colon, _ = llm.partition(":")
    if colon and not base_url and head.strip().lower() == "local":  # else OpenAI's model "local:..."
        return f"{what} {llm!r}: 'local' takes no options (another GGUF model: llamacpp:/path/model.gguf)"
    return None


BASE_URL_NEEDS_LLM = "--base-url needs --llm MODEL (the model that server runs)"
# click reads an empty variable as unset: the default LLM (OpenAI with a key) is no answer to
# HDEVAL_LLM=$LLM with LLM unset
HDEVAL_LLM_EMPTY = "HDEVAL_LLM is empty: unset it or give a model name"


def base_url_problem(url: str | None, what: str = "--base-url") -> str | None:
    """Why ``url`` cannot be a server's base URL before anything is asked of it (empty, or not
    readable as a URL), as one line that quotes none of it; None when it can."""
    if url is None:
        return None
    if not url.strip():
        return f"{what} is empty: give the server's URL, e.g. http://localhost:8000/v1"
    reason = urls.unreadable(url)
    return f"{what} is not a valid URL ({reason})" if reason else None


# what an identity appends after its base URL (OpenAICompatBackend.identity): "+<dialect>"
_SUFFIXES = tuple(f"+{d}" for d in DIALECTS)


def shown_identity(identity: str) -> str:
    """An LLM identity fit to print or write down: its URLs without credentials, query or fragment,
    the dialect it names after them (``+vllm``) kept."""
    return urls.shown_identity(identity, _SUFFIXES)


def keyed_identity(identity: str, url: str | None) -> str:
    """The identity a training run's cache keys were made with (:func:`hdeval.core.urls.keyed_identity`),
    a dialect the identity names kept after the URL's query."""
    return urls.keyed_identity(identity, url, _SUFFIXES)


class LLMSettings(BaseModel):
    """How requests to an LLM are made, declared once: :class:`LLMConfig` and a training run's
    settings (:class:`hdeval.run.train.TrainConfig`) are both made of these fields, and the CLI's
    options read their defaults and help from here. Unknown names are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(
        DEFAULT_TIMEOUT, description="Seconds per attempt of an LLM request (each retry gets its own)."
    )
    max_retries: int = Field(DEFAULT_MAX_RETRIES, description="Retries per request on 429/5xx/timeouts.")
    concurrency: int = Field(DEFAULT_CONCURRENCY, description="LLM requests in flight.")
    cache_dir: str | None = Field(
        None, description="LLM reply cache. Default: HDEVAL_CACHE_DIR or the per-user cache dir."
    )
    max_calls: int | None = Field(
        None, description="Stop cleanly before making more than N new LLM calls (cached calls are free)."
    )
    batch: bool = Field(  # see hdeval.llm.backends.batch
        False,
        description="Send each scoring stage's uncached requests through the OpenAI Batch API: half "
        "the price, results within 24 h; a killed run resumes its jobs (OpenAI-compatible "
        "servers only).",
    )

    def __init__(self, **given: Any) -> None:
        try:  # None is "not set": the default
            super().__init__(**{k: v for k, v in given.items() if v is not None})
        except ValidationError as exc:
            raise ConfigError(validation_line(exc, flags=True)) from None

    def llm_settings(self) -> dict[str, Any]:
        """These settings by name, to make another model of them (the one merge of run -> LLM)."""
        return {name: getattr(self, name) for name in LLMSettings.model_fields}

    def check_llm_settings(self) -> None:
        """The one check of the request settings: a one-line ConfigError naming the option."""
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
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)


class LLMConfig(LLMSettings):
    """Which LLM answers (``model`` and ``base_url``, in the cache key), and how requests to it are
    made (the :class:`LLMSettings`). Unknown option names are refused."""

    # ``fake`` (deterministic, offline; ``fake:garbage=0.2,logprobs=0`` for options), ``local`` (the
    # embedded default model, needs the ``local`` extra), ``llamacpp:/path/model.gguf``, or a model
    # name served by an OpenAI-compatible API. None: resolved by :func:`resolve_llm` (HDEVAL_LLM,
    # else OpenAI when OPENAI_API_KEY is set, else the local model when installed).
    model: str | None = None
    # OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), http://localhost:11434/v1 (Ollama).
    base_url: str | None = None
    # how an OpenAI-compatible server is told a request's answer constraint: "auto" (asks the
    # server's /models), "openai", "llama.cpp" or "vllm"; None: $HDEVAL_LLM_DIALECT, else "auto"
    dialect: str | None = None

    def __init__(self, model: str | None = None, base_url: str | None = None, **settings: Any) -> None:
        # the model and its server may be given by position, as in LLMConfig("fake")
        super().__init__(model=model, base_url=base_url, **settings)

    @classmethod
    def from_options(cls, **options: Any) -> "LLMConfig":
        """Build from keyword options (e.g. the CLI's); None is "not set" (the default), and an
        unknown name is a ConfigError."""
        unknown = sorted(set(options) - set(cls.model_fields))
        if unknown:
            raise ConfigError(f"unknown LLM option(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in options.items() if v is not None})

    def check(self) -> None:
        """The one check of the LLM options (the CLI, the Python API and benchmark all build an
        LLMConfig): a one-line ConfigError naming the option."""
        self.check_llm_settings()
        problem = base_url_problem(self.base_url) or llm_problem(self.model, self.base_url)
        if problem:
            raise ConfigError(problem)
        if self.dialect not in (None, *DIALECTS):
            raise ConfigError(
                f"the LLM server dialect must be one of {', '.join(DIALECTS)}, got {self.dialect!r}"
            )

    def replace(self, **changes: Any) -> "LLMConfig":
        """This config with some settings changed, checked as the constructor checks them."""
        return type(self)(**{**self.model_dump(), **changes})

    def to_manifest(self) -> dict[str, Any]:
        """What an artifact records: the model and server, never a key or credentials."""
        return {"model": self.model, "base_url": public_url(self.base_url)}
