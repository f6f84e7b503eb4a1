"""A small, scriptable OpenAI-compatible server for tests (stdlib only, 127.0.0.1 only).

It serves ``POST /v1/chat/completions`` from a background thread. Tests script it with a
queue of planned replies, consumed one per request, then fall back to a default behaviour::

    with LLMServer() as server:                       # binds 127.0.0.1, a free port
        server.plan(Reply.rate_limited(retry_after=1), Reply.error(500))
        backend = OpenAICompatBackend(model="m", base_url=server.url, api_key="k")
        backend.complete(request)                     # 429, 500, then the default reply
        assert server.calls == 3

Planned replies (see :class:`Reply` for the building blocks):

- ``Reply.ok("text", logprobs=...)`` / ``Reply.json(obj, status=...)``: a JSON body;
- ``Reply.error(status, message, headers=...)``: an OpenAI-style error body;
- ``Reply.rate_limited(retry_after=...)``: a 429, with or without ``Retry-After``;
- ``Reply.raw(b"...", status=200)``: arbitrary bytes (malformed bodies);
- ``Reply.disconnect()``: close the connection without answering;
- ``Reply.truncated(...)``: send headers and half the body, then close;
- ``Reply.hang(seconds)`` or ``delay=`` on any reply: wait before answering (timeouts).

A planned entry may also be a callable ``(RecordedRequest) -> Reply`` and ``server.default``
may be replaced by one, for replies that depend on the request. The default answers a
scoring-like ``"4"`` (text from ``server.reply_text`` or ``server.reply_fn(request_json)``),
with top logprobs when asked and ``server.logprobs`` is true, and with usage fields.
``server.reject_logprobs`` makes it answer 400 to any request asking for logprobs, like
servers that do not support them; ``server.require_key`` makes it answer 401 to a wrong key.

Every request is recorded (``server.requests``: headers, raw body, parsed JSON), so tests can
count calls and check where the API key was sent.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union

HOST = "127.0.0.1"  # never anything else: tests must not be reachable from the network


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # header names lower-cased
    body: bytes
    json: Any  # parsed body, or None when it was not JSON

    def asks_logprobs(self) -> bool:
        return isinstance(self.json, dict) and ("logprobs" in self.json or "top_logprobs" in self.json)


@dataclass(frozen=True)
class Reply:
    """What to answer to one request.

    ``body`` is sent as is (bytes) or JSON-encoded (anything else); ``delay`` seconds pass
    before answering; ``drop`` closes the connection without a reply; ``truncate`` sends the
    headers (with the full Content-Length) and only that many body bytes, then closes.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    truncate: int | None = None

    # -- building blocks ------------------------------------------------------------------

    @classmethod
    def json(cls, obj: Any, status: int = 200, headers: dict[str, str] | None = None, delay: float = 0.0) -> "Reply":
        return cls(status=status, body=obj, headers=dict(headers or {}), delay=delay)

    @classmethod
    def ok(
        cls,
        text: str | None = "4",
        *,
        logprobs: list[list[tuple[str, float]]] | None = None,
        usage: dict[str, Any] | None | bool = True,
        delay: float = 0.0,
    ) -> "Reply":
        """A successful chat completion; ``logprobs``: per position, (token, logprob) pairs."""
        return cls.json(chat_completion(text, logprobs=logprobs, usage=usage), delay=delay)

    @classmethod
    def error(
        cls,
        status: int = 500,
        message: str = "internal server error",
        *,
        headers: dict[str, str] | None = None,
        param: str | None = None,
        delay: float = 0.0,
    ) -> "Reply":
        """An OpenAI-style error body: ``{"error": {"message": ..., "type": ..., ...}}``."""
        body = {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                          "param": param, "code": None}}
        return cls.json(body, status=status, headers=headers, delay=delay)

    @classmethod
    def rate_limited(cls, retry_after: float | str | None = None, message: str = "rate limit reached") -> "Reply":
        """A 429; ``retry_after`` in seconds or as an HTTP-date string, or no header at all."""
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return cls.error(429, message, headers=headers)

    @classmethod
    def raw(cls, data: bytes, status: int = 200, content_type: str = "application/json") -> "Reply":
        """Arbitrary bytes, e.g. a malformed JSON body."""
        return cls(status=status, body=data, headers={"Content-Type": content_type})

    @classmethod
    def disconnect(cls, delay: float = 0.0) -> "Reply":
        """Close the connection without sending anything."""
        return cls(drop=True, delay=delay)

    @classmethod
    def truncated(cls, text: str = "4") -> "Reply":
        """Start a valid reply, then close the connection half way through the body."""
        data = json.dumps(chat_completion(text)).encode()
        return cls(body=data, headers={"Content-Type": "application/json"}, truncate=len(data) // 2)

    @classmethod
    def hang(cls, seconds: float) -> "Reply":
        """Answer normally, but only after ``seconds`` (to provoke client timeouts)."""
        return cls.ok(delay=seconds)


Planned = Union[Reply, Callable[[RecordedRequest], Reply]]


def chat_completion(
    text: str | None,
    *,
    logprobs: list[list[tuple[str, float]]] | None = None,
    usage: dict[str, Any] | None | bool = True,
    model: str = "test-model",
) -> dict[str, Any]:
    """A chat.completion body as OpenAI sends it; ``usage=False`` leaves usage out."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
        "logprobs": None,
    }
    if logprobs is not None:
        choice["logprobs"] = {
            "content": [
                {
                    "token": pos[0][0],
                    "logprob": pos[0][1],
                    "bytes": list(pos[0][0].encode()),
                    "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in pos],
                }
                for pos in logprobs
            ]
        }
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [choice],
    }
    if usage is True:
        body["usage"] = {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}
    elif isinstance(usage, dict):
        body["usage"] = usage
    return body


def digit_logprobs(best: str = "4", n: int = 5) -> list[tuple[str, float]]:
    """Top alternatives for one position: ``best`` most likely, the other digits 1-5 after it."""
    others = [d for d in "54321" if d != best]
    probs = [0.6] + [0.4 / (len(others))] * len(others)
    return [(tok, math.log(p)) for tok, p in zip([best, *others], probs)][:n]


class LLMServer:
    """The server; use as a context manager (starts on enter, stops on exit)."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.reply_text: str | None = "4"
        self.reply_fn: Callable[[Any], str | None] | None = None  # request JSON -> reply text
        self.logprobs = True  # give top logprobs when the request asks for them
        self.reject_logprobs = False  # answer 400 to requests that ask for logprobs
        self.require_key: str | None = None  # answer 401 unless "Authorization: Bearer <key>"
        self.default: Callable[[RecordedRequest], Reply] = self._default_reply
        self._planned: list[Planned] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting -------------------------------------------------------------------------

    def plan(self, *replies: Planned) -> None:
        """Queue replies for the next requests, in order; afterwards ``default`` answers."""
        with self._lock:
            self._planned.extend(replies)

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def url(self) -> str:
        """The base URL to give a client, e.g. ``http://127.0.0.1:PORT/v1``."""
        assert self._httpd is not None, "server not started"
        return f"http://{HOST}:{self._httpd.server_address[1]}/v1"

    def _next_reply(self, req: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(req)
            planned = self._planned.pop(0) if self._planned else None
        if planned is None:
            return self.default(req)
        return planned(req) if callable(planned) else planned

    def _default_reply(self, req: RecordedRequest) -> Reply:
        if req.path.rstrip("/") != "/v1/chat/completions":
            return Reply.error(404, f"no route {req.method} {req.path}")
        if self.require_key is not None and req.headers.get("authorization") != f"Bearer {self.require_key}":
            return Reply.error(401, "Incorrect API key provided")
        if not isinstance(req.json, dict) or not isinstance(req.json.get("messages"), list):
            return Reply.error(400, "body must be a JSON object with messages")
        if self.reject_logprobs and req.asks_logprobs():
            return Reply.error(400, "logprobs are not supported by this server", param="logprobs")
        text = self.reply_fn(req.json) if self.reply_fn is not None else self.reply_text
        lp = None
        if self.logprobs and req.json.get("logprobs") and text:
            n = int(req.json.get("top_logprobs") or 1)
            if text[0] in "12345":
                lp = [digit_logprobs(text[0], n)]
            else:  # prose: the first token and some other words, no digits
                first = text.split()[0] if text.split() else text
                lp = [[(first, -0.05), ("The", -3.2), ("This", -3.9), ("It", -4.4)][:n]]
        return Reply.ok(text, logprobs=lp)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "LLMServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers and httpx use

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
                pass  # keep test output clean

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                req = RecordedRequest(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    json=parsed,
                )
                reply = server._next_reply(req)
                if reply.delay and server._stopping.wait(reply.delay):
                    self.close_connection = True  # server is stopping: give up on the reply
                    return
                if reply.drop:
                    self._abort()
                    return
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json", **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if reply.truncate is not None:
                    self.wfile.write(data[: reply.truncate])
                    self.wfile.flush()
                    self._abort()
                    return
                self.wfile.write(data)

            def _abort(self) -> None:
                # shut the socket down now so the client sees the connection drop at once
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        httpd = ThreadingHTTPServer((HOST, 0), Handler)
        httpd.daemon_threads = True  # a hung handler must never keep the test process alive
        httpd.block_on_close = False  # type: ignore[attr-defined]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping on a delay
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "LLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port_url() -> tuple[str, socket.socket]:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused).

    The returned socket holds the port (bound, not listening) so nobody else takes it;
    close it when done.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    return f"http://{HOST}:{sock.getsockname()[1]}/v1", sock
