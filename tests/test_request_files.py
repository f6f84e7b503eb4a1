"""Engine-neutral request files.

``apply --export-requests`` writes the uncached requests as OpenAI batch-format JSONL and pays
for nothing; an engine answers the file (here: a small script answering like the fake LLM);
``hdeval cache import`` reads the result file into the cache, after which apply makes no call
and writes the same output as a direct run. Hostile result files are refused whole, with the
line number, and import nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import cache_entries, calls_made, one_line_error, toy_rows, write_jsonl
from llm_server import FaultServer, completion_body, fake_answer

from hdeval.cli import cli
from hdeval.llm.backends.fake import FakeBackend
from hdeval.run.train import train

MODEL = "test-model"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    from conftest import TOY_TASK

    d = tmp_path_factory.mktemp("art")
    task = d / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(d / "toy.jsonl", toy_rows())
    ev = train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="lr", cache_dir=str(d / "tc"))
    return ev.save(d / "art")


@pytest.fixture(scope="module")
def server():
    with FaultServer(lifetime=600) as s:
        yield s


@pytest.fixture
def new(tmp_path: Path) -> Path:
    rows = toy_rows(n_docs=8)
    for r in rows:
        r["id"] = "new-" + r["id"]
        r["output"] += " (again)"
    return write_jsonl(tmp_path / "new.jsonl", rows)


def llm(server) -> list[str]:
    return ["--llm", MODEL, "--base-url", server.url]


def answer(server: FaultServer, requests: Path, results: Path) -> int:
    """An engine: answers every request line as the test server (the fake LLM) would."""
    fake = FakeBackend(record=False)
    lines = []
    for text in requests.read_text(encoding="utf-8").splitlines():
        req = json.loads(text)
        assert req["method"] == "POST" and req["url"] == "/v1/chat/completions"
        completion = fake_answer(server.book, req["body"], fake)
        lines.append({"id": "batch_req_" + req["custom_id"][:8], "custom_id": req["custom_id"],
                      "response": {"status_code": 200, "request_id": "r",
                                   "body": completion_body(completion, req["body"]["model"])},
                      "error": None})
    write_jsonl(results, lines)
    return len(lines)


def test_help_offers_export() -> None:
    result = run("apply", "--help")
    assert result.exit_code == 0
    assert "--export-requests" in result.output and "cache import" in " ".join(result.output.split())


def test_export_answer_import_then_apply_makes_no_call(art, server, new, tmp_path) -> None:
    direct = run("apply", art, new, "-o", tmp_path / "direct.jsonl", "--cache-dir", tmp_path / "c1", *llm(server))
    assert direct.exit_code == 0, direct.stderr
    assert calls_made(direct) > 0

    cache = tmp_path / "c2"
    before = len(server.requests)
    req = tmp_path / "requests.jsonl"
    exported = run("apply", art, new, "--export-requests", req, "--cache-dir", cache, *llm(server))
    assert exported.exit_code == 0, exported.stderr
    assert len(server.requests) == before  # exporting pays for nothing
    n = answer(server, req, tmp_path / "results.jsonl")
    assert n == calls_made(direct)  # one line per request the direct run paid for
    assert f"wrote {n} requests" in exported.stderr
    keys = [json.loads(x)["custom_id"] for x in req.read_text().splitlines()]
    assert len(set(keys)) == n

    imported = run("cache", "import", tmp_path / "results.jsonl", "--requests", req, "--cache-dir", cache)
    assert imported.exit_code == 0, imported.stderr
    # and nothing else: no warning of a model mismatch with a model nobody asked for
    assert imported.stderr.splitlines() == [f"imported {n} replies into the cache {cache}"]
    assert set(cache_entries(cache)) == set(keys)

    after = run("apply", art, new, "-o", tmp_path / "after.jsonl", "--cache-dir", cache, *llm(server))
    assert after.exit_code == 0, after.stderr
    assert calls_made(after) == 0
    assert len(server.requests) == before
    assert (tmp_path / "after.jsonl").read_bytes() == (tmp_path / "direct.jsonl").read_bytes()

    # everything cached now: a second export has nothing to write
    again = run("apply", art, new, "--export-requests", tmp_path / "r2.jsonl", "--cache-dir", cache, *llm(server))
    assert again.exit_code == 0, again.stderr
    assert (tmp_path / "r2.jsonl").read_bytes() == b"" and "nothing to export" in again.stderr


def test_export_needs_an_openai_compatible_backend(art, new, tmp_path) -> None:
    result = run("apply", art, new, "--export-requests", tmp_path / "r.jsonl", "--cache-dir", tmp_path / "c")
    one_line_error(result, "OpenAI-compatible")
    assert not (tmp_path / "r.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_export_refuses_a_bad_input_line_before_writing(art, server, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**toy_rows(1)[0], "id": "a"}) + "\n{not json\n", encoding="utf-8")
    result = run("apply", art, bad, "--export-requests", tmp_path / "r.jsonl", "--cache-dir", tmp_path / "c",
                 *llm(server))
    one_line_error(result, "line 2")
    assert not (tmp_path / "r.jsonl").exists()


def test_export_reads_the_input_once(art, server, new, tmp_path, monkeypatch) -> None:
    """One pass, as apply: each row is parsed into a sample once (no separate validating pass)."""
    import hdeval.data.samples as data_mod

    built: list[str] = []
    real = data_mod._sample_from_row

    def spy(row, *a, **k):
        built.append(str(row.get("id")))
        return real(row, *a, **k)

    monkeypatch.setattr(data_mod, "_sample_from_row", spy)
    monkeypatch.setenv("HDEVAL_APPLY_CHUNK", "5")
    result = run("apply", art, new, "--export-requests", tmp_path / "r.jsonl", "--cache-dir", tmp_path / "c",
                 *llm(server))
    assert result.exit_code == 0, result.stderr
    ids = [json.loads(line)["id"] for line in new.read_text().splitlines()]
    assert built == ids


def test_export_bad_line_in_a_later_chunk_leaves_the_old_file(art, server, new, tmp_path, monkeypatch) -> None:
    """The streaming trade-off apply makes: chunks before a bad line are exported into a
    temporary file, then the bad line (with every other, file:line) stops the export and the
    temporary file goes; an existing export file is left as it was."""
    rows = [json.loads(line) for line in new.read_text().splitlines()]
    rows.append({**rows[0], "output": "again"})  # a duplicate id on the last line
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "r.jsonl"
    out.write_text("an earlier export\n")
    monkeypatch.setenv("HDEVAL_APPLY_CHUNK", "5")
    sent = len(server.requests)
    result = run("apply", art, bad, "--export-requests", out, "--force", "--cache-dir", tmp_path / "c", *llm(server))
    one_line_error(result, f"{bad}: 1 bad line(s): line {len(rows)}", "already used on line 1")
    assert out.read_text() == "an earlier export\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(server.requests) == sent  # exporting sends nothing


@pytest.fixture
def exported(art, server, new, tmp_path) -> tuple[Path, list[str], Path]:
    """(request file, its lines' result lines as text, cache dir) of an export of ``new``."""
    req = tmp_path / "requests.jsonl"
    result = run("apply", art, new, "--export-requests", req, "--cache-dir", tmp_path / "c", *llm(server))
    assert result.exit_code == 0, result.stderr
    answer(server, req, tmp_path / "good.jsonl")
    return req, (tmp_path / "good.jsonl").read_text().splitlines(), tmp_path / "c"


def _hostile(lines: list[str], case: str) -> list[str]:
    good = [json.loads(x) for x in lines]
    bad = dict(good[2])
    if case == "unknown id":
        bad["custom_id"] = "f" * 64
    elif case == "duplicate id":
        bad["custom_id"] = good[0]["custom_id"]
    elif case == "oversize line":
        return lines[:2] + [json.dumps({**bad, "pad": "x" * (8 * 2**20)})] + lines[3:]
    elif case == "not JSON":
        return lines[:2] + ['{"custom_id": "' + bad["custom_id"]] + lines[3:]
    elif case == "custom_id not text":
        bad["custom_id"] = 12
    elif case == "status_code not a number":
        bad["response"] = {**bad["response"], "status_code": "200"}
    elif case == "body not an object":
        bad["response"] = {**bad["response"], "body": ["choices"]}
    elif case == "body not a chat completion":
        bad["response"] = {**bad["response"], "body": {"choices": []}}
    elif case == "not an object":
        return lines[:2] + ["[1, 2]"] + lines[3:]
    return lines[:2] + [json.dumps(bad)] + lines[3:]


@pytest.mark.parametrize("case", ["unknown id", "duplicate id", "oversize line", "not JSON", "custom_id not text",
                                  "status_code not a number", "body not an object", "body not a chat completion",
                                  "not an object"])
def test_hostile_result_file_is_refused_whole(exported, tmp_path, case) -> None:
    req, lines, cache = exported
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_text("\n".join(_hostile(lines, case)) + "\n", encoding="utf-8")
    result = run("cache", "import", hostile, "--requests", req, "--cache-dir", cache)
    one_line_error(result, str(hostile), "line 3", "nothing imported")
    assert not cache.exists() or cache_entries(cache) == {}


def test_failed_requests_are_reported_not_imported(exported, tmp_path) -> None:
    req, lines, cache = exported
    rows = [json.loads(x) for x in lines]
    rows[1] = {"custom_id": rows[1]["custom_id"], "response": {"status_code": 500, "body": {"error": {"message": "boom"}}},
               "error": None}
    partial = write_jsonl(tmp_path / "partial.jsonl", rows[:-1])  # the last request unanswered
    result = run("cache", "import", partial, "--requests", req, "--cache-dir", cache)
    assert result.exit_code == 0, result.stderr
    assert f"imported {len(rows) - 2} replies" in result.stderr
    assert "1 request(s) have an error" in result.stderr and "HTTP 500: boom" in result.stderr
    assert "1 request(s) of" in result.stderr
    assert set(cache_entries(cache)) == {r["custom_id"] for r in rows[:-1]} - {rows[1]["custom_id"]}


def test_a_request_file_not_written_by_export_is_refused(exported, tmp_path) -> None:
    req, lines, cache = exported
    forged = tmp_path / "forged.jsonl"
    forged.write_text(req.read_text().splitlines()[0] + '\n{"custom_id": "../x", "body": {}}\n', encoding="utf-8")
    result = run("cache", "import", tmp_path / "good.jsonl", "--requests", forged, "--cache-dir", cache)
    one_line_error(result, str(forged), "line 2")
    assert not cache.exists() or cache_entries(cache) == {}


def test_apply_needs_an_output_or_an_export(art, new, tmp_path) -> None:
    one_line_error(run("apply", art, new, "--cache-dir", tmp_path / "c"), "--output", "--export-requests")


@pytest.mark.parametrize("extra", [["-o", "x.jsonl"], ["--explain"], ["--batch"]])
def test_export_refuses_options_that_score(art, server, new, tmp_path, extra) -> None:
    result = run("apply", art, new, "--export-requests", tmp_path / "r.jsonl", "--cache-dir", tmp_path / "c",
                 *llm(server), *extra)
    one_line_error(result, "--export-requests scores nothing", extra[0].replace("-o", "--output"))
    assert not (tmp_path / "r.jsonl").exists()
