"""A training run's scoring stages on Ray, on a local Ray
cluster of 2 CPUs: ``train --export-requests`` writes each stage's requests, Ray Data workers
answer them from the same OpenAI-compatible endpoint (:func:`answer_requests_on_ray`),
``hdeval cache import`` reads the answers, and the rerun goes on; the final evaluator is the
one a direct run trains. Ray schedules the work: hdeval adds no scheduler of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TOY_TASK, artifact_view, toy_rows, write_jsonl
from llm_server import FaultServer

from hdeval.cli import cli
from hdeval.core.errors import ConfigError, DataError

ray = pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')
pytest.importorskip("ray.data", reason='the Ray tests need Ray Data: pip install -e ".[ray]"')

from hdeval.integrations.ray import answer_requests_on_ray  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]
MODEL = "test-model"


@pytest.fixture(scope="module")
def server():
    # the Ray workers send bodies built in this process: the server's book knows their kind and data
    with FaultServer(lifetime=900) as s:
        yield s


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_training_stages_answered_on_ray_equal_a_direct_run(server, tmp_path: Path) -> None:
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    args = ["train", "--task", task, "--data", data, "--aggregator", "lr", "--layers", "2", "-q",
            "--llm", MODEL, "--base-url", server.url]
    direct = run(*args, "--cache-dir", tmp_path / "c1", "-o", tmp_path / "direct")
    assert direct.exit_code == 0, direct.stderr

    cache, req, res = tmp_path / "c2", tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    rounds = 0
    while True:
        r = run(*args, "--cache-dir", cache, "--export-requests", req, "-o", tmp_path / "ray")
        assert r.exit_code == 0, r.stderr
        if "wrote" not in r.stderr:
            break
        rounds += 1
        assert rounds <= 4
        n = answer_requests_on_ray(req, res, server.url, workers=2, batch_size=40)
        assert n == len(req.read_text().splitlines())
        rows = [json.loads(x) for x in res.read_text().splitlines()]
        assert all(row["response"]["status_code"] == 200 for row in rows)
        imp = run("cache", "import", res, "--requests", req, "--cache-dir", cache)
        assert imp.exit_code == 0, imp.stderr
    assert rounds == 3  # layer 1 scores, layer 2 decompositions, layer 2 scores
    assert "LLM calls made: 0," in r.stderr
    assert artifact_view(tmp_path / "ray") == artifact_view(tmp_path / "direct")


def test_a_file_that_is_not_a_request_file_is_refused_before_any_worker(tmp_path: Path) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"custom_id": "x", "body": {}}])
    with pytest.raises(DataError, match="line 1"):
        answer_requests_on_ray(bad, tmp_path / "out.jsonl", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="base-url"):
        answer_requests_on_ray(bad, tmp_path / "out.jsonl", "ftp://x")
    assert not (tmp_path / "out.jsonl").exists()
