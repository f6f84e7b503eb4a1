"""Nothing trusted blindly: ``hdeval apply`` on tampered, truncated, foreign or future artifacts.

One artifact is trained (fake LLM, real sfres slice) and copied per test; each test damages
its copy the way a disk, a careless edit or a hostile file would, then runs the real
``hdeval apply`` command. A damaged artifact must be refused with exit code != 0 and exactly
one ``error: ...`` line, before any LLM call and without turning a byte of an untrusted
file into objects; a harmless wording edit of ``tree.json`` only warns.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Callable, Iterator

import pytest
import skops.io as sio
from click.testing import CliRunner, Result
from conftest import data_file
from sklearn.preprocessing import FunctionTransformer

from hdeval.artifact.directory import FORMAT_VERSION, MANIFEST, sha256_file
from hdeval.cli import cli
from hdeval.methods.hdeval.evaluator import MODEL, TRUSTED_TYPES
from hdeval.run.train import train

MARKER = "hdeval-untrusted-code-ran"  # a file the hostile payloads below would create


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a decision tree aggregator: its sklearn Tree type is one of the explicitly trusted ones
    ev = train(task="sfres", data=str(data_file()), llm="fake", limit=40, layers=2, aggregator="dt",
               cache_dir=str(tmp_path_factory.mktemp("cache")))
    return ev.save(tmp_path_factory.mktemp("trained") / "artifact")


@pytest.fixture
def artifact(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "artifact"))


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    path = tmp_path / "new.jsonl"
    with data_file().open(encoding="utf-8") as fh:
        path.write_text("".join(next(fh) for _ in range(6)), encoding="utf-8")
    return path




def apply(artifact: Path, samples: Path, tmp_path: Path) -> Result:
    return CliRunner().invoke(cli, ["apply", str(artifact), str(samples), "-o", str(tmp_path / "scored.jsonl"),
                                    "--llm", "fake", "--cache-dir", str(tmp_path / "cache")])


def refused(result: Result, tmp_path: Path) -> str:
    """The one error line of a refused artifact (after checking that it was refused cleanly)."""
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not (tmp_path / "scored.jsonl").exists()
    return lines[0]


def rewrite_checksum(artifact: Path, name: str) -> None:
    """Make the manifest agree with a changed file, so only a deeper check can stop it."""
    manifest = json.loads((artifact / MANIFEST).read_text())
    manifest["files"][name] = sha256_file(artifact / name)
    (artifact / MANIFEST).write_text(json.dumps(manifest))


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


# -- the control ----------------------------------------------------------------------------


def test_intact_artifact_applies(artifact: Path, samples: Path, tmp_path: Path) -> None:
    result = apply(artifact, samples, tmp_path)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(set(r["scores"]) == {"informativeness", "naturalness", "quality"} for r in rows)


# -- checksums -----------------------------------------------------------------------------


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "metrics edited": (
        lambda a: edit_json(a / "metrics.json", lambda m: m["final"]["average"].update(spearman=0.99)),
        "metrics.json does not match its checksum",
    ),
    "aggregator bit flip": (lambda a: flip_a_byte(a / MODEL), "aggregator.skops does not match its checksum"),
    "aggregator truncated": (lambda a: truncate(a / MODEL), "aggregator.skops does not match its checksum"),
    "prompt edited": (
        lambda a: (a / "prompts" / "score.toml").write_text(
            (a / "prompts" / "score.toml").read_text().replace("strict evaluator", "generous evaluator")),
        "prompts/score.toml does not match its checksum",
    ),
    "scores table truncated": (lambda a: truncate(a / "scores.csv"), "scores.csv does not match its checksum"),
    "aggregator missing": (lambda a: (a / MODEL).unlink(), "aggregator.skops is missing"),
    "metrics missing": (lambda a: (a / "metrics.json").unlink(), "metrics.json is missing"),
    "prompt missing": (lambda a: (a / "prompts" / "score.toml").unlink(), "prompts/score.toml is missing"),
    "tree missing": (lambda a: (a / "tree.json").unlink(), "tree.json is missing"),
    "manifest missing": (lambda a: (a / MANIFEST).unlink(), "manifest.json is missing"),
    "manifest not json": (lambda a: truncate(a / MANIFEST), "manifest.json: unreadable"),
    # valid JSON Python will not read: an integer longer than int() converts
    "manifest number too long": (lambda a: (a / MANIFEST).write_text('{"format_version": ' + "9" * 5000 + "}"),
                                 "manifest.json: unreadable"),
    # an edited version is no newer hdeval's: it said "written by hdeval 0.1.0 (format 4) ... upgrade"
    "format version a string": (lambda a: edit_json(a / MANIFEST, lambda m: m.update(format_version="4")),
                                "manifest.json: 'format_version' must be a whole number, got '4'"),
    "format version a float": (lambda a: edit_json(a / MANIFEST, lambda m: m.update(format_version=4.0)),
                               "manifest.json: 'format_version' must be a whole number, got 4.0"),
    "format version zero": (lambda a: edit_json(a / MANIFEST, lambda m: m.update(format_version=0)),
                            "manifest.json: 'format_version' must be a whole number, got 0"),
    "format version missing": (lambda a: edit_json(a / MANIFEST, lambda m: m.pop("format_version")),
                               "manifest.json: 'format_version' is missing"),
    "checksum entry removed": (
        lambda a: edit_json(a / MANIFEST, lambda m: m["files"].pop("prompts/score.toml")),
        "no checksum recorded for prompts/score.toml",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_artifact_is_refused(
    damage: str, artifact: Path, samples: Path, tmp_path: Path, fake_calls: list[int]
) -> None:
    spoil, expected = DAMAGE[damage]
    spoil(artifact)
    line = refused(apply(artifact, samples, tmp_path), tmp_path)
    assert expected in line, line
    assert fake_calls == []  # refused before any LLM call


def test_a_broken_prompt_the_checksum_agrees_with_exits_2_as_every_artifact_error(
    artifact: Path, samples: Path, tmp_path: Path, fake_calls: list[int]
) -> None:
    prompt = artifact / "prompts" / "score.toml"
    prompt.write_text(prompt.read_text() + "\nnot = [valid\n")
    rewrite_checksum(artifact, "prompts/score.toml")
    result = apply(artifact, samples, tmp_path)
    assert "prompts/score.toml: invalid TOML" in refused(result, tmp_path)
    assert result.exit_code == 2 and fake_calls == []  # it was 1, unlike every other artifact error


def test_newer_format_is_refused_naming_both_versions(artifact: Path, samples: Path, tmp_path: Path) -> None:
    edit_json(artifact / MANIFEST, lambda m: m.update(format_version=FORMAT_VERSION + 1, hdeval_version="9.0.0"))
    line = refused(apply(artifact, samples, tmp_path), tmp_path)
    assert f"format {FORMAT_VERSION + 1}" in line and f"format {FORMAT_VERSION} or older" in line, line
    assert "9.0.0" in line and "upgrade" in line, line


# -- no code from an untrusted file ---------------------------------------------------------


class Payload:
    """A custom type whose restoration would run code (skops would call ``__setstate__``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __setstate__(self, state: dict) -> None:
        Path(state["marker"]).write_text("ran")
        self.__dict__.update(state)


class PicklePayload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.marker, "w"))  # unpickling this creates the marker file


@pytest.mark.parametrize(
    "payload, expected",
    [
        (lambda m: FunctionTransformer(func=os.system), "posix.system" if os.name == "posix" else "system"),
        (lambda m: {"models": [FunctionTransformer(func=eval)]}, "builtins.eval"),
        (lambda m: [Payload(m)], f"{__name__}.Payload"),
    ],
    ids=["os.system", "eval", "custom class"],
)
def test_untrusted_types_in_the_aggregator_are_refused(
    payload: Callable[[str], object], expected: str, artifact: Path, samples: Path, tmp_path: Path
) -> None:
    marker = tmp_path / MARKER
    sio.dump(payload(str(marker)), artifact / MODEL)
    rewrite_checksum(artifact, MODEL)  # the checksum agrees: only the type check is left
    line = refused(apply(artifact, samples, tmp_path), tmp_path)
    assert "contains types hdeval does not trust" in line and expected in line, line
    assert not marker.exists()
    assert not any(t in TRUSTED_TYPES for t in sio.get_untrusted_types(file=artifact / MODEL))


@pytest.mark.parametrize("content", ["pickle", "truncated"])
def test_aggregator_that_is_not_skops_is_refused(
    content: str, artifact: Path, samples: Path, tmp_path: Path
) -> None:
    marker = tmp_path / MARKER
    if content == "pickle":
        (artifact / MODEL).write_bytes(pickle.dumps([PicklePayload(str(marker))]))
    else:
        truncate(artifact / MODEL)
    rewrite_checksum(artifact, MODEL)
    line = refused(apply(artifact, samples, tmp_path), tmp_path)
    assert "aggregator.skops: not a readable skops file" in line, line
    assert not marker.exists()


# -- the editable tree ----------------------------------------------------------------------


def test_tree_wording_edit_warns_and_applies(artifact: Path, samples: Path, tmp_path: Path) -> None:
    def reword(tree: dict) -> None:
        text = json.dumps(tree)
        deepest = max(n.get("layer", 0) for n in _nodes(tree))  # the layer kept may be 1
        node = next(n for n in _nodes(tree) if n.get("layer") == deepest)
        assert node["definition"] in text
        node["definition"] = "Reworded by a person: " + node["definition"]

    edit_json(artifact / "tree.json", reword)
    result = apply(artifact, samples, tmp_path)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "tree.json was edited" in warnings[0], result.stderr
    assert (tmp_path / "scored.jsonl").exists()


@pytest.mark.parametrize("edit", ["remove a criterion", "rename a key", "not json"])
def test_tree_structure_edit_is_refused(edit: str, artifact: Path, samples: Path, tmp_path: Path) -> None:
    path = artifact / "tree.json"
    if edit == "not json":
        truncate(path)
    else:
        def change(tree: dict) -> None:
            deepest = max(n.get("layer", 0) for _, n in _holders(tree))  # the layer kept may be 1
            holder, node = next((h, n) for h, n in _holders(tree) if n.get("layer") == deepest)
            if edit == "remove a criterion":
                holder.remove(node)
            else:
                node["key"] = node["key"] + "_renamed"

        edit_json(path, change)
    line = refused(apply(artifact, samples, tmp_path), tmp_path)
    expected = "tree.json: unreadable" if edit == "not json" else "no longer has the criteria"
    assert expected in line, line


@pytest.mark.parametrize("edit,expected", [
    ("an unknown field", "tree.json: unknown field(s): criteria.0.weight"),
    ("a layer as text", "tree.json: criteria.0.layer must be a whole number, got '1'"),
    ("a name as a number", "tree.json: criteria.0.name must be text, got 7"),
])
def test_a_tree_edit_outside_its_format_is_one_line_naming_the_field(
    edit: str, expected: str, artifact: Path, samples: Path, tmp_path: Path
) -> None:
    def change(tree: dict) -> None:
        node = tree["criteria"][0]
        if edit == "an unknown field":
            node["weight"] = 2
        elif edit == "a layer as text":
            node["layer"] = str(node["layer"])
        else:
            node["name"] = 7

    edit_json(artifact / "tree.json", change)
    line = refused(apply(artifact, samples, tmp_path), tmp_path)
    assert line.startswith(f"error: {artifact / 'tree.json'}: ") and line.endswith(expected), line


def _holders(data: object) -> Iterator[tuple[list, dict]]:
    """(list, node) for every criterion-like dict in the tree JSON, whatever its nesting."""
    if isinstance(data, dict):
        for v in data.values():
            yield from _holders(v)
    elif isinstance(data, list):
        for item in data:
            if isinstance(item, dict) and {"key", "definition"} <= set(item):
                yield data, item
            yield from _holders(item)


def _nodes(data: object) -> Iterator[dict]:
    return (n for _, n in _holders(data))
