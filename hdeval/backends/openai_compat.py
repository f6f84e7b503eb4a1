"""A backend for any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp ...).

Requests go out lean: the JSON body is built once per request (:meth:`OpenAICompatBackend._params`)
and POSTed with ``httpx2`` (the HTTP library the ``openai`` package itself uses; the SDK's
request building cost more CPU than everything else per call, see
benchmarks/bench_throughput.py) over keep-alive connections, one per request in flight, and
replies are parsed by one function (:meth:`OpenAICompatBackend._parse`).

This is the one place in hdeval that retries: tenacity here retries rate limits, server
errors, dropped connections, timeouts and malformed bodies with capped, jittered exponential
backoff (or the server's ``Retry-After``).
Anything else becomes a one-line :class:`~hdeval.errors.BackendError` at once, except a 4xx
that is about one request (too long for the context, a content filter, an invalid prompt; 413,
422): that is a :class:`~hdeval.errors.RequestRejected`, which scoring records as that cell's
failure while the run goes on.

``timeout`` bounds a whole HTTP request (the client's own timeout is per read, so a server
dripping a byte a second would never trip it), and a reply body past ``max_reply_bytes`` is a
RequestRejected for that request, read no further and never cached. Redirects are not
followed but reported, with the Location's credentials stripped.

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

import httpx2
import tenacity

from hdeval import __version__
from hdeval.backends.base import (
    MAX_ALTERNATIVES,
    MAX_POSITIONS,
    Completion,
    CompletionRequest,
    TokenLogprob,
    read_logprob,
    token_count,
)
from hdeval.errors import BackendError, ConfigError, RequestRejected

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
PLACEHOLDER_KEY = "not-needed"  # local servers (vLLM, Ollama) ignore the key but the client wants one
RETRY_AFTER_CAP = 60.0  # seconds; a server asking for longer still gets retried after this
RESUME_HINT = "every finished call is cached, so rerunning the same command resumes"

MAX_REPLY_BYTES = 4 * 2**20  # a chat completion is a few KB; anything past this is not one

_RETRY_STATUSES = frozenset({408, 409, 429})  # plus every 5xx
_MAX_DETAIL = 200  # characters of a server's error message kept in ours
_MAX_ERROR_BYTES = 64 * 1024  # of an error reply's body: enough for its message
# A 400 whose message or code says it is about this request's content, not about the
# endpoint, the model or the parameters every request shares: the failure of one cell.
_REQUEST_PROBLEM = re.compile(
    r"context[ _-]?length|context[ _-]?window|context size|maximum context|too long|too many tokens"
    r"|max(imum)?[ _-]?tokens? .*exceed|exceeds? .*(context|token|limit)|content[ _-]?(filter|policy|management)"
    r"|safety|flagged|invalid[ _-]prompt|prompt is invalid",
    re.I,
)


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


class _SchemaRejected(Exception):
    """The server answered 400 to ``response_format: {"type": "json_schema", ...}``."""


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
    """The URL without user:password and without a trailing slash (for identity and messages).

    A password holding an unescaped ``/``, ``?`` or ``#`` ends the host part early, so
    everything up to the last ``@`` is dropped then: better to show too little than a piece
    of a password (such a URL is refused by :func:`_check_url` anyway)."""
    parts = urlsplit(url.strip())
    if "@" in parts.netloc:
        netloc = parts.netloc.rpartition("@")[2]
    elif "@" in url:
        return f"{parts.scheme}://***@{url.rpartition('@')[2]}".rstrip("/")
    else:
        netloc = parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), parts.query, parts.fragment))


def _check_url(url: str) -> None:
    """Refuse a base URL the HTTP client would misread, without quoting any of it (it may
    hold a password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--base-url must be an http:// or https:// URL, got {_display_url(url)!r}")
    if "@" not in parts.netloc and "@" in url:
        raise ConfigError(
            "--base-url has an '@' after its host part: if it holds user:password, percent-encode "
            "'/', '?', '#' and '@' in them (%2F, %3F, %23, %40)"
        )
    try:
        parts.port
    except ValueError:
        raise ConfigError(f"--base-url {_display_url(url)!r} has an invalid port") from None


def _is_openai(url: str) -> bool:
    return (urlsplit(url).hostname or "").lower() == "api.openai.com"


KIND_HEADER = "X-Hdeval-Kind"


class OpenAICompatBackend:
    """Chat completions over an OpenAI-compatible HTTP API.

    ``base_url`` None means the OpenAI API itself, which needs ``api_key``; any other server
    gets a placeholder key when none is given. ``timeout`` bounds each HTTP request as a
    whole (reading the reply included); a reply over ``max_reply_bytes`` is a RequestRejected;
    ``max_retries`` bounds retries of transient failures, waiting ``backoff_base * 2**n``
    seconds plus jitter (capped at ``backoff_cap``) or what ``Retry-After`` asks (capped at
    60 s). Malformed bodies are retried at most ``max_malformed_retries`` times. Safe to call
    from many threads at once: each request takes an idle one-connection HTTP client from a
    pool that grows to the number of requests in flight, of which at most ``concurrency`` (the
    number of calling threads) stay open between calls, so threads never queue on one shared
    connection pool's lock (whose upkeep also grows with its number of connections).
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
        max_reply_bytes: int = MAX_REPLY_BYTES,
        concurrency: int = 8,
    ) -> None:
        if not model:
            raise ConfigError("the OpenAI-compatible backend needs a model name (--llm MODEL)")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        if not timeout > 0:
            raise ConfigError(f"--timeout must be above 0 seconds, got {timeout}")
        url = (base_url or OPENAI_BASE_URL).strip()
        _check_url(url)
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
        self.max_reply_bytes = max_reply_bytes
        self._key = api_key
        # flips to False (never back) the first time the server rejects the logprobs parameter
        self._logprobs_supported = True
        # likewise for response_format json_schema: then plain json_object is asked for
        self._schema_supported = True
        self._lock = threading.Lock()
        # The URL is the one ``identity`` (and so the cache key) names: nothing is read from
        # OPENAI_BASE_URL or other environment settings that would send requests elsewhere.
        self._url = url.rstrip("/") + "/chat/completions"
        self._headers = {
            "Authorization": f"Bearer {api_key}",  # the one place the key goes
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"hdeval/{__version__}",
        }
        self.concurrency = max(1, int(concurrency))
        self._idle: list[httpx2.Client] = []  # clients not in use (list pop/append are atomic)
        self._clients: list[httpx2.Client] = []  # every client made, closed by close()
        self._tls: Any = None  # one TLS context for all clients (building one costs ~0.1 s)

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
        while True:
            want_logprobs = bool(request.top_logprobs) and self._logprobs_supported
            try:
                return self._complete_with_retries(request, want_logprobs)
            except _LogprobsRejected:
                with self._lock:
                    if self._logprobs_supported:
                        log.info("%s rejected the logprobs parameter; not asking for logprobs again", self.base_url)
                    self._logprobs_supported = False
            except _SchemaRejected:
                with self._lock:
                    if self._schema_supported:
                        log.info("%s rejected response_format json_schema; asking for plain JSON from now on",
                                 self.base_url)
                    self._schema_supported = False

    @property
    def schema_supported(self) -> bool:
        """False once the server rejected ``response_format`` ``json_schema``; not sent again."""
        return self._schema_supported

    def close(self) -> None:
        """Close every HTTP connection."""
        with self._lock:
            clients, self._clients = self._clients, []
            self._idle.clear()
        for client in clients:
            client.close()

    def _checkout(self) -> httpx2.Client:
        """An idle HTTP client (one keep-alive connection each), or a new one."""
        try:
            return self._idle.pop()
        except IndexError:
            pass
        with self._lock:
            if self._tls is None:
                self._tls = httpx2.create_ssl_context()
            client = httpx2.Client(
                timeout=httpx2.Timeout(self.timeout),
                limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1),
                verify=self._tls,
                # a redirect is reported, not followed: following turns a POST into a GET and
                # the user sees a puzzling 404/405 from wherever it led
                follow_redirects=False,
            )
            self._clients.append(client)
        return client

    # -- retries --------------------------------------------------------------------------

    def _complete_with_retries(self, request: CompletionRequest, logprobs: bool) -> Completion:
        malformed = 0
        params = self._params(request, logprobs)
        schema_sent = params.get("response_format", {}).get("type") == "json_schema"
        # built once, sent as is by every attempt
        body = json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        headers = {**self._headers, KIND_HEADER: request.kind} if request.kind else self._headers

        def attempt() -> Completion:
            nonlocal malformed
            try:
                return self._attempt(body, headers, logprobs, schema_sent)
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
        """The request body (a JSON object) for ``request``; ``logprobs``: ask for them.

        The one body builder: the prompt kind goes in a header, not here."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            params["seed"] = request.seed
        if request.json_schema is not None and self._schema_supported:
            # OpenAI structured outputs; vLLM and llama.cpp's server constrain decoding to it
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": json.loads(request.json_schema), "strict": True},
            }
        elif request.json_mode or request.json_schema is not None:
            params["response_format"] = {"type": "json_object"}
        if logprobs:
            params["logprobs"] = True
            params["top_logprobs"] = request.top_logprobs
        return params

    def _attempt(self, body: bytes, headers: Mapping[str, str], logprobs: bool, schema_sent: bool) -> Completion:
        """One HTTP request (``body`` with ``headers``; the ``X-Hdeval-Kind`` header names
        which hdeval prompt this is, so test servers answer without reading the wording; it
        carries nothing about the user or the data), bounded as a whole by ``timeout``.

        The client's timeout only bounds each read, so the request runs in a worker thread and
        is given up at the deadline; the worker notices at its next chunk and closes the
        connection (a worker stuck in one read ends at that read's timeout)."""
        deadline = time.monotonic() + self.timeout
        outcome: dict[str, Any] = {}
        finished = threading.Event()
        cancelled = threading.Event()

        def fetch() -> None:
            try:
                outcome["body"] = self._read_reply(body, headers, logprobs, schema_sent, deadline, cancelled)
            except BaseException as exc:  # handed to the waiting thread
                outcome["error"] = exc
            finally:
                finished.set()

        threading.Thread(target=fetch, name="hdeval-http", daemon=True).start()
        if not finished.wait(self.timeout):
            cancelled.set()
            raise _Transient(f"no complete reply within the {self.timeout:g}s timeout")
        if "error" in outcome:
            raise outcome["error"]
        return self._parse(outcome["body"], logprobs)

    def _read_reply(self, body: bytes, headers: Mapping[str, str], logprobs: bool, schema_sent: bool,
                    deadline: float, cancelled: threading.Event) -> bytes:
        too_late = _Transient(f"no complete reply within the {self.timeout:g}s timeout")
        too_large = RequestRejected(
            f"the reply from {self.base_url} is larger than {self.max_reply_bytes // 1024} KB, not a chat "
            "completion; not read further"
        )
        client = self._checkout()
        try:
            # streamed: we read the body ourselves, so a malformed one is a retryable fault
            # rather than a half-built object, and we can stop at the deadline or the size cap
            with client.stream("POST", self._url, content=body, headers=headers) as raw:
                ok = 200 <= raw.status_code < 300
                # an error's body only feeds a one-line message: the first 64 KB are plenty
                cap = self.max_reply_bytes if ok else _MAX_ERROR_BYTES
                length = raw.headers.get("content-length", "")
                if ok and length.isdigit() and len(length) < 20 and int(length) > cap:
                    raise too_large
                chunks: list[bytes] = []
                size = 0
                for chunk in raw.iter_bytes():
                    if cancelled.is_set() or time.monotonic() > deadline:
                        raise too_late
                    size += len(chunk)
                    if size > cap:
                        if ok:
                            raise too_large
                        chunks.append(chunk[: max(0, cap - (size - len(chunk)))])
                        break
                    chunks.append(chunk)
                data = b"".join(chunks)
                if not ok:
                    raise self._status_error(raw.status_code, raw.headers, data, logprobs, schema_sent)
                return data
        except httpx2.TimeoutException:
            raise too_late from None
        except httpx2.ConnectError as exc:
            raise _Transient(_one_line(str(exc) or "connection failed"), unreachable=True) from None
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            # dropped connections, truncated bodies, protocol errors, undecodable encodings
            raise _Transient(f"connection error ({_one_line(f'{type(exc).__name__}: {exc}')})") from None
        finally:
            # back only once this worker is done with it (a call given up at its deadline
            # keeps its client until its read ends)
            if client.is_closed:
                pass
            elif len(self._idle) < self.concurrency:
                self._idle.append(client)
            else:  # more than the callers need (after calls given up at their deadline)
                with self._lock:
                    if client in self._clients:
                        self._clients.remove(client)
                client.close()

    def _status_error(self, status: int, headers: Mapping[str, str], body: bytes, logprobs: bool,
                      schema_sent: bool = False) -> Exception:
        """Map an HTTP error (its status, headers and the start of its body) to a retryable
        fault, a logprobs or schema fallback, a rejection of this one request, or a final
        BackendError."""
        if 300 <= status < 400:
            location = headers.get("location", "")
            where = f" to {_one_line(_display_url(location))}" if location else ""
            return BackendError(self._redact(
                f"the server at {self.base_url} redirects (HTTP {status}){where}; hdeval does not follow "
                "redirects: give the final address as --base-url"))
        error, detail = _error_detail(status, body)
        said = f"{detail} {error}".lower()
        if status >= 500 or status in _RETRY_STATUSES:
            what = "rate limited" if status == 429 else "server error"
            return _Transient(f"{what} (HTTP {status}): {detail}",
                              retry_after=retry_after_seconds(headers))
        if logprobs and status in (400, 422) and "logprob" in said:
            return _LogprobsRejected()
        if schema_sent and status in (400, 422) and ("response_format" in said or "json_schema" in said):
            return _SchemaRejected()
        if status in (413, 422) or (status == 400 and _REQUEST_PROBLEM.search(said)):
            return RequestRejected(self._redact(f"the server rejected this request (HTTP {status}): {detail}"))
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
            content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        text = content if isinstance(content, str) else ""
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = token_count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Completion(
            text=text,
            top_logprobs=_parse_logprobs(choice.get("logprobs")) if logprobs and isinstance(choice, dict) else None,
            prompt_tokens=prompt_tokens,
            completion_tokens=token_count(usage.get("completion_tokens")),
            # the server reports prompt tokens it served from its prompt cache
            prompt_tokens_evaluated=max(0, prompt_tokens - token_count(cached)) if cached is not None else None,
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
    for pos in lp["content"][:MAX_POSITIONS]:
        if not isinstance(pos, dict):
            continue
        alts = pos.get("top_logprobs") or [pos]  # no alternatives: the chosen token is all we know
        parsed = []
        for alt in alts[:MAX_ALTERNATIVES] if isinstance(alts, list) else ():
            if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
                continue
            # an unreadable logprob (1000, Infinity, NaN, a string) is kept as NaN: the scorer
            # records a failure rather than a score computed from what is left
            parsed.append(TokenLogprob(alt["token"], read_logprob(alt.get("logprob"))))
        positions.append(tuple(parsed))
    return tuple(positions) if positions else None


def _error_detail(status: int, body: bytes) -> tuple[Any, str]:
    """The error an HTTP error body carries (its ``error`` member when it is a JSON object, else
    the JSON value or the text) and a one-line description of it."""
    text = body.decode("utf-8", "replace").strip()
    error: Any = text
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        pass
    else:
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict):
        msg = error.get("message")
        if msg:
            return error, _one_line(str(msg))
        return error, _one_line(json.dumps(error))  # e.g. FastAPI's {"detail": ...}
    if isinstance(error, str) and error.strip():
        return error, _one_line(error)
    return error, f"Error code: {status}"


def _one_line(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."

