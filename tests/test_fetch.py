"""hdeval.core.fetch.fetch_to_file: a download that stalls, or answers with an error, is one line naming
the URL (the cut-off, 404 and unreachable cases run through `hdeval data download` in test_datasets)."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from hdeval.core.errors import DownloadError
from hdeval.core.fetch import fetch_to_file


@pytest.fixture
def server():
    """/stall sends 10 of 100 bytes, then nothing for 3 s; anything else is HTTP 503."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path != "/stall":
                self.send_error(503)
                return
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            time.sleep(3)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_download_that_stalls_is_ended_at_the_timeout(server, tmp_path) -> None:
    seen: list[tuple[int, int | None]] = []
    with pytest.raises(DownloadError) as err:
        fetch_to_file(f"{server}/stall", tmp_path / "out", 0.5, lambda d, t: seen.append((d, t)))
    assert str(err.value) == f"{server}/stall: stalled for 0.5 s after 10 bytes"
    assert seen == [(10, 100)]


def test_an_http_error_names_the_url_and_status(server, tmp_path) -> None:
    with pytest.raises(DownloadError) as err:
        fetch_to_file(f"{server}/other", tmp_path / "out", 5, lambda d, t: None)
    assert str(err.value) == f"{server}/other: HTTP 503 Service Unavailable"
    assert not (tmp_path / "out").exists()
