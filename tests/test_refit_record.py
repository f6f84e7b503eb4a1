"""A refitted artifact keeps the record of what it was refitted from through a load and a save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from simjudge import pointwise_rows, write_pointwise

from hdeval.methods.registry import load_artifact


def _manifest(art: Path) -> dict:
    return json.loads((art / "manifest.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_refit_from_survives_a_load_and_a_save(tmp_path: Path) -> None:
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=16, seed=2))
    cache = ["--cache-dir", tmp_path / "c", "-q"]
    res = run_cli("train", "--task", task, "--data", data, "--llm", "fake", "--layers", "1", "--aggregator", "lr",
                  "-o", tmp_path / "art", *cache)
    assert res.exit_code == 0, res.output
    res = run_cli("refit", tmp_path / "art", "--llm", "fake:logprobs=0", "--data", data, "-o", tmp_path / "art2",
                  *cache)
    assert res.exit_code == 0, res.output
    recorded = _manifest(tmp_path / "art2")["state"]["refit_from"]
    assert recorded["identity"] == _manifest(tmp_path / "art")["llm"]["identity"]
    load_artifact(tmp_path / "art2").save(tmp_path / "art3")
    assert _manifest(tmp_path / "art3")["state"].get("refit_from") == recorded
