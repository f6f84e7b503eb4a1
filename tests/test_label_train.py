"""`hdeval train --data labels.db`: the labels file of `hdeval label` read as the samples
`hdeval data export-labels` would write, with no file in between; other readers refuse it."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import TOY_TASK, one_error, run_cli, toy_rows, train_artifact, write_jsonl

from hdeval.app.labels import LabelStore, export_labels
from hdeval.data.samples import read_samples, read_task_samples
from hdeval.core.errors import DataError
from hdeval.data.tasks import load_task


@pytest.fixture
def labelled(tmp_path):
    """A labels file over the toy pool: every sample labelled, some by two raters, one undone and
    labelled again, one skipped; and its export."""
    task_file = tmp_path / "toy.toml"
    task_file.write_text(TOY_TASK, encoding="utf-8")
    scored = toy_rows(12, 3)
    pool = [{k: v for k, v in r.items() if k != "scores"} for r in scored]
    task = load_task(task_file)
    samples = read_samples(write_jsonl(tmp_path / "pool.jsonl", pool), task, require_scores=False)
    db = tmp_path / "labels.db"
    with LabelStore(db, task) as store:
        for s, row in zip(samples, scored):
            store.add(s, row["scores"], rater="ann", session="a", strategy="diversity")
        for s in samples[::5]:
            store.add(s, {"clarity": 1, "accuracy": 5}, rater="bob", session="b", strategy="second rating")
        store.add(samples[3], {"clarity": 2, "accuracy": 2}, rater="bob", session="b", strategy="random")
        store.undo(rater="bob", session="b")
        store.skip(samples[7], rater="bob", session="b")
    out = tmp_path / "labeled.jsonl"
    export_labels(db, out)
    return task_file, task, db, out


def test_a_labels_file_reads_as_its_export(labelled):
    _, task, db, out = labelled
    direct = read_task_samples(db, task, labels_file=True)
    exported = read_task_samples(out, task)
    assert len(direct) == 36
    assert [(s.id, s.doc_id, s.fields, dict(s.scores)) for s in direct] == [
        (s.id, s.doc_id, s.fields, dict(s.scores)) for s in exported
    ]
    assert dict(direct[0].scores) != dict(toy_rows(12, 3)[0]["scores"])  # two raters: their mean


def test_other_readers_refuse_a_labels_file_saying_how_to_export_it(labelled):
    _, task, db, _ = labelled
    with pytest.raises(DataError) as got:
        read_task_samples(db, task)  # apply's, label's pool, ...: a labels file is not their input
    assert str(db) in str(got.value) and f"hdeval data export-labels {db} -o" in str(got.value)
    from hdeval.run.ppi_rows import estimate_file

    with pytest.raises(DataError, match="actively picked labels are refused here") as got:
        estimate_file("no-artifact-needed-to-refuse", str(db))
    assert f"hdeval data export-labels {db} -o" in str(got.value)


def test_apply_refuses_a_labels_file_before_counting_its_lines(labelled, tmp_path):
    """apply said 'up to 34 samples' (the database's lines) before refusing the file."""
    from conftest import one_error, run_cli, trained_toy_artifact

    _, _, db, _ = labelled
    (tmp_path / "t").mkdir()
    art = trained_toy_artifact(tmp_path / "t")
    res = run_cli("apply", art, db, "-o", tmp_path / "x.jsonl", "--llm", "fake")
    one_error(res, "is a labels file of hdeval label", f"hdeval data export-labels {db} -o")
    assert "up to" not in res.output and not (tmp_path / "x.jsonl").exists()


def test_train_refuses_another_tasks_labels_or_another_sqlite_file(labelled, tmp_path):
    task_file, _, db, _ = labelled
    other = tmp_path / "other.toml"
    other.write_text(TOY_TASK.replace('name = "toy_qa"', 'name = "other_qa"'), encoding="utf-8")
    one_error(run_cli("train", "--task", other, "--data", db, "--llm", "fake", "-o", tmp_path / "a"),
              str(db), "labels for task 'toy_qa'", "not 'other_qa'")
    stranger = tmp_path / "stranger.db"
    with sqlite3.connect(stranger) as con:
        con.execute("CREATE TABLE t (x)")
    con.close()
    one_error(run_cli("train", "--task", task_file, "--data", stranger, "--llm", "fake", "-o", tmp_path / "b"),
              str(stranger), "not an hdeval labels file")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_train_on_the_labels_file_is_train_on_its_export(labelled, tmp_path):
    task_file, _, db, out = labelled
    arts = [train_artifact(str(task_file), data, tmp_path / name, "--layers", "2")
            for name, data in (("from-db", db), ("from-export", out))]
    metrics = [json.loads((a / "metrics.json").read_text()) for a in arts]
    for m in metrics:
        m.pop("usage", None)
    assert metrics[0] == metrics[1]
    assert (arts[0] / "scores.csv").read_text() == (arts[1] / "scores.csv").read_text()
    assert metrics[0]["final"]["average"]["spearman"] is not None


def _hostile_labels_file(path, task_name, content, value, tables=True, shape="pointwise", aspect="clarity"):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE meta(key, value)")
    task = json.dumps({"name": task_name, "shape": shape})
    con.executemany("INSERT INTO meta VALUES (?, ?)", [("format", "1"), ("task", task)])
    if tables:
        con.execute(
            "CREATE TABLE labels(seq, sample_id, content_hash, aspect, action, value, rater, time, "
            "session, note, strategy, reason)"
        )
        con.execute("CREATE TABLE samples(content_hash, content)")
        con.execute("INSERT INTO samples VALUES ('h', ?)", (content,))
        con.execute(
            "INSERT INTO labels VALUES (1, 'x', 'h', ?, 'label', ?, 'ann', '', 's', NULL, NULL, NULL)",
            (aspect, value),
        )
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize(
    "content, value, tables, match",
    [
        ("not json", 4.0, True, "stored sample 'h' is not a JSON object"),
        ("[1, 2]", 4.0, True, "stored sample 'h' is not a JSON object"),
        ('{"id": "x", "source": "s", "output": "o"}', "high", True, "seq 1: value 'high' is not a number"),
        (None, 4.0, False, "is not an hdeval labels file .no such table"),
    ],
)
def test_a_damaged_labels_file_is_one_line_naming_it(labelled, tmp_path, content, value, tables, match):
    _, task, _, _ = labelled
    db = _hostile_labels_file(tmp_path / "bad.db", task.name, content, value, tables)
    with pytest.raises(DataError, match=match) as got:
        read_task_samples(db, task, labels_file=True)
    assert str(db) in str(got.value)


@pytest.mark.parametrize("aspect, value", [("label", 0.5), ("clarity", 1.0)])
def test_a_pair_label_that_is_no_choice_is_one_line_naming_its_row(tmp_path, aspect, value):
    task_file = tmp_path / "pairs.toml"
    task_file.write_text(
        TOY_TASK.replace('output_label = "Answer"', 'output_label = "Answer"\nshape = "pairwise"'), encoding="utf-8"
    )
    task = load_task(task_file)
    pair = json.dumps({"id": "p", "doc_id": "d", "source": "s", "output_a": "a", "output_b": "b"})
    db = _hostile_labels_file(tmp_path / "bad.db", task.name, pair, value, shape="pairwise", aspect=aspect)
    with pytest.raises(DataError, match=r"label row seq 1: a pair's label is 'label' = 1, 0 or -1") as got:
        read_task_samples(db, task, labels_file=True)
    assert str(db) in str(got.value)
