"""Hostile files and inputs outside the LLM transport. The user's files are never destroyed by
an output path; shard sets that are incomplete or mixed are refused; what reaches apply from outside (input lines, LLM
replies, criterion text, the cache's SQLite file) is bounded and checked, and failing is one
line, never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import copy_artifact, one_error, toy_rows, trained_toy_artifact, write_jsonl

from hdeval.cli import cli
from hdeval.run.train import train


def run(*args, env: dict | None = None, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], env=env, input=input)




@pytest.fixture(scope="module")
def trained_once(tmp_path_factory) -> Path:
    # training per test cost ~1.5 s of setup each; the tests only read it, each from its own copy
    return trained_toy_artifact(tmp_path_factory.mktemp("toy"), layers=1, aggregator="lr")


@pytest.fixture
def toy_artifact(trained_once: Path, toy, tmp_path: Path) -> Path:
    return copy_artifact(trained_once, tmp_path)


def new_samples(tmp_path: Path, n_docs: int = 6, name: str = "new.jsonl") -> Path:
    rows = toy_rows(n_docs=n_docs)
    for r in rows:
        r["id"] = "new-" + r["id"]
        r["output"] += " (again)"
    return write_jsonl(tmp_path / name, rows)


# ---------------------------------------------------------------- outputs never destroy inputs
def test_apply_refuses_to_write_over_its_input(toy_artifact: Path, tmp_path: Path,
                                                      fake_calls: list[int]) -> None:
    data = new_samples(tmp_path)
    before = data.read_bytes()
    one_error(run("apply", toy_artifact, data, "-o", data, "--cache-dir", tmp_path / "c"),
              str(data), "input")
    link = tmp_path / "link.jsonl"
    link.symlink_to(data)
    os.link(data, tmp_path / "hard.jsonl")
    for other in (link, tmp_path / "hard.jsonl"):  # the same file under another name
        one_error(run("apply", toy_artifact, data, "-o", other, "--cache-dir", tmp_path / "c"), "input")
    assert data.read_bytes() == before and fake_calls == []


def test_apply_refuses_to_write_into_the_artifact(toy_artifact: Path, tmp_path: Path) -> None:
    data = new_samples(tmp_path)
    inside = toy_artifact / "scores.csv"
    before = inside.read_bytes() if inside.exists() else None
    one_error(run("apply", toy_artifact, data, "-o", inside, "--cache-dir", tmp_path / "c"), "inside")
    assert (inside.read_bytes() if inside.exists() else None) == before


def test_a_fifo_or_device_is_not_replaced_by_a_file(toy_artifact: Path, tmp_path: Path) -> None:
    data = new_samples(tmp_path)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    one_error(run("apply", toy_artifact, data, "-o", fifo, "--cache-dir", tmp_path / "c"), "not a regular file")
    assert fifo.is_fifo()
    one_error(run("apply", toy_artifact, data, "-o", "/dev/null", "--cache-dir", tmp_path / "c"),
              "not a regular file")
    assert Path("/dev/null").is_char_device()
    ok = run("apply", toy_artifact, data, "-o", "-", "--cache-dir", tmp_path / "c")  # stdout stays allowed
    assert ok.exit_code == 0, ok.output
    assert len(ok.stdout.splitlines()) == 18


def test_export_training_refuses_to_write_over_its_corpus(tmp_path: Path) -> None:
    from test_paireval import TOY_DIALOGUE

    task = tmp_path / "dialogue.toml"
    task.write_text(TOY_DIALOGUE, encoding="utf-8")
    corpus = write_jsonl(tmp_path / "corpus.jsonl", toy_rows(aspects=("overall", "engagingness")))
    before = corpus.read_bytes()
    one_error(run("paireval", "export-training", "--data", corpus, "--task", task, "-o", corpus), "input")
    assert corpus.read_bytes() == before
    fifo = tmp_path / "pairs.jsonl"
    os.mkfifo(fifo)
    one_error(run("paireval", "export-training", "--data", corpus, "--task", task, "-o", fifo),
              "not a regular file")


def test_data_import_and_merge_shards_refuse_their_inputs(toy_artifact: Path, tmp_path: Path) -> None:
    table = tmp_path / "table.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
    task = tmp_path / "toy_task.toml"
    before = table.read_bytes()
    one_error(run("data", "import", table, "--task", task, "-o", table), "input")
    assert table.read_bytes() == before
    data = new_samples(tmp_path)
    part = tmp_path / "p1.jsonl"
    assert run("apply", toy_artifact, data, "--shard", "1/1", "-o", part,
               "--cache-dir", tmp_path / "c").exit_code == 0
    shard_text = part.read_bytes()
    one_error(run("merge-shards", part, part), "input")
    assert part.read_bytes() == shard_text
    # OUTPUT is an argument of merge-shards: the advice named apply's -o
    line = one_error(run("merge-shards", tmp_path / "m.txt", part), "name the OUTPUT file .jsonl, .csv or .parquet")
    assert line.endswith("or give - for JSONL on stdout") and not (tmp_path / "m.txt").exists()


# ---------------------------------------------------------------- merge-shards checks the set
@pytest.fixture
def shard_run(toy_artifact: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(part1, part2, the unsharded output) of one input scored by one artifact."""
    data = new_samples(tmp_path)
    cache = tmp_path / "c"
    assert run("apply", toy_artifact, data, "-o", tmp_path / "all.jsonl", "--cache-dir", cache).exit_code == 0
    parts = []
    for k in (1, 2):
        part = tmp_path / f"part{k}.jsonl"
        assert run("apply", toy_artifact, data, "--shard", f"{k}/2", "-o", part, "--cache-dir", cache).exit_code == 0
        parts.append(part)
    return parts[0], parts[1], tmp_path / "all.jsonl"


def merge_refused(tmp_path: Path, *shards, fragment: str) -> None:
    out = tmp_path / "merged.jsonl"
    out.write_text("previous\n")
    one_error(run("merge-shards", out, *shards), fragment)
    assert out.read_text() == "previous\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged")]


def test_a_complete_set_merges_into_exactly_the_unsharded_rows(shard_run, tmp_path: Path) -> None:
    p1, p2, whole = shard_run
    result = run("merge-shards", tmp_path / "m.jsonl", p2, p1)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m.jsonl").read_bytes() == whole.read_bytes()  # the closing records are dropped
    assert "merged 18 rows of 2 shard(s)" in result.stderr


def test_an_empty_shard_of_a_failed_run_is_refused(shard_run, tmp_path: Path) -> None:
    p1, p2, _ = shard_run
    failed = tmp_path / "failed.jsonl"
    failed.write_text("")  # `> part2.jsonl` of a run that died before writing
    merge_refused(tmp_path, p1, failed, fragment="empty")


def test_dev_null_as_a_shard_is_refused(shard_run, tmp_path: Path) -> None:
    p1, _, _ = shard_run
    merge_refused(tmp_path, p1, "/dev/null", fragment="not a regular file")


def test_a_shard_missing_its_last_row_is_refused(shard_run, tmp_path: Path) -> None:
    p1, p2, _ = shard_run
    lines = p2.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-2] + lines[-1:]))  # last scored row gone, closing record kept
    merge_refused(tmp_path, p1, cut, fragment="closing record says")
    cut.write_text("".join(lines[:-1]))  # cut short: no closing record
    merge_refused(tmp_path, p1, cut, fragment="no closing record")


def test_shards_of_two_artifacts_or_inputs_are_refused(shard_run, toy, tmp_path: Path) -> None:
    p1, p2, _ = shard_run
    task, data = toy
    other = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="dt",
                  cache_dir=str(tmp_path / "train-cache")).save(tmp_path / "art2")
    q2 = tmp_path / "other2.jsonl"
    assert run("apply", other, tmp_path / "new.jsonl", "--shard", "2/2", "-o", q2,
               "--cache-dir", tmp_path / "c").exit_code == 0
    merge_refused(tmp_path, p1, q2, fragment="different artifacts")
    edited = new_samples(tmp_path, name="edited.jsonl")
    edited.write_text(edited.read_text() + "\n")  # same samples, another file
    r2 = tmp_path / "edited2.jsonl"
    assert run("apply", tmp_path / "art", edited, "--shard", "2/2", "-o", r2,
               "--cache-dir", tmp_path / "c").exit_code == 0
    merge_refused(tmp_path, p1, r2, fragment="different inputs")


def test_a_crafted_shard_count_does_not_allocate(shard_run, tmp_path: Path) -> None:
    p1, _, _ = shard_run
    *rows, closing = [json.loads(line) for line in p1.read_text().splitlines()]
    big = 10**15
    crafted = write_jsonl(tmp_path / "big.jsonl", [{**r, "shard": {**r["shard"], "n": big}} for r in rows]
                          + [{"shard": {**closing["shard"], "n": big}}])
    merge_refused(tmp_path, crafted, fragment="not a shard")
    # within the bound, a huge N with two files names a few missing shards without listing all
    n = 999_999_999
    within = write_jsonl(tmp_path / "n.jsonl", [{"shard": {**closing["shard"], "k": 1, "n": n, "rows": 0}}])
    merge_refused(tmp_path, within, fragment="missing")


# ---------------------------------------------------------------- input lines are bounded
def test_apply_reads_dev_zero_with_a_bound(toy_artifact: Path, tmp_path: Path,
                                                  fake_calls: list[int]) -> None:
    one_error(run("apply", toy_artifact, "/dev/zero", "-o", tmp_path / "s.jsonl", "--cache-dir", tmp_path / "c"),
              "/dev/zero", "line 1", "longer than")
    assert fake_calls == [] and not (tmp_path / "s.jsonl").exists()


def test_a_huge_line_in_a_file_is_named_by_line(toy_artifact: Path, tmp_path: Path, monkeypatch) -> None:
    import hdeval.data.samples as data_mod

    monkeypatch.setattr(data_mod, "MAX_LINE_BYTES", 4096)
    data = new_samples(tmp_path)
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:2]) + "[" * 10_000 + "\n" + "".join(lines[2:]))
    one_error(run("apply", toy_artifact, data, "-o", tmp_path / "s.jsonl", "--cache-dir", tmp_path / "c"),
              str(data), "line 3", "longer than")


def test_apply_input_nested_too_deeply_is_one_line(toy_artifact: Path, tmp_path: Path,
                                                        fake_calls: list[int]) -> None:
    # the task-name pre-scan read it before the validating pass: a RecursionError traceback
    data = new_samples(tmp_path)
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:2]) + "[" * 100_000 + "]" * 100_000 + "\n" + "".join(lines[2:]))
    one_error(run("apply", toy_artifact, data, "-o", tmp_path / "s.jsonl", "--cache-dir", tmp_path / "c"),
              str(data), "line 3", "nested too deeply")
    assert fake_calls == [] and not (tmp_path / "s.jsonl").exists()


# ---------------------------------------------------------------- apply's failure rate
@pytest.fixture
def refusing_server():
    from llm_server import FaultServer, Reply

    with FaultServer(lifetime=120) as s:
        s.default = lambda req: Reply.error(400, "this request was refused by the content policy")
        yield s


@pytest.mark.parametrize("how", ["refused", "too large"])
def test_apply_whose_every_request_fails_exits_non_zero(how: str, refusing_server, toy_artifact: Path,
                                                               tmp_path: Path) -> None:
    from llm_server import Reply

    if how == "too large":
        from hdeval.llm.backends.openai_compat import MAX_REPLY_BYTES

        # twice the client's cap is as refused as 80 MB, without building 80 MB per request
        refusing_server.default = lambda req: Reply.huge(2 * MAX_REPLY_BYTES)
    data = new_samples(tmp_path, n_docs=2)
    out = tmp_path / "s.jsonl"
    out.write_text("previous\n")
    args = ["apply", toy_artifact, data, "-o", out, "--force", "--cache-dir", tmp_path / "c", "--llm", "test-model",
            "--base-url", refusing_server.url, "--max-retries", "0"]
    line = one_error(run(*args, env={"OPENAI_API_KEY": "sk-test"}), "could not be read", "--max-failure-rate")
    assert "100%" in line and refusing_server.calls > 0
    assert out.read_text() == "previous\n"  # no imputed scores in place of the old results
    # the user may accept it knowingly: every score imputed, and the rate said at the end
    result = run(*args, "--max-failure-rate", "1", env={"OPENAI_API_KEY": "sk-test"})
    assert result.exit_code == 0, result.output
    assert "failed LLM-filled scores:" in result.stderr and "(100.0%" in result.stderr


def test_apply_prints_its_failure_rate_and_checks_the_option(toy_artifact: Path, tmp_path: Path) -> None:
    data = new_samples(tmp_path, n_docs=2)
    result = run("apply", toy_artifact, data, "-o", tmp_path / "s.jsonl", "--cache-dir", tmp_path / "c")
    assert result.exit_code == 0, result.output
    assert "failed LLM-filled scores: 0 of " in result.stderr
    one_error(run("apply", toy_artifact, data, "-o", tmp_path / "t.jsonl", "--max-failure-rate", "1.5"),
              "--max-failure-rate must be between 0 and 1")


# ---------------------------------------------------------------- a planted SQLite object is refused
PLANTED = {
    "trigger": ("CREATE TRIGGER poison AFTER INSERT ON Cache BEGIN UPDATE Cache SET value = "
                "'{\"text\":\"5\"}' WHERE rowid = NEW.rowid; END", "trigger 'poison'"),
    "trigger under diskcache's name": (
        "DROP TRIGGER Settings_count_insert; CREATE TRIGGER Settings_count_insert AFTER INSERT ON Cache "
        "BEGIN DELETE FROM Cache WHERE rowid = NEW.rowid; END", "trigger 'Settings_count_insert'"),
    "view": ("CREATE VIEW replies AS SELECT key, value FROM Cache", "view 'replies'"),
    "table": ("CREATE TABLE stolen (key TEXT)", "table 'stolen'"),
    "index": ("CREATE INDEX by_value ON Cache (value)", "index 'by_value'"),
}


@pytest.mark.parametrize("kind", list(PLANTED))
def test_a_cache_with_a_planted_sqlite_object_is_refused_and_named(kind: str, toy_artifact: Path,
                                                                         tmp_path: Path, fake_calls) -> None:
    import sqlite3

    cache = tmp_path / "shared-cache"
    data = new_samples(tmp_path, n_docs=2)
    assert run("apply", toy_artifact, data, "-o", tmp_path / "a.jsonl", "--cache-dir", cache).exit_code == 0
    assert run("cache", "check", "--cache-dir", cache).exit_code == 0  # as the cache made it: clean
    sql, name = PLANTED[kind]
    con = sqlite3.connect(cache / "cache.db")
    con.executescript(sql)
    con.close()
    paid = len(fake_calls)
    more = new_samples(tmp_path, n_docs=4, name="more.jsonl")
    one_error(run("apply", toy_artifact, more, "-o", tmp_path / "b.jsonl", "--cache-dir", cache),
              str(cache / "cache.db"), name, "cache repair")
    assert len(fake_calls) == paid and not (tmp_path / "b.jsonl").exists()  # nothing paid into it
    check = run("cache", "check", "--cache-dir", cache)
    assert check.exit_code == 1 and name in check.stdout and "never creates" in check.stderr
    # the way out the message gives works: the readable entries in a fresh database
    assert run("cache", "repair", "--cache-dir", cache).exit_code == 0
    assert run("cache", "check", "--cache-dir", cache).exit_code == 0


# ---------------------------------------------------------------- read-only cache, read-only commands
def test_cache_check_and_stats_work_on_read_only_storage(toy_artifact: Path, tmp_path: Path, monkeypatch) -> None:
    import sqlite3

    cache = tmp_path / "ro-cache"
    data = new_samples(tmp_path, n_docs=2)
    assert run("apply", toy_artifact, data, "-o", tmp_path / "a.jsonl", "--cache-dir", cache).exit_code == 0
    entries = int(run("cache", "stats", "--cache-dir", cache).stdout.split(": ")[1].split()[0])
    assert entries > 0
    real_connect, real_access = sqlite3.connect, os.access

    def connect(database, *a, **kw):  # what SQLite says for a WAL database on a read-only mount
        if str(cache) in str(database) and "immutable=1" not in str(database):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(database, *a, **kw)

    def access(path, mode, *a, **kw):
        if str(path).startswith(str(cache)) and mode & os.W_OK:
            return False
        return real_access(path, mode, *a, **kw)

    monkeypatch.setattr(sqlite3, "connect", connect)
    monkeypatch.setattr(os, "access", access)
    check = run("cache", "check", "--cache-dir", cache)
    assert check.exit_code == 0, check.output
    assert "damaged" not in check.output and f"{entries} readable" in check.stdout
    stats = run("cache", "stats", "--cache-dir", cache)
    assert stats.exit_code == 0, stats.output
    assert "cannot write" not in stats.output and f"{entries} entries" in stats.stdout


# ---------------------------------------------------------------- deeply nested replies
@pytest.mark.parametrize("body", ["bare", "as content", "as json content"])
def test_a_reply_of_brackets_is_a_recorded_failure_not_a_traceback(body: str, refusing_server,
                                                                         toy_artifact: Path, tmp_path: Path) -> None:
    from llm_server import Reply

    brackets = "[" * 200_000
    refusing_server.default = {
        "bare": lambda req: Reply.raw(brackets.encode()),
        "as content": lambda req: Reply.ok(brackets),
        "as json content": lambda req: Reply.ok("{" + brackets + "}"),
    }[body]
    data = new_samples(tmp_path, n_docs=1)
    result = run("apply", toy_artifact, data, "-o", tmp_path / "s.jsonl", "--cache-dir", tmp_path / "c",
                 "--llm", "test-model", "--base-url", refusing_server.url, "--max-retries", "0",
                 env={"OPENAI_API_KEY": "sk-test"})
    assert isinstance(result.exception, SystemExit) or result.exception is None, result.exception
    assert "Traceback" not in result.output and "RecursionError" not in result.output
    assert result.exit_code != 0  # nothing readable: past the failure threshold, one line
    one_error(result)


def test_json_extraction_from_a_reply_is_bounded() -> None:
    from hdeval.judge.fill import extract_json

    for text in ("{" + "[" * 200_000 + "}", "{" + '{"a":' * 100_000 + "1" + "}" * 100_001):
        with pytest.raises(ValueError):
            extract_json(text)


# ---------------------------------------------------------------- lone surrogates in criterion text
LONE = "\ud800"


def test_a_tree_file_with_a_lone_surrogate_is_one_line(toy, tmp_path: Path) -> None:
    task, data = toy
    crit = lambda key, definition: {"key": key, "name": key.title(), "definition": definition,  # noqa: E731
                                    "parent": None, "layer": 1}
    tree = tmp_path / "tree.json"
    # json.dumps writes the surrogate as the escape "\ud800", as a hostile file would
    tree.write_text(json.dumps({"criteria": [crit("clarity", f"How clear{LONE} it is."),
                                             crit("accuracy", "How accurate it is.")]}), encoding="utf-8")
    result = run("train", "--task", task, "--data", data, "--llm", "fake", "--aggregator", "lr", "-q",
                 "--cache-dir", tmp_path / "c", "--tree", tree, "--layers", "2", "-o", tmp_path / "art")
    one_error(result, str(tree), "criteria[0].definition", "lone surrogate")
    assert not (tmp_path / "art").exists()


def test_a_decomposition_reply_with_a_lone_surrogate_is_rejected_as_unusable(toy, tmp_path: Path) -> None:
    from hdeval.llm.backends.base import Completion
    from hdeval.llm.backends.fake import RESPONDERS, FakeBackend

    task, data = toy

    def decompose(request, fake):  # the escape as a model writes it in its JSON reply
        return Completion('{"subcriteria": [{"key": "a", "name": "A", "definition": "Bad \\ud800 text."},'
                          ' {"key": "b", "name": "B", "definition": "Fine text."}]}')

    fake = FakeBackend(responders={**RESPONDERS, "decompose": decompose})
    # not UnicodeEncodeError from the cache key: layer 2 is refused and layer 1 kept, saying why
    ev = train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="lr", backend=fake,
               cache_dir=str(tmp_path / "c"))
    assert "lone surrogate" in ev.metrics["stopped"] and {c.layer for c in ev.tree} == {1}
    retries = [r for r in fake.requests if r.kind == "decompose" and len(r.messages) > 2]
    assert retries and all("lone surrogate" in r.messages[-1].content for r in retries)  # said what to fix


def test_dynamic_dna_aspects_with_a_lone_surrogate_are_recorded_failures(tmp_path: Path) -> None:
    from test_apply_stream import _pairs
    from test_dna import RESPONDERS, _responders

    from hdeval.core.errors import ScoringError
    from hdeval.llm.backends.base import Completion
    from hdeval.llm.backends.fake import FakeBackend

    def aspects(request, fake):
        items = [{"name": f"aspect {i}" + ("\\ud800" if i == 0 else ""), "definition": "How good it is."}
                 for i in range(4)]
        return Completion(json.dumps({"aspects": items}).replace("\\\\ud800", "\\ud800"))

    assert RESPONDERS  # the real responders answer every other kind
    fake = FakeBackend(responders=_responders(dna_aspects=aspects))
    data = write_jsonl(tmp_path / "pairs.jsonl", _pairs())
    with pytest.raises(ScoringError) as caught:
        train(task="faireval", data=str(data), method="dna", llm="fake", backend=fake,
              cache_dir=str(tmp_path / "c"), method_options={"aspect_source": "dynamic"})
    assert "lone surrogate" in str(caught.value) and "could not be judged" in str(caught.value)


# ---------------------------------------------------------------- messages that say what to do
def test_export_training_on_a_pairwise_task_says_what_to_pass(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"id": "p1", "doc_id": "q1", "source": "q", "output_a": "a",
                                                      "output_b": "b", "label": "a"}])
    line = one_error(run("paireval", "export-training", "--data", corpus, "--task", "faireval",
                         "-o", tmp_path / "pairs.jsonl"), "--task dailydialog_grade")
    assert "read_pairs" not in line and not (tmp_path / "pairs.jsonl").exists()


@pytest.mark.parametrize("model, fragment", [("/dev/zero", "not a regular file"), ("DIR", "is a directory"),
                                             ("NOTGGUF", "not a GGUF model file"),
                                             ("/nonexistent.gguf", "not found")])
def test_llamacpp_says_what_is_wrong_with_the_model_path(model: str, fragment: str, toy,
                                                                tmp_path: Path) -> None:
    from hdeval.core.errors import ConfigError
    from hdeval.core.paths import check_model_file

    if model == "DIR":
        model = str(tmp_path)
    elif model == "NOTGGUF":
        model = str(tmp_path / "weights.gguf")
        Path(model).write_bytes(b"\x00" * 64)
    with pytest.raises(ConfigError, match=fragment):
        check_model_file(Path(model))
    task, data = toy
    line = one_error(run("train", "--task", task, "--data", data, "--llm", f"llamacpp:{model}", "--aggregator",
                         "lr", "--layers", "1", "--cache-dir", tmp_path / "c", "-o", tmp_path / "art"))
    assert model in line
    try:
        from hdeval.llm.backends.factory import local_runtime

        local_runtime()
    except ConfigError:
        return  # no llama.cpp runtime installed: that is what the line says first
    assert fragment in line
