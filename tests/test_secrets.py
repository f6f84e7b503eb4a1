"""Secrets stay secret: the API key reaches the server's Authorization header and nothing else.

``train``, ``apply`` and ``train --dry-run`` run as real processes with ``OPENAI_API_KEY`` set
to a fresh random key, against a local server that insists on that key and whose error
bodies echo keys back. Afterwards every byte written anywhere under the test's directory
(cache incl. SQLite files, artifact, outputs, the XDG home) and every byte printed is
searched for the key.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner
from llm_server import FaultServer, Reply

from conftest import data_file
from hdeval.cli import cli

MODEL = "test-model"
TIMEOUT = 120


@pytest.fixture
def key() -> str:
    return f"sk-test-{secrets.token_hex(20)}"


@pytest.fixture
def server(key: str) -> Iterator[FaultServer]:
    with FaultServer(lifetime=300) as s:
        s.require_key = key
        yield s


def leaks(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` holding the secret (or its random part), in any case."""
    needles = [secret.encode(), secret.removeprefix("sk-test-").encode()]
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes().lower()
            if any(n.lower() in data for n in needles):
                found.append(str(path.relative_to(root)))
    return found


def run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hdeval.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.slow
def test_key_is_nowhere_after_train_apply_and_dry_run(key: str, server: FaultServer, tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HDEVAL_LLM", "HDEVAL_BASE_URL", "HDEVAL_CACHE_DIR")}
    env.update(OPENAI_API_KEY=key, HOME=str(home), XDG_CACHE_HOME=str(home / "cache"),
               XDG_DATA_HOME=str(home / "data"), HDEVAL_DATA_DIR=str(data_file().parent))
    # the first replies are errors that quote the key, as careless servers do: they pass
    # through the retry path (and its log line) before the run goes on
    server.plan(Reply.error(500, f"upstream failed for {key}"), Reply.rate_limited(retry_after=0))
    cache, artifact = work / "cache", work / "artifact"
    common = ["--task", "sfres", "--limit", "24", "--layers", "2", "--aggregator", "lr",
              "--llm", MODEL, "--base-url", server.url, "--cache-dir", str(cache)]
    outputs = []

    trained = run_cli(["train", *common, "-o", str(artifact)], work, env)
    assert trained.returncode == 0, trained.stderr
    outputs.append(trained)

    new = work / "new.jsonl"
    new.write_text("".join(data_file().read_text(encoding="utf-8").splitlines(keepends=True)[-5:]))
    before = server.calls
    refused = run_cli(["apply", str(artifact), str(new), "-o", str(work / "scored.jsonl"),
                       "--cache-dir", str(cache)], work, env)  # the URL comes only from the artifact
    assert refused.returncode != 0 and "--base-url" in refused.stderr and server.calls == before
    outputs.append(refused)
    applied = run_cli(["apply", str(artifact), str(new), "-o", str(work / "scored.jsonl"),
                       "--cache-dir", str(cache), "--base-url", server.url], work, env)  # the user names it
    assert applied.returncode == 0, applied.stderr
    assert server.calls > before  # new samples: the key was needed again
    outputs.append(applied)

    dry = run_cli(["train", "--dry-run", *common], work, env)
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout
    outputs.append(dry)

    # the test would prove nothing if the key had not been used: it was, in the header only
    assert server.calls > 0
    assert {r.headers.get("authorization") for r in server.requests} == {f"Bearer {key}"}
    assert all(key.encode() not in r.body for r in server.requests)
    assert (artifact / "manifest.json").is_file() and any(cache.iterdir())
    assert json.loads((artifact / "manifest.json").read_text())["llm"]["identity"] == f"openai:{MODEL}@{server.url}"

    assert leaks(tmp_path, key) == []
    for out in outputs:
        assert key not in out.stdout and key not in out.stderr


@pytest.mark.parametrize("failure", ["401", "503 quoting the key"])
def test_error_messages_never_show_the_key(failure: str, key: str, server: FaultServer, tmp_path: Path) -> None:
    if failure == "401":
        server.require_key = f"sk-test-{secrets.token_hex(20)}"  # not ours: 401, body quotes ours
    else:
        server.default = lambda r: Reply.error(503, f"overloaded; your key {key} is throttled")
    result = CliRunner().invoke(
        cli,
        ["train", "--task", "sfres", "--data", str(data_file()), "--limit", "24", "--layers", "1",
         "--llm", MODEL, "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
         "--max-retries", "0", "-o", str(tmp_path / "artifact")],
        env={"OPENAI_API_KEY": key},
    )
    assert result.exit_code == 3, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    expected = "rejected the API key (HTTP 401)" if failure == "401" else "HTTP 503"
    assert expected in errors[0], errors[0]
    # the server did echo the key, so this is the redaction at work, not luck
    assert any(r.headers.get("authorization") == f"Bearer {key}" for r in server.requests)
    assert key not in result.output and key[8:] not in result.output
    assert leaks(tmp_path, key) == []


def test_credentials_in_the_base_url_stay_out_of_the_artifact(server: FaultServer, tmp_path: Path) -> None:
    """Gateways often take ``https://user:password@host/v1``; an artifact is meant to be
    shared, so the manifest records the URL without them (as the cache identity does)."""
    password = f"pw-{secrets.token_hex(12)}"
    server.require_key = None  # the client sends Basic auth from the URL instead
    url = server.url.replace("http://", f"http://gateway-user:{password}@")
    artifact = tmp_path / "artifact"
    result = CliRunner().invoke(cli, [
        "train", "--task", "sfres", "--data", str(data_file()), "--limit", "24", "--layers", "1",
        "--aggregator", "lr", "--llm", MODEL, "--base-url", url, "--cache-dir", str(tmp_path / "cache"),
        "-o", str(artifact)])
    assert result.exit_code == 0, result.output
    assert server.calls > 0
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["llm"]["base_url"] == server.url
    assert leaks(tmp_path, password) == []
    assert password not in result.output


@pytest.mark.parametrize("method", ["dna", "paireval", "direct"])
def test_credentials_in_the_base_url_stay_out_of_every_methods_artifact(method: str, server: FaultServer,
                                                                       tmp_path: Path) -> None:
    """The manifest's run record (``config.base_url``) of the methods other than HD-Eval kept
    the URL as typed, user and password included."""
    from conftest import TOY_DIALOGUE, TOY_TASK, toy_pairs, toy_rows, write_jsonl

    password = f"pw-{secrets.token_hex(12)}"
    server.require_key = None
    url = server.url.replace("http://", f"http://gateway-user:{password}@")
    (tmp_path / "task.toml").write_text(TOY_DIALOGUE if method == "paireval" else TOY_TASK, encoding="utf-8")
    task, rows = ("faireval", toy_pairs()) if method == "dna" else (str(tmp_path / "task.toml"), toy_rows())
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    artifact = tmp_path / "artifact"
    result = CliRunner().invoke(cli, [
        "train", "--task", task, "--data", str(data), "--method", method, "--llm", MODEL, "--base-url", url,
        "--cache-dir", str(tmp_path / "cache"), "-o", str(artifact), "-q"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["run"]["config"]["base_url"] == server.url
    assert leaks(artifact, password) == []


@pytest.mark.slow
def test_refit_never_prints_the_query_of_the_new_judges_base_url(server: FaultServer, tmp_path: Path) -> None:
    """Azure-style gateways take the key in the base URL's query; refit's closing line named the
    new judge by its raw cache identity, query and key included."""
    import dataclasses

    from conftest import run_cli as run_in_process
    from simjudge import pointwise_rows, write_pointwise

    server.require_key = None
    server.default = lambda req: server._default_reply(dataclasses.replace(req, path=req.path.split("?")[0]))
    secret = f"QUERY-{secrets.token_hex(12)}"
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=16, seed=2))
    cache = ["--cache-dir", tmp_path / "c", "-q"]
    r = run_in_process("train", "--task", task, "--data", data, "--llm", "fake", "--layers", "1",
                       "--aggregator", "lr", "-o", tmp_path / "art", *cache)
    assert r.exit_code == 0, r.output
    r = run_in_process("refit", tmp_path / "art", "--llm", MODEL, "--base-url", f"{server.url}?api-key={secret}",
                       "--data", data, "-o", tmp_path / "art2", *cache)
    assert r.exit_code == 0, r.output
    assert server.calls > 0
    assert f"with openai:{MODEL}@{server.url}: change" in r.output, r.output
    assert secret not in r.output + r.stderr
    assert leaks(tmp_path / "art2", secret) == []
