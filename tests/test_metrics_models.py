"""Each built-in method's metrics.json is a strict pydantic model (issue #33): a number field holding
text, true or NaN is refused in one line naming the field, through `hdeval apply` and `hdeval
report`, before any LLM call.

Before, the fields every method writes were read laxly (pydantic coerced `usage.calls = "5"`,
`split.train = "12"`, `failure_rate = "0.1"` and took NaN), and a field name from the file was
quoted whole, so a huge key made a huge message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, edited_metrics, run_cli, set_field

from hdeval.core.errors import ArtifactError
from hdeval.methods.registry import load_artifact

EX = REPO / "examples"
QA, PAIRS = (EX / "qa_task.toml", EX / "new_qa.jsonl"), (EX / "pairs_task.toml", EX / "new_pairs.jsonl")
# method: (task file and new samples, train arguments, `hdeval report` draws it)
FAST = {
    "hdeval": (QA, ["--layers", "1", "--aggregator", "lr"], True),
    "hdeval-pairwise": (PAIRS, ["--layers", "1", "--aggregator", "lr"], True),
    "paireval": (QA, ["--method", "paireval", "--comparisons", "1"], False),
    "direct": (QA, ["--method", "direct"], False),
    "dna": (PAIRS, ["--method", "dna"], True),
}
# each over 2 s to train under load: run with the slow tests
SLOW = {
    "jury": (QA, ["--layers", "1", "--aggregator", "lr", "--llm", "fake:logprobs=0"], True),
    "dna-dynamic": (PAIRS, ["--method", "dna", "-O", "aspect_source=dynamic", "-O", "k=3"], True),
}
METHODS = FAST | SLOW
_trained: dict[str, Path] = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("metrics_models")


def artifact(work: Path, method: str) -> Path:
    """The method's artifact, trained with the fake LLM once per module."""
    key = f"{work}:{method}"
    if key not in _trained:
        (task, _), args, _ = METHODS[method]
        r = run_cli("train", "--task", task, *args, "--llm", "fake", "--cache-dir", work / "cache",
                    "-o", work / method, "-q")
        assert r.exit_code == 0, r.output
        _trained[key] = work / method
    return _trained[key]


def refused(r, art: Path, message: str) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"error: {art}/metrics.json: {message}", r.stderr


def check_refused(work: Path, tmp_path: Path, method: str, change, message: str) -> None:
    (_, new), _, reports = METHODS[method]
    art = edited_metrics(artifact(work, method), tmp_path / "art", change)
    with pytest.raises(ArtifactError) as err:
        load_artifact(art)
    assert str(err.value) == f"{art}/metrics.json: {message}"
    r = run_cli("apply", art, new, "-o", tmp_path / "out.jsonl", "--cache-dir", tmp_path / "cache")
    refused(r, art, message)
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "cache").exists()  # nothing asked
    if reports:
        r = run_cli("report", art, "-o", tmp_path / "report")
        refused(r, art, message)
        assert not (tmp_path / "report").exists()


def nan_at(path: str):
    # json.dumps writes NaN and json.loads reads it back: a file can hold it
    return set_field(path, float("nan"))


N, F, C = "a finite number or null", "a finite number", "a whole number (0 or more)"
# (method, tampering, change, the whole message after "<artifact>/metrics.json: ")
CASES = [
    # the fields every method writes: taken laxly before
    ("hdeval", "calls text", set_field("usage.calls", "5"), f"'usage.calls' must be {C}, got \"5\""),
    ("hdeval", "calls true", set_field("usage.calls", True), f"'usage.calls' must be {C}, got true"),
    # a count of calls or tokens is never negative (the report and the benchmark's totals add them)
    ("direct", "tokens negative", set_field("usage.prompt_tokens", -40), f"'usage.prompt_tokens' must be {C}, got -40"),
    ("paireval", "split count text", set_field("split.train", "12"), f"'split.train' must be {C}, got \"12\""),
    # a count's own words: a figure's ("or null") said null was taken, which a count refuses
    ("paireval", "split count null", set_field("split.train", None), f"'split.train' must be {C}, got null"),
    ("direct", "split count negative", set_field("split.train", -1), f"'split.train' must be {C}, got -1"),
    ("direct", "split count a fraction", set_field("split.test", 2.5), f"'split.test' must be {C}, got 2.5"),
    ("direct", "failure rate NaN", nan_at("failure_rate"), "'failure_rate': Input should be a finite number"),
    ("direct", "failure rate text", set_field("failure_rate", "0.1"), "'failure_rate': Input should be a valid number"),
    # a method's own fields
    ("hdeval", "spearman text", set_field("final.accuracy.spearman", "0.5"),
     f"'final.accuracy.spearman' must be {N}, got \"0.5\""),
    ("hdeval", "pearson true", set_field("layers.1.average.pearson", True),
     f"'layers.1.average.pearson' must be {N}, got true"),
    ("hdeval", "layer a superscript", lambda m: {**m, "layers": {"\u00b2": m["layers"]["1"]}},
     "'layers' must be keyed by layer number, got '\u00b2'"),
    ("hdeval", "why a number", set_field("final.average.why", 3), "'final.average.why' must be text or null, got 3"),
    ("hdeval", "final null", set_field("final", None), "'final' is missing, null or empty"),
    ("hdeval-pairwise", "w_ties false", set_field("final.w_ties", False), f"'final.w_ties' must be {N}, got false"),
    ("hdeval-pairwise", "importance text", set_field("importance.accuracy", "1"),
     f"'importance.accuracy' must be {F}, got \"1\""),
    ("dna", "tie margin true", set_field("tie_margin.value", True), f"'tie_margin.value' must be {N}, got true"),
    ("dna", "agreement NaN", nan_at("test.llm_weights.wo_ties"), f"'test.llm_weights.wo_ties' must be {N}, got NaN"),
    ("dna", "a static weight an object", set_field("mean_weights.accuracy", {"mean": 0.3, "instances": 2}),
     f"'mean_weights.accuracy' must be {F}, got {{\"mean\": 0.3, \"instances\": 2}}"),
    ("jury", "interval text", set_field("jury.intervals.learned.spearman", "0.5"),
     f"'jury.intervals.learned.spearman' must be {N}, got \"0.5\""),
    ("jury", "effective judges true", set_field("jury.effective_judges", True),
     f"'jury.effective_judges' must be {N}, got true"),
    ("jury", "jury mean NaN", nan_at("jury.baselines.jury_mean.average.spearman"),
     f"'jury.baselines.jury_mean.average.spearman' must be {N}, got NaN"),
    ("dna-dynamic", "a dynamic weight a number", set_field("mean_weights", {"tone": 0.3}),
     "'mean_weights.tone' must be a JSON object, got 0.3"),
    ("dna-dynamic", "a dynamic mean text", set_field("mean_weights", {"tone": {"mean": "0.3", "instances": 2}}),
     f"'mean_weights.tone.mean' must be {F}, got \"0.3\""),
    ("dna-dynamic", "a dynamic mean null", set_field("mean_weights", {"tone": {"mean": None, "instances": 2}}),
     "'mean_weights.tone.mean' is missing, null or empty"),
]


def _param(case):
    return pytest.param(*case, id=f"{case[0]}-{case[1]}",
                        marks=[pytest.mark.slow] if case[0] in SLOW else [])


@pytest.mark.parametrize("method,name,change,message", [_param(c) for c in CASES])
def test_a_wrong_type_is_one_line_naming_the_field(work, tmp_path, method, name, change, message):
    check_refused(work, tmp_path, method, change, message)


@pytest.mark.parametrize("method", [pytest.param(m, marks=[pytest.mark.slow] if m in SLOW else [])
                                    for m in METHODS])
def test_each_methods_artifact_loads_and_its_metrics_stay_the_dict(work, method):
    art = artifact(work, method)
    ev = load_artifact(art)
    assert type(ev.metrics) is dict
    assert ev.metrics == json.loads((art / "metrics.json").read_text(encoding="utf-8"))
    assert ev.metrics_model().model_validate(ev.metrics).split  # the model the load checked with


def test_a_dynamic_dna_weight_is_not_taken_by_a_static_artifact(work, tmp_path):
    # the shape of a weight depends on the artifact's own settings
    check_refused(work, tmp_path, "dna", set_field("mean_weights", {"tone": {"mean": 0.3, "instances": 2}}),
                  f"'mean_weights.tone' must be {F}, got {{\"mean\": 0.3, \"instances\": 2}}")


def test_a_huge_hostile_field_name_is_cut_and_cannot_add_a_line(work, tmp_path):
    key = "x\n" * 5000
    art = edited_metrics(artifact(work, "hdeval"), tmp_path / "art", set_field(f"final.{key}", "0.5"))
    with pytest.raises(ArtifactError) as err:
        load_artifact(art)
    line = str(err.value)
    assert "\n" not in line and len(line) < len(str(art)) + 300, line[:400]
    assert line.startswith(f"{art}/metrics.json: 'final.x\\nx\\n") and "...' must be a JSON object" in line


def test_a_plug_in_still_declaring_metrics_shape_is_told_it_is_no_longer_read() -> None:
    # the shape language was replaced by metrics_model(): an old plug-in's checks would go unseen
    from hdeval.methods.base import Fitted

    with pytest.warns(UserWarning, match=r"Old defines metrics_shape\(\), which hdeval no longer reads"):

        class Old(Fitted):
            def metrics_shape(self) -> dict:
                return {"final!": {}}


def test_numpy_counts_in_memory_read_as_the_same_file_values(work):
    # a method or a user fills metrics from pandas (numpy.int64); json.dump turns them into plain
    # ints, so ev.metrics must take them too, and still refuse a bool where a count belongs
    import numpy as np

    from hdeval.run.api import TrainedEvaluator

    ev = TrainedEvaluator(load_artifact(artifact(work, "hdeval")))
    on_disk = ev.metrics
    ev.fitted.metrics["usage"] = {k: np.int64(v) if type(v) is int else v
                                  for k, v in ev.fitted.metrics["usage"].items()}
    ev.fitted.metrics["split"] = {k: np.int64(v) if type(v) is int else v
                                  for k, v in ev.fitted.metrics["split"].items()}
    in_memory = ev.metrics
    assert in_memory == on_disk
    assert type(in_memory.usage["calls"]) is int
    ev.fitted.metrics["usage"]["calls"] = np.int64(-1)
    with pytest.raises(ArtifactError, match="'usage.calls' must be a whole number"):
        ev.metrics
    for bad in (True, np.bool_(True)):
        ev.fitted.metrics["usage"]["calls"] = bad
        with pytest.raises(ArtifactError, match="'usage.calls' must be a whole number"):
            ev.metrics


def test_numpy_counts_the_metrics_model_takes_are_saved_as_the_same_ints(work, tmp_path: Path):
    # ev.metrics takes numpy counts (a pandas count), so saving must write them: a crash in
    # json.dumps there made the in-memory evaluator one that cannot be saved
    import numpy as np

    from hdeval.run.api import TrainedEvaluator

    fitted = load_artifact(artifact(work, "hdeval"))
    plain = json.loads((artifact(work, "hdeval") / "metrics.json").read_text(encoding="utf-8"))
    fitted.metrics["usage"] = {k: np.int64(v) if type(v) is int else v for k, v in fitted.metrics["usage"].items()}
    fitted.metrics["split"] = {k: np.int64(v) if type(v) is int else v for k, v in fitted.metrics["split"].items()}
    in_memory = TrainedEvaluator(fitted).metrics
    fitted.save(tmp_path / "art")
    assert json.loads((tmp_path / "art" / "metrics.json").read_text(encoding="utf-8")) == plain
    assert TrainedEvaluator(load_artifact(tmp_path / "art")).metrics == in_memory
