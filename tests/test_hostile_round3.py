"""Issue #22, round three of trying to break it (the items outside the LLM transport).

Each test names its item. The user's files are never destroyed by an output path; shard sets
that are incomplete or mixed are refused; what reaches apply from outside (input lines, LLM
replies, criterion text, the cache's SQLite file) is bounded and checked, and failing is one
line, never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from conftest import toy_rows, write_jsonl
from hdeval.cli import cli
from hdeval.train import train


def run(*args, env: dict | None = None, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], env=env, input=input)


def one_error(result: Result, *fragments: str) -> str:
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def toy_artifact(toy, tmp_path: Path) -> Path:
    task, data = toy
    ev = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr",
               cache_dir=str(tmp_path / "train-cache"))
    return ev.save(tmp_path / "art")


def new_samples(tmp_path: Path, n_docs: int = 6, name: str = "new.jsonl") -> Path:
    rows = toy_rows(n_docs=n_docs)
    for r in rows:
        r["id"] = "new-" + r["id"]
        r["output"] += " (again)"
    return write_jsonl(tmp_path / name, rows)


# ---------------------------------------------------------------- item 4: outputs never destroy inputs
def test_item4_apply_refuses_to_write_over_its_input(toy_artifact: Path, tmp_path: Path,
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


def test_item4_apply_refuses_to_write_into_the_artifact(toy_artifact: Path, tmp_path: Path) -> None:
    data = new_samples(tmp_path)
    inside = toy_artifact / "scores.csv"
    before = inside.read_bytes() if inside.exists() else None
    one_error(run("apply", toy_artifact, data, "-o", inside, "--cache-dir", tmp_path / "c"), "inside")
    assert (inside.read_bytes() if inside.exists() else None) == before


def test_item4_a_fifo_or_device_is_not_replaced_by_a_file(toy_artifact: Path, tmp_path: Path) -> None:
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


def test_item4_export_training_refuses_to_write_over_its_corpus(tmp_path: Path) -> None:
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


def test_item4_data_import_and_merge_shards_refuse_their_inputs(toy_artifact: Path, tmp_path: Path) -> None:
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
