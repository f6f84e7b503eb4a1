"""Stream one URL into a file, with every way a download can fail said in one line (used by
``hdeval data download`` and the embedded model's first-use fetch)."""

from __future__ import annotations

import hashlib
import http.client
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from hdeval.errors import DownloadError

_CHUNK = 64 * 1024


def sha256_file(path: str | Path) -> str:
    """sha256 of a file, hex, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_to_file(url: str, out: Path, timeout: float, on_bytes: Callable[[int, int | None], None],
                  user_agent: str = "hdeval (hdeval data download)", max_bytes: int | None = None,
                  hint_404: str = "check the address") -> None:
    """Stream ``url`` into ``out``; raise :class:`DownloadError` unless every byte arrived (and,
    with ``max_bytes``, no more than that many)."""
    req = urllib.request.Request(url, headers={"User-Agent": user_agent})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise DownloadError(f"{url}: not found (HTTP 404); {hint_404}") from None
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DownloadError(f"cannot reach {url}: {exc.reason}") from None
    except TimeoutError:  # socket.timeout too (an alias since 3.10)
        raise DownloadError(f"{url}: no answer within {timeout:g} s") from None
    except (ValueError, http.client.HTTPException, OSError) as exc:
        raise DownloadError(f"cannot download {url}: {exc}") from None
    with resp:
        length = resp.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        done = 0
        # write errors (disk full) propagate as OSError: not the network's fault, the caller words them
        with out.open("wb") as fh:
            while True:
                try:
                    # b"" when the peer closes early: a cut-off body is caught by the length check below
                    chunk = resp.read(_CHUNK)
                except http.client.IncompleteRead as exc:
                    raise DownloadError(
                        f"{url}: connection closed after {done + len(exc.partial)} bytes"
                        + (f" of {total}" if total is not None else "")
                        + "; nothing was written, run the command again"
                    ) from None
                except TimeoutError:
                    raise DownloadError(f"{url}: stalled for {timeout:g} s after {done} bytes") from None
                except (http.client.HTTPException, OSError) as exc:
                    raise DownloadError(f"{url}: download failed after {done} bytes ({exc})") from None
                if not chunk:
                    break
                if max_bytes is not None and done + len(chunk) > max_bytes:
                    raise DownloadError(f"{url}: larger than {max_bytes} bytes; refused")
                fh.write(chunk)
                done += len(chunk)
                on_bytes(done, total)
    if total is not None and done != total:
        raise DownloadError(f"{url}: connection closed after {done} of {total} bytes; nothing was written, "
                            "run the command again")
