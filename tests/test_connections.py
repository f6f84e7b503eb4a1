"""The LLM connections a command opens are closed when it ends, however it ends.

An SDK client left open keeps its keep-alive socket until the garbage collector frees it at a
random moment, with a ResourceWarning that once landed in an artifact. The server below counts
the connections its clients have not closed yet.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner
from llm_server import FaultMix, FaultServer, LLMServer, Reply

from hdeval.cli import cli
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.llm.client import open_llm
from hdeval.llm.config import LLMConfig

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

KEY = "sk-test-connections"


def req(text: str = "Rate this text.") -> CompletionRequest:
    return CompletionRequest(messages=(Message("user", text),))


def test_closing_the_client_open_llm_made_closes_its_connections(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with LLMServer() as server:
        llm = open_llm(LLMConfig("test-model", server.url, cache_dir=str(tmp_path / "c"), concurrency=2))
        llm.complete_many([req("one"), req("two")])
        assert server.calls == 2
        llm.close()
        assert server.wait_all_closed() == 0


def test_an_injected_backend_stays_its_callers(tmp_path: Path) -> None:
    # the caller may go on using it (a notebook, a test): closing the cached client leaves it alone
    with LLMServer() as server:
        mine = OpenAICompatBackend("test-model", base_url=server.url, api_key=KEY, timeout=5.0)
        try:
            llm = open_llm(LLMConfig("test-model", server.url, cache_dir=str(tmp_path / "c")), mine)
            llm.complete_many([req()])
            llm.close()
            assert mine.complete(req("again")).text == "4"
        finally:
            mine.close()
        assert server.wait_all_closed() == 0


def _train(server: LLMServer, toy: tuple[Path, Path], tmp_path: Path, *more: str):
    task, data = toy
    return CliRunner(env={"OPENAI_API_KEY": KEY}).invoke(cli, [
        "train", "--task", str(task), "--data", str(data), "--layers", "1", "--aggregator", "lr",
        "--llm", "test-model", "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
        "--max-retries", "0", "--concurrency", "4", "-q", "-o", str(tmp_path / "art"), *more])


def test_train_closes_its_connections_when_it_succeeds(toy, tmp_path: Path) -> None:
    with FaultServer() as server:
        result = _train(server, toy, tmp_path)
        assert result.exit_code == 0, result.output
        assert server.calls > 0 and (tmp_path / "art").is_dir()
        assert server.wait_all_closed() == 0


def test_train_closes_its_connections_when_it_fails(toy, tmp_path: Path) -> None:
    with FaultServer(FaultMix(0.5, ("prose",), seed=5)) as server:
        result = _train(server, toy, tmp_path, "--max-failure-rate", "0.05")
        assert result.exit_code != 0 and "error:" in result.stderr, result.output
        assert server.calls > 0 and not (tmp_path / "art").exists()
        assert server.wait_all_closed() == 0


def test_train_closes_its_connections_on_ctrl_c(toy, tmp_path: Path) -> None:
    # Ctrl-C as the terminal sends it: SIGINT to the process, mid-run. The server holds the 10th
    # reply until the main thread has taken the signal (a readiness signal, not a sleep), so the
    # interrupt lands while the run is in flight however loaded the machine is.
    delivered = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        delivered.set()
        raise KeyboardInterrupt

    def ctrl_c(n: int) -> None:
        if n == 10 and not delivered.is_set():
            os.kill(os.getpid(), signal.SIGINT)
            delivered.wait(60)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with FaultServer(on_request=ctrl_c) as server:
            result = _train(server, toy, tmp_path)
            assert delivered.is_set() and result.exit_code == 130, result.output
            assert not (tmp_path / "art").exists()
            assert server.wait_all_closed() == 0
    finally:
        signal.signal(signal.SIGINT, previous)


def test_apply_closes_its_connections(toy, tmp_path: Path) -> None:
    with FaultServer() as server:
        assert _train(server, toy, tmp_path).exit_code == 0
        assert server.wait_all_closed() == 0
        before = server.calls
        result = CliRunner(env={"OPENAI_API_KEY": KEY}).invoke(cli, [
            "apply", str(tmp_path / "art"), str(toy[1]), "-o", str(tmp_path / "scored.jsonl"),
            "--llm", "test-model", "--base-url", server.url, "--cache-dir", str(tmp_path / "other-cache"), "-q"])
        assert result.exit_code == 0, result.output
        assert server.calls > before and (tmp_path / "scored.jsonl").is_file()
        assert server.wait_all_closed() == 0


def test_a_cached_client_the_caller_passes_in_stays_open_for_the_next_run(toy, tmp_path: Path) -> None:
    # open_llm hands an injected CachedBackend back as it is: train, its dry run and the
    # benchmark's runs must leave it to its caller, who goes on with it (a sweep, a notebook)
    from hdeval.run.train import TrainConfig, plan, train

    task, data = toy
    mine = open_llm(LLMConfig("fake", cache_dir=str(tmp_path / "c")))
    try:
        for layers in (1, 2):
            train(task=str(task), data=str(data), llm="fake", layers=layers, aggregator="lr", backend=mine)
        dpo = train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="lr", backend=mine,
                    decompose_backend=mine)
        assert dpo.metrics["final"]
        for method in ("hdeval", "direct"):
            plan(TrainConfig(task=str(task), data=str(data), llm="fake", method=method), backend=mine)
        again = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr", backend=mine)
        assert again.metrics["final"]
    finally:
        mine.close()
    mine.close()  # twice: harmless


def test_the_connections_kept_open_are_at_most_the_concurrency() -> None:
    # 8 requests at once, each held 0.3 s by the server: 8 connections; once answered, the
    # backend keeps as many open for the next requests as its callers keep in flight, no more
    with LLMServer() as server:
        server.default = lambda r: Reply.ok("4", delay=0.3)
        backend = OpenAICompatBackend("test-model", base_url=server.url, api_key=KEY, concurrency=3)
        try:
            with ThreadPoolExecutor(8) as pool:
                texts = list(pool.map(lambda i: backend.complete(req(f"sample {i}")).text, range(8)))
            assert texts == ["4"] * 8 and server.calls == 8
            assert server.wait_all_closed(timeout=0.3) == 3
            assert backend.complete(req("again")).text == "4"  # on a kept connection
            assert server.wait_all_closed(timeout=0.3) == 3
        finally:
            backend.close()
        assert server.wait_all_closed() == 0
