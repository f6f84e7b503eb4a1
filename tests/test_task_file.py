"""A task file is read by its pydantic models (hdeval.data.task_file): an unknown key in any of its
tables is one line naming the file, the table and the key, with the known key it is closest to;
a blank optional value means "not set"."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TOY_TASK

from hdeval.core.errors import ConfigError
from hdeval.data.tasks import load_task


def _task(tmp_path: Path, old: str, new: str) -> Path:
    assert old in TOY_TASK
    path = tmp_path / "task.toml"
    path.write_text(TOY_TASK.replace(old, new, 1), encoding="utf-8")
    return path


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_task(str(path))
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("old,new,expected", [
    # the second aspect's table, a misspelt key
    ('key = "accuracy"', 'key = "accuracy"\ndefinitoin = "x"', "aspects #2 has unknown key(s) definitoin; "
                                                               "did you mean 'definition'?"),
    ('label = "Question"', 'label = "Question"\nlable = "Q"', "fields #1 has unknown key(s) lable; "
                                                             "did you mean 'label'?"),
    ('output_label = "Answer"', 'output_label = "Answer"\nskip_empti = true', "unknown key(s) skip_empti; "
                                                                             "did you mean 'skip_empty'?"),
    ('output_label = "Answer"', 'output_label = "Answer"\nowner = "me"', "unknown key(s) owner"),
])
def test_an_unknown_key_names_its_table_and_the_closest_known_key(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    msg = _refused(_task(tmp_path, old, new))
    assert msg.endswith(expected), msg


def test_an_unknown_key_in_a_preset_or_the_columns_table_is_refused(tmp_path: Path) -> None:
    preset = TOY_TASK + '\n[presets.short]\naspects = ["clarity"]\nown_regresor = ["clarity"]\n'
    path = tmp_path / "preset.toml"
    path.write_text(preset, encoding="utf-8")
    msg = _refused(path)
    assert "presets.short has unknown key(s) own_regresor" in msg and "did you mean 'own_regressor'?" in msg

    columns = TOY_TASK + '\n[columns]\nsource = "question"\nanswer = "reply"\n'
    path.write_text(columns, encoding="utf-8")
    assert "columns: unknown key 'answer'" in _refused(path)


def test_a_wrong_value_inside_a_table_names_the_aspect_and_key(tmp_path: Path) -> None:
    msg = _refused(_task(tmp_path, 'definition = "How correct the answer is."', "definition = 3"))
    assert msg.endswith("aspect 'accuracy' has a number as 'definition'; it must be non-empty text"), msg


def test_blank_optional_text_means_not_set(tmp_path: Path) -> None:
    path = _task(tmp_path, 'output_label = "Answer"', 'output_label = "  "\ndata_file = ""')
    path.write_text(path.read_text(encoding="utf-8").replace('name = "Clarity"', 'name = ""'), encoding="utf-8")
    task = load_task(str(path))
    assert task.output_label == "Output" and task.data_file == "toy_qa.jsonl"
    assert task.aspects[0].name == "Clarity" and task.aspects[0].range == (1.0, 5.0)


def test_presets_where_and_columns_are_read_in_the_files_order(tmp_path: Path) -> None:
    path = tmp_path / "full.toml"
    path.write_text(
        TOY_TASK
        + '\n[presets.short]\naspects = ["accuracy", "clarity"]\nown_regressor = ["clarity"]\n'
        + '\n[columns]\noutput = "reply"\nsource = "question"\nscores = { accuracy = "acc" }\n',
        encoding="utf-8",
    )
    task = load_task(str(path))
    assert task.presets == (("short", ("accuracy", "clarity"), ("clarity",)),)
    assert task.columns == (("output", "reply"), ("source", "question"), ("scores.accuracy", "acc"))


@pytest.mark.parametrize("columns,named", [({"scores": None}, "scores"), ({"output": None}, "output")])
def test_a_null_column_in_a_manifests_task_is_one_line_not_a_crash(columns: dict, named: str) -> None:
    # an artifact's manifest is JSON (untrusted: it may be edited), so unlike TOML it can hold null;
    # the task's columns were read as "not given" and then used (an AttributeError, or None as a column)
    import tomllib

    from hdeval.data.tasks import task_from_dict

    raw = {**tomllib.loads(TOY_TASK), "columns": columns}
    with pytest.raises(ConfigError) as err:
        task_from_dict(raw, where="art/manifest.json")
    msg = str(err.value)
    assert msg.startswith("art/manifest.json: columns") and named in msg and "\n" not in msg, msg


def test_an_artifact_whose_manifest_task_has_null_columns_is_refused_in_one_line(tmp_path: Path) -> None:
    import json
    import shutil

    from hdeval.core.errors import HdevalError
    from hdeval.methods.registry import load_artifact

    art = tmp_path / "art"
    shutil.copytree(Path(__file__).parent / "golden" / "dna_artifact_margin_v1", art)
    manifest = json.loads((art / "manifest.json").read_text(encoding="utf-8"))
    manifest["task"]["columns"] = {"scores": None}
    (art / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(HdevalError) as err:  # the CLI prints it as one line
        load_artifact(art)
    msg = str(err.value)
    assert "manifest.json" in msg and "columns: scores" in msg and "\n" not in msg, msg


def test_an_unknown_key_with_line_breaks_in_a_manifests_task_is_one_line() -> None:
    import tomllib

    from hdeval.data.tasks import task_from_dict

    raw = {**tomllib.loads(TOY_TASK), "evil\nerror: all is well\x1b[2J": 1}
    with pytest.raises(ConfigError) as err:
        task_from_dict(raw, where="art/manifest.json")
    msg = str(err.value)
    assert msg.startswith("art/manifest.json: unknown key(s) ") and msg.isprintable(), msg
