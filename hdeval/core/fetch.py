"""Stream one URL into a file, with every way a download can fail said in one line (used by
``hdeval data download`` and the embedded model's first-use fetch)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from hdeval.core.errors import DownloadError


def sha256_file(path: str | Path) -> str:
    """sha256 of a file, hex, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_to_file(
    url: str,
    out: Path,
    timeout: float,
    on_bytes: Callable[[int, int | None], None],
    user_agent: str = "hdeval (hdeval data download)",
    max_bytes: int | None = None,
    hint_404: str = "check the address",
) -> None:
    """Stream ``url`` into ``out``; raise :class:`DownloadError` unless every byte arrived (and,
    with ``max_bytes``, no more than that many). A ``file://`` URL is read from this machine."""
    if url.lower().startswith("file:"):
        _copy_local(url, out, on_bytes, max_bytes, hint_404)
        return
    import httpx2  # here: sha256_file's users (every command) need no HTTP client

    done, total = 0, None
    # identity: the bytes written are the bytes Content-Length counts (httpx checks that they all came)
    headers = {"User-Agent": user_agent, "Accept-Encoding": "identity"}
    try:
        with httpx2.stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as resp:
            if resp.status_code == 404:
                raise DownloadError(f"{url}: not found (HTTP 404); {hint_404}")
            if resp.status_code >= 400:
                raise DownloadError(f"{url}: HTTP {resp.status_code} {resp.reason_phrase}")
            length = resp.headers.get("Content-Length", "")
            total = int(length) if length.isdigit() else None
            # write errors (disk full) propagate as OSError: not the network's fault, the caller words them
            with out.open("wb") as fh:
                for chunk in resp.iter_raw():
                    if max_bytes is not None and done + len(chunk) > max_bytes:
                        raise DownloadError(f"{url}: larger than {max_bytes} bytes; refused")
                    fh.write(chunk)
                    done += len(chunk)
                    on_bytes(done, total)
    except httpx2.ConnectError as exc:
        raise DownloadError(f"cannot reach {url}: {exc}") from None
    except httpx2.TimeoutException:
        what = f"stalled for {timeout:g} s after {done} bytes" if done else f"no answer within {timeout:g} s"
        raise DownloadError(f"{url}: {what}") from None
    except httpx2.RemoteProtocolError:  # the peer closed before the whole body came
        of = f" of {total}" if total is not None else ""
        raise DownloadError(
            f"{url}: connection closed after {done}{of} bytes; nothing was written, run the command again"
        ) from None
    except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
        raise DownloadError(f"cannot download {url}: {exc}") from None


def _copy_local(
    url: str, out: Path, on_bytes: Callable[[int, int | None], None], max_bytes: int | None, hint_404: str
) -> None:
    """A ``file://`` URL's file copied into ``out``, block by block, with the same bounds and
    one-line errors as a download (httpx reads http(s) only)."""
    import os
    from urllib.parse import unquote, urlsplit
    from urllib.request import url2pathname

    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise DownloadError(
            f"cannot download {url}: a file:// URL names a file on this machine (file:///path)"
        )
    path = Path(url2pathname(unquote(parts.path)))
    try:
        with open(path, "rb") as src:
            if not os.path.isfile(path):
                raise DownloadError(f"{url}: not a regular file; {hint_404}")
            total, done = os.fstat(src.fileno()).st_size, 0
            with out.open("wb") as fh:  # write errors propagate as OSError, as for a download
                for block in iter(lambda: src.read(1 << 20), b""):
                    if max_bytes is not None and done + len(block) > max_bytes:
                        raise DownloadError(f"{url}: larger than {max_bytes} bytes; refused")
                    fh.write(block)
                    done += len(block)
                    on_bytes(done, total)
    except FileNotFoundError:
        raise DownloadError(f"{url}: not found; {hint_404}") from None
    except IsADirectoryError:
        raise DownloadError(f"{url}: a folder, not a file; {hint_404}") from None
    except PermissionError as exc:
        raise DownloadError(f"cannot read {url}: {exc.strerror}") from None
