"""Where hdeval looks for its bundled resources and keeps per-user data and cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# the package folder (this file is in hdeval/core/)
_PKG = Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> Path:
    """``prompts`` or ``tasks``: inside the package in a wheel, at the repo top in a checkout."""
    for cand in (_PKG / "_resources" / name, _PKG.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"hdeval resource directory {name!r} not found (broken install?)")


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return Path(base) if base else Path.home() / fallback


def user_data_dir() -> Path:
    """Per-user data dir that ``hdeval data download`` fills and ``train`` searches."""
    return _xdg("XDG_DATA_HOME", ".local/share") / "hdeval" / "data"


def user_model_dir() -> Path:
    """Where the embedded model is kept after its first-use download (``HDEVAL_MODEL_DIR``
    overrides)."""
    env = os.environ.get("HDEVAL_MODEL_DIR")
    return Path(env) if env else _xdg("XDG_DATA_HOME", ".local/share") / "hdeval" / "models"


def default_cache_dir() -> Path:
    env = os.environ.get("HDEVAL_CACHE_DIR")
    return Path(env) if env else _xdg("XDG_CACHE_HOME", ".cache") / "hdeval"


def check_model_file(path: Path) -> None:
    """Raise a one-line ConfigError unless ``path`` is a GGUF model file: saying what is wrong
    (missing, a directory, a device, not GGUF) instead of letting a runtime read /dev/zero."""
    from hdeval.core.errors import ConfigError

    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(
                f"{path} is a directory, not a model file: give the .gguf file in it "
                "(--llm llamacpp:/path/to/model.gguf)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                f"{path} is not a regular file (a device, FIFO or socket), not a model file: "
                "--llm llamacpp: needs a .gguf file"
            )
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise ConfigError(f"GGUF model file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the model file {path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise ConfigError(
            f"cannot load GGUF model {path}: not a GGUF model file (it does not start with 'GGUF'); "
            "--llm llamacpp: needs a llama.cpp model in GGUF format"
        )
