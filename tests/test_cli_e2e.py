"""End to end through the real command line: train -> apply, and every bad input path."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import one_line_error, slice_jsonl, write_jsonl

from hdeval.cli import cli
from hdeval.methods.hdeval.evaluator import Evaluator


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.mark.parametrize("task, n", [("summeval", 48), ("topical_chat", 36), ("sfres", 40), ("sfhot", 40)])
def test_train_then_apply_on_real_slices(task, n, data_dir, tmp_path):
    data = slice_jsonl(data_dir / f"{task}.jsonl", tmp_path / f"{task}.jsonl", n)
    cache = str(tmp_path / "cache")
    out = tmp_path / "art"
    r = run("train", "--task", task, "--data", str(data), "--llm", "fake", "--layers", "2",
            "--aggregator", "auto", "--cache-dir", cache, "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "artifact written to" in r.stdout
    assert "layer 2:" in r.stderr and "LLM calls made:" in r.stderr
    for f in ("manifest.json", "tree.json", "aggregator.skops", "metrics.json", "scores.csv"):
        assert (out / f).is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    for section in ("final", "direct_layer1", "mean_all_criteria"):
        assert set(metrics[section]) >= {"average"}
        assert set(metrics[section]["average"]) == {"pearson", "spearman", "kendall"}
    assert set(metrics["layers"]) == {"1", "2"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["llm"]["identity"] == "fake:v1"
    assert set(manifest["run"]["split"]) == {"train", "test"}
    assert manifest["state"]["prompts"]["score"] and manifest["files"]["aggregator.skops"]
    # every aspect was decomposed into 4; the artifact keeps the layers chosen on training data
    layers = manifest["state"]["layers"]
    assert len(layers[1]["added"]) == 4 * len(layers[0]["added"])
    kept = metrics["selection"]["kept_layer"]
    tree = json.loads((out / "tree.json").read_text())["criteria"]
    assert {c["layer"] for c in tree} == set(range(1, kept + 1))

    # apply to the same samples with human scores stripped
    rows = [json.loads(l) for l in data.read_text().splitlines()[:10]]
    for r_ in rows:
        r_.pop("scores")
    new = write_jsonl(tmp_path / "new.jsonl", rows)
    scored = tmp_path / "scored.jsonl"
    r = run("apply", str(out), str(new), "-o", str(scored), "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    assert "LLM calls made: 0" in r.stderr  # same prompts and LLM: all cached
    got = [json.loads(l) for l in scored.read_text().splitlines()]
    assert [g["id"] for g in got] == [x["id"] for x in rows]
    ev = Evaluator.load(out)
    for g in got:
        assert set(g["scores"]) == set(ev.task.aspect_keys)
        for a, v in g["scores"].items():
            lo, hi = ev.task.aspect(a).range
            assert lo <= v <= hi
        assert set(g["criteria"]) == set(ev.needed_criteria)


def test_apply_prints_correlations_when_input_has_human_scores(toy, tmp_path):
    task, data = toy
    cache = str(tmp_path / "c")
    out = tmp_path / "art"
    # the smallest artifact: apply's closing lines do not depend on its depth or model
    assert run("train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1",
               "--aggregator", "lr", "--cache-dir", cache, "-o", str(out)).exit_code == 0
    r = run("apply", str(out), str(data), "-o", str(tmp_path / "s.jsonl"), "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    assert "correlation with the human scores" in r.stdout and "clarity" in r.stdout
    assert "LLM calls per sample" in r.stderr


def test_custom_task_python_api_roundtrip(toy, tmp_path):
    from hdeval import Evaluator, train
    from hdeval.data.samples import read_samples

    task, data = toy
    ev = train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="dt",
               cache_dir=str(tmp_path / "c"))
    path = ev.save(tmp_path / "art")
    loaded = Evaluator.load(path)
    assert loaded.tree == ev.tree
    samples = read_samples(data, loaded.task)
    a = loaded.score(samples, cache_dir=tmp_path / "c")
    assert a.usage["calls"] == 0
    assert a.predictions.shape == (len(samples), 2)
    # the loaded aggregator reproduces the trained one on the recorded score matrix
    import numpy as np
    import pandas as pd

    table = pd.read_csv(path / "scores.csv")
    X = table[ev.feature_keys].to_numpy(float)
    np.testing.assert_allclose(loaded.aggregator.predict(X), ev.aggregator.predict(X))


def test_aspects_subset(toy, tmp_path):
    task, data = toy
    out = tmp_path / "art"
    r = run("train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1",
            "--aspects", "accuracy", "--cache-dir", str(tmp_path / "c"), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert Evaluator.load(out).task.aspect_keys == ("accuracy",)


def test_an_aspect_name_that_ends_in_a_space_is_applied_with_the_prompts_it_trained_with(toy, tmp_path):
    """tree.json kept the name as trained, but reloading stripped it: apply then sent other
    prompts than training had (other cache keys), and paid for every call again."""
    task, data = toy
    text = task.read_text(encoding="utf-8").replace('name = "Accuracy"', 'name = "Accuracy "')
    task.write_text(text.replace('"How correct the answer is."', '"How correct the answer is.  \\r\\n"'),
                    encoding="utf-8")
    out, cache = tmp_path / "art", str(tmp_path / "c")
    r = run("train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1",
            "--cache-dir", cache, "-o", str(out), "-q")
    assert r.exit_code == 0, r.output
    r = run("apply", str(out), str(data), "-o", str(tmp_path / "s.jsonl"), "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    assert "LLM calls made: 0" in r.stderr


def test_an_aspect_key_with_edge_spaces_is_refused_before_training(toy, tmp_path):
    """tree.json refuses such a key on reload: an artifact trained with it could never be used."""
    task, data = toy
    task.write_text(task.read_text(encoding="utf-8").replace('key = "clarity"', 'key = "clarity "'),
                    encoding="utf-8")
    r = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake",
                                 "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art")])
    one_line_error(r, str(task), "aspect key 'clarity '", "leading or trailing spaces")
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize("key", ["split", "sample_id", "human:accuracy"])
def test_an_aspect_key_a_score_table_column_takes_is_refused_before_any_call(toy, tmp_path, key):
    # 'split' ended in a traceback after every paid call; 'human:accuracy' beside 'accuracy' wrote
    # an artifact whose every later use said "the manifest was edited"
    task, data = toy
    task.write_text(task.read_text(encoding="utf-8").replace('key = "clarity"', f'key = "{key}"'),
                    encoding="utf-8")
    r = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake",
                                 "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art")])
    one_line_error(r, str(task), f"aspect key {key!r} is taken")
    assert not (tmp_path / "art").exists() and not (tmp_path / "c").exists()


def test_tasks_and_cache_commands(tmp_path, toy):
    r = run("tasks")
    assert r.exit_code == 0
    for name in ("summeval", "topical_chat", "sfres", "sfhot", "groundedness [0-1]"):
        assert name in r.stdout
    task, data = toy
    cache = str(tmp_path / "c")
    run("train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1",
        "--cache-dir", cache, "-o", str(tmp_path / "a"))
    r = run("cache", "stats", "--cache-dir", cache)
    assert r.exit_code == 0 and "72 entries" in r.stdout  # 36 samples x 2 aspects
    r = run("cache", "clear", "--cache-dir", cache, "--yes")
    assert "deleted 72" in r.stdout
    assert "0 entries" in run("cache", "stats", "--cache-dir", cache).stdout


# ------------------------------------------------------------------ bad input
def _train(tmp_path, *extra, task="summeval"):
    out = tmp_path / "out"
    r = run("train", "--task", task, "--llm", "fake", "--cache-dir", str(tmp_path / "c"),
            "-o", str(out), *extra)
    assert not out.exists(), "nothing may be written on a failed run"
    return r


def test_unknown_task(tmp_path):
    one_line_error(_train(tmp_path, task="nonesuch"), "unknown task 'nonesuch'", "summeval")


def test_missing_data_file_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("HDEVAL_DATA_DIR", raising=False)
    one_line_error(_train(tmp_path), "no data for task summeval", "HDEVAL_DATA_DIR", "--data")
    one_line_error(_train(tmp_path, "--data", str(tmp_path / "nope.jsonl")), "data file not found")


def test_jsonl_line_not_json(tmp_path, toy):
    task, data = toy
    lines = data.read_text().splitlines()
    lines[6] = '{"id": "broken", '
    data.write_text("\n".join(lines) + "\n")
    one_line_error(_train(tmp_path, "--data", str(data), task=str(task)), "line 7: not valid JSON")


def test_sample_missing_field(tmp_path, toy):
    task, data = toy
    rows = [json.loads(l) for l in data.read_text().splitlines()]
    del rows[2]["source"]
    write_jsonl(data, rows)
    one_line_error(_train(tmp_path, "--data", str(data), task=str(task)), "line 3: field 'source'", "missing")


@pytest.mark.parametrize("value, text", [("NaN", "not a finite number"), ("7", "outside the task's range")])
def test_bad_human_score(tmp_path, toy, value, text):
    task, data = toy
    lines = data.read_text().splitlines()
    lines[4] = lines[4].replace('"clarity": ', f'"clarity": {value}, "x": ', 1)
    data.write_text("\n".join(lines) + "\n")
    one_line_error(_train(tmp_path, "--data", str(data), task=str(task)), "line 5: scores.clarity", text)


def test_layers_zero_and_unknown_aggregator(tmp_path, toy):
    task, data = toy
    one_line_error(_train(tmp_path, "--data", str(data), "--layers", "0", task=str(task)),
                   "--layers must be at least 1")
    one_line_error(_train(tmp_path, "--data", str(data), "--aggregator", "svm", task=str(task)),
                   "unknown aggregator 'svm'")


def test_server_unreachable(tmp_path, toy):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    task, data = toy
    r = _train(tmp_path, "--data", str(data), "--llm", "some-model", "--base-url",
               f"http://127.0.0.1:{port}/v1", "--max-retries", "1", "--timeout", "2", task=str(task))
    one_line_error(r, "cannot reach LLM server", f"127.0.0.1:{port}", "rerun")
    assert r.exit_code == 3


def test_apply_on_non_artifact(tmp_path, toy):
    task, data = toy
    r = run("apply", str(tmp_path), str(data), "-o", str(tmp_path / "o.jsonl"))
    one_line_error(r, "not an hdeval artifact")
    assert not (tmp_path / "o.jsonl").exists()
