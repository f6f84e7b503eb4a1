"""``cache import`` serves a reply under a request's key only when the model that answered is the
model the request asked (``body.model``, a dated or tagged version of it included): another
model's result is refused with its line, or with ``--skip-other-models`` left out and counted."""

from __future__ import annotations

import json
from pathlib import Path

from test_request_files import art, exported, new, run, server  # noqa: F401 - fixtures

from conftest import cache_entries, one_line_error, write_jsonl


def _answered_by(lines: list[str], which: dict[int, str]) -> list[dict]:
    rows = [json.loads(x) for x in lines]
    for i, model in which.items():
        rows[i]["response"]["body"]["model"] = model
    return rows


def test_a_result_of_another_model_is_refused_whole(exported, tmp_path: Path) -> None:
    req, lines, cache = exported
    results = write_jsonl(tmp_path / "mixed.jsonl", _answered_by(lines, {3: "gpt-3.5-turbo"}))
    r = run("cache", "import", results, "--requests", req, "--cache-dir", cache)
    one_line_error(r, str(results), "line 4", "gpt-3.5-turbo", "nothing imported", "--skip-other-models")
    assert not cache.exists() or cache_entries(cache) == {}


def test_skip_other_models_imports_the_rest_and_counts_the_others(exported, tmp_path: Path) -> None:
    req, lines, cache = exported
    rows = _answered_by(lines, {0: "other-model", 2: "other-model"})
    results = write_jsonl(tmp_path / "mixed.jsonl", rows)
    r = run("cache", "import", results, "--requests", req, "--cache-dir", cache, "--skip-other-models")
    assert r.exit_code == 0, r.stderr
    assert f"imported {len(rows) - 2} replies" in r.stderr and "2 result(s) answered by another model" in r.stderr
    assert set(cache_entries(cache)) == {x["custom_id"] for i, x in enumerate(rows) if i not in (0, 2)}


def test_a_dated_version_of_the_requested_model_is_the_same_model(exported, tmp_path: Path) -> None:
    req, lines, cache = exported
    model = json.loads(req.read_text().splitlines()[0])["body"]["model"]
    rows = _answered_by(lines, {0: f"{model}-2024-08-06", 1: f"{model}:latest"})
    results = write_jsonl(tmp_path / "dated.jsonl", rows)
    r = run("cache", "import", results, "--requests", req, "--cache-dir", cache)
    assert r.exit_code == 0 and f"imported {len(rows)} replies" in r.stderr, r.stderr


def test_a_model_whose_name_only_starts_with_the_requested_one_is_another(exported, tmp_path: Path) -> None:
    """gpt-4o-mini is not a version of gpt-4o, nor llama3:70b of llama3: their replies were
    imported as the requested model's."""
    req, lines, cache = exported
    model = json.loads(req.read_text().splitlines()[0])["body"]["model"]
    for other in (f"{model}-mini", f"{model}:70b"):
        results = write_jsonl(tmp_path / "other.jsonl", _answered_by(lines, {1: other}))
        r = run("cache", "import", results, "--requests", req, "--cache-dir", cache)
        one_line_error(r, str(results), "line 2", other, "nothing imported")
    assert not cache.exists() or cache_entries(cache) == {}
