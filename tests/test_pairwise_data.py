"""Pairwise samples (output_a / output_b / label), the task files of the PairEval and DnA data,
the `where` row filter, and the doc-grouped split on pairs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import write_jsonl

from hdeval.cli import cli
from hdeval.core.errors import ConfigError, DataError
from hdeval.core.types import PairSample
from hdeval.data.datasets import download_datasets
from hdeval.data.samples import (
    limit_samples,
    read_samples,
    read_task_samples,
    split_samples,
)
from hdeval.data.tasks import load_task, task_from_dict

POINTWISE_NEW = {"convai2_usr": 300, "fed_turn": 375, "dailydialog_grade": 300, "convai2_grade": 600}
PAIRWISE_NEW = {"llmbar": 419, "llmbar_adversarial": 319, "faireval": 80, "llmeval2": 2265, "llmeval2_eli5": 149}

PAIR_TASK = """
name = "pairs"
shape = "pairwise"
description = "Two answers to a question."
output_label = "Answer"
{extra}
[[fields]]
key = "source"
label = "Question"

[[fields]]
key = "output"
label = "Answer"

[[aspects]]
key = "helpfulness"
definition = "How much the answer helps."
range = [1, 10]
"""


def pair_task(tmp_path, extra: str = ""):
    p = tmp_path / "pairs.toml"
    p.write_text(PAIR_TASK.format(extra=extra), encoding="utf-8")
    return load_task(str(p))


def _pair(i, **over):
    r = {"id": f"p{i}", "task": "pairs", "source": f"question {i // 2}", "context": None,
         "output_a": f"answer a{i}", "output_b": f"answer b{i}", "system_a": None, "system_b": None,
         "label": "ab"[i % 2], "annotations": None, "doc_id": f"q{i // 2}", "meta": {"subset": "x" if i % 3 else "y"}}
    r.update(over)
    return r


# --------------------------------------------------------------------------- task files


def test_new_dialogue_tasks_have_the_readme_aspects_and_ranges():
    usr = load_task("convai2_usr")
    assert usr.shape == "pointwise"
    assert [f.key for f in usr.fields] == ["source", "context", "output"]  # context = persona facts
    assert {a.key: a.range for a in usr.aspects} == {
        "understandability": (0, 1), "naturalness": (1, 3), "coherence": (1, 3),
        "engagingness": (1, 3), "groundedness": (0, 1), "overall": (1, 5)}
    fed = load_task("fed_turn")
    assert [f.key for f in fed.fields] == ["source", "output"]
    ranges = {a.key: a.range for a in fed.aspects}
    assert ranges.pop("understandable") == (0, 1) and ranges.pop("overall") == (0, 4)
    assert set(ranges) == {"interesting", "engaging", "specific", "relevant", "correct",
                           "semantically_appropriate", "fluent"}
    assert set(ranges.values()) == {(0, 2)}
    for name in ("dailydialog_grade", "convai2_grade"):
        t = load_task(name)
        assert t.aspect_keys == ("overall",) and t.aspect("overall").range == (1, 5)
        assert "coheren" in t.aspect("overall").definition.lower()


def test_pairwise_tasks_say_their_shape_and_filters():
    for name in PAIRWISE_NEW:
        t = load_task(name)
        assert t.shape == "pairwise", name
        assert "output" in [f.key for f in t.fields]
    assert load_task("faireval").aspect_keys == ("helpfulness", "relevance", "accuracy", "level_of_detail")
    assert dict(load_task("llmeval2_eli5").where) == {"subset": ("eli5",)}
    assert load_task("llmeval2_eli5").data_file == load_task("llmeval2").data_file == "llmeval2.jsonl"
    assert len(dict(load_task("llmbar_adversarial").where)["subset"]) == 4
    assert load_task("llmeval2").skip_empty and not load_task("faireval").skip_empty


def test_task_dict_round_trips_shape_and_filter_but_pointwise_manifest_is_unchanged():
    t = load_task("llmeval2_eli5")
    assert task_from_dict(t.to_dict(), where="manifest") == t
    # a pointwise task's manifest section has no new keys (golden artifacts stay byte-identical)
    assert set(load_task("summeval").to_dict()) == {
        "name", "description", "output_label", "data_file", "fields", "aspects"}


@pytest.mark.parametrize("extra, fragment", [
    ('shape = "triple"', "shape must be one of pointwise, pairwise, got 'triple'"),
    ('where = { subset = [] }', "where.subset must be a string"),
    ('where = "eli5"', "where must be a non-empty table"),
    ('skip_empty = "yes"', "skip_empty must be true or false"),
])
def test_bad_shape_or_filter_in_task_file(tmp_path, extra, fragment):
    p = tmp_path / "t.toml"
    p.write_text(PAIR_TASK.replace('shape = "pairwise"', "").format(extra=extra), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_task(str(p))
    assert fragment in str(e.value) and str(p) in str(e.value)


def test_where_on_a_pointwise_task_is_refused(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text(PAIR_TASK.replace('shape = "pairwise"', "").format(extra='where = { subset = "x" }'))
    with pytest.raises(ConfigError, match="supported for pairwise tasks only"):
        load_task(str(p))


# --------------------------------------------------------------------------- the shared files


@pytest.mark.parametrize("name, n", sorted(POINTWISE_NEW.items()))
def test_every_row_of_the_new_dialogue_files_reads(data_dir, name, n):
    samples = read_samples(data_dir / f"{name}.jsonl", load_task(name))
    assert len(samples) == n
    if name == "convai2_usr":
        assert all(s.text("context").startswith("your persona:") for s in samples)


def test_fed_null_annotation_cells_do_not_matter(data_dir):
    # The 12 upstream "N/A" cells are null in `annotations` only; `scores` are complete.
    rows = [json.loads(l) for l in (data_dir / "fed_turn.jsonl").open(encoding="utf-8")]
    nulls = sum(v is None for r in rows for a in r["annotations"] for v in a.values())
    assert nulls == 12
    samples = read_samples(data_dir / "fed_turn.jsonl", load_task("fed_turn"))
    assert all(len(s.scores) == 9 for s in samples)


def test_a_null_dialogue_text_is_one_clear_error(tmp_path):
    # what a null *text* cell in a FED-style row would give: the line, the field and its label
    task = load_task("fed_turn")
    scores = {a: 1.0 for a in task.aspect_keys}
    p = write_jsonl(tmp_path / "fed.jsonl", [
        {"id": "f1", "source": "User: hi", "output": "hello", "scores": scores,
         "annotations": [{"annotator": "slot1", "correct": None}]},
        {"id": "f2", "source": "User: hi", "output": None, "scores": scores},
    ])
    with pytest.raises(DataError) as e:
        read_samples(p, task)
    assert "1 bad line(s): line 2: field 'output' (Response) is missing" in str(e.value)


@pytest.mark.parametrize("name, n", sorted(PAIRWISE_NEW.items()))
def test_every_row_of_the_pairwise_files_reads(data_dir, name, n):
    task = load_task(name)
    pairs = read_task_samples(data_dir / task.data_file, task)
    assert len(pairs) == n
    assert all(p.label in ("a", "b", "tie") and p.output_a.strip() and p.output_b.strip() for p in pairs)
    lines = sum(1 for l in (data_dir / task.data_file).open(encoding="utf-8") if l.strip())
    if name == "llmeval2":
        assert lines == 2553 and len(pairs) == lines - 288  # skip_empty leaves 288 rows out
    elif not task.where:
        assert len(pairs) == lines


def test_pairwise_file_facts(data_dir):
    fe = read_task_samples(data_dir / "faireval.jsonl", load_task("faireval"))
    assert [sum(p.label == x for p in fe) for x in ("a", "b", "tie")] == [41, 25, 14]
    assert {(p.system_a, p.system_b) for p in fe} and all(p.system_a for p in fe)
    eli5 = read_task_samples(data_dir / "llmeval2.jsonl", load_task("llmeval2_eli5"))
    assert {p.meta["subset"] for p in eli5} == {"eli5"} and all(p.label != "tie" for p in eli5)
    bar = read_task_samples(data_dir / "llmbar.jsonl", load_task("llmbar"))
    assert sum(p.meta.get("subset") == "Natural" for p in bar) == 100


# --------------------------------------------------------------------------- bad pairwise input


@pytest.mark.parametrize("over, fragment", [
    ({"output_b": None}, "line 2: field 'output_b' (Answer B) is missing"),
    ({"label": "c"}, "line 2: field 'label' is 'c', not one of a, b, tie"),
    ({"label": None}, "line 2: field 'label' is missing"),
    ({"output_a": "  "}, "line 2: field 'output_a' (Answer A) is empty"),
    ({"source": ""}, "line 2: field 'source' (Question) is empty"),
    ({"output_a": 3}, "line 2: field 'output_a' (Answer A) is not text"),
    ({"id": "p1"}, "line 2: id 'p1' already used on line 1"),
    ({"meta": "eli5"}, "line 2: field 'meta' must be an object or null"),
])
def test_bad_pair_is_one_line_with_line_number_and_field(tmp_path, over, fragment):
    task = pair_task(tmp_path)
    p = write_jsonl(tmp_path / "bad.jsonl", [_pair(1), _pair(2, **over), _pair(3)])
    with pytest.raises(DataError) as e:
        read_task_samples(p, task)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}: 1 bad line(s): ") and fragment in msg


def test_all_bad_pair_lines_reported_together(tmp_path):
    task = pair_task(tmp_path)
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b"\n".join([json.dumps(_pair(1)).encode(), b"{not json", b"[1]", b"\xff\xfe",
                              json.dumps(_pair(5, label="A")).encode()]) + b"\n")
    with pytest.raises(DataError) as e:
        read_task_samples(p, task)
    msg = str(e.value)
    assert "4 bad line(s)" in msg and "\n" not in msg
    for frag in ("line 2: not valid JSON", "line 3: not a JSON object", "line 4: not UTF-8 text",
                 "line 5: field 'label' is 'A'"):
        assert frag in msg


def test_unlabelled_pairs_read_for_scoring_but_labels_are_still_checked(tmp_path):
    task = pair_task(tmp_path)
    p = write_jsonl(tmp_path / "new.jsonl", [_pair(1, label=None), _pair(2)])
    pairs = read_task_samples(p, task, require_labels=False)
    assert [x.label for x in pairs] == [None, "a"]
    write_jsonl(p, [_pair(1, label="both")])
    with pytest.raises(DataError, match="line 1: field 'label' is 'both'"):
        read_task_samples(p, task, require_labels=False)


def test_skip_empty_leaves_out_empty_text_but_not_missing_fields(tmp_path):
    task = pair_task(tmp_path, "skip_empty = true")
    p = write_jsonl(tmp_path / "p.jsonl", [_pair(1), _pair(2, output_b=""), _pair(3, source=" "), _pair(4)])
    assert [x.id for x in read_task_samples(p, task)] == ["p1", "p4"]
    write_jsonl(p, [_pair(1), _pair(2, output_b=None)])
    with pytest.raises(DataError, match="line 2: field 'output_b' .* is missing"):
        read_task_samples(p, task)
    write_jsonl(p, [_pair(1, output_a=""), _pair(2, output_a="", label="x")])
    with pytest.raises(DataError, match="line 2: field 'label' is 'x'"):
        read_task_samples(p, task)  # a skippable row is still checked for the rest


def test_pointwise_reader_refuses_a_pairwise_task(tmp_path):
    task = pair_task(tmp_path)
    p = write_jsonl(tmp_path / "p.jsonl", [_pair(1)])
    with pytest.raises(ConfigError, match="task pairs judges pairs of responses .* use a pointwise task"):
        read_samples(p, task)


# --------------------------------------------------------------------------- where filter


def test_where_in_task_file(tmp_path):
    rows = [_pair(i) for i in range(1, 7)]
    rows[1]["output_b"] = None  # broken, but dropped by the filter (subset x) so never checked
    p = write_jsonl(tmp_path / "p.jsonl", rows)
    only_y = pair_task(tmp_path, 'where = { subset = "y" }')
    assert [x.id for x in read_task_samples(p, only_y)] == ["p3", "p6"]
    with pytest.raises(DataError, match="line 2: field 'output_b'"):
        read_task_samples(p, pair_task(tmp_path))
    # every key must match; a top-level field works too; lists mean any-of
    both = pair_task(tmp_path, 'where = { subset = "y", doc_id = ["q3", "q9"] }')
    assert [x.id for x in read_task_samples(p, both)] == ["p6"]
    assert [x.id for x in read_task_samples(p, pair_task(tmp_path, 'where = { subset = "y", label = "a" }'))] == ["p6"]
    with pytest.raises(DataError, match=r"no pairs matching where subset = 'zzz'"):
        read_task_samples(p, pair_task(tmp_path, 'where = { subset = "zzz" }'))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", '["y", nan]'])
def test_where_refuses_a_value_that_can_never_match(tmp_path, value):
    # NaN equals nothing and JSON has no inf: the filter would drop every row, silently before
    with pytest.raises(ConfigError, match=r"pairs\.toml: where\.score = .* can never match a row"):
        pair_task(tmp_path, f"where = {{ score = {value} }}")


# --------------------------------------------------------------------------- split


def test_split_and_limit_group_pairs_by_doc_id(tmp_path):
    task = pair_task(tmp_path)
    p = write_jsonl(tmp_path / "p.jsonl", [_pair(i) for i in range(40)])  # 20 questions x 2 pairs
    pairs = read_task_samples(p, task)
    a = split_samples(pairs, 0.5, 0.5, seed=1)
    assert a == split_samples(pairs, 0.5, 0.5, seed=1) != split_samples(pairs, 0.5, 0.5, seed=2)
    doc = {x.id: x.doc_id for x in pairs}
    assert not {doc[i] for i in a.train_ids} & {doc[i] for i in a.test_ids}
    assert len(a.train_ids) == len(a.test_ids) == 20
    few = limit_samples(pairs, 6, seed=0)
    assert len(few) == 6 and len({x.doc_id for x in few}) == 3
    assert all(isinstance(x, PairSample) for x in few)


# --------------------------------------------------------------------------- CLI


def _run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_train_on_pairwise_task_is_a_clear_error_before_any_llm_call(tmp_path):
    # a method that takes only pointwise data (hdeval and dna take pairs: test_pairwise_hdeval.py)
    cache = tmp_path / "cache"
    for extra in ([], ["--dry-run"]):
        r = _run("train", "--task", "faireval", "--method", "paireval", "--data", str(tmp_path / "absent.jsonl"),
                 "--llm", "fake", "--cache-dir", str(cache), "-o", str(tmp_path / "art"), *extra)
        assert r.exit_code == 2
        errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert errors == ["error: method 'paireval' does not support pairwise tasks yet (task 'faireval'); "
                          "it takes pointwise data"]
    assert not cache.exists() and not (tmp_path / "art").exists()


@pytest.mark.parametrize("name", sorted(POINTWISE_NEW))
def test_train_runs_on_new_dialogue_tasks(data_dir, tmp_path, name):
    out = tmp_path / "art"
    r = _run("train", "--task", name, "--llm", "fake", "--layers", "1", "--limit", "40",
             "--cache-dir", str(tmp_path / "c"), "-o", str(out), "-q")
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["final"]) == set(load_task(name).aspect_keys) | {"average"}


def test_tasks_lists_every_task_with_its_shape():
    r = _run("tasks")
    assert r.exit_code == 0
    for name in POINTWISE_NEW:
        assert f"{name} (pointwise):" in r.stdout
    for name in PAIRWISE_NEW:
        assert f"{name} (pairwise):" in r.stdout
    assert "summeval (pointwise):" in r.stdout


def test_tasks_points_only_downloadable_tasks_at_data_download(monkeypatch):
    # it used to tell every task without data to run `hdeval data download`, which fails for
    # the nine built-in tasks that have no download source
    monkeypatch.delenv("HDEVAL_DATA_DIR", raising=False)
    r = _run("tasks")
    assert r.exit_code == 0, r.output
    status = {}
    for line in r.stdout.splitlines():
        if not line.startswith(" "):
            name = line.split(" ", 1)[0]
        elif line.startswith("  data: "):
            status[name] = line
    assert set(status) == set(POINTWISE_NEW) | set(PAIRWISE_NEW) | {"summeval", "topical_chat", "sfres", "sfhot"}
    for name in ("summeval", "topical_chat", "sfres", "sfhot"):
        assert status[name].endswith(f"or run `hdeval data download {name}`)"), status[name]
    for name in (*POINTWISE_NEW, *PAIRWISE_NEW):
        assert status[name] == "  data: not found (no download source: set HDEVAL_DATA_DIR or pass --data)"


def test_data_list_and_download_on_tasks_without_a_source(tmp_path, monkeypatch):
    monkeypatch.delenv("HDEVAL_DATA_DIR", raising=False)
    r = _run("data", "list")
    assert r.exit_code == 0, r.output
    i = r.stdout.splitlines().index("llmbar: aspects instruction_following, helpfulness, accuracy, "
                                    "level_of_detail, harmlessness")
    assert "no download source; set HDEVAL_DATA_DIR to a folder holding llmbar.jsonl" in r.stdout.splitlines()[i + 2]
    assert "run `hdeval data download summeval`" in r.stdout
    with pytest.raises(ConfigError, match="llmbar: no download source; set HDEVAL_DATA_DIR"):
        download_datasets(["llmbar"], dest=tmp_path)


def test_data_list_counts_pairwise_files(data_dir):
    r = _run("data", "list", env={"HDEVAL_DATA_DIR": str(data_dir)})
    assert r.exit_code == 0, r.output
    assert f"* {data_dir / 'llmeval2.jsonl'}  (present, 2265 rows)" in r.stdout
    assert f"* {data_dir / 'llmbar.jsonl'}  (present, 319 rows)" in r.stdout  # llmbar_adversarial


def test_data_import_refuses_a_pairwise_task(tmp_path):
    from hdeval.data.datasets import import_table

    p = write_jsonl(tmp_path / "rows.jsonl", [_pair(1)])
    with pytest.raises(ConfigError, match="task faireval is pairwise: data import handles pointwise tasks only"):
        import_table(p, load_task("faireval"))


def test_the_misleading_read_pairs_alias_is_gone():
    # it returned pointwise samples for a pointwise task despite its name; read_task_samples says what it does
    import hdeval.data.samples

    assert not hasattr(hdeval.data.samples, "read_pairs")
