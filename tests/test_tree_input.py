"""`hdeval train --tree` (start from a criteria tree, locked criteria kept) and `--decompose-llm`
(decompose with one LLM, score with another): what is asked of which LLM, what is kept, what a
bad tree file gets."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hdeval.cli import cli
from hdeval.core.errors import BudgetExceeded, ConfigError
from hdeval.llm.backends.fake import FakeBackend
from hdeval.run.train import train

_CRITERION = re.compile(r"^Criterion to decompose: .+? \(key: ([^)]+)\)", re.M)


def crit(key: str, parent: str | None = None, locked: bool | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"key": key, "name": key.split("/")[-1].title(),
                         "definition": f"How well the answer does on {key}.", "parent": parent,
                         "layer": key.count("/") + 1}
    if locked is not None:
        c["locked"] = locked
    c.update(extra)
    return c


# A two-layer tree for the toy task (aspects clarity and accuracy), as a person would write it.
TREE2 = {"criteria": [
    crit("clarity"), crit("accuracy"),
    crit("clarity/wording", "clarity", locked=True), crit("clarity/order", "clarity"),
    crit("accuracy/facts", "accuracy", locked=True), crit("accuracy/units", "accuracy"),
    crit("accuracy/scope", "accuracy"),
]}


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def kinds(fake: FakeBackend) -> Counter:
    return Counter(r.kind for r in fake.requests)


def decomposed(fake: FakeBackend) -> list[str]:
    """The criteria the decomposition requests asked about (first attempts)."""
    return [_CRITERION.search(r.messages[-1].content).group(1) for r in fake.requests if r.kind == "decompose"]


def run(toy, tmp_path: Path, **options: Any):
    task, data = toy
    return train(task=str(task), data=str(data), llm="fake", aggregator="lr",
                 cache_dir=str(tmp_path / "cache"), **options)


def test_a_two_layer_tree_with_two_layers_only_scores_its_criteria(toy, tmp_path: Path) -> None:
    tree = write(tmp_path / "tree.json", TREE2)
    fake = FakeBackend()
    ev = run(toy, tmp_path, tree=str(tree), layers=2, backend=fake)
    assert kinds(fake) == {"score": 36 * 7}  # no decomposition call at all
    keys = [c["key"] for c in TREE2["criteria"]]
    assert sorted(ev.feature_keys) == sorted(keys)
    assert [(c.key, c.name, c.definition, c.parent_key) for c in ev.tree] == [
        (c["key"], c["name"], c["definition"], c["parent"]) for c in TREE2["criteria"]]
    record = ev.manifest_extra["tree_input"]
    assert record["criteria"] == keys and record["locked"] == ["clarity/wording", "accuracy/facts"]


def test_more_layers_expand_only_unlocked_leaves_and_keep_locked_ones(toy, tmp_path: Path, monkeypatch) -> None:
    import hdeval.methods.hdeval.loop as loop

    seen: list[list[str]] = []
    real = loop.prune

    def prune_all(template, X, Y, keys, candidates, groups, top_k, **kw):
        seen.append(list(candidates))
        r = real(template, X, Y, keys, candidates, groups, top_k, **kw)
        return type(r)(r.importance, r.per_aspect, tuple(candidates)[:top_k], len(candidates))

    monkeypatch.setattr(loop, "prune", prune_all)  # every candidate is worth expanding
    tree = write(tmp_path / "tree.json", TREE2)
    fake = FakeBackend()
    ev = run(toy, tmp_path, tree=str(tree), layers=3, top_k=5, children=2, backend=fake)
    unlocked = ["clarity/order", "accuracy/units", "accuracy/scope"]
    assert seen == [unlocked]  # pruning only ever considers the unlocked leaves
    assert sorted(decomposed(fake)) == sorted(unlocked)
    for c in TREE2["criteria"]:  # everything from the file survives unchanged
        assert ev.tree[c["key"]].name == c["name"] and ev.tree[c["key"]].definition == c["definition"]
    for key in ("clarity/wording", "accuracy/facts"):
        assert ev.tree.children(key) == []
    added = ev.manifest_extra["layers"][-1]["added"]  # explored, whichever layer is kept
    assert added and {k.rsplit("/", 1)[0] for k in added} == set(unlocked)
    kept = ev.metrics["selection"]["kept_layer"]
    assert kept >= 2  # the given tree (2 layers) is never cut
    assert len(ev.feature_keys) == 7 + (len(added) if kept == 3 else 0)


def test_an_unlocked_aspect_without_sub_criteria_is_decomposed_at_layer_2(toy, tmp_path: Path) -> None:
    # the human-in-the-loop case: sub-criteria written for clarity, accuracy left to the LLM
    tree = write(tmp_path / "tree.json", {"criteria": TREE2["criteria"][:4]})
    fake = FakeBackend()
    ev = run(toy, tmp_path, tree=str(tree), layers=2, backend=fake)
    assert decomposed(fake) == ["accuracy"]
    assert [c.key for c in ev.tree.children("clarity")] == ["clarity/wording", "clarity/order"]
    assert ev.tree.children("accuracy") and kinds(fake)["score"] == 36 * (2 + 2 + len(ev.tree.children("accuracy")))
    # locked, it stays a leaf: nothing is decomposed
    locked = [dict(c, locked=True) if c["key"] == "accuracy" else c for c in TREE2["criteria"][:4]]
    fake = FakeBackend()
    ev = run(toy, tmp_path, tree=str(write(tmp_path / "locked.json", {"criteria": locked})), layers=2, backend=fake)
    assert kinds(fake)["decompose"] == 0 and ev.tree.children("accuracy") == []


def test_a_one_layer_tree_decomposes_its_unlocked_aspects_only(toy, tmp_path: Path) -> None:
    tree = write(tmp_path / "tree.json", {"criteria": [
        crit("clarity", locked=True), crit("accuracy", name="Correctness", definition="Are the facts right?")]})
    fake = FakeBackend()
    ev = run(toy, tmp_path, tree=str(tree), layers=2, backend=fake)
    assert decomposed(fake) == ["accuracy"]
    assert ev.tree.children("clarity") == [] and ev.tree["accuracy"].name == "Correctness"
    # layer 2 holds accuracy's children only (the layer kept may be 1: read what layer 2 added)
    added = ev.manifest_extra["layers"][1]["added"]
    assert added and all(key.startswith("accuracy/") for key in added)


def test_tree_from_an_artifact_directory_rescoring_costs_nothing(toy, tmp_path: Path) -> None:
    first = run(toy, tmp_path, layers=2, backend=FakeBackend())
    art = first.save(tmp_path / "art")
    fake = FakeBackend()
    ev = run(toy, tmp_path, tree=str(art), layers=2, backend=fake)
    assert ev.tree == first.tree and ev.feature_keys == first.feature_keys
    # every criterion of both layers is scored again from the cache; a kept tree of layer 1 alone
    # is decomposed again too, from the cache (one reply per aspect)
    scored = sum(len(r["added"]) for r in first.manifest_extra["layers"])
    again = len(first.tree.layer(1)) if not first.tree.layer(2) else 0
    assert fake.calls == 0 and ev.metrics["usage"]["cache_hits"] == 36 * scored + again
    assert ev.manifest_extra["tree_input"]["file"] == str(art / "tree.json")


def test_decompose_llm_gets_the_decompositions_and_the_scoring_llm_the_scores(toy, tmp_path: Path) -> None:
    scorer, decomposer = FakeBackend(), FakeBackend(logprobs=False)
    ev = run(toy, tmp_path, layers=2, backend=scorer, decompose_backend=decomposer)
    assert set(kinds(scorer)) == {"score"} and set(kinds(decomposer)) == {"decompose"}
    assert sorted(decomposed(decomposer)) == ["accuracy", "clarity"]
    assert ev.manifest_extra["decompose_llm"]["identity"] == "fake:v1:logprobs=0"
    assert ev.metrics["usage_decompose"]["calls"] == 2
    assert ev.metrics["usage"]["calls"] == scorer.calls + decomposer.calls


def test_the_decompose_llm_server_is_recorded_without_credentials(toy, tmp_path: Path) -> None:
    url = "http://gw-user:SECRET1@127.0.0.1:9/v1?api-key=SECRET2"
    ev = run(toy, tmp_path, layers=2, backend=FakeBackend(), decompose_llm="big-model", decompose_base_url=url,
             decompose_backend=FakeBackend(logprobs=False))
    text = (ev.save(tmp_path / "art") / "manifest.json").read_text()
    assert "SECRET" not in text and "gw-user" not in text
    m = json.loads(text)
    assert m["state"]["decompose_llm"]["model"] == "big-model"
    assert m["state"]["decompose_llm"]["base_url"] == m["run"]["config"]["options"]["decompose_base_url"] == "http://127.0.0.1:9/v1"


def test_one_max_calls_budget_for_both_llms(toy, tmp_path: Path) -> None:
    scorer, decomposer = FakeBackend(), FakeBackend(logprobs=False)
    with pytest.raises(BudgetExceeded):
        run(toy, tmp_path, layers=2, backend=scorer, decompose_backend=decomposer, max_calls=73, concurrency=1)
    assert (scorer.calls, decomposer.calls) == (72, 1)  # 72 layer-1 scores, then 1 decomposition
    scorer, decomposer = FakeBackend(), FakeBackend(logprobs=False)
    with pytest.raises(BudgetExceeded):
        run(toy, tmp_path / "again", layers=2, backend=scorer, decompose_backend=decomposer, max_calls=79,
            concurrency=1)
    assert (scorer.calls, decomposer.calls) == (77, 2)  # 72 + 5 layer-2 scores, 2 decompositions


@pytest.mark.parametrize("spec, needle", [
    ("llamacpp:/nowhere/model.gguf", "--decompose-llm llamacpp:/nowhere/model.gguf: "),
    ("gpt-4o", "OPENAI_API_KEY"),
])
def test_a_decompose_llm_that_cannot_be_opened_stops_before_any_call(toy, tmp_path: Path, spec, needle) -> None:
    fake = FakeBackend()
    with pytest.raises(ConfigError, match=re.escape(needle)) as err:
        run(toy, tmp_path, layers=2, decompose_llm=spec, backend=fake)
    assert "\n" not in str(err.value) and str(err.value).startswith("--decompose-llm")
    assert fake.calls == 0


def cli_train(toy, tmp_path: Path, *args: str):
    task, data = toy
    return CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake",
                                    "--aggregator", "lr", "-q", "--cache-dir", str(tmp_path / "cache"),
                                    *args])


def one_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


BAD_TREES = {
    "bad-json": ('{"criteria": [', "not valid JSON (line 1"),
    "missing-field": ({"criteria": [crit("clarity"), {"key": "accuracy", "definition": "x"}]},
                      "criteria[1].name: missing"),
    "too-deep": ({"criteria": [crit("clarity"), crit("accuracy")] + [
        crit("clarity" + "/d" * n, "clarity" + "/d" * (n - 1)) for n in range(1, 7)]},
        "criteria[7]: layer 7 is deeper than the 6 layers"),
    "unknown-aspect": ({"criteria": [crit("clarity"), crit("accuracy"), crit("fluency")]},
                       "criteria[2].key: 'fluency' has no parent but is not an aspect trained"),
    "missing-aspect": ({"criteria": [crit("clarity")]}, "criteria: no criterion for aspect(s) accuracy"),
    "typo-in-field": ({"criteria": [crit("clarity"), crit("accuracy", lockd=True)]},
                      "criteria[1].lockd: unknown field"),
    "child-before-parent": ({"criteria": [crit("clarity/x", "clarity"), crit("clarity"), crit("accuracy")]},
                            "criteria[0].parent: 'clarity' is not the key of a criterion listed before it"),
    "bad-locked": ({"criteria": [crit("clarity", locked="yes"), crit("accuracy")]},
                   "criteria[0].locked: must be true or false"),
    "not-a-tree": ([1, 2], 'expected an object {"criteria": [...]}'),
    "layer-as-text": ({"criteria": [crit("clarity", layer="1"), crit("accuracy")]},
                      "criteria[0].layer: must be a whole number, not '1'"),
    "too-long-a-name": ({"criteria": [crit("clarity", name="n" * 201), crit("accuracy")]},
                        "criteria[0].name: longer than 200 characters"),
}


@pytest.mark.parametrize("case", sorted(BAD_TREES))
def test_a_malformed_tree_file_is_one_line_naming_file_and_field_and_nothing_is_written(
        toy, tmp_path: Path, case: str) -> None:
    data, message = BAD_TREES[case]
    tree = write(tmp_path / "my_tree.json", data)
    line = one_error(cli_train(toy, tmp_path, "--tree", str(tree), "--layers", "3", "-o", str(tmp_path / "art")))
    assert f"error: {tree}: " in line and message in line, line
    assert not (tmp_path / "art").exists() and not (tmp_path / "cache").exists()


def test_a_huge_tree_file_is_refused_unread(toy, tmp_path: Path) -> None:
    tree = tmp_path / "huge.json"
    tree.write_text('{"criteria": [' + " " * (2 << 20) + "]}")
    line = one_error(cli_train(toy, tmp_path, "--tree", str(tree), "-o", str(tmp_path / "art")))
    assert str(tree) in line and "larger than" in line


def test_fewer_layers_than_the_tree_has_is_an_error(toy, tmp_path: Path) -> None:
    tree = write(tmp_path / "tree.json", TREE2)
    line = one_error(cli_train(toy, tmp_path, "--tree", str(tree), "--layers", "1", "-o", str(tmp_path / "a")))
    assert "the tree has 2 layers but --layers is 1" in line and str(tree) in line


def test_tree_and_decompose_llm_are_hdeval_options(toy, tmp_path: Path) -> None:
    tree = write(tmp_path / "tree.json", TREE2)
    line = one_error(cli_train(toy, tmp_path, "--method", "direct", "--tree", str(tree)))
    assert "--tree is an option of --method hdeval" in line
    line = one_error(cli_train(toy, tmp_path, "--decompose-base-url", "http://127.0.0.1:9/v1"))
    assert "--decompose-base-url needs --decompose-llm" in line


def test_cli_summary_names_the_criteria_from_the_file(toy, tmp_path: Path) -> None:
    tree = write(tmp_path / "tree.json", TREE2)
    r = cli_train(toy, tmp_path, "--tree", str(tree), "--layers", "2", "-o", str(tmp_path / "art"))
    assert r.exit_code == 0, r.output
    assert (f"criteria from {tree} (7, 2 locked): clarity, accuracy, clarity/wording (locked), clarity/order, "
            "accuracy/facts (locked), accuracy/units, accuracy/scope") in r.stdout
    assert "criteria added by decomposition: 0" in r.stdout
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["state"]["tree_input"]["locked"] == ["clarity/wording", "accuracy/facts"]
    assert manifest["run"]["config"]["options"]["tree"] == str(tree)


def test_cli_decompose_llm_on_a_server_gets_only_decompositions(toy, tmp_path: Path, monkeypatch) -> None:
    from llm_server import FaultServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-never-recorded")
    with FaultServer(lifetime=120) as server:
        args = ("--layers", "2", "--decompose-llm", "test-model", "--decompose-base-url", server.url,
                "--max-retries", "0")
        r = cli_train(toy, tmp_path, *args, "-o", str(tmp_path / "art"))
        assert r.exit_code == 0, r.output
        assert {server.kind_of(q) for q in server.requests} == {"decompose"} and server.calls == 2
        text = (tmp_path / "art" / "manifest.json").read_text()
        assert "sk-test-key-never-recorded" not in text
        m = json.loads(text)
        assert m["llm"]["identity"] == "fake:v1"
        assert m["state"]["decompose_llm"]["identity"] == f"openai:test-model@{server.url}"
        assert m["state"]["decompose_llm"]["model"] == "test-model"
        # the same run again: both LLMs' replies come from the one cache dir
        r = cli_train(toy, tmp_path, *args, "-o", str(tmp_path / "art2"))
        assert r.exit_code == 0, r.output
        assert server.calls == 2


def test_dry_run_prices_both_llms_and_counts_a_given_tree_exactly(toy, tmp_path: Path) -> None:
    tree = write(tmp_path / "tree.json", TREE2)
    base = ("--dry-run", "--tree", str(tree), "--decompose-llm", "fake:logprobs=0", "--price-in", "1",
            "--price-out", "2")
    r = cli_train(toy, tmp_path, *base, "--layers", "2")
    assert r.exit_code == 0, r.output
    assert "LLM fake:v1, decomposition LLM fake:v1:logprobs=0" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert [(row[0], row[1], row[2]) for row in rows] == [("1", "0", "72"), ("2", "0", "180")]  # 36 x 5
    part = write(tmp_path / "part.json", {"criteria": TREE2["criteria"][:4]})  # accuracy: no sub-criteria
    r = cli_train(toy, tmp_path, "--dry-run", "--tree", str(part), "--layers", "2")
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert rows[1][:3] == ["2", "1", "<="] and rows[1][3] == str(36 * 2 + 36 * 4)  # 2 given + <= 4 new
    r = cli_train(toy, tmp_path, *base, "--layers", "3", "--decompose-price-in", "100",
                  "--decompose-price-out", "200")
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert rows[2][:2] == ["3", "3"]  # the three unlocked leaves, at most --top-k 4
    m = re.search(r"estimated cost: at most ([\d.]+): scoring ([\d.]+) \(at 1.0/2.0 per 1M tokens\), "
                  r"decomposition ([\d.]+) \(at 100.0/200.0 per 1M tokens\)", r.stdout)
    assert m, r.stdout
    total, scoring, decomposition = map(float, m.groups())
    assert decomposition > 0 and abs(total - scoring - decomposition) < 0.011


@pytest.mark.parametrize("field", ["evil\nerror: nothing is wrong", "x\x1b[2Jy", "p\u2028q"])
def test_an_artifacts_tree_json_with_a_multi_line_field_name_is_still_one_line(field: str) -> None:
    # an artifact is untrusted: the name of a field it holds must not add lines (or terminal
    # codes) to the error that names it
    from hdeval.core.errors import ArtifactError
    from hdeval.methods.hdeval.tree_file import stored_tree

    crit = {"key": "clarity", "name": "Clarity", "definition": "Clear.", "layer": 1, field: 1}
    with pytest.raises(ArtifactError) as err:
        stored_tree({"criteria": [crit]}, "art/tree.json")
    msg = str(err.value)
    assert msg.startswith("art/tree.json: unknown field(s): criteria.0.") and msg.isprintable(), msg


@pytest.mark.parametrize("name, problem", [("x" * 201, "longer than 200 characters"),
                                           ("Clar\x1b[2Jity", "holds a control character")])
def test_a_criterion_name_is_bounded_in_tree_json_and_in_a_tree_file(tmp_path, name: str, problem: str) -> None:
    # explain, report and the summary print names on one line: a 1 MB name or a terminal code is refused
    from hdeval.core.errors import ArtifactError
    from hdeval.methods.hdeval.tree_file import stored_tree

    crit = {"key": "clarity", "name": name, "definition": "Clear.", "layer": 1}
    with pytest.raises(ArtifactError) as err:
        stored_tree({"criteria": [crit]}, "art/tree.json")
    msg = str(err.value)
    assert msg.startswith("art/tree.json: criteria.0.name") and problem in msg and msg.isprintable(), msg
    assert stored_tree({"criteria": [{**crit, "name": "x" * 200}]}, "art/tree.json").keys == ["clarity"]


@pytest.mark.parametrize("definition, problem", [("x" * 20_001, "longer than 20000 characters"),
                                                 ("Clear.\x1b[2J", "holds a control character"),
                                                 # apply's cache key (UTF-8) crashed on it
                                                 ("Clear.\ud800", "surrogate")])
def test_a_definition_is_bounded_in_tree_json(definition: str, problem: str) -> None:
    # an artifact is untrusted: a 1 MB definition would ride in every prompt apply sends
    from hdeval.core.errors import ArtifactError
    from hdeval.methods.hdeval.tree_file import stored_tree

    crit = {"key": "clarity", "name": "Clarity", "definition": definition, "layer": 1}
    with pytest.raises(ArtifactError) as err:
        stored_tree({"criteria": [crit]}, "art/tree.json")
    msg = str(err.value)
    assert msg.startswith("art/tree.json: criteria.0.definition") and problem in msg and msg.isprintable(), msg
    # a task's multi-line definition (its line ends and trailing newline too) is kept exactly
    head = " Clear,\r\n\tand short. "
    kept = head + "x" * (19_999 - len(head)) + "\n"
    assert stored_tree({"criteria": [{**crit, "definition": kept}]}, "art/tree.json")["clarity"].definition == kept


@pytest.mark.parametrize("definition, problem", [("x" * 20_001, "longer than 20000 characters"),
                                                 ("Plain\x00words.", "control character")])
def test_decomposition_refuses_a_definition_the_tree_json_would_refuse(definition: str, problem: str) -> None:
    from hdeval.core.types import CriteriaTree, Criterion
    from hdeval.methods.hdeval.decompose import validate_subcriteria

    root = Criterion("clarity", "Clarity", "Clear.", None, 1)
    reply = {"subcriteria": [{"name": "Plain words", "definition": definition}]}
    with pytest.raises(ValueError, match=f"sub-criterion #1: its definition .*{problem}"):
        validate_subcriteria(reply, root, CriteriaTree([root]), 3, set())


@pytest.mark.parametrize("name, problem", [("x" * 201, "longer than 200 characters"),
                                           ("Clar\nity", "control character")])
def test_decomposition_refuses_a_name_the_tree_json_would_refuse(name: str, problem: str) -> None:
    # refused (and so re-asked with the reason), never written to tree.json to fail on reload
    from hdeval.core.types import CriteriaTree, Criterion
    from hdeval.methods.hdeval.decompose import validate_subcriteria

    root = Criterion("clarity", "Clarity", "Clear.", None, 1)
    reply = {"subcriteria": [{"name": name, "definition": "The wording is plain and short."}]}
    with pytest.raises(ValueError, match=f"sub-criterion #1: its name .*{problem}"):
        validate_subcriteria(reply, root, CriteriaTree([root]), 3, set())


def test_an_artifacts_tree_json_with_line_ends_a_decomposition_wrote_is_taken_by_tree(tmp_path: Path) -> None:
    # decomposition and tree.json keep a definition's CR LF (a model's reply may hold one): --tree
    # on that artifact's tree.json, edited or not, must take what hdeval itself wrote
    from conftest import TOY_TASK

    from hdeval.core.types import CriteriaTree, Criterion
    from hdeval.data.tasks import load_task
    from hdeval.methods.hdeval.decompose import validate_subcriteria
    from hdeval.methods.hdeval.tree_file import parse_tree, stored_tree

    (tmp_path / "task.toml").write_text(TOY_TASK, encoding="utf-8")
    task = load_task(str(tmp_path / "task.toml"))
    roots = [Criterion(a.key, a.name, a.definition, None, 1) for a in task.aspects]
    kids = validate_subcriteria({"subcriteria": [{"name": "Plain words", "definition": "Plain words.\r\nNo jargon."}]},
                                roots[0], CriteriaTree(roots), 3, set())
    written = CriteriaTree(roots + kids).to_dict()
    assert stored_tree(written, "art/tree.json")[kids[0].key].definition == "Plain words.\r\nNo jargon."
    given = parse_tree(written, task, "art/tree.json")
    assert given.tree[kids[0].key].definition == "Plain words.\r\nNo jargon."
    # a terminal code stays refused in a tree file
    bad = {"criteria": [*written["criteria"][:2], {**written["criteria"][2], "definition": "Plain.\x1b[2J"}]}
    with pytest.raises(ConfigError, match=r"criteria\[2\]\.definition: holds a control character"):
        parse_tree(bad, task, "art/tree.json")


def test_a_tree_file_and_an_artifacts_tree_json_saved_with_a_bom_are_read(toy, tmp_path: Path) -> None:
    """An editor that saves UTF-8 with a byte-order mark made tree.json 'not valid JSON (Unexpected
    UTF-8 BOM)', where data and task files take one; the checksum still covers the bytes."""
    from hdeval.methods.registry import load_artifact

    tree = tmp_path / "tree.json"
    tree.write_bytes(b"\xef\xbb\xbf" + json.dumps(TREE2).encode("utf-8"))
    ev = run(toy, tmp_path, tree=str(tree), layers=2, backend=FakeBackend())
    assert sorted(ev.feature_keys) == sorted(c["key"] for c in TREE2["criteria"])
    art = ev.save(tmp_path / "art")
    stored = art / "tree.json"
    stored.write_bytes(b"\xef\xbb\xbf" + stored.read_bytes())  # re-saved by an editor, words unchanged
    again = load_artifact(art)
    assert again.tree == ev.tree
    assert any("tree.json was edited after training" in w for w in again.warnings)  # the bytes differ
    fake = FakeBackend()
    assert run(toy, tmp_path, tree=str(art), layers=2, backend=fake).tree == ev.tree and fake.calls == 0


def test_a_jury_file_saved_with_a_bom_is_read(tmp_path: Path) -> None:
    from hdeval.methods.jury import read_jury

    jury = tmp_path / "jury.toml"
    jury.write_bytes(b"\xef\xbb\xbf" + b'[[judge]]\nname = "a"\nllm = "fake"\n[[judge]]\nname = "b"\nllm = "local"\n')
    assert [j.name for j in read_jury(jury)] == ["a", "b"]
