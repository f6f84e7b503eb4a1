"""A tiny static file server on 127.0.0.1 for tests that download (no real network).

    with FileServer({"/a/b.json": b"[]"}) as srv:
        urllib.request.urlopen(srv.url + "/a/b.json")
        assert srv.requests == ["/a/b.json"]

``truncate``: paths answered with a Content-Length larger than the body, after which the
connection is closed - what a dropped connection mid-download looks like to a client.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Collection, Mapping
from urllib.parse import urlsplit


class FileServer:
    """Serves ``files`` (URL path -> bytes); every other path is a 404."""

    def __init__(self, files: Mapping[str, bytes], truncate: Collection[str] = ()) -> None:
        self.files = dict(files)
        self.truncate = set(truncate)
        #: URL paths of the GET requests received, in order
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = urlsplit(self.path).path
                server.requests.append(path)
                body = server.files.get(path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if path in server.truncate:
                    self.send_header("Content-Length", str(len(body) + 1000))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # keep pytest output clean

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def files_under(root: Path, layout: Mapping[str, str], prefix: str = "") -> dict[str, bytes]:
    """``{prefix + "/" + url_path: bytes of root / file_name}`` for ``layout`` url_path -> file_name."""
    return {f"{prefix}/{url_path}": (root / name).read_bytes() for url_path, name in layout.items()}
