"""A tampered metrics.json is refused on load in one line naming the file and the field.

An artifact is shared between teams: its metrics.json may be valid JSON of the wrong shape with
the manifest's checksum updated to match. Before, ``hdeval report`` then stopped with a Python
traceback (AttributeError, TypeError, ValueError from deep in the page or a plot), and every
command took a metrics.json that is not an object as no figures at all.
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
# method name: (task file and new samples, train arguments, `hdeval report` draws it)
METHODS = {
    "hdeval": (QA, ["--layers", "1", "--aggregator", "lr"], True),
    "hdeval-pairwise": (PAIRS, ["--layers", "1", "--aggregator", "lr"], True),
    "paireval": (QA, ["--method", "paireval", "--comparisons", "1"], False),
    "direct": (QA, ["--method", "direct"], False),
    "direct-yesno": (QA, ["--method", "direct-yesno"], False),
    "dna": (PAIRS, ["--method", "dna"], True),
    "dna-swap": (PAIRS, ["--method", "dna", "--swap"], True),
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("metrics")
    out = {}
    for name, ((task, _), args, _) in METHODS.items():
        r = run_cli("train", "--task", task, *args, "--llm", "fake", "--cache-dir", work / "cache",
                    "-o", work / name, "-q")
        assert r.exit_code == 0, r.output
        out[name] = work / name
    return out


tampered, put = edited_metrics, set_field


def drop(key: str):
    return lambda m: {k: v for k, v in m.items() if k != key}


N = "a finite number or null"
# (method, tampering, change, what the one error line says after "<artifact>/metrics.json: ")
CASES = [
    *[(m, "not an object", lambda _: [], "must be a JSON object, got []") for m in METHODS],
    *[(m, "null", lambda _: None, "must be a JSON object, got null") for m in ("paireval", "direct", "direct-yesno")],
    ("hdeval", "empty", lambda _: {}, "'final' is missing, null or empty"),
    ("hdeval", "final a number", put("final", 5), "'final' must be a JSON object, got 5"),
    ("hdeval", "final average text", put("final.average", "x"), "'final.average' must be a JSON object, got \"x\""),
    ("hdeval", "a figure text", put("final.average.spearman", "x"), f"'final.average.spearman' must be {N}, got \"x\""),
    ("hdeval", "a figure NaN", put("direct_layer1.clarity.pearson", float("nan")),
     f"'direct_layer1.clarity.pearson' must be {N}, got NaN"),
    ("hdeval", "no layers", drop("layers"), "'layers' is missing, null or empty"),
    ("hdeval", "no layer tables", lambda m: {"final": m["final"], "layers": {}}, "'layers' is missing, null or empty"),
    ("hdeval", "layer not a number", lambda m: {**m, "layers": {"one": m["layers"]["1"]}},
     "'layers' must be keyed by layer number, got 'one'"),
    # str.isdigit takes it, int() (the report's layer order) does not
    ("hdeval", "layer a superscript digit", lambda m: {**m, "layers": {"\u00b2": m["layers"]["1"]}},
     "'layers' must be keyed by layer number, got '\u00b2'"),
    ("hdeval", "baseline table text", put("mean_subtree.average", "x"), "'mean_subtree.average' must be a JSON object"),
    ("hdeval-pairwise", "final a number", put("final", 5), "'final' must be a JSON object, got 5"),
    ("hdeval-pairwise", "split text", put("split.train", "x"), f"'split.train' must be a whole number (0 or more), got \"x\""),
    ("hdeval-pairwise", "layer figure text", put("layers.1.wo_ties", "x"), f"'layers.1.wo_ties' must be {N}"),
    ("hdeval-pairwise", "importance null", put("importance.accuracy", None),
     "'importance.accuracy' must be a finite number, got null"),
    ("hdeval-pairwise", "confusion text", put("final.confusion.a", "x"), "'final.confusion.a' must be a JSON object"),
    ("dna", "no test figures", drop("test"), "'test' is missing, null or empty"),
    ("dna", "test text", put("test", "x"), "'test' must be a JSON object, got \"x\""),
    ("dna", "agreement text", put("test.llm_weights.wo_ties", "x"), f"'test.llm_weights.wo_ties' must be {N}"),
    ("dna-swap", "consistency text", put("position_consistency", "x"), f"'position_consistency' must be {N}"),
    ("dna-swap", "test consistency text", put("test.position_consistency", "x"),
     "'test.position_consistency' must be a finite number or null"),
    ("dna", "weight text", put("mean_weights.accuracy", "x"), "'mean_weights.accuracy' must be a finite number"),
    ("dna", "flip rate text", put("swap_flip_rate", "x"), f"'swap_flip_rate' must be {N}, got \"x\""),
    ("dna", "primary a list", put("primary", [1]), "'primary' must be text or null, got [1]"),
    ("dna", "margin figure text", put("tie_margin.train_w_ties", "x"), f"'tie_margin.train_w_ties' must be {N}"),
    ("dna", "split text", put("split.test", "x"), f"'split.test' must be a whole number (0 or more)"),
    # fields every method writes, which no method's own shape lists: the Metrics model checks them
    ("hdeval", "usage text", put("usage.calls", "many"), "'usage.calls' must be a whole number (0 or more)"),
    ("direct", "no split", drop("split"), "'split': Field required"),
    ("paireval", "failure rate text", put("failure_rate", "low"), "'failure_rate': Input should be a valid number"),
]


def refused(r, art: Path, message: str) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {art}/metrics.json: {message}"), r.stderr


@pytest.mark.parametrize("method,name,change,message", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_tampered_metrics_file_is_one_line_naming_the_field(artifacts, tmp_path, method, name, change, message):
    (task, new), _, reports = METHODS[method]
    art = tampered(artifacts[method], tmp_path / "art", change)
    if reports:
        r = run_cli("report", art, "-o", tmp_path / "report")
        refused(r, art, message)
        assert not (tmp_path / "report").exists() and not (art / "report").exists()
    r = run_cli("apply", art, new, "-o", tmp_path / "out.jsonl", "--cache-dir", tmp_path / "cache")
    refused(r, art, message)
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "cache").exists()  # nothing asked


def test_explain_and_the_python_api_refuse_it_too(artifacts, tmp_path):
    from hdeval.methods.hdeval.evaluator import Evaluator

    art = tampered(artifacts["hdeval"], tmp_path / "art", put("final.average", "x"))
    r = run_cli("explain", art, "--sample", "new-qa-0", "--data", QA[1], "--cache-dir", tmp_path / "cache")
    refused(r, art, "'final.average' must be a JSON object, got \"x\"")
    with pytest.raises(ArtifactError, match=r"metrics.json: 'final.average' must be a JSON object"):
        Evaluator.load(art)


def test_a_field_name_from_the_file_cannot_add_a_line(artifacts, tmp_path):
    art = tampered(artifacts["hdeval"], tmp_path / "art", put("final.a\nb", "x"))
    with pytest.raises(ArtifactError) as err:
        load_artifact(art)
    assert "\n" not in str(err.value) and "'final.a\\nb' must be" in str(err.value)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_todays_artifacts_and_their_nulls_load(artifacts, tmp_path, method):
    # a correlation or agreement that could not be computed is written as null: still loads
    ev = load_artifact(artifacts[method])
    assert ev.metrics == json.loads((artifacts[method] / "metrics.json").read_text(encoding="utf-8"))
    key = {"hdeval": "final.average.spearman", "hdeval-pairwise": "final.wo_ties", "dna": "test.learned.w_ties"}
    if method in key:
        assert load_artifact(tampered(artifacts[method], tmp_path / "art", put(key[method], None))).metrics


def test_an_older_dna_artifact_still_loads():
    # format 2, written before the learned tie margin's own fields (tests/test_dna.py reads it too)
    ev = load_artifact(REPO / "tests" / "golden" / "dna_artifact_margin_v1")
    assert ev.metrics["test"]


def test_a_dna_report_with_a_consistency_but_a_null_flip_rate_is_drawn(artifacts, tmp_path):
    # both are fine alone (null: not measured); together the page formatted the null as a number
    art = tampered(artifacts["dna"], tmp_path / "art", lambda m: {**m, "position_consistency": 0.9,
                                                                   "swap_flip_rate": None})
    r = run_cli("report", art, "-o", tmp_path / "report")
    assert r.exit_code == 0, r.output
    assert "swap flip rate 0.100" in (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
