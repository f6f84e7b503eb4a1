"""The time estimate: dry runs say how long a run takes, and a many-hour run on the embedded
model does not start without asking."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, embedded_model_or_skip

from hdeval.llm import eta as estimate
from hdeval.llm.eta import Rate

QA = ["--task", str(REPO / "examples" / "qa_task.toml")]


def hdeval(*args: str, cwd: Path, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HDEVAL_LLM")}
    e.update(PYTHONPATH=str(REPO), HDEVAL_CACHE_DIR=str(cache), HDEVAL_OFFLINE="1", **env)
    return subprocess.run([sys.executable, "-m", "hdeval.cli", *args], cwd=cwd, env=e, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)


def plan(calls: int, cached: int | None, tokens: int, upper: bool = False) -> SimpleNamespace:
    return SimpleNamespace(decompose_calls=0, score_calls=calls, cached=cached, prompt_tokens=tokens,
                           upper_bound=upper)


def test_only_uncached_calls_are_counted() -> None:
    assert estimate.uncached_tokens([plan(100, 25, 1000), plan(10, None, 50), plan(0, 0, 0)]) == (85, 800)


def test_durations_read_as_people_say_them() -> None:
    assert [estimate.format_duration(s) for s in (0.2, 75, 600, 5400, 40000)] == ["1 s", "75 s", "10 min",
                                                                                   "1.5 h", "11.1 h"]


def test_a_recorded_rate_is_read_back_and_replaced_by_the_next_run(tmp_path: Path) -> None:
    estimate.record_rate(tmp_path, "m", calls=100, prompt_tokens=50_000, seconds=25.0)
    assert estimate.load_rate(tmp_path, "m").seconds_per_1k_tokens == pytest.approx(0.5)
    estimate.record_rate(tmp_path, "m", calls=100, prompt_tokens=50_000, seconds=50.0)
    assert estimate.load_rate(tmp_path, "m").seconds_per_1k_tokens == pytest.approx(1.0)
    # a run too short to say anything about the steady rate is not recorded
    estimate.record_rate(tmp_path, "m", calls=3, prompt_tokens=900, seconds=90.0)
    assert estimate.load_rate(tmp_path, "m").seconds_per_1k_tokens == pytest.approx(1.0)


@pytest.mark.parametrize("content", ['{"m": {"seconds_per_1k_tokens": NaN}}', '{"m": {"seconds_per_1k_tokens": -1}}',
                                     '{"m": "fast"}', "[1, 2]", "not json", '{"m": {"seconds_per_1k_tokens": "1"}}'])
def test_a_rates_file_someone_else_wrote_wrong_is_no_rate(tmp_path: Path, content: str) -> None:
    (tmp_path / estimate.RATES_FILE).write_text(content)
    assert estimate.load_rate(tmp_path, "m") is None


def test_a_server_never_run_has_no_estimate_rather_than_a_guess(tmp_path: Path) -> None:
    seconds, line = estimate.estimate_plan([plan(500, 0, 100_000)], "openai:gpt-4o-mini",
                                           SimpleNamespace(model="gpt-4o-mini"), tmp_path)
    assert seconds is None and "unknown for openai:gpt-4o-mini" in line
    estimate.record_rate(tmp_path, "openai:gpt-4o-mini", calls=200, prompt_tokens=100_000, seconds=60.0)
    seconds, line = estimate.estimate_plan([plan(500, 0, 100_000, upper=True)], "openai:gpt-4o-mini",
                                           SimpleNamespace(model="gpt-4o-mini"), tmp_path)
    assert seconds == pytest.approx(60.0) and line.startswith("estimated time for the whole run (1 stage): at most 60 s for 500 uncached calls")


@pytest.mark.slow  # three CLI processes
def test_dry_run_prints_the_time_and_a_fake_run_records_its_rate(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    r = hdeval("train", *QA, "--layers", "2", "--llm", "gpt-4o-mini", "--dry-run", cwd=tmp_path, cache=cache)
    assert r.returncode == 0, r.stderr
    assert "estimated time: unknown for openai:gpt-4o-mini" in r.stdout
    r = hdeval("train", *QA, "--layers", "1", "--llm", "fake", "-o", "art", cwd=tmp_path, cache=cache)
    assert r.returncode == 0, r.stderr
    rates = json.loads((cache / estimate.RATES_FILE).read_text())
    assert [v["calls"] for v in rates.values()] and all(v["calls"] >= 20 for v in rates.values())
    # layer 1's requests are known before the run: all cached now
    r = hdeval("train", *QA, "--layers", "1", "--llm", "fake", "--dry-run", cwd=tmp_path, cache=cache)
    assert "estimated time: none (every call is cached)" in r.stdout


needs_local = pytest.mark.skipif(
    not any(importlib.util.find_spec(m) for m in ("xllamacpp", "llama_cpp")),
    reason="the local extra (a llama.cpp runtime) is not installed")


@pytest.mark.slow  # reads the embedded model
@needs_local
def test_a_long_run_on_the_embedded_model_without_a_terminal_refuses_unless_yes(tmp_path: Path) -> None:
    embedded_model_or_skip()
    from hdeval.llm.backends.llama_cpp import default_model_path, local_identity

    cache = tmp_path / "cache"
    cache.mkdir()
    # a rate as slow as a loaded machine's, recorded for the embedded model: no probe needed
    ident = local_identity(default_model_path())  # the backend identity rates are kept under
    (cache / estimate.RATES_FILE).write_text(json.dumps({ident: {"seconds_per_1k_tokens": 500.0, "calls": 50}}))
    r = hdeval("train", *QA, "--layers", "2", "--llm", "local", "-o", "art", cwd=tmp_path, cache=cache)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: this run on the embedded model is at most ") and " h for " in last
    assert "pass --yes" in last
    assert not (tmp_path / "art").exists()
    # the dry run names the same estimate and its source
    r = hdeval("train", *QA, "--layers", "2", "--llm", "local", "--dry-run", cwd=tmp_path, cache=cache)
    assert "at 500.00 s per 1k, rate recorded from the last run's 50 calls" in r.stdout
