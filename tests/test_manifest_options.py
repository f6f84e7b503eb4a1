"""The manifest records each method's own options under ``config.options`` (artifact format 3);
artifacts of format 2, which recorded HD-Eval's tree options flat for every method and a
method's other changed options under ``method_options``, still load, apply, report and start a
new run (``--tree``) exactly as the same run's format-3 artifact does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import TOY_DIALOGUE, TOY_TASK, run_cli, toy_pairs, toy_rows, write_jsonl

from hdeval.methods.base import Reports
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train

# The `config` sections the format-2 writer (hdeval before format 3) put in these runs'
# manifests, the run's temporary directory written as <tmp>.
V2_CONFIGS = Path(__file__).parent / "golden" / "manifest_v2_configs.json"

# name: (task (a built-in name, or TOML text written to <tmp>/task.toml), rows, train options)
CASES = {
    "hdeval": (TOY_TASK, toy_rows(), {"layers": 2, "children": 2, "aggregator": "lr"}),
    "paireval": (TOY_DIALOGUE, toy_rows(), {"method": "paireval", "comparisons": 2, "aggregator": "lr"}),
    "dna": ("faireval", toy_pairs(), {"method": "dna", "swap": True}),
    "hdeval-pairwise": ("faireval", toy_pairs(), {"layers": 1, "children": 2}),
}


def train_case(name: str, tmp: Path) -> Path:
    """Train one case with the fake LLM; its artifact's path."""
    task, rows, options = CASES[name]
    if "\n" in task:
        (tmp / "task.toml").write_text(task, encoding="utf-8")
        task = str(tmp / "task.toml")
    data = write_jsonl(tmp / "data.jsonl", rows)
    ev = train(task=task, data=str(data), llm="fake", cache_dir=str(tmp / "cache"), **options)
    return ev.save(tmp / "art")


def _as_v2(new: Path, old: Path, tmp: Path, name: str) -> None:
    """``old``: ``new`` with the manifest the format-2 writer gave the same run."""
    shutil.copytree(new, old)
    v2 = json.loads(V2_CONFIGS.read_text(encoding="utf-8"))[name]
    m = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    m = {**{k: v for k, v in m.items() if k not in ("state", "run")}, **m["state"], **m["run"]}  # one level
    m["format_version"] = 2
    m["config"] = json.loads(json.dumps(v2).replace("<tmp>", str(tmp)))
    (old / "manifest.json").write_text(json.dumps(m, indent=2), encoding="utf-8")


@pytest.mark.parametrize("name", list(CASES))
def test_the_manifest_records_the_methods_own_options_only(name, tmp_path):
    from hdeval.methods.registry import get_method

    m = json.loads((train_case(name, tmp_path) / "manifest.json").read_text())
    assert m["format_version"] == 4
    config = m["run"]["config"]
    method = get_method(m["method"])
    # every option of the method, at its default or not; no other method's, none flat
    assert set(config["options"]) == set(method.options.specs())
    for k, v in CASES[name][2].items():
        assert k == "method" or config["options"][k] == v
    for other in ("layers", "children", "top_k", "aggregator", "decompose_llm", "tree", "method_options"):
        assert other not in config
    v2 = json.loads(V2_CONFIGS.read_text())[name]
    shared = {k: v for k, v in v2.items() if k not in ("method_options", "layers", "children", "top_k",
                                                       "aggregator", "decompose_llm", "decompose_base_url", "tree")}
    assert {k: v for k, v in config.items() if k != "options"} == json.loads(
        json.dumps(shared).replace("<tmp>", str(tmp_path)))  # the shared options as before


@pytest.mark.parametrize("name", list(CASES))
def test_a_format_2_artifact_loads_applies_and_reports_as_format_3_does(name, tmp_path, fake_calls):
    new = train_case(name, tmp_path)
    old = tmp_path / "old"
    _as_v2(new, old, tmp_path, name)
    a, b = load_artifact(new), load_artifact(old)
    assert type(a) is type(b) and a.method_args() == b.method_args()
    assert b.method_args() == json.loads((old / "manifest.json").read_text())["method_args"]
    fake_calls.clear()
    outs = []
    for art in (new, old):
        out = tmp_path / f"{art.name}.jsonl"
        r = run_cli("apply", art, tmp_path / "data.jsonl", "-o", out, "--cache-dir", tmp_path / "cache", "-q")
        assert r.exit_code == 0, r.output
        outs.append(out.read_text())
    assert outs[0] == outs[1] and not fake_calls  # the same rows, and every reply from the cache
    if isinstance(a, Reports):
        pages = []
        for art in (new, old):
            r = run_cli("report", art, "-q", "--cache-dir", tmp_path / "cache")
            assert r.exit_code == 0, r.output
            page = json.loads((art / "report" / "report.json").read_text().replace(str(art), "<art>"))
            page.pop("created", None)  # when the report was made
            pages.append(page)
        assert pages[0] == pages[1]


def test_a_new_run_starts_from_a_format_2_artifacts_tree_as_from_a_format_3_one(tmp_path):
    new = train_case("hdeval", tmp_path)
    old = tmp_path / "old"
    _as_v2(new, old, tmp_path, "hdeval")
    runs = [train(task=str(tmp_path / "task.toml"), data=str(tmp_path / "data.jsonl"), llm="fake", layers=3,
                  children=2, aggregator="lr", tree=str(art), cache_dir=str(tmp_path / "cache")) for art in (new, old)]
    assert runs[0].metrics["final"] == runs[1].metrics["final"]
    assert runs[0].tree.to_dict() == runs[1].tree.to_dict()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["run"]["config"].update(options=["layers", 2]), "'config.options' is not an object"),
    (lambda m: m["run"].update(config="layers=2"), "'config' is not an object"),
    (lambda m: m.update(run=["seed", 0]), "'run' must be a JSON object"),
    (lambda m: m.update(state="features"), "'state' must be a JSON object"),
    (lambda m: m.update(features=["a"]), "unknown field 'features' \\(a format-4 manifest holds the header"),
])
def test_a_malformed_options_record_is_refused_on_load(edit, message, tmp_path):
    from hdeval.core.errors import ArtifactError

    art = train_case("hdeval", tmp_path)
    m = json.loads((art / "manifest.json").read_text())
    edit(m)
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=message):
        load_artifact(art)


@pytest.mark.parametrize("options, message", [
    ({"layers": "x"}, "--layers must be a whole number, got 'x'"),
    ({"layers": {"a": [1, 2]}}, "--layers must be a whole number"),
    ({"aggregator": ["lr"]}, "--aggregator must be"),
    ({"top_k": 0}, "--top-k must be at least 1"),
    ({"decompose_llm": {"model": 1}}, "--decompose-llm must be text"),
    ({"tree": "x" * 10 + "\n" * 3, "layers": True}, "--layers must be a whole number, got True"),
])
@pytest.mark.parametrize("route", ["load", "class-load", "apply"])
def test_a_hostile_options_record_is_refused_in_one_line(options, message, route, tmp_path):
    """The record feeds method_args (re-saved with the artifact) and the report: a wrong-typed
    value is refused where the artifact is opened, naming the manifest and the option."""
    from hdeval.core.errors import ArtifactError
    from hdeval.methods.hdeval.evaluator import Evaluator

    art = train_case("hdeval", tmp_path)
    m = json.loads((art / "manifest.json").read_text())
    m["run"]["config"]["options"].update(options)
    (art / "manifest.json").write_text(json.dumps(m))
    if route == "apply":
        r = run_cli("apply", art, tmp_path / "data.jsonl", "-o", tmp_path / "out.jsonl", "-q")
        assert r.exit_code != 0 and not (tmp_path / "out.jsonl").exists()
        assert f"{art / 'manifest.json'}: config.options: " in r.output and message in r.output
        return
    with pytest.raises(ArtifactError, match="config.options: " + __import__("re").escape(message)):
        (load_artifact if route == "load" else Evaluator.load)(art)


@pytest.mark.parametrize("name", ["dna", "paireval"])
def test_a_format_2_record_of_another_methods_options_is_not_refused(name, tmp_path):
    # format 2 recorded HD-Eval's tree options flat for every method: not this method's options
    new = train_case(name, tmp_path)
    _as_v2(new, tmp_path / "old", tmp_path, name)
    m = json.loads((tmp_path / "old" / "manifest.json").read_text())
    assert "layers" in m["config"]
    assert type(load_artifact(tmp_path / "old")) is type(load_artifact(new))


@pytest.mark.parametrize("name", ["hdeval", "paireval"])
def test_a_format_3_artifact_with_state_and_run_at_the_top_level_loads_as_format_4(name, tmp_path):
    # format 4 keeps the method's state and the run record under their own keys; format 3 kept
    # them beside the header, and such an artifact loads to the same evaluator
    new = train_case(name, tmp_path)
    old = tmp_path / "old"
    shutil.copytree(new, old)
    m = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    flat = {**{k: v for k, v in m.items() if k not in ("state", "run")}, **m["state"], **m["run"],
            "format_version": 3}
    (old / "manifest.json").write_text(json.dumps(flat, indent=2), encoding="utf-8")
    a, b = load_artifact(new), load_artifact(old)
    assert type(a) is type(b) and a.method_args() == b.method_args() and a.run == b.run
    assert a.training_ids() == b.training_ids() and a.training_ids()
    saved = json.loads((b.save(tmp_path / "again") / "manifest.json").read_text())  # read old, write new
    assert saved["format_version"] == 4 and saved["state"] == m["state"] and saved["run"] == m["run"]
