"""Task files, sample reading with line-numbered errors, and the doc-grouped split."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl

from hdeval.core.errors import ConfigError, DataError
from hdeval.data.samples import limit_samples, read_samples, split_samples
from hdeval.data.tasks import builtin_tasks, load_task, select_aspects


def test_builtin_tasks_have_the_paper_aspects_and_ranges():
    assert set(builtin_tasks()) == {
        "summeval", "topical_chat", "sfres", "sfhot",  # HD-Eval paper
        "convai2_usr", "fed_turn", "dailydialog_grade", "convai2_grade",  # PairEval
        "llmbar", "llmbar_adversarial", "faireval", "llmeval2", "llmeval2_eli5",  # DnA
    }
    se = load_task("summeval")
    assert se.aspect_keys == ("coherence", "consistency", "fluency", "relevance")
    assert all(a.range == (1, 5) for a in se.aspects)
    tc = load_task("topical_chat")
    assert tc.aspect("groundedness").range == (0, 1)
    assert tc.aspect("naturalness").range == (1, 3)
    assert [f.key for f in tc.fields] == ["source", "context", "output"]
    for name in ("sfres", "sfhot"):
        t = load_task(name)
        assert t.aspect_keys == ("informativeness", "naturalness", "quality")
        assert all(a.range == (1, 6) for a in t.aspects)


def test_unknown_task_names_the_choices():
    with pytest.raises(ConfigError, match="unknown task 'nope'.*summeval"):
        load_task("nope")


def test_bad_task_file_names_file_and_problem(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('name = "x"\ndescription = "d"\n[[fields]]\nkey = "source"\nlabel = "S"\n'
                 '[[aspects]]\nkey = "a"\ndefinition = "d"\nrange = [1, 5]\n')
    with pytest.raises(ConfigError, match=r"t\.toml: fields must include the 'output'"):
        load_task(str(p))
    p.write_text("name = [")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_task(str(p))


def test_select_aspects_subset_and_unknown(toy):
    task = load_task(str(toy[0]))
    assert select_aspects(task, ["accuracy"]).aspect_keys == ("accuracy",)
    with pytest.raises(ConfigError, match="unknown aspect.*fluency"):
        select_aspects(task, ["fluency"])


def _row(i, **over):
    r = {"id": f"s{i}", "doc_id": f"d{i}", "source": "src", "output": "out", "scores": {"clarity": 3, "accuracy": 4}}
    r.update(over)
    return r


def test_bad_lines_are_all_reported_with_line_numbers(tmp_path, toy):
    task = load_task(str(toy[0]))
    p = tmp_path / "bad.jsonl"
    lines = [json.dumps(_row(1)), "{not json", json.dumps(_row(3, output="")),
             json.dumps(_row(4, scores={"clarity": 9, "accuracy": 1})), json.dumps(_row(5))]
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        read_samples(p, task)
    msg = str(e.value)
    assert "\n" not in msg
    assert "3 bad line(s)" in msg
    assert "line 2: not valid JSON" in msg
    assert "line 3: field 'output'" in msg
    assert "line 4: scores.clarity = 9 is outside the task's range [1, 5]" in msg


def test_nan_score_and_missing_score(tmp_path, toy):
    task = load_task(str(toy[0]))
    p = tmp_path / "nan.jsonl"
    p.write_text('{"id": "a", "source": "s", "output": "o", "scores": {"clarity": NaN, "accuracy": 1}}\n')
    with pytest.raises(DataError, match="line 1: scores.clarity is nan, not a finite number"):
        read_samples(p, task)
    write_jsonl(p, [_row(1, scores={"clarity": 2})])
    with pytest.raises(DataError, match="line 1: scores.accuracy is missing"):
        read_samples(p, task)
    # apply-time input may lack human scores entirely
    assert read_samples(p, task, require_scores=False)[0].scores == {"clarity": 2.0}


def test_duplicate_ids_rejected(tmp_path, toy):
    task = load_task(str(toy[0]))
    p = write_jsonl(tmp_path / "dup.jsonl", [_row(1), _row(1)])
    with pytest.raises(DataError, match="line 2: id 's1' already used on line 1"):
        read_samples(p, task)


def test_split_is_grouped_deterministic_and_sized(data_dir):
    task = load_task("summeval")
    samples = read_samples(data_dir / "summeval.jsonl", task)
    a = split_samples(samples, 0.5, 0.5, seed=3)
    b = split_samples(samples, 0.5, 0.5, seed=3)
    c = split_samples(samples, 0.5, 0.5, seed=4)
    assert a == b and a != c
    doc = {s.id: s.doc_id for s in samples}
    assert not {doc[i] for i in a.train_ids} & {doc[i] for i in a.test_ids}
    assert len(a.test_ids) == 800 and len(a.train_ids) == 800
    quarter = split_samples(samples, 0.5, 0.25, seed=3)
    assert len(quarter.train_ids) == 400 and quarter.test_ids == a.test_ids


def test_limit_takes_whole_documents(data_dir):
    task = load_task("topical_chat")
    samples = read_samples(data_dir / "topical_chat.jsonl", task)
    assert len(samples) == 360
    few = limit_samples(samples, 30, seed=0)
    assert len(few) == 30
    assert len({s.doc_id for s in few}) == 5  # 6 responses per dialogue
    with pytest.raises(ConfigError, match="train-frac"):
        split_samples(samples, 0.5, 0.8, seed=0)


def test_real_files_load(data_dir):
    counts = {"summeval": 1600, "topical_chat": 360, "sfres": 1181, "sfhot": 875}
    for name, n in counts.items():
        assert len(read_samples(data_dir / f"{name}.jsonl", load_task(name))) == n
