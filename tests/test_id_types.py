"""A sample's ``id`` and ``doc_id`` are text or a whole number (docs/tasks-and-data.md): a list, an
object, a decimal number or true/false is the one-line field error every other wrong type gets,
naming the file, the line and the field, from ``train`` and ``apply`` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import one_error, run_cli, toy_rows, train_artifact, write_jsonl

BAD = [("doc_id", [1], "a list"), ("id", [5], "a list"), ("doc_id", {"a": 1}, "an object"),
       ("id", 5.5, "a decimal number"), ("doc_id", True, "true/false")]


def _with(tmp_path: Path, field: str, value: object, line: int = 4) -> Path:
    rows = toy_rows()
    rows[line - 1][field] = value
    return write_jsonl(tmp_path / "bad.jsonl", rows)


@pytest.mark.parametrize("field,value,kind", BAD)
def test_train_refuses_an_id_that_is_not_text_or_a_whole_number(toy, tmp_path: Path, fake_calls: list,
                                                                  field: str, value: object, kind: str) -> None:
    task, _ = toy
    data = _with(tmp_path, field, value)
    r = run_cli("train", "--task", task, "--data", data, "--llm", "fake", "--cache-dir", tmp_path / "c",
                "-o", tmp_path / "art")
    one_error(r, str(data), "line 4:", f"field {field!r}", kind)
    assert fake_calls == [] and not (tmp_path / "art").exists()


def test_apply_refuses_a_list_doc_id(toy, tmp_path: Path) -> None:
    task, data = toy
    # any artifact will do: one layer with lr, not the default three with auto (5-8 s)
    art = train_artifact(str(task), data, tmp_path, "--layers", 1, "--aggregator", "lr")
    bad = _with(tmp_path, "doc_id", [1], line=7)
    out = tmp_path / "scored.jsonl"
    r = run_cli("apply", art, bad, "-o", out, "--llm", "fake", "--cache-dir", tmp_path / "cache")
    one_error(r, str(bad), "line 7:", "field 'doc_id'", "a list")
    assert not out.exists()


def test_whole_number_ids_are_accepted(toy, tmp_path: Path) -> None:
    task, _ = toy
    rows = toy_rows()
    for i, row in enumerate(rows):
        row["id"], row["doc_id"] = i, int(row["doc_id"].split("-")[1])
    data = write_jsonl(tmp_path / "ints.jsonl", rows)
    r = run_cli("train", "--task", task, "--data", data, "--llm", "fake", "--cache-dir", tmp_path / "c",
                "-o", tmp_path / "art", "--dry-run")
    assert r.exit_code == 0, r.output
