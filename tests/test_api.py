"""The notebook API: hdeval.load(path) loads any method's artifact; its score takes a DataFrame,
a list of dicts or a JSONL path and returns a DataFrame; bad input is one HdevalError."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import hdeval
from conftest import train_artifact

EX = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def direct_artifact(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("api")
    return train_artifact(str(EX / "qa_task.toml"), EX / "qa.jsonl", tmp, "--method", "direct")


def test_dir_shows_the_public_api_only_and_old_names_still_import():
    assert dir(hdeval) == sorted(hdeval.__all__)
    assert {"load", "train", "TrainConfig", "TrainedEvaluator", "Metrics", "HdevalError"} <= set(dir(hdeval))
    assert "importlib" not in dir(hdeval) and "sys" not in dir(hdeval)
    from hdeval import Evaluator  # the pointwise HD-Eval class, for code written before hdeval.load

    assert Evaluator.__name__ == "Evaluator"


def test_load_scores_a_frame_a_list_of_dicts_and_a_path_alike(direct_artifact, tmp_path):
    ev = hdeval.load(direct_artifact)
    assert repr(ev) == (f"<TrainedEvaluator method='direct' task='qa' (pointwise, 2 aspect(s)) llm='fake:v1', "
                        f"path={str(direct_artifact)!r}>")
    assert isinstance(ev.metrics, hdeval.Metrics) and set(ev.metrics.split) == {"train", "test"}
    assert set(ev.metrics.final) >= {"clarity", "accuracy", "average"}
    rows = [json.loads(line) for line in (EX / "new_qa.jsonl").read_text().splitlines()]
    by_path = ev.score(EX / "new_qa.jsonl", llm="fake", cache_dir=tmp_path / "c")
    by_frame = ev.score(pd.DataFrame(rows), llm="fake", cache_dir=tmp_path / "c")
    by_list = ev.score(rows, llm="fake", cache_dir=tmp_path / "c")
    assert list(by_path.index) == ["new-qa-0", "new-qa-1", "new-qa-2"]
    assert {"scores.clarity", "scores.accuracy"} <= set(by_path.columns)
    pd.testing.assert_frame_equal(by_path, by_frame)
    pd.testing.assert_frame_equal(by_path, by_list)
    framed = pd.DataFrame(rows).set_index("id")  # the id as the frame's index is read too
    pd.testing.assert_frame_equal(by_path, ev.score(framed, llm="fake", cache_dir=tmp_path / "c"))


@pytest.mark.parametrize("bad, message", [
    (42, "score takes a DataFrame, a list of dicts or a JSONL path, got int"),
    ({"id": "x"}, "score takes a DataFrame, a list of dicts or a JSONL path, got dict"),
    ([], "the rows given: no samples to score"),
    ([{"id": "a", "source": "q", "output": "x"}, "row"], "the rows given: row 2 is str, not a dict of fields"),
    ([{"id": "a", "source": "q"}], "the rows given: 1 bad row(s): row 1: field 'output'"),
    (pd.DataFrame({"id": ["a"], "source": ["q"], "output": [float("inf")]}), "row 1 holds an infinite number"),
    ([{"id": "a", "source": "q", "output": object()}], "row 1 holds a object, which is not JSON data"),
    ([{"id": "a", "source": "q"}, {"id": "b", "source": "q"}], "2 bad row(s): rows 1, 2: field 'output'"),
])
def test_bad_input_is_one_hdeval_error_before_any_call(direct_artifact, tmp_path, bad, message):
    ev = hdeval.load(direct_artifact)
    with pytest.raises(hdeval.HdevalError) as err:
        ev.score(bad, llm="fake", cache_dir=tmp_path / "c")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "c").exists()  # nothing asked


@pytest.mark.parametrize("options, message", [
    ({"concurrency": -1}, "score: concurrency must be a whole number of at least 1, got -1"),
    ({"concurrency": "2"}, "score: concurrency must be a whole number of at least 1, got '2'"),
    ({"concurrency": 0}, "score: concurrency must be a whole number of at least 1, got 0"),
    ({"llm": 1}, "score: llm must be text, got 1"),
])
def test_bad_score_options_are_one_hdeval_error_before_any_call(direct_artifact, tmp_path, options, message):
    # they ended in an AttributeError or a TypeError deep in the client, after the rows were read
    ev = hdeval.load(direct_artifact)
    with pytest.raises(hdeval.HdevalError, match=message):
        ev.score(EX / "new_qa.jsonl", cache_dir=tmp_path / "c", **{"llm": "fake", **options})
    assert not (tmp_path / "c").exists()


def test_array_cells_are_lists_and_flat_score_columns_are_said_not_read(direct_artifact, tmp_path):
    import numpy as np

    rows = [json.loads(line) for line in (EX / "new_qa.jsonl").read_text().splitlines()]
    ev = hdeval.load(direct_artifact)
    framed = pd.DataFrame([{**r, "emb": np.zeros(3)} for r in rows])  # an embedding column
    assert len(ev.score(framed, llm="fake", cache_dir=tmp_path / "c")) == len(rows)
    flat = pd.json_normalize([{**r, "scores": {"clarity": 4, "accuracy": 3}} for r in rows])
    with pytest.warns(UserWarning, match=r"does not read the columns scores.clarity, scores.accuracy as human"):
        out = ev.score(flat, llm="fake", cache_dir=tmp_path / "c")
    assert "human.clarity" not in out.columns


def test_a_trained_evaluator_wraps_only_a_trained_evaluator(direct_artifact):
    with pytest.raises(hdeval.HdevalError, match=r"got str; for an artifact's path use hdeval.load\(path\)"):
        hdeval.TrainedEvaluator(str(direct_artifact))
    ev = hdeval.load(direct_artifact)
    assert hdeval.TrainedEvaluator(ev).fitted is ev.fitted


def test_load_of_something_that_is_no_artifact_is_one_hdeval_error(tmp_path):
    for bad in (tmp_path / "missing", tmp_path, 3):
        with pytest.raises(hdeval.HdevalError):
            hdeval.load(bad)


def test_saving_over_an_artifact_names_the_python_way_to_replace_it(tmp_path):
    """A notebook user has no --force: the refusal names save(..., force=True), which works."""
    ev = hdeval.train(task=str(EX / "qa_task.toml"), method="direct", llm="fake", cache_dir=str(tmp_path / "c"))
    out = ev.save(tmp_path / "art")
    with pytest.raises(hdeval.HdevalError, match=r"force=True"):
        ev.save(out)
    assert hdeval.load(ev.save(out, force=True)).method == "direct"


CASES = {  # as tests/test_golden_methods.py trains them: (task, first rows, extra rows, train arguments)
    "direct-yesno": ("summeval", 60, None, ["--method", "direct-yesno"]),
    "paireval": ("summeval", 160, None, ["--method", "paireval"]),
    "hdeval": ("summeval", 48, None, ["--method", "hdeval", "--layers", "2", "--children", "2"]),
    "dna": ("faireval", 40, None, ["--method", "dna"]),
    "hdeval-pairwise": ("llmbar", 40, (200, 220), ["--method", "hdeval", "--layers", "1"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_built_in_method_loads_and_scores_a_frame(name, data_dir, tmp_path):
    task, first, extra, args = CASES[name]
    lines = (data_dir / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
    keep = lines[:first] + (lines[extra[0]:extra[1]] if extra else [])
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(keep) + "\n", encoding="utf-8")
    ev = hdeval.load(train_artifact(task, data, tmp_path, *args))
    assert ev.method == name.split("-pairwise")[0] and f"method={ev.method!r}" in repr(ev)
    rows = [json.loads(line) for line in keep[:4]]
    got = ev.score(pd.DataFrame(rows), llm="fake", cache_dir=tmp_path / "cache")
    assert isinstance(got, pd.DataFrame) and list(got.index) == [r["id"] for r in rows]
    assert isinstance(ev.metrics, hdeval.Metrics)


def test_a_loaded_artifacts_own_server_is_called_only_when_named(tmp_path):
    # the artifact is a file from anyone: as apply, score sends nothing where it says unasked;
    # and base_url alone used to be ignored (the artifact's server was called instead)
    from llm_server import LLMServer

    with LLMServer() as server:
        art = train_artifact(str(EX / "qa_task.toml"), EX / "qa.jsonl", tmp_path, "--method", "direct",
                             llm=("--llm", "test-model", "--base-url", server.url))
        ev = hdeval.load(art)
        before = server.calls
        with pytest.raises(hdeval.HdevalError, match=rf"the artifact names the LLM server {server.url}: .*"
                                                     r"hdeval.load\(path\).score\(rows, base_url=URL\)"):
            ev.score(EX / "new_qa.jsonl", cache_dir=tmp_path / "c2")
        assert server.calls == before
        out = ev.score(EX / "new_qa.jsonl", base_url=server.url, cache_dir=tmp_path / "c2")
        assert server.calls > before and out["scores.clarity"].notna().all()
        assert {r.json["model"] for r in server.requests[before:]} == {"test-model"}
        # the method's own evaluator takes the server as a backend
        from hdeval.llm.client import open_llm
        from hdeval.llm.config import LLMConfig
        from hdeval.methods.registry import load_artifact

        samples = hdeval.data.samples.read_task_samples(EX / "new_qa.jsonl", ev.task, require_labels=False)
        backend = open_llm(LLMConfig(model="test-model", base_url=server.url, cache_dir=str(tmp_path / "c3")))
        try:
            assert len(load_artifact(art).score(samples, backend=backend).to_frame()) == 3
        finally:
            backend.close()
