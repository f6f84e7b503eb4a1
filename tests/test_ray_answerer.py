"""The Ray request answerer's HTTP client (hdeval.integrations.ray.RequestAnswerer), called
directly (no Ray cluster): it talks to a server like hdeval's own backends do, replies bounded
and redirects never followed. Servers here are on 127.0.0.1 only."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from hdeval.integrations.ray import RequestAnswerer
from hdeval.llm.request_files import MAX_LINE_BYTES


class _Server:
    """A loopback server answering every POST with ``reply(handler)``; counts requests and the
    body bytes it managed to send."""

    def __init__(self, reply):
        outer = self
        self.requests = 0
        self.sent = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.last_body = self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.requests += 1
                try:
                    reply(self, outer)
                except OSError:  # the client dropped the connection: what a bounded client does
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _line(key: str = "k" * 64) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return json.dumps({"custom_id": key, "method": "POST", "url": "/v1/chat/completions", "body": body})


def _answer(url: str) -> dict:
    answerer = RequestAnswerer(url, timeout=20, max_retries=0, concurrency=1)
    (out,) = answerer({"text": np.array([_line()], dtype=object)})["result"]
    return json.loads(out)


def test_a_huge_reply_is_not_read_to_its_end() -> None:
    """A server sending far more than a result line may hold: the answerer drops the connection
    once past the bound (the worker's memory stays bounded) and records the request as failed."""
    total = 8 * MAX_LINE_BYTES
    chunk = b"x" * 2**20

    def huge(h, srv):
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.end_headers()  # no content-length: the body must be bounded while it is read
        for _ in range(total // len(chunk)):
            h.wfile.write(chunk)
            srv.sent += len(chunk)

    with _Server(huge) as srv:
        got = _answer(srv.url)
    assert got["custom_id"] == "k" * 64 and got["response"] is None
    assert f"larger than {MAX_LINE_BYTES // 1024} KB" in got["error"]["message"]
    assert srv.sent < total / 2, f"the answerer read {srv.sent} bytes of a {total}-byte reply"


def test_a_redirect_is_not_followed() -> None:
    """A reply redirecting elsewhere is an error, as with hdeval's backends: the request (and the
    API key in it) never goes to the other address."""
    with _Server(lambda h, srv: None) as other:
        def redirect(h, srv):
            h.send_response(307)
            h.send_header("location", other.url + "/chat/completions")
            h.send_header("content-length", "0")
            h.end_headers()

        with _Server(redirect) as srv:
            got = _answer(srv.url)
        assert srv.requests == 1
        assert other.requests == 0
    assert got["response"]["status_code"] == 307 and got["error"]["message"]


def test_a_normal_reply_is_written_as_a_batch_result_line() -> None:
    reply = {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "3"}, "finish_reason": "stop"}]}

    def ok(h, srv):
        data = json.dumps(reply).encode()
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    with _Server(ok) as srv:
        got = _answer(srv.url)
    assert got == {"custom_id": "k" * 64, "response": {"status_code": 200, "body": reply}, "error": None}


def test_a_malformed_reply_is_asked_again_under_the_clients_retry_policy() -> None:
    """The answerer retries as hdeval's client does: a reply that is not a chat completion is
    asked for again (the SDK's own retries would have written it as a failed line)."""
    good = {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "3"}, "finish_reason": "stop"}]}

    def flaky(h, srv):
        data = b"not json" if srv.requests == 1 else json.dumps(good).encode()
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    with _Server(flaky) as srv:
        answerer = RequestAnswerer(srv.url, timeout=20, max_retries=1, concurrency=1)
        (out,) = answerer({"text": np.array([_line()], dtype=object)})["result"]
    got = json.loads(out)
    assert srv.requests == 2
    assert got["error"] is None and got["response"] == {"status_code": 200, "body": good}
