"""A backend for any OpenAI-compatible chat completions API (OpenAI, Azure OpenAI, vLLM, Ollama,
llama.cpp's server ...), on the official ``openai`` SDK and ``tenacity``. One ``AsyncOpenAI`` a
backend posts each request's body, built once (the Batch API writes the same body); hdeval reads
the reply's bytes itself. Every attempt runs inside the tenacity policy, the SDK's own retries off
(the policy also retries malformed bodies and honours ``Retry-After``). Its HTTP client bounds
replies, takes one response a request, never follows a redirect; every message and reply passes
:class:`~hdeval.core.redaction.Redactor`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import email.utils
import json
import logging
import os
import random
import re
import time
import urllib.request
import warnings
import zlib
from typing import Any, AsyncIterator, Awaitable, Iterator, Mapping
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import httpx2
import openai
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from hdeval import __version__
from hdeval.core.errors import BackendError, ConfigError, RequestRejected, RetriesExhausted, one_line
from hdeval.core.redaction import Redactor
from hdeval.core.urls import public_url, unreadable
from hdeval.llm import aio
from hdeval.llm.backends.base import Completion, CompletionRequest, Message, chat_completion, token_count
from hdeval.llm.backends.constraints import Labels, Scale, constraint_of, to_gbnf, to_openai_params
from hdeval.llm.backends.llama_server import choose_completion, choose_params
from hdeval.llm.config import DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, DIALECTS

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
PLACEHOLDER_KEY = "not-needed"  # local servers (vLLM, Ollama) ignore the key but the SDK wants one
RETRY_AFTER_CAP = 60.0  # seconds; a server asking for longer still gets retried after this
LONG_WAIT = 10.0  # seconds; a retry wait this long is a warning, not only a log line
LONG_WAIT_REPEAT = 60.0  # seconds between two such warnings of one client
RESUME_HINT = "every finished call is cached, so rerunning the same command resumes"
MAX_REPLY_BYTES = 4 * 2**20  # a chat completion is a few KB; anything past this is not one
BATCH_ENDPOINT = "/v1/chat/completions"  # the url of a batch-format request line
AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")

_RETRY_STATUSES = frozenset({408, 409, 429})  # plus every 5xx
_MAX_ERROR_BYTES = 64 * 1024  # of an error reply's body: enough for its message
# A 400 whose message or code says it is about this request's content, not about the
# endpoint, the model or the parameters every request shares: the failure of one cell.
_REQUEST_PROBLEM = re.compile(
    r"context[ _-]?length|context[ _-]?window|context size|maximum context|too long|too many tokens"
    r"|max(imum)?[ _-]?tokens? .*exceed|exceeds? .*(context|token|limit)|content[ _-]?(filter|policy|management)"
    r"|safety|flagged|invalid[ _-]prompt|prompt is invalid",
    re.I,
)


# How a server is told a request's answer constraint (see hdeval.llm.backends.constraints): "openai"
# (structured outputs for JSON, nothing for a scale or labels: today's behaviour for any server it
# does not recognise), "llama.cpp" (a grammar, and the embedded runtime's one-word request),
# "vllm" (``guided_choice``; SGLang takes it too); "auto" asks the server's /models.
_DETECT_TIMEOUT = 5.0
_MODELS_REPLY_BYTES = 2**20


class ModelMismatch(UserWarning):
    """The server answered with another model than the one asked for."""


class _Transient(Exception):
    """A failure worth retrying; ``retry_after`` is the server's requested wait, if any."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        malformed: bool = False,
        unreachable: bool = False,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.malformed = malformed
        self.unreachable = unreachable
        self.attempts = 1  # set when retries ran out


class _Unsupported(Exception):
    """The server answered 400 to an optional parameter: the ``flag`` to turn off, and what to log."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


class ReplyTooLarge(httpx2.TransportError):
    """A reply body past the cap, raised while it is read; an httpx error, so the SDK hands it
    on as the cause of its connection error."""


class StrayReply(httpx2.TransportError):
    """A connection that held more than the reply just read: a response nobody asked for, which
    HTTP/1.1 would hand to the next request on that connection as its reply. The connection is
    closed; an httpx error, so the SDK hands it on as the cause of its connection error."""


def retry_after_seconds(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The wait a response asks for: ``Retry-After`` in seconds or as an HTTP-date
    (``retry-after-ms`` too, which OpenAI sends); None when absent or unreadable."""
    if not headers:
        return None
    for name, unit in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            return max(0.0, float(headers.get(name) or "") / unit)
        except ValueError:
            pass
    try:
        when = email.utils.parsedate_to_datetime((headers.get("retry-after") or "").strip())
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_wait(attempt: int, retry_after: float | None, base: float, cap: float) -> float:
    """Seconds before retry number ``attempt`` (from 1): capped exponential backoff with jitter,
    or the server's ``Retry-After`` when that is longer (capped); 0 does not turn backoff off."""
    backoff = min(base * 2.0 ** min(attempt - 1, 32) + random.uniform(0, base), cap)
    if retry_after is None:
        return backoff
    return min(max(retry_after, backoff), RETRY_AFTER_CAP)


def retry_policy(
    stop: Any, base: float, cap: float, before_sleep: Any = None, on: type[Exception] = _Transient
) -> AsyncRetrying:
    """Retry failures ``on`` until ``stop`` (a tenacity stop or an int of retries), waiting
    :func:`retry_wait`; the last failure is raised as it is."""

    def wait(state: Any) -> float:
        exc = state.outcome.exception()
        return retry_wait(state.attempt_number, getattr(exc, "retry_after", None), base, cap)

    return AsyncRetrying(
        stop=stop_after_attempt(stop + 1) if isinstance(stop, int) else stop,
        wait=wait,
        retry=retry_if_exception_type(on),
        reraise=True,
        before_sleep=before_sleep,
    )


def _display_url(url: str) -> str:
    """The URL without user:password or a trailing slash, query kept: the identity (and so the
    cache key) names it, so it must stay as it always was. ``url`` passed :func:`check_url`."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), parts.query, parts.fragment))


def _shown(url: str) -> str:
    return (public_url(url.strip()) or "").rstrip("/")


def check_url(url: str) -> None:
    """Refuse a base URL the HTTP client would misread, without quoting any of it."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ConfigError(
            "--base-url holds a space or a control character: give the URL alone "
            "(percent-encode a space in it as %20)"
        )
    reason = unreadable(url)
    if reason:
        raise ConfigError(f"--base-url is not a valid URL ({reason})")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--base-url must be an http:// or https:// URL, got {_shown(url)!r}")
    if "@" not in parts.netloc and "@" in url:
        raise ConfigError(
            "--base-url has an '@' after its host part: if it holds user:password, percent-encode "
            "'/', '?', '#' and '@' in them (%2F, %3F, %23, %40)"
        )
    try:
        parts.port  # noqa: B018 (reading .port validates it)
    except ValueError:
        raise ConfigError(f"--base-url {_shown(url)!r} has an invalid port") from None


def check_key(key: str) -> None:
    """Refuse, without quoting it, a key that cannot go in a header (a ``.env`` with Windows line ends)."""
    if not key.isascii() or not key.isprintable():
        raise ConfigError(
            "the API key (OPENAI_API_KEY) holds a control character or one that is not "
            "ASCII, such as the line end of a file saved with Windows line ends: set it to "
            "the key alone"
        )


def _basic(user: str | None, password: str | None) -> str:
    pair = f"{unquote(user or '')}:{unquote(password or '')}".encode("utf-8")
    return base64.b64encode(pair).decode("ascii")


def proxy_for(url: str) -> str | None:
    """The proxy ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` name for ``url``, ``NO_PROXY`` honoured."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return None
    return proxy if "://" in proxy else "http://" + proxy


class _BoundedStream(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """A reply body (of a sync or an async client) read with a bound: past ``cap`` bytes (once
    inflated) a success raises :class:`ReplyTooLarge` and an error body is cut; the connection is
    dropped, not drained."""

    def __init__(self, inner: Any, cap: int, fail: bool, encoding: str) -> None:
        self._inner = inner
        self._cap = cap
        self._fail = fail
        self._encoding = encoding
        self._size = 0
        self._inflate: Any = None

    def take(self, chunk: bytes) -> tuple[bytes, bool]:
        """What to hand on of ``chunk``, and whether the body ends here."""
        if self._encoding:
            if self._inflate is None:
                # 47: gzip or zlib header; deflate sent raw (no header) as some servers do: -15
                raw = self._encoding == "deflate" and chunk[:1] and chunk[0] & 0x0F != 8
                self._inflate = zlib.decompressobj(-15 if raw else 47)
            try:
                chunk = self._inflate.decompress(chunk, self._cap + 1 - self._size)
            except zlib.error:
                raise httpx2.DecodingError(f"a {self._encoding} reply that does not decompress") from None
            if self._inflate.unconsumed_tail:
                self._size = self._cap + 1  # more than the cap once inflated
        self._size += len(chunk)
        if self._size > self._cap:
            if self._fail:
                raise ReplyTooLarge("reply too large")
            return chunk[: max(0, len(chunk) - (self._size - self._cap))], True
        return chunk, False

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                part, end = self.take(chunk)
                yield part
                if end:
                    return
        finally:
            self._inner.close()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                part, end = self.take(chunk)
                yield part
                if end:
                    return
        finally:
            await self._inner.aclose()

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()


def bound_reply(response: httpx2.Response, max_reply_bytes: int) -> None:
    """Have ``response``'s body read with a bound (its encoding and length headers
    dropped: the bound decodes and cuts it), or refuse it unread (an unknown encoding, too long a
    success): an httpx response hook, so httpx closes a refused reply."""
    ok = 200 <= response.status_code < 300
    cap = max_reply_bytes if ok else _MAX_ERROR_BYTES
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("identity",):
        encoding = ""
    if encoding not in ("", "gzip", "x-gzip", "deflate"):
        raise httpx2.DecodingError(f"a reply in an encoding hdeval cannot read ({encoding[:40]!r})")
    length = response.headers.get("content-length", "")
    if ok and not encoding and length.isdigit() and int(length) > cap:
        raise ReplyTooLarge("reply too large")
    # in place: building a new Response per reply cost more than the rest of the bound
    for name in ("content-encoding", "content-length"):
        if name in response.headers:
            del response.headers[name]
    response.stream = _BoundedStream(response.stream, cap, ok, encoding.replace("x-", ""))


def _refuse_stray(stream: Any) -> None:
    """Raise :class:`StrayReply` when the connection a reply body (``stream``, an httpx
    transport's, read to its end) came on holds bytes past it (blank lines apart, which the HTTP/1.1
    parser skips), after marking the connection failed so that closing the reply closes it. Bytes
    arriving later, on an idle connection, make httpcore drop it before reuse. Connections of
    other kinds (HTTP/2, through a proxy) are not checked."""
    # the transport's stream -> httpcore's pool stream -> the connection -> its HTTP/1.1 part
    pooled = getattr(getattr(stream, "_httpcore_stream", None), "_pool_request", None)
    http11 = getattr(getattr(pooled, "connection", None), "_connection", None)
    state = getattr(http11, "_h11_state", None)
    if state is not None and state.trailing_data[0].strip():
        state.send_failed()  # h11: this connection takes no further request
        raise StrayReply("a response nobody asked for followed the reply on its connection")


class _Lent(httpx2.AsyncByteStream):
    """A reply body from one of :class:`_OneConnectionEach`'s transports, handed back to it when
    the body is closed; read to its end, checked for a response nobody asked for."""

    def __init__(self, inner: Any, give_back: Any) -> None:
        self._inner = inner
        self._give_back = give_back

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk
        _refuse_stray(self._inner)

    async def aclose(self) -> None:
        give_back, self._give_back = self._give_back, None
        try:
            await self._inner.aclose()
        finally:
            if give_back is not None:
                await give_back()


class _OneConnectionEach(httpx2.AsyncBaseTransport):
    """An HTTP transport that lends each request in flight a transport of its own, holding one
    keep-alive connection: httpcore's pool looks at every connection it holds twice a request, so
    each pool holds one. At most ``keep`` idle ones are kept (the run's concurrency)."""

    def __init__(self, make: Any, keep: int) -> None:
        self._make = make
        self._keep = keep
        self._idle: list[Any] = []
        self._all: set[Any] = set()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._idle:
            transport = self._idle.pop()
        else:
            transport = self._make()
            self._all.add(transport)

        async def give_back() -> None:
            if len(self._idle) < self._keep:
                self._idle.append(transport)
            else:
                self._all.discard(transport)
                await transport.aclose()

        try:
            response = await transport.handle_async_request(request)
        except BaseException:
            await give_back()
            raise
        response.stream = _Lent(response.stream, give_back)
        return response

    async def aclose(self) -> None:
        transports, self._all, self._idle = self._all, set(), []
        for transport in transports:
            await transport.aclose()


def http_client(
    timeout: float | None,
    proxy: str | None,
    max_reply_bytes: int,
    keepalive: int,
    verify: Any = True,
    sync: bool = False,
    one_each: bool = False,
) -> Any:
    """The SDK's HTTP client (``sync``: a synchronous one): bounded replies, no redirects
    followed, the proxy chosen here. ``keepalive`` connections stay open between requests; more in
    flight open more rather than wait for one (a wait would count against the request's deadline).
    ``one_each`` (async): a transport of one connection a request in flight, each reply checked
    for a response nobody asked for. ``verify``: an ``ssl.SSLContext`` shared by every client."""
    client, transport = (
        (httpx2.Client, httpx2.HTTPTransport) if sync else (httpx2.AsyncClient, httpx2.AsyncHTTPTransport)
    )
    made: Any  # a transport: the sync or the async kind
    if one_each and not sync:
        one = httpx2.Limits(max_connections=None, max_keepalive_connections=1)
        made = _OneConnectionEach(lambda: transport(verify=verify, proxy=proxy, limits=one), keepalive)
    else:
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=keepalive)
        made = transport(verify=verify, proxy=proxy, limits=limits)

    def hook(response: httpx2.Response) -> None:
        bound_reply(response, max_reply_bytes)

    async def async_hook(response: httpx2.Response) -> None:
        bound_reply(response, max_reply_bytes)

    return client(
        transport=made,
        trust_env=False,
        follow_redirects=False,
        timeout=httpx2.Timeout(timeout),
        event_hooks={"response": [hook if sync else async_hook]},
    )


# aprobe's prompt: short, any model can answer it; it says JSON, which OpenAI's JSON mode
# refuses a request without
PROBE_PROMPT = "Reply with the word OK (as JSON if JSON is asked for)."


class OpenAICompatBackend:
    """Chat completions over an OpenAI-compatible HTTP API.

    ``base_url`` None means the OpenAI API itself, which needs ``api_key``; any other server gets
    a placeholder key when none is given; an Azure host gets ``AsyncAzureOpenAI`` (``?api-version=``
    from the URL). ``timeout`` bounds each attempt as a whole; ``max_retries`` bounds retries of
    transient failures, waiting ``backoff_base * 2**n`` seconds plus jitter (capped at
    ``backoff_cap``); malformed bodies are retried at most ``max_malformed_retries`` times.
    :meth:`acomplete` runs on :mod:`hdeval.llm.aio`'s loop; :meth:`complete` is its synchronous door.
    ``dialect`` (one of :data:`~hdeval.llm.config.DIALECTS`) is how the answer constraint is sent;
    "auto" asks the server's ``/models`` once, when first needed, unless ``detect`` is False.
    ``concurrency``: the requests its callers keep in flight, the connections it keeps open.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        *,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        max_malformed_retries: int = 2,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        dialect: str = "openai",
        detect: bool = True,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        if dialect not in DIALECTS:
            raise ConfigError(
                f"unknown LLM server dialect {dialect!r}: expected one of {', '.join(DIALECTS)}"
            )
        if not model:
            raise ConfigError("the OpenAI-compatible backend needs a model name (--llm MODEL)")
        url = (base_url or OPENAI_BASE_URL).strip()
        check_url(url)
        if api_key:
            check_key(api_key)
        else:
            if base_url is None or (urlsplit(url).hostname or "").lower() == "api.openai.com":
                raise ConfigError(
                    f"--llm {model} uses the OpenAI API, which needs a key: export OPENAI_API_KEY=..., "
                    "or pass --base-url URL for a local OpenAI-compatible server"
                )
            api_key = PLACEHOLDER_KEY
        self.model = model
        self.base_url = _display_url(url)  # identity material: unchanged, so caches keep hitting
        self.shown_url = _shown(url)  # what messages show: no credentials, no query
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_malformed_retries = max_malformed_retries
        self.max_reply_bytes = max_reply_bytes
        self.concurrency = concurrency
        self._key = api_key
        self._url = url  # credentials and query included: endpoint() gives it, never shown
        self.redact = Redactor(api_key, url)
        parts = urlsplit(url)
        self._query = dict(parse_qsl(parts.query))
        # the SDK joins paths to its base URL: it gets the URL without credentials or query
        # (the query goes back on every request as a query, so ?api-version= works)
        netloc = parts.netloc.rpartition("@")[2]
        self._sdk_url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        self._headers = {"User-Agent": f"hdeval/{__version__}", "Accept-Encoding": "gzip, deflate"}
        if "@" in parts.netloc:
            # a gateway's user:password in the URL is Basic auth instead of the key
            user, _, password = parts.netloc.rpartition("@")[0].partition(":")
            self._headers["Authorization"] = "Basic " + _basic(user, password)
        self._proxy = proxy_for(url)
        bad_proxy = self._proxy is not None and unreadable(self._proxy)
        if bad_proxy:
            raise ConfigError(
                f"the proxy the environment names for {self.shown_url} is not a valid URL ({bad_proxy}): "
                "fix it (HTTPS_PROXY, HTTP_PROXY or ALL_PROXY) or add the host to NO_PROXY"
            )
        if self._proxy is not None and urlsplit(self._proxy).scheme not in ("http", "https"):
            raise ConfigError(
                f"the proxy the environment names for {self.shown_url} ({_shown(self._proxy)}) is not an "
                "http:// proxy, the only kind hdeval speaks; unset it or add the host to NO_PROXY"
            )
        # Azure's v1 API (.../openai/v1) speaks the plain OpenAI protocol, with no api-version
        v1 = parts.path.rstrip("/").endswith("/openai/v1")
        self._azure = (parts.hostname or "").lower().endswith(AZURE_HOSTS) and not v1
        if self._azure and "api-version" not in self._query:
            raise ConfigError(
                f"--base-url {self.shown_url} is an Azure OpenAI endpoint: add ?api-version=... to "
                "it, or use its v1 API (.../openai/v1)"
            )
        self._chat_path = "/chat/completions"
        if self._azure and "/deployments" not in parts.path:
            # AsyncAzureOpenAI adds the deployment only to a JSON body it builds; ours is built here
            self._chat_path = f"/deployments/{quote(model, safe='')}/chat/completions"
        # asked of the server once, when first needed (it joins the identity: a constrained reply
        # is not the unconstrained one); a dry run (``detect`` False) never asks
        self._dialect = None if dialect == "auto" else dialect
        self._detect = (
            detect
            and base_url is not None
            and not self._azure
            and (parts.hostname or "").lower() != "api.openai.com"
        )
        self._model_warned = False
        self._long_wait_said = -LONG_WAIT_REPEAT  # when a long retry wait was last said
        # False (never back) once the server rejects logprobs, or response_format json_schema
        self.logprobs_supported = self.schema_supported = True
        self._sdk: Any = None  # the SDK client of every request, made on the loop when first needed
        self._tls: Any = None

    def __repr__(self) -> str:
        return f"OpenAICompatBackend({self.model!r}@{self.shown_url!r})"

    def endpoint(self) -> tuple[str, str]:
        """(the server's URL, credentials and query included; the API key): for a second client
        of the same server, such as the Batch API's. Never shown: messages use ``shown_url``."""
        return self._url, self._key

    @property
    def identity(self) -> str:
        """The cache identity; a dialect that sends scale and label constraints is part of it."""
        dialect = self.dialect
        return f"openai:{self.model}@{self.base_url}" + ("" if dialect == "openai" else f"+{dialect}")

    @property
    def dialect(self) -> str:
        if self._dialect is None:
            self._dialect = self._detect_dialect() if self._detect else "openai"
        return self._dialect

    def _detect_dialect(self) -> str:
        """The dialect the server's ``/models`` reply names (llama.cpp's server: ``owned_by:
        llamacpp`` or a ``Server: llama.cpp`` header; vLLM and SGLang: ``owned_by`` vllm/sglang);
        "openai" for any other reply or none."""
        headers = dict(self._headers)
        if self._key != PLACEHOLDER_KEY and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            with http_client(_DETECT_TIMEOUT, self._proxy, _MODELS_REPLY_BYTES, 1, sync=True) as client:
                reply = client.get(
                    self._sdk_url.rstrip("/") + "/models", headers=headers, params=self._query or None
                )
                body = reply.read()
            server = reply.headers.get("server", "").lower()
            data = json.loads(body) if reply.status_code == 200 else {}
        except (httpx2.HTTPError, ValueError, RecursionError, OSError) as exc:
            log.info(
                "cannot ask %s which server it is (%s): no answer constraint sent",
                self.shown_url,
                self.redact(one_line(str(exc))),
            )
            return "openai"
        models = data.get("data") if isinstance(data, dict) else None
        owners = (
            {m.get("owned_by") for m in models[:100] if isinstance(m, dict)}
            if isinstance(models, list)
            else set()
        )
        if "llamacpp" in owners or server.startswith("llama.cpp"):
            return "llama.cpp"
        if owners & {"vllm", "sglang"}:
            return "vllm"
        return "openai"

    def _check_model(self, data: Any) -> None:
        """Say once when the server answered with another model than the one asked for (a
        server with one model answers any name with it): the artifact would record the wrong one."""
        got = data.get("model") if isinstance(data, dict) else None
        if (
            self._model_warned
            or not isinstance(got, str)
            or not got
            or got.startswith(self.model)
            or os.path.basename(got) == self.model
        ):
            return
        self._model_warned = (
            True  # OpenAI answers "gpt-4o-mini" with "gpt-4o-mini-2024-07-18": not a mismatch
        )
        warnings.warn(
            f"--llm {self.model!r} was asked for, but {self.shown_url} answered with model "
            f"{one_line(got)[:120]!r}; give that name as --llm so the artifact records the "
            "model that judged",
            ModelMismatch,
            stacklevel=2,
        )

    def sdk_client(
        self,
        max_reply_bytes: int | None = None,
        socket_timeout: float | None = None,
        keepalive: int = 1,
        one_each: bool = False,
    ) -> Any:
        """A new SDK client for this server (``AsyncOpenAI``, or ``AsyncAzureOpenAI`` for an Azure
        host), replies bounded by ``max_reply_bytes`` (default: this backend's), SDK retries off,
        ``keepalive`` idle connections kept (``one_each``: see :func:`http_client`).
        ``socket_timeout`` also bounds each connect, read and write (the Batch API's downloads);
        without it no per-operation timer is armed: the caller's deadline covers the request."""
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()  # the CA store, read once for all its clients
        cap = max_reply_bytes or self.max_reply_bytes
        http = http_client(socket_timeout, self._proxy, cap, keepalive, self._tls, one_each=one_each)
        common: dict[str, Any] = dict(
            api_key=self._key,
            max_retries=0,
            timeout=socket_timeout,
            http_client=http,
            default_headers=self._headers,
        )
        if self._azure:
            query = {k: v for k, v in self._query.items() if k != "api-version"}
            return openai.AsyncAzureOpenAI(
                base_url=self._sdk_url,
                api_version=self._query["api-version"],
                default_query=query or None,
                **common,
            )
        return openai.AsyncOpenAI(base_url=self._sdk_url, default_query=self._query or None, **common)

    def complete(self, request: CompletionRequest) -> Completion:
        """:meth:`acomplete`, waited for."""
        return aio.run(self.acomplete(request))

    async def acomplete(self, request: CompletionRequest) -> Completion:
        """Send one chat completion request (retrying transient failures) and parse the reply;
        a one-line :class:`BackendError` when the server refuses it or keeps failing."""
        while True:
            logprobs = bool(request.top_logprobs) and self.logprobs_supported
            try:
                return await self._with_retries(request, logprobs)
            except _Unsupported as exc:
                if getattr(self, exc.flag):
                    log.info("%s rejected %s", self.shown_url, exc)
                setattr(self, exc.flag, False)

    async def aprobe(self, like: CompletionRequest) -> Completion | None:
        """The reply to ``like`` with a short prompt in place of its messages (its other
        parameters kept: logprobs, a constraint, a schema), one attempt, no retry; None when the
        server gives none. What a run asks before it takes requests that keep failing for a
        server that is down: it may be those requests' prompts alone."""
        request = dataclasses.replace(
            like, messages=(Message("user", PROBE_PROMPT),), max_tokens=min(like.max_tokens or 16, 16)
        )
        logprobs = bool(request.top_logprobs) and self.logprobs_supported
        params = self._params(request, logprobs)
        schema_sent = params.get("response_format", {}).get("type") == "json_schema"
        try:
            return await self._attempt(  # type: ignore[no-any-return]
                _body_bytes(params),
                logprobs,
                schema_sent,
                lambda data: read_completion(data, logprobs, self.redact),
            )
        except (Exception, asyncio.TimeoutError):
            return None

    def close(self) -> None:
        """Close the SDK client's connections."""
        if self._sdk is not None:
            aio.run(self.aclose())

    async def aclose(self) -> None:
        sdk, self._sdk = self._sdk, None
        if sdk is not None:
            await sdk.close()

    def _params(self, request: CompletionRequest, logprobs: bool) -> dict[str, Any]:
        """The request body, which the Batch API writes as it is into a JSONL line."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            params["seed"] = request.seed
        if logprobs:
            params["logprobs"] = True
            params["top_logprobs"] = request.top_logprobs
        constraint = constraint_of(request)
        dialect = self.dialect
        if isinstance(constraint, (Scale, Labels)) and dialect == "llama.cpp":
            if constraint.single_token:  # as the embedded runtime asks it: the same probabilities
                params.update(choose_params(constraint, 0 if request.seed is None else request.seed))
            else:
                params["grammar"] = to_gbnf(constraint)
        elif isinstance(constraint, (Scale, Labels)) and dialect == "vllm" and constraint.words:
            if not isinstance(constraint, Scale) or constraint.count == 1:
                params["guided_choice"] = list(constraint.words)
        else:
            # structured outputs for JSON; nothing for a scale or labels (the body stays as without)
            params.update(to_openai_params(constraint, self.schema_supported))
        return params

    def _one_word(self, request: CompletionRequest) -> Scale | Labels | None:
        """The constraint of a request sent as llama.cpp's one-word request, if it is one."""
        constraint = constraint_of(request)
        if (
            isinstance(constraint, (Scale, Labels))
            and constraint.single_token
            and self.dialect == "llama.cpp"
        ):
            return constraint
        return None

    def request_line(self, key: str, request: CompletionRequest) -> bytes:
        """One OpenAI batch-format input line (``--batch``, request files): the body a normal call
        sends, under ``custom_id`` = the cache key."""
        body = self._params(request, bool(request.top_logprobs) and self.logprobs_supported)
        return (
            json.dumps(
                {"custom_id": key, "method": "POST", "url": BATCH_ENDPOINT, "body": body},
                ensure_ascii=False,
                separators=(",", ":"),
            )
            + "\n"
        ).encode("utf-8")

    async def _with_retries(self, request: CompletionRequest, logprobs: bool) -> Completion:
        params = self._params(request, logprobs)
        schema_sent = params.get("response_format", {}).get("type") == "json_schema"
        one_word = self._one_word(request)

        def read(data: Any) -> Completion:
            if one_word is None:
                return read_completion(data, logprobs, self.redact)
            usage = (
                data.get("usage") if isinstance(data, dict) and isinstance(data.get("usage"), dict) else {}
            )
            try:
                return choose_completion(
                    data, one_word, request, token_count(usage.get("prompt_tokens")), None
                )
            except BackendError as exc:
                raise ValueError(str(exc)) from None

        try:
            return await self._send(_body_bytes(params), logprobs, schema_sent, read)
        except _Transient as last:
            tries = _tries(last)
            if last.unreachable and self._proxy is not None:
                msg = (
                    f"cannot reach the proxy {_shown(self._proxy)} that the environment (HTTP_PROXY/"
                    f"HTTPS_PROXY/ALL_PROXY) names for {self.shown_url} ({last}) after {tries}; "
                    f"check the proxy, or add the host to NO_PROXY; {RESUME_HINT}"
                )
            elif last.unreachable:
                msg = (
                    f"cannot reach LLM server at {self.shown_url} ({last}) after {tries}; "
                    f"is it running? {RESUME_HINT}"
                )
            else:
                msg = (
                    f"LLM server at {self.shown_url} kept failing after {tries}, last error: {last}; "
                    f"{RESUME_HINT}"
                )
            raise (BackendError if last.unreachable else RetriesExhausted)(self.redact(msg)) from None

    async def _send(
        self, body: bytes, logprobs: bool, schema_sent: bool, read: Any, seen: dict | None = None
    ) -> Any:
        """``body`` posted under the retry policy, the reply read by ``read``; the last
        :class:`_Transient` raised when retries run out (its ``attempts`` set)."""
        malformed = [0]

        def stop(state: Any) -> bool:
            malformed[0] += bool(getattr(state.outcome.exception(), "malformed", False))
            return state.attempt_number > self.max_retries or malformed[0] > self.max_malformed_retries

        def before_sleep(state: Any) -> None:
            wait, why = state.next_action.sleep, self.redact(one_line(str(state.outcome.exception())))
            log.info("retrying %s in %.1fs (attempt %d): %s", self.shown_url, wait, state.attempt_number, why)
            now = time.monotonic()
            if wait >= LONG_WAIT and now - self._long_wait_said >= LONG_WAIT_REPEAT:
                # a minute of silence reads as a hang: say it (once a minute, not per request)
                self._long_wait_said = now
                asked = getattr(state.outcome.exception(), "retry_after", None) is not None
                log.warning(
                    "the server at %s %s %.0f s before retrying (%s); waiting",
                    self.shown_url,
                    "asked to wait" if asked else "keeps failing: backing off",
                    wait,
                    why,
                )

        retrying = retry_policy(stop, self.backoff_base, self.backoff_cap, before_sleep)
        try:
            return await retrying(self._attempt, body, logprobs, schema_sent, read, seen)
        except _Transient as last:
            last.attempts = retrying.statistics["attempt_number"]
            raise

    def send_body(self, body: Mapping[str, Any]) -> tuple[int | None, dict[str, Any] | str]:
        """:meth:`asend_body`, waited for."""
        return aio.run(self.asend_body(body))

    async def asend_body(self, body: Mapping[str, Any]) -> tuple[int | None, dict[str, Any] | str]:
        """Send one chat completions request body as it is (an exported request line's) through
        this backend's client and retry policy, replies bounded by ``max_reply_bytes``. Returns
        (HTTP status, the reply: a chat completion, with no secret of this backend's in it), or,
        when it fails, (the HTTP status of an error reply or None, a one-line reason with no
        secret): one request's failure, never raised."""
        logprobs = bool(body.get("logprobs"))

        def read(data: Any) -> dict[str, Any]:
            read_completion(data, logprobs, self.redact)  # ValueError when not a chat completion
            return data  # type: ignore[no-any-return]

        seen: dict[str, Any] = {}
        try:
            data = await self._send(_body_bytes(dict(body)), False, False, read, seen)
        except _Transient as last:
            return seen.get("status"), self.redact(f"{last} (after {_tries(last)})")
        except BackendError as exc:  # a redirect, a rejection, a reply too large
            msg, detail = str(exc), seen.get("detail")
            if isinstance(detail, str) and detail not in msg:  # the result line keeps the server's word
                msg = f"{msg} (the server said: {detail})"
            return seen.get("status"), self.redact(msg)
        return seen.get("status"), self.redact.json(data)

    async def _attempt(
        self, body: bytes, logprobs: bool, schema_sent: bool, read: Any, seen: dict | None = None
    ) -> Any:
        """One attempt: ``body`` posted, the reply read by ``read``; ``seen["status"]``: the
        HTTP status of an error reply or of a reply read, None for no reply (or none read)."""
        if self._sdk is None:
            self._sdk = self.sdk_client(keepalive=self.concurrency, one_each=True)
        if seen is not None:
            seen["status"] = seen["detail"] = None
        try:
            post = self._sdk.post(self._chat_path, content=body, cast_to=httpx2.Response)
            reply = await _within(self.timeout, post)
            data = reply.content
        except (asyncio.TimeoutError, openai.APITimeoutError):
            raise _Transient(f"no complete reply within the {self.timeout:g}s timeout") from None
        except openai.APIStatusError as exc:
            if seen is not None:
                seen["status"], seen["detail"] = exc.status_code, _error_detail(exc.status_code, exc.body)[1]
            raise self._status_error(
                exc.status_code, exc.response.headers, exc.body, logprobs, schema_sent
            ) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__
            if isinstance(cause, ReplyTooLarge):
                kb = self.max_reply_bytes // 1024
                raise RequestRejected(
                    f"the reply from {self.shown_url} is larger than {kb} KB, not a chat "
                    "completion; not read further"
                ) from None
            if isinstance(cause, StrayReply):
                raise _Transient(
                    "the server sent a response nobody asked for on the connection; closed it, asking again"
                ) from None
            unreachable = isinstance(cause, (httpx2.ConnectError, httpx2.ProxyError))
            what = f"{type(cause).__name__}: {cause}" if cause is not None else "connection error"
            raise _Transient(f"connection error ({one_line(what)})", unreachable=unreachable) from None
        completion = self._parse(data, read, check_model=seen is None)
        if seen is not None:
            seen["status"] = reply.status_code
        return completion

    def _status_error(
        self, status: int, headers: Mapping[str, str], body: Any, logprobs: bool, schema_sent: bool = False
    ) -> Exception:
        """An HTTP error as a retryable fault, a fallback, this one request's rejection, or a BackendError."""
        if 300 <= status < 400:
            location = headers.get("location", "")
            where = f" to {one_line(_shown(location))}" if location else ""
            return BackendError(
                self.redact(
                    f"the server at {self.shown_url} redirects (HTTP {status}){where}; hdeval does not follow "
                    "redirects: give the final address as --base-url"
                )
            )
        error, detail = _error_detail(status, body)
        said = f"{detail} {error}".lower()
        if status >= 500 or status in _RETRY_STATUSES:
            what = "rate limited" if status == 429 else "server error"
            return _Transient(f"{what} (HTTP {status}): {detail}", retry_after=retry_after_seconds(headers))
        if logprobs and status in (400, 422) and "logprob" in said:
            return _Unsupported("logprobs_supported", "the logprobs parameter; not asking for logprobs again")
        if schema_sent and status in (400, 422) and ("response_format" in said or "json_schema" in said):
            return _Unsupported(
                "schema_supported", "response_format json_schema; asking for plain JSON from now on"
            )
        if status in (413, 422) or (status == 400 and _REQUEST_PROBLEM.search(said)):
            return RequestRejected(self.redact(f"the server rejected this request (HTTP {status}): {detail}"))
        if status == 401:
            msg = (
                f"the server at {self.shown_url} rejected the API key (HTTP 401); "
                "check OPENAI_API_KEY, or unset it for a local server that needs none"
            )
        elif status == 403:
            msg = f"the server at {self.shown_url} refused access (HTTP 403): {detail}"
        elif status == 404:
            msg = (
                f"the server at {self.shown_url} answered HTTP 404 for model {self.model!r}: {detail}; "
                "check --llm and --base-url (it usually ends in /v1)"
            )
        else:
            msg = f"the server at {self.shown_url} rejected the request (HTTP {status}): {detail}"
        return BackendError(self.redact(msg))

    def _parse(self, body: bytes, read: Any, check_model: bool = True) -> Any:
        """``body`` read by ``read`` (data -> Completion), or as a chat completion with logprobs
        when ``read`` is True (request files); ``check_model``: say when another model answered."""
        try:
            data = read_reply(body)
            completion = read(data) if callable(read) else read_completion(data, bool(read), self.redact)
            if check_model:
                self._check_model(data)
            return completion
        except ValueError:
            snippet = one_line(self.redact(body[:80].decode("utf-8", "replace"))) or "<empty>"
            raise _Transient(f"malformed reply, not a chat completion: {snippet!r}", malformed=True) from None


def _body_bytes(params: dict[str, Any]) -> bytes:
    # built once, sent as is by every attempt: chat.completions.create would transform the
    # parameters again on each call, the largest cost of a call (benchmarks/bench_throughput.md)
    return json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _tries(last: Exception) -> str:
    n = getattr(last, "attempts", 1)
    return f"{n} attempt{'s' if n != 1 else ''}"


def read_reply(body: bytes) -> dict[str, Any]:
    """A reply body's JSON object: the one reader of a server's (already bounded) reply, for the
    client and the Ray answerer alike; ValueError when it is not JSON, nests too deep or is no object."""
    try:
        data = json.loads(body)
    except RecursionError:  # "[[[[..." bodies
        raise ValueError("a reply nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("a reply that is not a JSON object")
    return data


def read_completion(data: Any, logprobs: bool, redact: Redactor) -> Completion:
    """A chat completion body read (:func:`~hdeval.llm.backends.base.chat_completion`), its text
    without any secret of ``redact``'s: a server echoing the key gets it no further (the cache,
    reports, outputs). ValueError when it is not a chat completion."""
    completion = chat_completion(data, logprobs)
    text = redact(completion.text)
    return completion if text == completion.text else dataclasses.replace(completion, text=text)


async def _within(seconds: float, aw: Awaitable[Any]) -> Any:
    """``aw`` bounded as a whole; asyncio.TimeoutError past ``seconds``."""
    if not hasattr(asyncio, "timeout"):  # Python 3.10: the same bound, one task more per call
        return await asyncio.wait_for(aw, seconds)
    async with asyncio.timeout(seconds):
        return await aw


def result_outcome(row: Any) -> tuple[dict | None, str | None]:
    """(chat completion body, None) for a successful batch-format result row; (None, why) otherwise."""
    response = row.get("response") if isinstance(row, dict) else None
    code = response.get("status_code") if isinstance(response, dict) else None
    body = response.get("body") if isinstance(response, dict) else None
    if code == 200 and isinstance(body, dict):
        return body, None
    err = row.get("error") if isinstance(row, dict) and isinstance(row.get("error"), dict) else None
    if err is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
    msg = one_line(str(err.get("message") or err.get("code") or "")) if err else ""
    return None, (f"HTTP {one_line(str(code))[:40]}: {msg}" if code else (msg or "no response"))


def _error_detail(status: int, body: Any) -> tuple[Any, str]:
    """The error an error body carries (its JSON ``error``, the JSON, or the text), and one line of
    it; ``body``: the SDK's parse of the (bounded) body, ``APIStatusError.body``."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        msg = error.get("message")
        if msg:
            return error, one_line(str(msg))
        return error, one_line(json.dumps(error))  # e.g. FastAPI's {"detail": ...}
    if isinstance(error, str) and error.strip():
        return error, one_line(error)
    return error, f"Error code: {status}"
