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
- ``Reply.hang(seconds)`` or ``delay=`` on any reply: wait before answering (timeouts);
- ``Reply.dripping(...)``: headers at once, then the body one byte every ``drip`` seconds;
- ``Reply.huge(n)``: an ``n``-byte body, with or without Content-Length;
- ``Reply.redirect(status, location)``: a 301/302/307 with a Location header.

A planned entry may also be a callable ``(RecordedRequest) -> Reply`` and ``server.default``
may be replaced by one, for replies that depend on the request. The default answers a
scoring-like ``"4"`` (text from ``server.reply_text`` or ``server.reply_fn(request_json)``),
with top logprobs when asked and ``server.logprobs`` is true, and with usage fields.
``server.reject_logprobs`` makes it answer 400 to any request asking for logprobs, like
servers that do not support them; ``server.require_key`` makes it answer 401 to a wrong key.

Every request is recorded (``server.requests``: headers, raw body, parsed JSON), so tests can
count calls and check where the API key was sent.

:class:`FaultServer` (at the end) answers like hdeval's FakeBackend, so ``hdeval train`` can
run against it (the request's declared kind and data, which are never sent, come from a
:class:`RequestBook` of the requests built in the test process), and injects faults by configuration (:class:`FaultMix`): 429 with and without
Retry-After, 500/502/503, hangs, dropped connections, truncated and malformed bodies, prose or
out-of-range scores, decomposition replies that are not JSON or empty, hostile score values
(``SCORE_HOSTILE``), refusals of one request and oversized replies (``REQUEST_FAULTS``), and
bodies dripping a byte per second (``SLOW_FAULTS``). It logs every reply's
outcome, refuses requests past a limit and stops by itself after a lifetime.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Protocol, Union

from hdeval.llm.backends.base import Completion, CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend

HOST = "127.0.0.1"  # never anything else: tests must not be reachable from the network


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # header names lower-cased
    body: bytes
    json: Any  # parsed body, or None when it was not JSON
    at: float = field(default_factory=time.monotonic)  # when it arrived

    def asks_logprobs(self) -> bool:
        return isinstance(self.json, dict) and ("logprobs" in self.json or "top_logprobs" in self.json)


@dataclass(frozen=True)
class Reply:
    """What to answer to one request.

    ``body`` is sent as is (bytes) or JSON-encoded (anything else); ``delay`` seconds pass
    before answering; ``drop`` closes the connection without a reply; ``truncate`` sends the
    headers (with the full Content-Length) and only that many body bytes, then closes;
    ``drip`` sends the body one byte every ``drip`` seconds (until the client gives up or the
    server stops); ``no_length`` sends no Content-Length and closes after the body.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    truncate: int | None = None
    drip: float = 0.0
    no_length: bool = False

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

    @classmethod
    def dripping(cls, text: str = "4", drip: float = 1.0) -> "Reply":
        """A valid reply whose body trickles in a byte every ``drip`` seconds: each read is
        quick, so only a deadline on the whole request ends it."""
        return cls(body=json.dumps(chat_completion(text)).encode(), drip=drip)

    @classmethod
    def huge(cls, size: int, *, with_length: bool = True) -> "Reply":
        """A ``size``-byte body (a JSON string padding a completion), announced by
        Content-Length or, with ``with_length=False``, only ended by closing the connection."""
        head = b'{"choices": [{"message": {"role": "assistant", "content": "4"}}], "pad": "'
        data = head + b"x" * max(0, size - len(head) - 2) + b'"}'
        return cls(body=data, no_length=not with_length)

    @classmethod
    def redirect(cls, status: int, location: str) -> "Reply":
        return cls(status=status, body=b"", headers={"Location": location})


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
        self.sent_bytes = 0  # bytes of no-length bodies sent in full (the client read them all)
        self.default: Callable[[RecordedRequest], Reply] = self._default_reply
        self._planned: list[Planned] = []
        self._lock = threading.Lock()
        self._open = 0  # client connections not yet closed (a handler runs until the client hangs up)
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

    def wait_all_closed(self, timeout: float = 10.0) -> int:
        """Wait (at most ``timeout`` s) until every client connection is closed; how many are
        still open. A keep-alive connection stays open until the client closes it."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._open == 0 or time.monotonic() >= deadline:
                    return self._open
            time.sleep(0.01)

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

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._open += 1

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with server._lock:
                        server._open -= 1

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
                if reply.no_length:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if reply.drip:
                    try:
                        for i in range(len(data)):
                            self.wfile.write(data[i : i + 1])
                            self.wfile.flush()
                            if server._stopping.wait(reply.drip):
                                break
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the client gave up: what a bounded client does
                    self.close_connection = True
                    return
                if reply.no_length:
                    try:
                        for i in range(0, len(data), 65536):
                            self.wfile.write(data[i : i + 65536])
                        server.sent_bytes += len(data)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
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


# == fault injection ===========================================================================
#
# ``FaultServer`` answers like an LLM (fault-free replies come from hdeval's deterministic
# FakeBackend, so a run through it builds the same tree as ``--llm fake``) and injects faults
# by configuration (:class:`FaultMix`). Which request gets which fault is a pure function of
# (seed, request body, how often that body was seen before), so a run's fault pattern does
# not depend on thread scheduling and a failing test replays exactly. Every reply is logged
# with its outcome, so tests can tell a completion the client received from a 200 it never
# saw (a hang past its timeout, a truncated body).

#: transport faults: the client never gets a usable completion and must retry
TRANSPORT_FAULTS = ("429", "429-retry-after", "500", "502", "503", "hang", "drop", "truncate", "malformed")
#: scoring replies that arrive fine (HTTP 200) but hold no usable score: cached, become NaN
SCORE_GARBAGE = ("prose", "out-of-range")
#: decomposition replies that arrive fine but hold no usable JSON: cached, asked again
DECOMPOSE_GARBAGE = ("bad-json", "empty")
#: scoring replies (HTTP 200) with hostile values: a superscript or Arabic-Indic digit, a
#: logprob of 1000 / Infinity / NaN, a 5000-digit number, a content that is not a string, a
#: token count of 1e999; cached, each a recorded failure (or for usage, a count of 0)
SCORE_HOSTILE = ("superscript", "arabic-digit", "logprob-1000", "logprob-inf", "logprob-nan",
                 "long-number", "not-a-string", "usage-1e999")
#: answers about one request: 400 context_length_exceeded / content filter, 413; and a reply
#: past the client's size cap. Not cached; a recorded failure of that cell, the run goes on
REQUEST_FAULTS = ("context-length", "content-filter", "413", "huge")
#: a body dripping a byte per second (only a deadline on the whole request ends it)
SLOW_FAULTS = ("drip",)
ALL_FAULTS = TRANSPORT_FAULTS + SCORE_GARBAGE + DECOMPOSE_GARBAGE + SCORE_HOSTILE + REQUEST_FAULTS + SLOW_FAULTS


class RequestBook:
    """The hdeval requests built in this process while the book is open, by their messages: how a
    test server learns a request's declared kind and data (``CompletionRequest.kind``/``data``),
    which never go over the wire. Every ``CompletionRequest`` constructed meanwhile (by a method, a
    retry's ``dataclasses.replace``, a CLI run in the test process) is entered; bodies sent from
    other processes (Ray workers) carry messages built here, so they are found too."""

    _open: list["RequestBook"] = []
    _guard = threading.Lock()
    _real_init: Any = None

    def __init__(self) -> None:
        self._by_messages: dict[tuple[tuple[str, str], ...], CompletionRequest] = {}
        self._lock = threading.RLock()  # reading the children's books builds requests, which enter
        self._read: dict[str, int] = {}  # a child's book file -> bytes read

    def __enter__(self) -> "RequestBook":
        cls = RequestBook
        with cls._guard:
            if not cls._open:
                real = cls._real_init = CompletionRequest.__init__

                def init(request: CompletionRequest, *args: Any, **kwargs: Any) -> None:
                    real(request, *args, **kwargs)
                    if request.kind:
                        for book in list(cls._open):
                            book.enter(request)

                CompletionRequest.__init__ = init  # type: ignore[method-assign]
            cls._open.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        cls = RequestBook
        with cls._guard:
            if self in cls._open:
                cls._open.remove(self)
            if not cls._open and cls._real_init is not None:
                CompletionRequest.__init__ = cls._real_init  # type: ignore[method-assign]
                cls._real_init = None

    def enter(self, request: CompletionRequest) -> None:
        with self._lock:
            self._by_messages[tuple((m.role, m.content) for m in request.messages)] = request

    def declared(self, body: Any) -> CompletionRequest | None:
        """The request a chat body's messages were built from, None when it was not built here."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return None
        key = tuple((str(m.get("role")), str(m.get("content"))) for m in messages)
        with self._lock:
            if key not in self._by_messages:
                self._read_children()
            return self._by_messages.get(key)

    def _read_children(self) -> None:
        """Enter the requests child processes built since the last read (``tests/child_book``)."""
        folder = os.environ.get("HDEVAL_TEST_BOOK_DIR")
        if not folder or not os.path.isdir(folder):
            return
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            with open(path, "rb") as fh:
                fh.seek(self._read.get(path, 0))
                data = fh.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            self._read[path] = self._read.get(path, 0) + len(whole)
            for line in whole.splitlines():
                try:
                    row = json.loads(line.decode("utf-8", "surrogatepass"))
                    messages = tuple(Message(role, content) for role, content in row["messages"])
                    request = CompletionRequest(messages, kind=row["kind"], data=row["data"])
                except (ValueError, TypeError, KeyError):
                    # a line a child killed mid-write left (a test may kill it on purpose): one
                    # request lost, never the book, which every later server of the session reads
                    continue
                self.enter(request)


def completion_request(body: dict[str, Any], declared: CompletionRequest | None = None) -> CompletionRequest:
    """The hdeval request an OpenAI request body was made from (inverse of the backend's
    ``_params``), with the kind, data and JSON schema ``declared`` gives it (a schema stays on
    the client when a server rejected it, but is part of the cache key): so a test can compute
    the cache key of a request the server saw, and the fake answer it as it was asked."""
    fmt = body.get("response_format")
    json_mode = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    schema = None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = json.dumps(fmt["json_schema"]["schema"], sort_keys=True)
    elif declared is not None:
        schema = declared.json_schema
    return CompletionRequest(
        messages=tuple(Message(m["role"], m["content"]) for m in body["messages"]),
        temperature=float(body.get("temperature", 0.0)),
        max_tokens=int(body.get("max_tokens", 16)),
        top_logprobs=int(body["top_logprobs"]) if body.get("logprobs") and body.get("top_logprobs") else None,
        seed=body.get("seed"),
        json_mode=json_mode,
        json_schema=schema,
        kind=declared.kind if declared is not None else "",
        data=declared.data if declared is not None else {},
    )


CHILD_BOOK = str(Path(__file__).resolve().parent / "child_book")


def child_book_env(env: dict[str, str], folder: str) -> dict[str, str]:
    """``env`` for child processes whose requests the test servers of this process answer: they
    enter them in ``folder`` (``child_book/sitecustomize.py``), which this process reads."""
    os.environ["HDEVAL_TEST_BOOK_DIR"] = folder
    out = dict(env, HDEVAL_TEST_BOOK_DIR=folder)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [CHILD_BOOK, env.get("PYTHONPATH")]))
    return out


def fake_answer(book: RequestBook, body: dict[str, Any], fake: FakeBackend) -> Completion:
    """What the fake LLM answers to a chat body (a server's, or a request file line's), from the
    kind and data the book holds for its messages."""
    declared = book.declared(body)
    assert declared is not None, "no request built in this test (or its children) has these messages"
    return fake.complete(completion_request(body, declared))


def completion_body(c: Completion, model: str = "test-model") -> dict[str, Any]:
    """An hdeval Completion as the chat.completion body an OpenAI server would send."""
    lp = None
    if c.top_logprobs:
        lp = [[(t.token, t.logprob) for t in pos] for pos in c.top_logprobs if pos]
    usage = {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
             "total_tokens": c.prompt_tokens + c.completion_tokens}
    return chat_completion(c.text, logprobs=lp or None, usage=usage, model=model)


def _hostile_body(fault: str) -> bytes:
    """A chat completion (HTTP 200) carrying one hostile value, as raw JSON text (so it can
    hold what ``json.dumps`` would not write: 1e999, a bare Infinity)."""
    def completion(content: str, logprobs: str = "null", usage: str = '{"prompt_tokens": 12, "completion_tokens": 1}') -> bytes:
        return (f'{{"id": "x", "object": "chat.completion", "choices": [{{"index": 0, "message": {{"role": '
                f'"assistant", "content": {content}}}, "logprobs": {logprobs}, "finish_reason": "stop"}}], '
                f'"usage": {usage}}}').encode()

    def lp(token: str, value: str) -> str:
        alt = f'{{"token": {json.dumps(token)}, "logprob": {value}}}'
        return f'{{"content": [{{"token": {json.dumps(token)}, "logprob": {value}, "top_logprobs": [{alt}]}}]}}'

    if fault == "superscript":
        return completion('"\u00b2"', lp("\u00b2", "-0.01"))
    if fault == "arabic-digit":
        return completion('"\u0664"', lp("\u0664", "-0.01"))
    if fault == "logprob-1000":
        return completion('"4"', lp("4", "1000"))
    if fault == "logprob-inf":
        return completion('"4"', lp("4", "Infinity"))
    if fault == "logprob-nan":
        return completion('"4"', lp("4", "NaN"))
    if fault == "long-number":
        return completion('"' + "5" * 5000 + '"')
    if fault == "not-a-string":
        return completion('{"score": 4}')
    if fault == "usage-1e999":
        return completion('"4"', lp("4", "-0.01"), '{"prompt_tokens": 1e999, "completion_tokens": -5}')
    raise ValueError(fault)


def stable_unit(*parts: Any) -> float:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class FaultMix:
    """``rate`` of requests get a fault, drawn uniformly from ``faults`` (those that apply
    to the request's kind: garbage scores only to scoring requests, garbage JSON only to
    decompositions). ``retry_after`` is the header value of ``429-retry-after``; ``hang``
    is how long a hung request waits (make it longer than the client's timeout); ``huge``
    the size of a "huge" body, ``drip`` the seconds between the bytes of a "drip" body."""

    rate: float
    faults: tuple[str, ...] = TRANSPORT_FAULTS
    seed: int = 0
    retry_after: str = "1"
    hang: float = 4.5
    huge: int = 5 * 2**20  # bytes of a "huge" reply: past the client's 4 MB cap
    drip: float = 1.0  # seconds between the bytes of a "drip" reply

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {ALL_FAULTS}")

    def pick(self, body: bytes, kind: str, seen_before: int) -> str | None:
        """The fault for the ``seen_before``-th repeat of ``body``, or None."""
        if stable_unit(self.seed, "rate", body, seen_before) >= self.rate:
            return None
        usable = [f for f in self.faults
                  if f in TRANSPORT_FAULTS or f in REQUEST_FAULTS or f in SLOW_FAULTS
                  or (kind == "score" and f in SCORE_GARBAGE + SCORE_HOSTILE)
                  or (kind == "decompose" and f in DECOMPOSE_GARBAGE)]
        if not usable:
            return None
        return usable[int(stable_unit(self.seed, "which", body, seen_before) * len(usable))]


class FaultPicker(Protocol):
    """What :class:`FaultServer` asks which fault (if any) a request gets; :class:`FaultMix`
    is one, a test may script its own."""

    def pick(self, body: bytes, kind: str, seen_before: int) -> str | None: ...


@dataclass(frozen=True)
class Answer:
    """One logged reply: ``outcome`` is ``ok`` for a complete completion the client received
    (as far as the server can tell), else the fault name, ``401``, ``limit`` (past
    ``max_requests``), ``stopped`` (held by :meth:`FaultServer.pause`) or ``unknown`` (messages
    its :class:`RequestBook` does not hold)."""

    body: bytes
    kind: str
    outcome: str
    at: float  # time.monotonic() when the reply was chosen


class FaultServer(LLMServer):
    """An OpenAI-compatible server that answers like hdeval's FakeBackend, with faults.

    ``faults``: a :class:`FaultMix` (or other :class:`FaultPicker`) or None (fault-free); it
    may be swapped between runs (the port, and so the client's identity and cache keys, stay
    the same); ``delay``: seconds before every reply
    (to make a run last long enough to be killed); ``max_requests`` and ``lifetime`` bound
    every test: past ``max_requests`` each request gets a non-retryable 400, and after
    ``lifetime`` seconds the server stops by itself. ``on_request(n)`` is called with the
    running request count before each reply (tests use it to kill a client mid-run);
    :meth:`pause` makes it stop answering. ``require_key``: a wrong key gets a 401 that
    echoes the key it was sent (the worst case for a client's error messages).
    """

    def __init__(
        self,
        faults: FaultPicker | None = None,
        *,
        delay: float = 0.0,
        max_requests: int = 20_000,
        lifetime: float = 300.0,
        on_request: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__()
        self.faults = faults
        self.delay = delay
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.on_request = on_request
        self.fake = FakeBackend()
        self.book = RequestBook()
        self.log: list[Answer] = []
        self._running = threading.Event()  # cleared by pause(): new requests wait unanswered
        self._running.set()
        self._seen: Counter[bytes] = Counter()
        self._timer: threading.Timer | None = None
        self.default = self._answer

    # -- answering ----------------------------------------------------------------------------

    def kind_of(self, req: RecordedRequest) -> str:
        """The declared kind of the request a body was built from ("" when not built here)."""
        declared = self.book.declared(req.json)
        return declared.kind if declared is not None else ""

    def _answer(self, req: RecordedRequest) -> Reply:
        if req.path.rstrip("/") != "/v1/chat/completions" or not isinstance(req.json, dict):
            return Reply.error(404, f"no route {req.method} {req.path}")
        declared = self.book.declared(req.json)
        kind = declared.kind if declared is not None else ""
        with self._lock:
            n = len(self.requests)
            seen = self._seen[req.body]
            self._seen[req.body] += 1
        if self.on_request is not None:
            self.on_request(n)
        if not self._running.is_set():
            # a frozen server: the client waits on its timeout; the test kills it meanwhile
            self._running.wait(self.lifetime)
            return self._logged(req, kind, "stopped", Reply.error(503, "server was paused"))
        if n > self.max_requests:
            return self._logged(req, kind, "limit", Reply.error(400, f"test server request limit {self.max_requests} reached"))
        sent = req.headers.get("authorization", "")
        if self.require_key is not None and sent != f"Bearer {self.require_key}":
            # echo the key as some servers do: the worst case for a client's error messages
            presented = sent.removeprefix("Bearer ")
            return self._logged(req, kind, "401", Reply.error(401, f"Incorrect API key provided: {presented}"))
        if declared is None:
            return self._logged(req, kind, "unknown", Reply.error(
                400, "the test server knows no request with these messages: it answers requests built "
                     "in its own process while it runs"))
        fault = self.faults.pick(req.body, kind, seen) if self.faults is not None else None
        completion = self.fake.complete(completion_request(req.json, declared))
        body = completion_body(completion, str(req.json.get("model", "test-model")))
        reply = self._fault_reply(fault, body, kind) if fault else Reply.json(body)
        if self.delay:
            reply = Reply(reply.status, reply.body, reply.headers, reply.delay + self.delay, reply.drop, reply.truncate)
        return self._logged(req, kind, fault or "ok", reply)

    def _fault_reply(self, fault: str, body: dict[str, Any], kind: str) -> Reply:
        # the timing knobs of a FaultMix; a scripted picker gets the defaults
        mix = self.faults if isinstance(self.faults, FaultMix) else FaultMix(0.0)
        if fault == "429":
            return Reply.rate_limited()
        if fault == "429-retry-after":
            return Reply.rate_limited(retry_after=mix.retry_after)
        if fault in ("500", "502", "503"):
            return Reply.error(int(fault), f"injected {fault}")
        if fault == "hang":
            return Reply.json(body, delay=mix.hang)
        if fault == "drop":
            return Reply.disconnect()
        if fault == "truncate":
            data = json.dumps(body).encode()
            return Reply(body=data, headers={"Content-Type": "application/json"}, truncate=len(data) // 2)
        if fault == "malformed":
            # an HTML error page from a proxy, or a JSON body cut short: both answered 200
            html = len(json.dumps(body)) % 2 == 0
            return Reply.raw(b"<html><body>502 Bad Gateway</body></html>" if html else b'{"choices": [{"mess')
        if fault == "prose":
            return Reply.ok("This utterance reads well and I would rate it fairly highly overall.",
                            logprobs=[[("This", -0.02), ("The", -4.0), ("I", -5.0)]])
        if fault == "out-of-range":
            return Reply.ok("9", logprobs=[[("9", -0.01), ("10", -5.0), ("7", -6.0)]])
        if fault == "bad-json":
            return Reply.ok('Sure! Here are the sub-criteria: {"subcriteria": [{"key": "clarity", "name": ')
        if fault == "empty":
            return Reply.ok("")
        if fault in SCORE_HOSTILE:
            return Reply.raw(_hostile_body(fault))
        if fault == "context-length":
            return Reply.json({"error": {
                "message": "This model's maximum context length is 128 tokens. However, your messages "
                           "resulted in 9000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}},
                status=400)
        if fault == "content-filter":
            return Reply.json({"error": {
                "message": "The response was filtered due to the prompt triggering the content management policy.",
                "type": None, "param": "prompt", "code": "content_filter"}}, status=400)
        if fault == "413":
            return Reply.error(413, "request entity too large")
        if fault == "huge":
            return Reply.huge(mix.huge)
        if fault == "drip":
            return Reply(body=json.dumps(body).encode(), drip=mix.drip)
        raise ValueError(fault)  # pragma: no cover - FaultMix validates names

    def _logged(self, req: RecordedRequest, kind: str, outcome: str, reply: Reply) -> Reply:
        with self._lock:
            self.log.append(Answer(req.body, kind, outcome, time.monotonic()))
        return reply

    def pause(self) -> None:
        """Leave every request from now on unanswered (until :meth:`resume`, at most
        ``lifetime``), as a server that stopped responding."""
        self._running.clear()

    def resume(self) -> None:
        """Answer again; requests held by :meth:`pause` get a 503."""
        self._running.set()

    # -- reading the log ----------------------------------------------------------------------

    def outcomes(self) -> Counter[str]:
        with self._lock:
            return Counter(a.outcome for a in self.log)

    def ok_bodies(self) -> Counter[bytes]:
        """How often each request body was answered with a usable 200 (garbage included:
        garbage is a completion the client receives and caches)."""
        usable = {"ok", *SCORE_GARBAGE, *DECOMPOSE_GARBAGE, *SCORE_HOSTILE}
        with self._lock:
            return Counter(a.body for a in self.log if a.outcome in usable)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> "FaultServer":
        self.book.__enter__()
        super().start()
        assert self._httpd is not None
        report = self._httpd.handle_error

        def handle_error(request: Any, client_address: Any) -> None:
            # a client that gave up (timeout) or that we cut off makes the handler's write
            # fail: expected here, so not worth a traceback in the test output
            exc = sys.exc_info()[1]
            if not isinstance(exc, (BrokenPipeError, ConnectionResetError)):
                report(request, client_address)

        self._httpd.handle_error = handle_error  # type: ignore[method-assign]
        # never outlive a test that forgot to stop us (or hung): stop after ``lifetime``
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        self._running.set()  # release paused handlers
        super().stop()
        self.book.__exit__(None, None, None)

    def __enter__(self) -> "FaultServer":
        return self.start()
