"""A format-4 manifest is a pydantic model (``hdeval.artifact.manifest_file.Manifest``): a
hand-edited or hostile header, run record or file list (a wrong type, an unknown key, a huge
value) is one ArtifactError line naming manifest.json and the field, from the Python API and
from the CLI."""


from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TOY_TASK, edited_artifact, refused_in_one_line, toy_rows, write_jsonl

from hdeval.run.train import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A direct artifact (the quickest to train) and its data."""
    tmp = tmp_path_factory.mktemp("direct")
    (tmp / "task.toml").write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp / "data.jsonl", toy_rows())
    ev = train(task=str(tmp / "task.toml"), data=str(data), llm="fake", method="direct",
               cache_dir=str(tmp / "cache"))
    return ev.save(tmp / "art"), data


def _edited(trained, tmp_path: Path, change) -> tuple[Path, Path]:
    """A copy of the artifact whose manifest ``change`` edited; (artifact, data)."""
    src, data = trained
    return edited_artifact(src, tmp_path, change), data


# ------------------------------------------------------------------ the manifest itself
@pytest.mark.parametrize("edit, says", [
    (lambda m: m["run"].update(seed="0"), "'run.seed': Input should be a valid integer"),
    (lambda m: m["run"].update(seed=10**30), "'run.seed': Input should be less than"),
    (lambda m: m["run"].update(notes="mine"), "unknown field 'run.notes'"),
    (lambda m: m["run"]["split"].update(train=[1, 2]), "'run.split.train.0': Input should be a valid string"),
    (lambda m: m.update(method_args=[]), "'method_args': Input should be a valid dictionary"),
    (lambda m: m["versions"].update(numpy=2), "'versions.numpy': Input should be a valid string"),
    (lambda m: m.pop("created"), "'created': Field required"),
    (lambda m: m["files"].update({"x.txt": "not hex"}), "the checksum of 'x.txt' is not a sha256 hex digest"),
    (lambda m: m["files"].update({"x" * 2000: "0" * 64}), "String should have at most 1024 characters"),
    (lambda m: m["files"].update({f"f{i}": "0" * 64 for i in range(1001)}),
     "'files' must map at most 1000 file names to checksums"),
])
def test_a_hostile_manifest_is_one_line_naming_the_field(edit, says, trained, tmp_path):
    art, data = _edited(trained, tmp_path, edit)
    refused_in_one_line(art, data, tmp_path, says)
