"""Every built-in method's state is a strict pydantic model (``State``), checked when its
artifact is loaded: a hand-edited or hostile state (a wrong type, an unknown key, a huge value) is
one ArtifactError line naming manifest.json and the field, from the Python API and from the CLI;
artifacts of formats 1-3 still load (a state field an older hdeval wrote is left out, not
refused), and every method's artifact loads, scores and saves its state unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import (
    TOY_DIALOGUE,
    TOY_TASK,
    edited_artifact,
    refused_in_one_line,
    run_cli,
    toy_pairs,
    toy_rows,
    write_jsonl,
)
from simjudge import pointwise_rows, write_pointwise

from hdeval.core.errors import ArtifactError
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train

# name: (task (TOML text, or a built-in name), rows, train options); the jury is trained apart
CASES = {
    "direct": (TOY_TASK, toy_rows(), {"method": "direct"}),
    "direct-yesno": (TOY_TASK, toy_rows(), {"method": "direct-yesno"}),
    "paireval": (TOY_DIALOGUE, toy_rows(), {"method": "paireval", "comparisons": 2, "aggregator": "lr"}),
    "hdeval": (TOY_TASK, toy_rows(), {"layers": 1, "children": 2, "aggregator": "lr"}),
    "hdeval-pairwise": ("faireval", toy_pairs(), {"layers": 1, "children": 2}),
    "dna": ("faireval", toy_pairs(), {"method": "dna", "swap": True}),
}
METHODS = [*CASES, "jury"]
# the per-method cases train an artifact each: only direct's run by default
SLOW = {m: () if m == "direct" else (pytest.mark.slow,) for m in METHODS}


def _train(name: str, tmp: Path) -> tuple[Path, Path]:
    """Train ``name`` with the fake LLM; (its artifact, its data file)."""
    if name == "jury":
        task, data = write_pointwise(tmp, pointwise_rows(n_docs=12))
        jury = tmp / "jury.toml"
        jury.write_text('[[judge]]\nname = "a"\nllm = "fake"\n'
                        '[[judge]]\nname = "b"\nllm = "fake:logprobs=0"\n')
        ev = train(task=str(task), data=str(data), jury=str(jury), layers=1, aggregator="lr",
                   cache_dir=str(tmp / "cache"))
        return ev.save(tmp / "art"), data
    task, rows, options = CASES[name]
    if "\n" in task:
        (tmp / "task.toml").write_text(task, encoding="utf-8")
        task = str(tmp / "task.toml")
    data = write_jsonl(tmp / "data.jsonl", rows)
    ev = train(task=task, data=str(data), llm="fake", cache_dir=str(tmp / "cache"), **options)
    return ev.save(tmp / "art"), data


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    made: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in made:
            made[name] = _train(name, tmp_path_factory.mktemp(name.replace("-", "_")))
        return made[name]

    return get


def _edited(trained, name: str, tmp_path: Path, change) -> tuple[Path, Path]:
    """A copy of ``name``'s artifact whose manifest ``change`` edited; (artifact, data)."""
    src, data = trained(name)
    return edited_artifact(src, tmp_path, change), data


# ------------------------------------------------------------------ every method's state
@pytest.mark.parametrize("name", [pytest.param(m, marks=SLOW[m]) for m in METHODS])
def test_an_unknown_state_field_is_one_line_naming_it(name, trained, tmp_path):
    art, data = _edited(trained, name, tmp_path, lambda m: m["state"].update(weights=[1, 2]))
    refused_in_one_line(art, data, tmp_path, "state field 'weights': Extra inputs are not permitted")


@pytest.mark.parametrize("name", [pytest.param(m, marks=SLOW[m]) for m in METHODS])
def test_a_wrongly_typed_state_field_is_one_line_naming_it(name, trained, tmp_path):
    def change(m: dict) -> None:
        first = sorted(m["state"]["prompts"])[0]
        m["state"]["prompts"][first] = 12345
        change.field = f"prompts.{first}"

    art, data = _edited(trained, name, tmp_path, change)
    refused_in_one_line(art, data, tmp_path, f"state field {change.field!r}", "string")


@pytest.mark.parametrize("name, edit, field", [
    pytest.param("paireval", lambda s: s["aggregator"].update(random_state=10**30), "aggregator.random_state",
                 marks=pytest.mark.slow),
    pytest.param("paireval", lambda s: s.update(comparison_source=["train"]), "comparison_source",
                 marks=pytest.mark.slow),
    pytest.param("hdeval", lambda s: s["aggregator"].update(random_state="0"), "aggregator.random_state",
                 marks=pytest.mark.slow),
    pytest.param("hdeval", lambda s: s["layers"][0].update(layer="1"), "layers.0.layer",
                 marks=pytest.mark.slow),
    pytest.param("hdeval", lambda s: s["layers"][0].update(colour="red"), "layers.0.colour",
                 marks=pytest.mark.slow),
    pytest.param("hdeval", lambda s: s.update(features=["c"] * 100_001), "features",
                 marks=pytest.mark.slow),
    pytest.param("hdeval", lambda s: s.update(decompose_llm={"model": "x"}), "decompose_llm.base_url",
                 marks=pytest.mark.slow),
    pytest.param("hdeval-pairwise", lambda s: s.update(shape="pointwise"), "shape", marks=pytest.mark.slow),
    pytest.param("hdeval-pairwise", lambda s: s["classifier"].update(weights=[0.5]), "classifier.weights",
                 marks=pytest.mark.slow),
    pytest.param("jury", lambda s: s["jury"].update(kept="a"), "jury.kept", marks=pytest.mark.slow),
    pytest.param("direct", lambda s: s.update(prompts={"score": "0" * 10_000}), "prompts.score"),
])
def test_a_hostile_state_value_is_one_line_naming_its_field(name, edit, field, trained, tmp_path):
    art, data = _edited(trained, name, tmp_path, lambda m: edit(m["state"]))
    refused_in_one_line(art, data, tmp_path, repr(field))


def test_a_format_3_manifest_keeps_a_field_an_older_hdeval_wrote(trained, tmp_path):
    """One level, as formats 1-3 were written: a field the state model does not know (here one an
    older writer might have left) is left out, not refused; a wrong type still is."""

    def flatten(m: dict) -> None:
        state, run = m.pop("state"), m.pop("run")
        m.update(state, **run, format_version=3, prompt_digest="0" * 64)

    art, data = _edited(trained, "direct", tmp_path, flatten)
    ev = load_artifact(art)
    assert ev.method == "direct" and ev.run["seed"] == 0
    out = tmp_path / "out.jsonl"
    r = run_cli("apply", art, data, "-o", out, "--cache-dir", tmp_path / "c", "-q")
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == len(toy_rows())
    m = json.loads((art / "manifest.json").read_text())
    m["prompts"] = {"score": 5}
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"manifest.json: state field 'prompts.score'"):
        load_artifact(art)


@pytest.mark.parametrize("name", [pytest.param(m, marks=SLOW[m]) for m in METHODS])
def test_every_methods_artifact_loads_scores_and_saves_its_state_unchanged(name, trained, tmp_path):
    src, data = trained(name)
    ev = load_artifact(src)
    out = tmp_path / "out.jsonl"
    r = run_cli("apply", src, data, "-o", out, "--cache-dir", tmp_path / "c", "-q")
    assert r.exit_code == 0, r.output
    assert out.read_text().count("\n") == len(data.read_text().splitlines())
    again = ev.save(tmp_path / "again")
    old, new = (json.loads((p / "manifest.json").read_text()) for p in (src, again))
    assert new["state"] == old["state"] and new["run"] == old["run"]
    # every file comes along: a re-save dropped scores.csv, which reports and SHAP read
    assert set(new["files"]) == set(old["files"])
    if "scores.csv" in old["files"]:
        assert (again / "scores.csv").read_bytes() == (src / "scores.csv").read_bytes()


def test_saving_a_loaded_artifact_over_itself_keeps_its_scores_and_refuses_a_changed_one(trained, tmp_path):
    src, _ = trained("direct")
    art = tmp_path / "art"
    shutil.copytree(src, art)
    before = (art / "scores.csv").read_bytes()
    load_artifact(art).save(art, force=True)
    assert (art / "scores.csv").read_bytes() == before
    ev = load_artifact(art)
    (art / "scores.csv").write_text("sample_id,split\nforged,train\n")  # after the load's check
    with pytest.raises(ArtifactError, match=r"scores.csv changed or went missing since the artifact was loaded"):
        ev.save(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
