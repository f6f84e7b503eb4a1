"""Where hdeval looks for its bundled resources and keeps per-user data and cache."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


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


def default_cache_dir() -> Path:
    env = os.environ.get("HDEVAL_CACHE_DIR")
    if env:
        return Path(env)
    return _xdg("XDG_CACHE_HOME", ".cache") / "hdeval"
