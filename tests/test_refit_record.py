"""A refitted artifact keeps the record of what it was refitted from through a load and a save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import trained_and_refitted

from hdeval.methods.registry import load_artifact


def _manifest(art: Path) -> dict:
    return json.loads((art / "manifest.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_refit_from_survives_a_load_and_a_save(tmp_path: Path) -> None:
    art, art2 = trained_and_refitted(tmp_path)
    recorded = _manifest(art2)["state"]["refit_from"]
    assert recorded["identity"] == _manifest(art)["llm"]["identity"]
    load_artifact(art2).save(tmp_path / "art3")
    assert _manifest(tmp_path / "art3")["state"].get("refit_from") == recorded
