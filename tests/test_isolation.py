"""The test suite never touches the developer's own cache, API key or default LLM, not even
from a module-scoped fixture (a trained artifact shared by a module's tests), which pytest sets
up before any per-test fixture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def seen_by_a_module_fixture() -> dict[str, str | None]:
    names = ("XDG_CACHE_HOME", "HDEVAL_CACHE_DIR", "HDEVAL_LLM", "OPENAI_API_KEY", "HDEVAL_OFFLINE")
    return {n: os.environ.get(n) for n in names}


def test_a_module_fixture_sees_an_isolated_home(seen_by_a_module_fixture, tmp_path_factory) -> None:
    seen = seen_by_a_module_fixture
    base = tmp_path_factory.getbasetemp().resolve()
    assert seen["XDG_CACHE_HOME"] is not None and base in Path(seen["XDG_CACHE_HOME"]).resolve().parents
    assert seen["HDEVAL_CACHE_DIR"] is None and seen["HDEVAL_LLM"] is None and seen["OPENAI_API_KEY"] is None
    assert seen["HDEVAL_OFFLINE"] == "1"
