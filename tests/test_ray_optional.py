"""Without the ray extra, the Ray integration says what to install (runs without ray)."""

from __future__ import annotations

import sys

import pytest

from hdeval.core.errors import ConfigError


def test_without_ray_a_clear_error(monkeypatch, tmp_path) -> None:
    """Runs without the extra too: the message says what to install."""
    from hdeval.integrations import ray as hray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r'pip install "hdeval\[ray\]"'):
        hray.apply_on_ray(tmp_path / "art", tmp_path / "in.jsonl", str(tmp_path / "out.jsonl"))
