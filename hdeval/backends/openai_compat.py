"""A backend for any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp ...).

This is the one place in hdeval that retries: the ``openai`` client runs with its own retries
off, and tenacity here retries rate limits, server errors, dropped connections, timeouts and
malformed bodies with capped, jittered exponential backoff (or the server's ``Retry-After``).
Anything else becomes a one-line :class:`~hdeval.errors.BackendError` at once.

The API key never leaves the ``Authorization`` header: not in ``identity`` (the cache key),
not in error messages.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import re
import threading
import time
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

import openai
import tenacity

from hdeval.backends.base import Completion, CompletionRequest, TokenLogprob
from hdeval.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
PLACEHOLDER_KEY = "not-needed"  # local servers (vLLM, Ollama) ignore the key but the client wants one
RETRY_AFTER_CAP = 60.0  # seconds; a server asking for longer still gets retried after this
RESUME_HINT = "every finished call is cached, so rerunning the same command resumes"

_RETRY_STATUSES = frozenset({408, 409, 429})  # plus every 5xx
_MAX_DETAIL = 200  # characters of a server's error message kept in ours


class _Transient(Exception):
    """A failure worth retrying; ``retry_after`` is the server's requested wait, if any."""

    def __init__(self, message: str, *, retry_after: float | None = None, malformed: bool = False,
                 unreachable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.malformed = malformed
        self.unreachable = unreachable


class _LogprobsRejected(Exception):
    """The server answered 400 to the ``logprobs`` parameter."""


def retry_after_seconds(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The wait a response asks for: ``Retry-After`` in seconds or as an HTTP-date
    (``retry-after-ms`` too, which OpenAI sends); None when absent or unreadable."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _display_url(url: str) -> str:
    """The URL without user:password and without a trailing slash (for identity and messages)."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), parts.query, parts.fragment))


def _is_openai(url: str) -> bool:
    return (urlsplit(url).hostname or "").lower() == "api.openai.com"


KIND_HEADER = "X-Hdeval-Kind"


class OpenAICompatBackend:
    """Chat completions over an OpenAI-compatible HTTP API.

    ``base_url`` None means the OpenAI API itself, which needs ``api_key``; any other server
    gets a placeholder key when none is given. ``timeout`` is per HTTP request;
    ``max_retries`` bounds retries of transient failures, waiting ``backoff_base * 2**n``
    seconds plus jitter (capped at ``backoff_cap``) or what ``Retry-After`` asks (capped at
    60 s). Malformed bodies are retried at most ``max_malformed_retries`` times. Safe to call
    from many threads at once.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 6,
        *,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        max_malformed_retries: int = 2,
    ) -> None:
        if not model:
            raise ConfigError("the OpenAI-compatible backend needs a model name (--llm MODEL)")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        url = (base_url or OPENAI_BASE_URL).strip()
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ConfigError(f"--base-url must be an http:// or https:// URL, got {_display_url(url)!r}")
        if not api_key:
            if base_url is None or _is_openai(url):
                raise ConfigError(
                    f"--llm {model} uses the OpenAI API, which needs a key: export OPENAI_API_KEY=..., "
                    "or pass --base-url URL for a local OpenAI-compatible server"
                )
            api_key = PLACEHOLDER_KEY
        self.model = model
        self.base_url = _display_url(url)
        self.identity = f"openai:{model}@{self.base_url}"
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_malformed_retries = max_malformed_retries
        self._key = api_key
        # flips to False (never back) the first time the server rejects the logprobs parameter
        self._logprobs_supported = True
        self._lock = threading.Lock()
        # An explicit base_url keeps the client from reading OPENAI_BASE_URL, which would send
        # requests somewhere other than what ``identity`` (and so the cache key) names.
        self._client = openai.OpenAI(
            api_key=api_key,
            base_url=url.rstrip("/"),
            timeout=timeout,
            max_retries=0,  # retries happen here, once, not also inside the client
        )

    def __repr__(self) -> str:  # the default repr would show nothing secret, but be explicit
        return f"OpenAICompatBackend({self.identity!r})"

    @property
    def logprobs_supported(self) -> bool:
        """False once the server rejected the ``logprobs`` parameter; it is not asked again."""
        return self._logprobs_supported

    # -- public -------------------------------------------------------------------------------

    def complete(self, request: CompletionRequest) -> Completion:
        """Send one chat completion request (retrying transient failures) and parse the reply.

        Raises :class:`BackendError` with a one-line message when the server refuses the request
        or keeps failing.
        """
        want_logprobs = bool(request.top_logprobs) and self._logprobs_supported
        try:
            return self._complete_with_retries(request, want_logprobs)
        except _LogprobsRejected:
            with self._lock:
                if self._logprobs_supported:
                    log.info("%s rejected the logprobs parameter; not asking for logprobs again", self.base_url)
                self._logprobs_supported = False
            return self._complete_with_retries(request, False)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    # -- retries --------------------------------------------------------------------------

    def _complete_with_retries(self, request: CompletionRequest, logprobs: bool) -> Completion:
        malformed = 0

        def attempt() -> Completion:
            nonlocal malformed
            try:
                return self._attempt(request, logprobs)
            except _Transient as exc:
                malformed += exc.malformed
                raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Transient),
            stop=tenacity.stop_any(
                tenacity.stop_after_attempt(self.max_retries + 1),
                lambda _state: malformed > self.max_malformed_retries,
            ),
            wait=self._wait,
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Transient as exc:
            n = retrying.statistics.get("attempt_number", 1)
            tries = f"{n} attempt{'s' if n != 1 else ''}"
            if exc.unreachable:
                msg = (f"cannot reach LLM server at {self.base_url} ({exc.message}) after {tries}; "
                       f"is it running? {RESUME_HINT}")
            else:
                msg = f"LLM server at {self.base_url} kept failing after {tries}, last error: {exc.message}; {RESUME_HINT}"
            raise BackendError(self._redact(msg)) from None

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _Transient) and exc.retry_after is not None:
            return min(exc.retry_after, RETRY_AFTER_CAP)
        # computed here rather than with tenacity.wait_exponential_jitter, whose arguments were
        # renamed across tenacity versions; jitter spreads the retries of --concurrency
        # threads that failed together
        exponent = min(state.attempt_number - 1, 32)  # bounded so a huge max_retries cannot overflow
        backoff = self.backoff_base * 2.0**exponent + random.uniform(0, self.backoff_base)
        return min(backoff, self.backoff_cap)

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.info("retrying %s in %.1fs (attempt %d): %s", self.base_url, wait, state.attempt_number,
                 self._redact(str(exc)))

    # -- one HTTP request -----------------------------------------------------------------

    def _params(self, request: CompletionRequest, logprobs: bool) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            params["seed"] = request.seed
        if request.json_mode:
            params["response_format"] = {"type": "json_object"}
        if logprobs:
            params["logprobs"] = True
            params["top_logprobs"] = request.top_logprobs
        if request.kind:
            # which hdeval prompt this is: lets test servers answer without reading the wording
            # (and shows up in a proxy's logs); it carries nothing about the user or the data
            params["extra_headers"] = {KIND_HEADER: request.kind}
        return params

    def _attempt(self, request: CompletionRequest, logprobs: bool) -> Completion:
        try:
            # raw response: we parse the body ourselves so a malformed one is a retryable
            # fault rather than a half-built object or a str from the client's lenient parser
            raw = self._client.chat.completions.with_raw_response.create(**self._params(request, logprobs))
            body = raw.content
        except openai.APITimeoutError:
            raise _Transient(f"no reply within the {self.timeout:g}s timeout") from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__
            # by name: the client's HTTP library is httpx or httpx2 depending on its version
            if type(cause).__name__ == "ConnectError":
                raise _Transient(_one_line(str(cause) or "connection failed"), unreachable=True) from None
            detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
            raise _Transient(f"connection error ({_one_line(detail)})") from None
        except openai.APIStatusError as exc:
            raise self._status_error(exc, logprobs) from None
        return self._parse(body, logprobs)

    def _status_error(self, exc: openai.APIStatusError, logprobs: bool) -> Exception:
        """Map an HTTP error to a retryable fault, a logprobs fallback or a final BackendError."""
        status = exc.status_code
        detail = _error_detail(exc)
        if status >= 500 or status in _RETRY_STATUSES:
            what = "rate limited" if status == 429 else "server error"
            return _Transient(f"{what} (HTTP {status}): {detail}",
                              retry_after=retry_after_seconds(exc.response.headers))
        if logprobs and status in (400, 422) and "logprob" in f"{detail} {exc.body}".lower():
            return _LogprobsRejected()
        if status == 401:
            msg = (f"the server at {self.base_url} rejected the API key (HTTP 401); "
                   "check OPENAI_API_KEY, or unset it for a local server that needs none")
        elif status == 403:
            msg = f"the server at {self.base_url} refused access (HTTP 403): {detail}"
        elif status == 404:
            msg = (f"the server at {self.base_url} answered HTTP 404 for model {self.model!r}: {detail}; "
                   "check --llm and --base-url (it usually ends in /v1)")
        else:
            msg = f"the server at {self.base_url} rejected the request (HTTP {status}): {detail}"
        return BackendError(self._redact(msg))

    def _parse(self, body: bytes, logprobs: bool) -> Completion:
        try:
            data = json.loads(body)
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            snippet = _one_line(body[:80].decode("utf-8", "replace")) or "<empty>"
            raise _Transient(f"malformed reply, not a chat completion: {snippet!r}", malformed=True) from None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # some servers send content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = content if isinstance(content, str) else ""
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = _int(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Completion(
            text=text,
            top_logprobs=_parse_logprobs(choice.get("logprobs")) if logprobs else None,
            prompt_tokens=prompt_tokens,
            completion_tokens=_int(usage.get("completion_tokens")),
            # the server reports prompt tokens it served from its prompt cache
            prompt_tokens_evaluated=prompt_tokens - _int(cached) if cached is not None else None,
        )

    def _redact(self, text: str) -> str:
        # a server may echo the key in an error body; short keys are left alone because
        # replacing them would garble the message (and they are not real secrets)
        if self._key and self._key != PLACEHOLDER_KEY and len(self._key) >= 4:
            text = text.replace(self._key, "***")
        return text


def _parse_logprobs(lp: Any) -> tuple[tuple[TokenLogprob, ...], ...] | None:
    """``choices[0].logprobs.content[i].top_logprobs`` -> one tuple of alternatives per position."""
    if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return None
    positions = []
    for pos in lp["content"]:
        if not isinstance(pos, dict):
            continue
        alts = pos.get("top_logprobs") or [pos]  # no alternatives: the chosen token is all we know
        parsed = []
        for alt in alts:
            if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
                continue
            try:
                parsed.append(TokenLogprob(alt["token"], float(alt["logprob"])))
            except (KeyError, TypeError, ValueError):
                continue
        positions.append(tuple(parsed))
    return tuple(positions) if positions else None


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return _one_line(str(msg))
        return _one_line(json.dumps(body))  # e.g. FastAPI's {"detail": ...}
    if isinstance(body, str) and body.strip():
        return _one_line(body)
    return _one_line(exc.message)


def _one_line(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
