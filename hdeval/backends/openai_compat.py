"""A backend for any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp ...).

Requests go out lean: the JSON body is built once per request (:meth:`OpenAICompatBackend._params`)
and POSTed with the standard library's ``http.client`` over HTTP/1.1 keep-alive connections,
one per request in flight, and replies are parsed by one function
(:meth:`OpenAICompatBackend._parse`). (The ``openai`` SDK's request building, then ``httpx2``'s
per-request handling, cost more client CPU than everything else per call: 0.56 ms for
``httpx2`` against 0.15 ms for ``http.client``; see benchmarks/bench_throughput.py.) Proxies
named by ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (``http://`` ones; ``NO_PROXY``
honoured) are used as ``httpx2`` used them; TLS trusts what ``httpx2`` trusts.

This is the one place in hdeval that retries: one loop here retries rate limits, server
errors, dropped connections, timeouts and malformed bodies with capped, jittered exponential
backoff (or the server's ``Retry-After``).
Anything else becomes a one-line :class:`~hdeval.errors.BackendError` at once, except a 4xx
that is about one request (too long for the context, a content filter, an invalid prompt; 413,
422): that is a :class:`~hdeval.errors.RequestRejected`, which scoring records as that cell's
failure while the run goes on.

``timeout`` bounds a whole HTTP request (a socket timeout is per read, so a server dripping a
byte a second would never trip it: one watchdog thread for the whole process shuts the
socket of a request past its deadline), and a reply body past ``max_reply_bytes`` is a RequestRejected
for that request, read no further and never cached. Redirects are not
followed but reported, with the Location's credentials stripped.

The API key never leaves the ``Authorization`` header: not in ``identity`` (the cache key),
not in error messages.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import itertools
import json
import logging
import math
import random
import re
import select
import socket
import threading
import time
import urllib.request
import zlib
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx2

from hdeval import __version__
from hdeval.backends.constraints import constraint_of, to_openai_params  # [answer constraint]
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

_READ_CHUNK = 64 * 1024


class _Watch:
    """One request the watchdog keeps an eye on."""

    __slots__ = ("token", "deadline", "conn", "sock", "bucket", "fired")

    def __init__(self, token: int, deadline: float, conn: http.client.HTTPConnection,
                 bucket: "dict[int, _Watch]") -> None:
        self.token = token
        self.deadline = deadline
        self.conn = conn
        # the connected socket: http.client hands it to the response (conn.sock = None) when
        # the reply ends with the connection, and the body is still read from it then
        self.sock: socket.socket | None = None
        self.bucket = bucket  # the watchdog's requests of the same timeout
        self.fired: bool | None = None  # set by release()


class _Watchdog:
    """Ends HTTP requests that pass their deadline: one thread for every request in flight in
    the process (a thread per attempt cost a thread start and two more GIL hand-offs per call).

    A request registers with :meth:`watch` before its first socket call and unregisters with
    :meth:`release`; at the deadline the watchdog shuts its socket down (never closes it: the
    file descriptor stays the requester's), which ends a blocked connect, send or read at once,
    and :meth:`release` then says it fired. Requests are kept per timeout, so within one
    timeout deadlines arrive in the order requests registered: the watchdog looks only at the
    oldest of each, and registering wakes it only when it would otherwise sleep past the new
    deadline (when idle, or for a shorter timeout). Releasing takes no lock. The thread ends
    after ``IDLE`` seconds with nothing to watch and starts again on demand.
    """

    IDLE = 2.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._buckets: dict[float, dict[int, _Watch]] = {}  # timeout -> insertion (= deadline) order
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake = math.inf  # when the watchdog wakes next on its own
        self.fired = 0  # requests ended at their deadline

    def watch(self, conn: http.client.HTTPConnection, timeout: float) -> _Watch:
        """Watch a request on ``conn`` that must end within ``timeout`` seconds from now."""
        with self._cond:
            bucket = self._buckets.get(timeout)
            if bucket is None:
                bucket = self._buckets[timeout] = {}
            w = _Watch(next(self._tokens), time.monotonic() + timeout, conn, bucket)
            bucket[w.token] = w
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hdeval-http-watchdog", daemon=True)
                self._thread.start()
            elif w.deadline < self._wake:
                self._cond.notify()
        return w

    def release(self, w: _Watch) -> bool:
        """Stop watching ``w``; True if the watchdog got to it first (its socket is shut).
        Calling it again gives the same answer."""
        if w.fired is None:
            if w.bucket.pop(w.token, None) is not None:  # atomic: no lock on the common path
                w.fired = False
            else:
                with self._cond:  # the watchdog shuts the socket while holding this: done now
                    w.fired = True
        return w.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                earliest = math.inf
                for timeout, bucket in list(self._buckets.items()):
                    while True:
                        token = next(iter(bucket), None)  # one atomic step: releases pop unlocked
                        if token is None:
                            break
                        w = bucket.get(token)
                        if w is None:
                            continue  # released meanwhile
                        if w.deadline > now:
                            earliest = min(earliest, w.deadline)
                            break
                        if bucket.pop(token, None) is not None:  # else: released in time
                            self._fire(w)
                    if not bucket:
                        del self._buckets[timeout]
                if earliest == math.inf:
                    self._wake = math.inf
                    self._cond.wait(self.IDLE)
                    if not self._buckets:
                        self._thread = None
                        return
                else:
                    self._wake = earliest
                    self._cond.wait(earliest - now)

    def _fire(self, w: _Watch) -> None:
        self.fired += 1
        sock = w.sock if w.sock is not None else w.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


_WATCHDOG = _Watchdog()


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, with ``NO_PROXY`` honoured), as httpx2 picked it; None for none."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    if urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    return proxy


def _basic(user: str | None, password: str | None) -> str:
    pair = f"{unquote(user or '')}:{unquote(password or '')}".encode("utf-8")
    return "Basic " + base64.b64encode(pair).decode("ascii")


class OpenAICompatBackend:
    """Chat completions over an OpenAI-compatible HTTP API.

    ``base_url`` None means the OpenAI API itself, which needs ``api_key``; any other server
    gets a placeholder key when none is given. ``timeout`` bounds each HTTP request as a
    whole (reading the reply included); a reply over ``max_reply_bytes`` is a RequestRejected;
    ``max_retries`` bounds retries of transient failures, waiting ``backoff_base * 2**n``
    seconds plus jitter (capped at ``backoff_cap``) or what ``Retry-After`` asks (capped at
    60 s). Malformed bodies are retried at most ``max_malformed_retries`` times. Safe to call
    from many threads at once: each request takes an idle keep-alive connection from a pool
    that grows to the number of requests in flight, of which at most ``concurrency`` (the
    number of calling threads) stay open between calls, so threads never queue on one shared
    connection pool's lock.
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
        parts = urlsplit(self._url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {
            "Authorization": f"Bearer {api_key}",  # the one place the key goes
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"hdeval/{__version__}",
        }
        if parts.username is not None or parts.password is not None:
            # a gateway's user:password in the URL is Basic auth instead (as httpx2 sent it)
            self._headers["Authorization"] = _basic(parts.username, parts.password)
        self._proxy = _proxy_for(self._url)
        if self._proxy is not None and urlsplit(self._proxy).scheme != "http":
            raise ConfigError(
                f"the proxy the environment names for {self.base_url} ({_display_url(self._proxy)}) is not "
                "an http:// proxy, the only kind hdeval speaks; unset it or add the host to NO_PROXY")
        if self._proxy is not None and not self._https:
            # a plain-HTTP request through a proxy names the whole URL (credentials left out)
            self._target = urlunsplit((parts.scheme, self._host_port(), parts.path or "/", parts.query, ""))
            proxy = urlsplit(self._proxy)
            if proxy.username is not None:
                self._headers["Proxy-Authorization"] = _basic(proxy.username, proxy.password)
        self.concurrency = max(1, int(concurrency))
        self._idle: list[http.client.HTTPConnection] = []  # not in use (list pop/append are atomic)
        self._conns: list[http.client.HTTPConnection] = []  # every connection made, closed by close()
        self._tls: Any = None  # one TLS context for all connections (building one costs ~0.1 s)
        self._watchdog = _WATCHDOG

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
            conns, self._conns = self._conns, []
            self._idle.clear()
        for conn in conns:
            conn.close()

    def _host_port(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self._port}"

    def _checkout(self) -> http.client.HTTPConnection:
        """An idle keep-alive connection, or a new (not yet connected) one. A redirect is never
        followed (``http.client`` does not): it is reported, see :meth:`_status_error`."""
        try:
            conn = self._idle.pop()
        except IndexError:
            pass
        else:
            sock = conn.sock
            if sock is not None:  # (None: closed after its last reply; connects again on use)
                try:
                    # an idle keep-alive socket with something to read was closed by the server
                    stale = bool(select.select([sock], [], [], 0)[0])
                except (OSError, ValueError):
                    stale = True
                if stale:
                    conn.close()
            return conn
        with self._lock:
            if self._proxy is not None:
                proxy = urlsplit(self._proxy)
                where: tuple[str, int] = (proxy.hostname or "", proxy.port or 80)
            else:
                where = (self._host, self._port)
            if self._https:
                if self._tls is None:
                    self._tls = httpx2.create_ssl_context()
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    *where, timeout=self.timeout, context=self._tls)
            else:
                conn = http.client.HTTPConnection(*where, timeout=self.timeout)
            if self._proxy is not None:
                proxy = urlsplit(self._proxy)
                auth = ({"Proxy-Authorization": _basic(proxy.username, proxy.password)}
                        if proxy.username is not None else {})
                if self._https:
                    conn.set_tunnel(self._host, self._port, headers=auth)
            self._conns.append(conn)
        return conn

    def _checkin(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if not reusable:
            conn.close()  # the object is reused: it connects again on its next request
        if len(self._idle) < self.concurrency:
            self._idle.append(conn)
        else:  # more than the callers need
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()

    # -- retries --------------------------------------------------------------------------

    def _complete_with_retries(self, request: CompletionRequest, logprobs: bool) -> Completion:
        malformed = 0
        params = self._params(request, logprobs)
        schema_sent = params.get("response_format", {}).get("type") == "json_schema"
        # built once, sent as is by every attempt
        body = json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        headers = {**self._headers, KIND_HEADER: request.kind} if request.kind else self._headers

        # the retry loop (it was tenacity's Retrying: the same policy; this call's own CPU
        # around a successful first attempt fell from 25 to 9 us)
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._attempt(body, headers, logprobs, schema_sent)
            except _Transient as exc:
                malformed += exc.malformed
                if attempts > self.max_retries or malformed > self.max_malformed_retries:
                    last = exc
                    break
                wait = self._wait(exc, attempts)
                log.info("retrying %s in %.1fs (attempt %d): %s", self.base_url, wait, attempts,
                         self._redact(str(exc)))
                time.sleep(wait)
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        if last.unreachable:
            msg = (f"cannot reach LLM server at {self.base_url} ({last.message}) after {tries}; "
                   f"is it running? {RESUME_HINT}")
        else:
            msg = f"LLM server at {self.base_url} kept failing after {tries}, last error: {last.message}; {RESUME_HINT}"
        raise BackendError(self._redact(msg)) from None

    def _wait(self, exc: _Transient, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1): what the server's
        ``Retry-After`` asks (capped), else capped exponential backoff with jitter, which
        spreads the retries of --concurrency threads that failed together."""
        if exc.retry_after is not None:
            return min(exc.retry_after, RETRY_AFTER_CAP)
        exponent = min(attempt - 1, 32)  # bounded so a huge max_retries cannot overflow
        backoff = self.backoff_base * 2.0**exponent + random.uniform(0, self.backoff_base)
        return min(backoff, self.backoff_cap)

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
        # [answer constraint] the request's constraint as body fields (backends/constraints.py)
        params.update(to_openai_params(constraint_of(request), self._schema_supported))
        if logprobs:
            params["logprobs"] = True
            params["top_logprobs"] = request.top_logprobs
        return params

    def _attempt(self, body: bytes, headers: Mapping[str, str], logprobs: bool, schema_sent: bool) -> Completion:
        """One HTTP request (``body`` with ``headers``; the ``X-Hdeval-Kind`` header names
        which hdeval prompt this is, so test servers answer without reading the wording; it
        carries nothing about the user or the data), bounded as a whole by ``timeout``."""
        return self._parse(self._read_reply(body, headers, logprobs, schema_sent), logprobs)

    def _read_reply(self, body: bytes, headers: Mapping[str, str], logprobs: bool, schema_sent: bool) -> bytes:
        """POST ``body`` on a pooled connection and read the reply body, bounded in size and,
        through the watchdog, in time (each socket call is also bounded by ``timeout``)."""
        conn = self._checkout()
        watch = self._watchdog.watch(conn, self.timeout)
        deadline = watch.deadline
        reusable = False
        try:
            try:
                if conn.sock is None:
                    conn.connect()
                watch.sock = conn.sock
            except (socket.timeout, TimeoutError):
                raise self._too_late() from None
            except (OSError, http.client.HTTPException) as exc:
                raise _Transient(_one_line(str(exc) or type(exc).__name__), unreachable=True) from None
            conn.request("POST", self._target, body=body, headers=headers)
            raw = conn.getresponse()
            ok = 200 <= raw.status < 300
            # an error's body only feeds a one-line message: the first 64 KB are plenty
            cap = self.max_reply_bytes if ok else _MAX_ERROR_BYTES
            if ok and raw.length is not None and raw.length > cap:
                raise self._too_large()
            chunks: list[bytes] = []
            size = 0
            while True:
                # streamed: we read the body ourselves, so a malformed one is a retryable fault
                # rather than a half-built object, and we stop at the deadline or the size cap
                chunk = raw.read(min(_READ_CHUNK, cap + 1 - size))
                if not chunk:
                    break
                if time.monotonic() > deadline:
                    raise self._too_late()
                size += len(chunk)
                if size > cap:
                    if ok:
                        raise self._too_large()
                    chunks.append(chunk[: max(0, cap - (size - len(chunk)))])
                    break
                chunks.append(chunk)
            if self._watchdog.release(watch):  # its socket was shut: what was read may be cut short
                raise self._too_late()
            data = _decode(b"".join(chunks), raw.getheader("content-encoding"), cap)
            if ok and len(data) > cap:
                raise self._too_large()
            reusable = raw.isclosed() and not raw.will_close
            if not ok:
                raise self._status_error(raw.status, raw.headers, data, logprobs, schema_sent)
            return data
        except (_Transient, RequestRejected, BackendError, _LogprobsRejected, _SchemaRejected):
            raise
        except (socket.timeout, TimeoutError):
            raise self._too_late() from None
        except (OSError, http.client.HTTPException, ValueError, zlib.error) as exc:
            if self._watchdog.release(watch):
                raise self._too_late() from None
            # dropped connections, truncated bodies, protocol errors, undecodable encodings
            raise _Transient(f"connection error ({_one_line(f'{type(exc).__name__}: {exc}')})") from None
        finally:
            if self._watchdog.release(watch):  # shut at its deadline: not reusable
                reusable = False
            self._checkin(conn, reusable)

    def _too_late(self) -> _Transient:
        return _Transient(f"no complete reply within the {self.timeout:g}s timeout")

    def _too_large(self) -> RequestRejected:
        return RequestRejected(
            f"the reply from {self.base_url} is larger than {self.max_reply_bytes // 1024} KB, not a chat "
            "completion; not read further"
        )

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
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):  # RecursionError: "[[[[..." bodies
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


def _decode(data: bytes, encoding: str | None, cap: int) -> bytes:
    """A reply body undone from its ``Content-Encoding`` (hdeval asks for none, but a proxy may
    still compress), inflated to at most ``cap + 1`` bytes."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ValueError(f"a reply in an encoding hdeval cannot read ({encoding[:40]!r})")
    # 47: gzip or zlib header; deflate sent raw (no header) as some servers do: -15
    for wbits in ((47, -15) if encoding == "deflate" else (47,)):
        try:
            return zlib.decompressobj(wbits).decompress(data, cap + 1)
        except zlib.error:
            continue
    raise ValueError(f"a {encoding} reply that does not decompress")


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

