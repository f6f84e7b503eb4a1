"""One request, one response: a keep-alive connection on which the server sends a response nobody
asked for (two answers to one request, back to back) is closed, and the request asked again; the
stray reply is never taken as the next request's, never scored, never cached."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
from conftest import cache_entries

from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.llm.cache.client import CachedBackend

pytestmark = pytest.mark.usefixtures("no_leaked_resources")


def _response(text: str) -> bytes:
    body = json.dumps({"object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


class DoubleAnswerServer:
    """A keep-alive HTTP/1.1 server on 127.0.0.1 answering each request with its own last message
    (``echo: ...``); the ``stray_after``-th request gets a second, unsolicited 200 right behind it."""

    def __init__(self, stray_after: int = 1) -> None:
        self.stray_after = stray_after
        self.requests = 0
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(rest) < length:
                    rest += conn.recv(65536)
                body, buf = json.loads(rest[:length]), rest[length:]
                with self._lock:
                    self.requests += 1
                    n = self.requests
                reply = _response("echo: " + body["messages"][-1]["content"])
                if n == self.stray_after:
                    reply += _response("stray: not an answer to anything")
                conn.sendall(reply)
        except OSError:
            return

    def close(self) -> None:
        self._sock.close()
        for conn in self._conns:
            conn.close()


def test_a_stray_response_is_never_taken_as_the_next_requests_reply(tmp_path: Path) -> None:
    server = DoubleAnswerServer(stray_after=1)
    backend = OpenAICompatBackend("m", base_url=server.url, api_key="k", max_retries=2, backoff_base=0.01)
    client = CachedBackend(backend, tmp_path / "cache", concurrency=1)
    try:
        asked = [CompletionRequest((Message("user", f"question {i}"),)) for i in range(4)]
        got = [client.complete(r).text for r in asked]
    finally:
        client.close()
        backend.close()
        server.close()
    assert got == [f"echo: question {i}" for i in range(4)]
    assert server.connections == 2  # the connection that held the stray was closed, a new one opened
    assert server.requests == 5  # the first request, whose connection held two answers, asked again
    assert sorted(c.text for c in cache_entries(tmp_path / "cache").values()) == got
