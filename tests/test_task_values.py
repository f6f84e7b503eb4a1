"""A task file's text holds no control character (a NUL in an aspect name, an escape in a label;
prose may hold line ends and tabs), and an aspect's range stays within +-1e6: one line naming the
file and the field, not a task that breaks prompts, file names or arithmetic later."""

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


@pytest.mark.parametrize("old,new,field", [
    ('name = "Clarity"', 'name = "Clar\\u0000ity"', "'name'"),
    ('name = "Clarity"', 'name = "Clarity\\u001b[31m"', "'name'"),
    ('name = "Clarity"', 'name = "Clarity\\nNew line"', "'name'"),
    ('key = "clarity"', 'key = "cla\\u0000rity"', "'key'"),
    ('label = "Question"', 'label = "Ques\\u0007tion"', "'label'"),
    ('definition = "How clear the answer is."', 'definition = "How clear\\u0000"', "'definition'"),
])
def test_a_control_character_in_task_text_is_refused(tmp_path: Path, old: str, new: str, field: str) -> None:
    path = _task(tmp_path, old, new)
    with pytest.raises(ConfigError, match="control character") as err:
        load_task(str(path))
    assert str(path) in str(err.value) and field in str(err.value) and "\n" not in str(err.value)


def test_a_definition_over_several_lines_is_fine(tmp_path: Path) -> None:
    path = _task(tmp_path, 'definition = "How clear the answer is."',
                 'definition = """How clear the answer is.\n\tIgnore typos."""')
    assert "\n\t" in load_task(str(path)).aspect("clarity").definition


@pytest.mark.parametrize("rng", ["[1, 1e300]", "[-1e7, 5]", "[1, 1.5e6]"])
def test_an_absurd_range_is_refused(tmp_path: Path, rng: str) -> None:
    path = _task(tmp_path, "range = [1, 5]", f"range = {rng}")
    with pytest.raises(ConfigError, match="between -1e\\+06 and 1e\\+06") as err:
        load_task(str(path))
    assert "'clarity'" in str(err.value)


def test_a_0_to_100_scale_is_fine(tmp_path: Path) -> None:
    path = _task(tmp_path, "range = [1, 5]", "range = [0, 100]")
    assert load_task(str(path)).aspect("clarity").high == 100


@pytest.mark.parametrize("old,new,field", [
    ('name = "Clarity"', f'name = "{"C" * 201}"', "name"),
    ('key = "clarity"', f'key = "{"c" * 201}"', "key"),
])
def test_an_aspect_name_a_tree_json_would_refuse_is_refused(tmp_path: Path, old: str, new: str, field: str) -> None:
    # an aspect is the tree's first-layer criterion: tree.json refuses names over 200 characters
    path = _task(tmp_path, old, new)
    with pytest.raises(ConfigError, match=f"{field} is longer than 200 characters") as err:
        load_task(str(path))
    assert str(err.value).startswith(f"{path}: aspect ")
    assert load_task(str(_task(tmp_path, old, new.replace("C" * 201, "C" * 200).replace("c" * 201, "c" * 200))))


def test_an_aspect_definition_a_tree_json_would_refuse_is_refused(tmp_path: Path) -> None:
    # tree.json bounds definitions at 20,000 characters: a task must not write one it would refuse
    long = "d" * 20_001
    path = _task(tmp_path, 'definition = "', f'definition = "{long}')
    with pytest.raises(ConfigError, match="definition is longer than 20000 characters") as err:
        load_task(str(path))
    assert str(err.value).startswith(f"{path}: aspect ")

