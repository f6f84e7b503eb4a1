"""The OpenAI-compatible backend's HTTP path (the SDK over hdeval's bounded transport): the
whole-request deadline, dead keep-alive connections, proxies from the environment, and
compressed replies."""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
from conftest import close_after_test
from llm_server import LLMServer, Reply, chat_completion, closed_port_url

from hdeval.core.errors import BackendError, ConfigError
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import OpenAICompatBackend

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

KEY = "sk-test-SECRET-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as s:
        yield s


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def make(url: str, **kwargs: object) -> OpenAICompatBackend:
    options: dict = {"api_key": KEY, "timeout": 10.0, "max_retries": 1, "backoff_base": 0.01}
    options.update(kwargs)
    return close_after_test(OpenAICompatBackend(model="test-model", base_url=url, **options))


def req(text: str = "Rate this text.") -> CompletionRequest:
    return CompletionRequest(messages=(Message("user", text),), kind="score")


# -- the deadline ----------------------------------------------------------------------------


def test_a_reply_dripping_within_its_content_length_is_ended_at_the_deadline(server: LLMServer) -> None:
    # each byte comes well within a per-read timeout: only the deadline on the whole request stops it
    server.plan(Reply.dripping("4", drip=0.2))
    with pytest.raises(BackendError, match="no complete reply within the 0.8s timeout"):
        make(server.url, timeout=0.8, max_retries=0).complete(req())


def test_an_unreachable_server_is_still_named_as_such() -> None:
    url, holder = closed_port_url()
    try:
        with pytest.raises(BackendError, match="cannot reach LLM server"):
            make(url, max_retries=0).complete(req())
    finally:
        holder.close()


# -- keep-alive -----------------------------------------------------------------------------


def test_a_connection_the_server_closed_is_not_reused(server: LLMServer) -> None:
    b = make(server.url, max_retries=0)  # a reused dead socket would fail the next call
    server.plan(Reply.huge(1000, with_length=False))  # said "Connection: close" with this reply
    assert b.complete(req("first")).text == "4"
    assert b.complete(req("second")).text == "4"
    assert server.calls == 2
    b.close()


def test_an_idle_connection_the_server_dropped_silently_is_not_reused() -> None:
    """A keep-alive server that closes an idle connection without saying so beforehand (an
    idle timeout): the next request must not go out on the dead socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    closed = threading.Event()
    data = json.dumps(chat_completion("2")).encode()
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(data)).encode() + b"\r\n\r\n" + data)

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                got = b""
                while b"\r\n\r\n" not in got:
                    got += conn.recv(65536)
                head, _, rest = got.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                conn.sendall(reply)  # keep-alive by HTTP/1.1 default, then closed anyway
            closed.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        b = make(f"http://127.0.0.1:{port}/v1", max_retries=0)
        assert b.complete(req("first")).text == "2"
        assert closed.wait(10)
        assert b.complete(req("second")).text == "2"  # on a new connection
        b.close()
    finally:
        listener.close()


# -- proxies, compression -------------------------------------------------------------------


class _Proxy:
    """A stand-in HTTP proxy on 127.0.0.1: records each request line and headers, answers
    with a chat completion itself."""

    def __init__(self) -> None:
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                data = json.dumps(chat_completion("3")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_http_proxy_from_the_environment_gets_the_whole_url(no_proxy_env) -> None:
    proxy = _Proxy()
    try:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://proxy-user:proxy-pw@"))
        b = make("http://llm.example:8000/v1")  # never resolved: the request goes to the proxy
        assert b.complete(req()).text == "3"
        ((path, headers),) = proxy.seen
        assert path == "http://llm.example:8000/v1/chat/completions"
        assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"proxy-user:proxy-pw").decode()
        assert headers["authorization"] == f"Bearer {KEY}"
        b.close()
    finally:
        proxy.close()


def test_no_proxy_is_honoured(server: LLMServer, no_proxy_env) -> None:
    proxy, holder = closed_port_url()
    try:
        no_proxy_env.setenv("HTTP_PROXY", proxy)
        no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
        assert make(server.url).complete(req()).text == "4"
        assert server.requests[0].path == "/v1/chat/completions"
    finally:
        holder.close()


def test_a_proxy_hdeval_cannot_speak_is_a_config_error(no_proxy_env) -> None:
    no_proxy_env.setenv("HTTPS_PROXY", "socks5://user:secret-pw@127.0.0.1:1080")
    with pytest.raises(ConfigError, match="not an http:// proxy") as info:
        make("https://llm.example/v1")
    assert "secret-pw" not in str(info.value)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_reply_is_read(server: LLMServer, encoding: str) -> None:
    data = json.dumps(chat_completion("5")).encode()
    packed = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    server.plan(Reply(body=packed, headers={"Content-Encoding": encoding}))
    assert make(server.url).complete(req()).text == "5"


def test_a_compression_bomb_is_cut_at_the_size_cap(server: LLMServer) -> None:
    from hdeval.core.errors import RequestRejected

    server.plan(Reply(body=gzip.compress(b" " * (8 * 2**20)), headers={"Content-Encoding": "gzip"}))
    with pytest.raises(RequestRejected, match="larger than"):
        make(server.url).complete(req())


def test_a_reply_dripping_until_the_server_closes_is_ended_at_the_deadline(server: LLMServer) -> None:
    # no Content-Length: the body ends when the server closes
    body = json.dumps(chat_completion("4")).encode()
    assert len(body) > 250  # dripping in full takes over 50 s
    server.plan(Reply(body=body, drip=0.2, no_length=True))
    # read to its end, the reply would be a success: the error is the deadline's
    with pytest.raises(BackendError, match="no complete reply within the 0.8s timeout"):
        make(server.url, timeout=0.8, max_retries=0).complete(req())
