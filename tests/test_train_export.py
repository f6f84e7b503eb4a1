"""``train --export-requests``: each rerun writes the next
stage's uncached requests as OpenAI batch-format JSONL and pays for nothing; an engine answers
them (here: a script answering as the fake LLM does); after ``hdeval cache import`` the same
command goes on to the next stage, and once every stage is cached it trains with 0 calls and
saves the same evaluator as a direct run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import TOY_TASK, artifact_view, calls_made, toy_rows, write_jsonl
from llm_server import FaultServer, completion_body, fake_answer

from hdeval.cli import cli
from hdeval.llm.backends.fake import FakeBackend

MODEL = "test-model"


def run(*args) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def server():
    with FaultServer(lifetime=600) as s:
        yield s


@pytest.fixture
def toy(tmp_path: Path) -> list[str]:
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    return ["--task", str(task), "--data", str(data), "--aggregator", "lr", "-q"]


def answer(server: FaultServer, requests: Path, results: Path) -> list[str]:
    """An engine answering every request line as the fake LLM behind the test server would;
    the kinds of prompt it saw."""
    fake = FakeBackend(record=False)
    lines, kinds = [], []
    for text in requests.read_text(encoding="utf-8").splitlines():
        req = json.loads(text)
        kinds.append(server.book.declared(req["body"]).kind)
        completion = fake_answer(server.book, req["body"], fake)
        lines.append({"custom_id": req["custom_id"], "error": None,
                      "response": {"status_code": 200, "body": completion_body(completion, req["body"]["model"])}})
    write_jsonl(results, lines)
    return kinds


def test_help_offers_export() -> None:
    result = run("train", "--help")
    assert result.exit_code == 0
    assert "--export-requests" in result.output and "cache import" in " ".join(result.output.split())


def test_export_stage_by_stage_then_train_makes_no_call(server, toy, tmp_path: Path) -> None:
    llm = ["--llm", MODEL, "--base-url", server.url, "--layers", "2"]
    direct = run("train", *toy, *llm, "--cache-dir", tmp_path / "c1", "-o", tmp_path / "direct")
    assert direct.exit_code == 0, direct.stderr
    paid = calls_made(direct)

    cache, req = tmp_path / "c2", tmp_path / "requests.jsonl"
    before = len(server.requests)
    stages = []
    for _ in range(6):  # layer 1 scores, layer 2 decompositions, layer 2 scores, then done
        r = run("train", *toy, *llm, "--cache-dir", cache, "--export-requests", req, "-o", tmp_path / "exported")
        assert r.exit_code == 0, r.stderr
        assert len(server.requests) == before  # exporting pays for nothing
        if "wrote" not in r.stderr:
            break
        assert not (tmp_path / "exported").exists()  # no artifact until every stage is cached
        kinds = answer(server, req, tmp_path / "results.jsonl")
        stages.append((set(kinds), len(kinds)))
        assert f"wrote {len(kinds)} requests" in r.stderr and "rerun this same train command" in r.stderr
        imp = run("cache", "import", tmp_path / "results.jsonl", "--requests", req, "--cache-dir", cache)
        assert imp.exit_code == 0, imp.stderr
    assert [k for k, _ in stages] == [{"score"}, {"decompose"}, {"score"}]
    assert sum(n for _, n in stages) == paid  # every request the direct run paid for, once
    assert calls_made(r) == 0
    # the project's view of an artifact (tree, metrics less usage, every criterion score): as
    # the golden tests compare training output
    assert artifact_view(tmp_path / "exported") == artifact_view(tmp_path / "direct")


def test_an_unanswered_request_file_is_never_overwritten(server, toy, tmp_path: Path) -> None:
    llm = ["--llm", MODEL, "--base-url", server.url, "--layers", "1", "--cache-dir", tmp_path / "c"]
    req = tmp_path / "requests.jsonl"
    first = run("train", *toy, *llm, "--export-requests", req)
    assert first.exit_code == 0, first.stderr
    written = req.read_bytes()
    again = run("train", *toy, *llm, "--export-requests", req)
    assert again.exit_code != 0
    assert "not in the cache yet" in again.stderr and "Traceback" not in again.stderr
    assert req.read_bytes() == written
    other = tmp_path / "notes.jsonl"
    other.write_text('{"mine": 1}\n')
    refused = run("train", *toy, *llm, "--export-requests", other)
    assert refused.exit_code != 0 and "not a request file" in refused.stderr
    assert other.read_text() == '{"mine": 1}\n'


@pytest.mark.parametrize("extra, flag", [(["--max-calls", "5"], "--max-calls"), (["--batch"], "--batch"),
                                         (["--dry-run"], "--dry-run")])
def test_export_refuses_options_that_pay_or_only_count(server, toy, tmp_path: Path, extra, flag) -> None:
    r = run("train", *toy, "--llm", MODEL, "--base-url", server.url, "--layers", "1", "--cache-dir",
            tmp_path / "c", "--export-requests", tmp_path / "r.jsonl", *extra)
    assert r.exit_code != 0 and flag in r.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_export_needs_an_openai_compatible_backend(toy, tmp_path: Path) -> None:
    r = run("train", *toy, "--llm", "fake", "--layers", "1", "--cache-dir", tmp_path / "c",
            "--export-requests", tmp_path / "r.jsonl")
    assert r.exit_code != 0 and "OpenAI-compatible" in r.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_a_decomposition_re_ask_is_refused_with_one_line(server, toy, tmp_path: Path) -> None:
    llm = ["--llm", MODEL, "--base-url", server.url, "--layers", "2", "--cache-dir", tmp_path / "c"]
    req, res = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    for garbage in (False, True):  # layer 1's scores, then layer 2's decompositions, unusable
        r = run("train", *toy, *llm, "--export-requests", req)
        assert r.exit_code == 0 and "wrote" in r.stderr, r.stderr
        kinds = answer(server, req, res)
        if garbage:
            assert set(kinds) == {"decompose"}
            rows = [json.loads(x) for x in res.read_text().splitlines()]
            for row in rows:
                row["response"]["body"]["choices"][0]["message"]["content"] = "no criteria here"
            write_jsonl(res, rows)
        assert run("cache", "import", res, "--requests", req, "--cache-dir", tmp_path / "c").exit_code == 0
    written = req.read_bytes()
    r = run("train", *toy, *llm, "--export-requests", req)
    assert r.exit_code != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "one request at a time" in last and "without --export-requests" in last and "Traceback" not in r.stderr
    assert req.read_bytes() == written  # the answered file is left as it was
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".requests.jsonl.")]  # no temporary left


def test_dna_weights_asked_per_pair_are_refused_with_one_line(faireval40, tmp_path: Path) -> None:
    r = run("train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--llm", MODEL,
            "--base-url", "http://127.0.0.1:9/v1", "--cache-dir", tmp_path / "c", "-q",
            "--export-requests", tmp_path / "r.jsonl")
    # DnA asks each pair's aspects and weights as JSON with re-asks: refused in one line naming
    # the way out, never the budget's "--max-calls 0", and no file written
    assert r.exit_code != 0 and "Traceback" not in r.stderr and "max-calls" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "one request at a time" in last and "DnA" in last and "without --export-requests" in last
    assert not (tmp_path / "r.jsonl").exists()


def test_the_python_api_raises_requests_exported(server, tmp_path: Path) -> None:
    from hdeval.llm.request_files import RequestsExported
    from hdeval.run.train import train

    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    req = tmp_path / "r.jsonl"
    before = len(server.requests)
    with pytest.raises(RequestsExported) as got:
        train(task=str(task), data=str(data), llm=MODEL, base_url=server.url, layers=1, aggregator="lr",
              cache_dir=str(tmp_path / "c"), export_requests=req)
    assert got.value.path == req and got.value.count == len(req.read_text().splitlines()) == 36 * 2
    assert len(server.requests) == before
