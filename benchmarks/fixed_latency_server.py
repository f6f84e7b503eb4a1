"""A minimal OpenAI-compatible chat server that answers after a fixed latency (stdlib asyncio).

It exists to measure hdeval's client, so it must never be the bottleneck: one event loop,
HTTP/1.1 keep-alive, no request parsing beyond the headers and Content-Length, and the same
tiny valid ``chat.completion`` body for every request, sent ``L`` milliseconds after the
request arrived. ``L`` comes from the path: ``POST /lat/<ms>/v1/chat/completions`` waits
``<ms>`` ms, plain ``/v1/chat/completions`` waits ``--latency-ms``. ``GET /stats`` answers
``{"requests": n}``. Binds 127.0.0.1 only.

    python benchmarks/fixed_latency_server.py --port 0 --latency-ms 50
    # prints "listening on http://127.0.0.1:PORT" and serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

HOST = "127.0.0.1"
BODY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
}, separators=(",", ":")).encode()
MAX_HEADER = 64 * 1024
MAX_BODY = 8 * 2**20


class Server:
    def __init__(self, latency_ms: float) -> None:
        self.latency_ms = latency_ms
        self.requests = 0

    def _latency(self, path: str) -> float:
        parts = path.split("/")
        if len(parts) > 3 and parts[1] == "lat":
            try:
                return max(0.0, float(parts[2])) / 1000.0
            except ValueError:
                pass
        return self.latency_ms / 1000.0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
                length = 0
                close = False
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value.strip() or 0)
                    elif name == "connection" and value.strip().lower() == "close":
                        close = True
                if length > MAX_BODY:
                    return
                if length:
                    await reader.readexactly(length)
                if method == "GET" and path == "/stats":
                    status, body = "200 OK", json.dumps({"requests": self.requests}).encode()
                elif method == "POST" and path.endswith("/chat/completions"):
                    self.requests += 1
                    await asyncio.sleep(self._latency(path))
                    status, body = "200 OK", BODY
                else:
                    status, body = "404 Not Found", b'{"error":{"message":"no such route"}}'
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                )
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()


async def serve(port: int, latency_ms: float) -> None:
    server = Server(latency_ms)
    srv = await asyncio.start_server(server.handle, HOST, port, backlog=1024, limit=MAX_HEADER)
    bound = srv.sockets[0].getsockname()[1]
    print(f"listening on http://{HOST}:{bound}", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    p.add_argument("--latency-ms", type=float, default=50.0)
    args = p.parse_args(argv)
    try:
        asyncio.run(serve(args.port, args.latency_ms))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
