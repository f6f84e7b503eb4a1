"""Nothing lost, nothing trusted blindly.

* ``train -o`` never deletes a directory that is not an artifact, replaces an artifact only
  with ``--force``, refuses the working directory and unwritable places before any LLM call,
  and swaps a replaced artifact so that a stop at any moment leaves the old or the new one.
* ``Evaluator.load`` checks the manifest's internal consistency (feature order, aggregator
  width, groups, ranges, needed criteria), keeps every file inside the artifact and refuses
  symbolic links; ``hdeval report`` never writes through one.
* ``apply`` sends nothing (and no key) to a server only the artifact names, never lets an
  environment variable swap the artifact's LLM, writes .jsonl/.csv/.parquet/stdout atomically,
  and warns when the input belongs to another task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hdeval.artifact.directory import ASIDE, MANIFEST, NEW, sha256_file
from hdeval.cli import cli
from hdeval.core.errors import ArtifactError, ConfigError
from hdeval.methods.hdeval.evaluator import MODEL, Evaluator
from hdeval.run.train import train

REPO = Path(__file__).resolve().parent.parent


def run(*args: str, env: dict | None = None, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, input=input)


def one_error(result: Result, *fragments: str) -> str:
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def train_args(toy, tmp_path: Path, out: str | Path, *extra: str) -> list[str]:
    task, data = toy
    return ["train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "2",
            "--aggregator", "lr", "--cache-dir", str(tmp_path / "cache"), "-q", "-o", str(out), *extra]


@pytest.fixture
def trained(toy, tmp_path: Path) -> Evaluator:
    task, data = toy
    return train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="lr",
                 cache_dir=str(tmp_path / "cache"))


@pytest.fixture
def artifact(trained: Evaluator, tmp_path: Path) -> Path:
    return trained.save(tmp_path / "art")


def created(path: Path) -> str:
    return json.loads((path / MANIFEST).read_text())["created"] + sha256_file(path / MANIFEST)


def siblings(path: Path) -> list[str]:
    """hdeval's temporary names next to an artifact (there must be none after a save)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


# ------------------------------------------------------------------------------ train -o


def test_train_refuses_a_user_directory_even_with_force(toy, tmp_path: Path, fake_calls: list[int]) -> None:
    thesis = tmp_path / "v" / "thesis.txt"
    thesis.parent.mkdir()
    thesis.write_text("precious")
    for extra in ((), ("--force",)):
        one_error(run(*train_args(toy, tmp_path, thesis.parent, *extra)),
                  str(thesis.parent), "not an hdeval artifact", "--force does not change that")
    assert thesis.read_text() == "precious" and sorted(os.listdir(thesis.parent)) == ["thesis.txt"]
    assert fake_calls == []  # refused before any LLM call


def test_library_save_refuses_a_user_directory(trained: Evaluator, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("x")
    with pytest.raises(ConfigError, match="not an hdeval artifact"):
        trained.save(tmp_path / "mine", force=True)
    assert (tmp_path / "mine" / "notes.md").read_text() == "x"


@pytest.mark.parametrize("how", [".", "$PWD", "parent"])
def test_train_refuses_the_working_directory(how: str, toy, tmp_path: Path, monkeypatch,
                                             fake_calls: list[int]) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('hi')")
    monkeypatch.chdir(project / "src")
    out = {".": ".", "$PWD": str(project / "src"), "parent": ".."}[how]
    one_error(run(*train_args(toy, tmp_path, out, "--force")), "current directory")
    assert (project / "src" / "main.py").read_text() == "print('hi')"
    assert fake_calls == []


def test_train_replaces_an_artifact_only_with_force(toy, tmp_path: Path, fake_calls: list[int]) -> None:
    out = tmp_path / "art"
    assert run(*train_args(toy, tmp_path, out)).exit_code == 0
    first = created(out)
    calls = len(fake_calls)
    one_error(run(*train_args(toy, tmp_path, out)), "already holds an hdeval artifact", "--force")
    assert len(fake_calls) == calls and created(out) == first
    result = run(*train_args(toy, tmp_path, out, "--force"))
    assert result.exit_code == 0, result.output
    assert created(out) != first and Evaluator.load(out).feature_keys
    assert siblings(out) == []


def test_force_replaces_an_artifact_only_when_it_holds_nothing_of_the_users(
    toy, tmp_path: Path, fake_calls: list[int]
) -> None:
    # --force used to swap the folder and delete the old one whole: notes, a data file, a
    # cache kept inside the artifact went with it
    out = tmp_path / "art"
    assert run(*train_args(toy, tmp_path, out)).exit_code == 0
    assert run("report", str(out), "-q").exit_code == 0  # report/ is hdeval's own
    first, calls = created(out), len(fake_calls)
    (out / "NOTES.txt").write_text("mine")
    (out / "prompts" / "my-draft.toml").write_text("draft")
    (out / "keep").mkdir()
    line = one_error(run(*train_args(toy, tmp_path, out, "--force")), f"refusing to replace the artifact in {out}")
    assert "NOTES.txt" in line and "keep/" in line and "prompts/my-draft.toml" in line
    assert len(fake_calls) == calls  # before any LLM call
    assert created(out) == first and (out / "NOTES.txt").read_text() == "mine"
    assert (out / "prompts" / "my-draft.toml").read_text() == "draft" and (out / "keep").is_dir()
    with pytest.raises(ConfigError, match="NOTES.txt"):  # the library's save as well
        Evaluator.load(out).save(out, force=True)
    for mine in ("NOTES.txt", "prompts/my-draft.toml", "keep"):
        p = out / mine
        p.rmdir() if p.is_dir() else p.unlink()
    (out / ".DS_Store").write_bytes(b"\0")  # what opening the folder in a file browser or Jupyter leaves
    (out / ".ipynb_checkpoints").mkdir()
    result = run(*train_args(toy, tmp_path, out, "--force"))
    assert result.exit_code == 0, result.output
    assert created(out) != first and not (out / "report").exists()


@pytest.mark.parametrize("inside", ["--data", "--cache-dir", "--task", "--tree", "--jury", "--export-requests"])
@pytest.mark.parametrize("exists", [False, True])
def test_train_refuses_an_output_that_holds_what_the_run_reads(
    inside: str, exists: bool, toy, tmp_path: Path, fake_calls: list[int]
) -> None:
    # -o NEW --cache-dir NEW/cache paid for every call and then refused NEW (no longer empty)
    # for good; -o ART --data ART/x.jsonl --force deleted the data it trained on
    task, data = toy
    out = tmp_path / "art"
    if exists:
        assert run(*train_args(toy, tmp_path, out)).exit_code == 0
        first = created(out)
    where = {"--data": out / "mine.jsonl", "--cache-dir": out / "cache", "--task": out / "task.toml",
             "--tree": out / "tree.json", "--jury": out / "jury.toml", "--export-requests": out / "req.jsonl"}[inside]
    if inside in ("--data", "--task"):  # files that must exist to be read
        where.parent.mkdir(exist_ok=True)
        where.write_bytes((data if inside == "--data" else task).read_bytes())
    args = [a if a != str(tmp_path / "cache") or inside != "--cache-dir" else str(where)
            for a in train_args(toy, tmp_path, out, "--force")]
    if inside == "--task":
        args[args.index("--task") + 1] = str(where)
    elif inside != "--cache-dir":
        args += [inside, str(where)]
    calls = len(fake_calls)
    one_error(run(*args), f"-o {out} holds {inside} {where}", f"keep {inside} outside it")
    assert len(fake_calls) == calls  # before any LLM call
    if exists:
        assert created(out) == first
    if inside in ("--data", "--task"):  # still there, untouched
        assert where.read_bytes() == (data if inside == "--data" else task).read_bytes()
    elif not exists:
        assert not out.exists()


def test_retraining_into_a_folder_named_like_the_built_in_task_is_no_input_inside_it(
    tmp_path: Path, monkeypatch
) -> None:
    # '-o sfres' the second time: the folder sfres existed, so --task sfres was taken for a file in it
    from conftest import data_file

    data = data_file()
    monkeypatch.chdir(tmp_path)
    args = ["train", "--task", "sfres", "--data", str(data), "--limit", "20", "--llm", "fake", "--layers", "1",
            "--cache-dir", str(tmp_path / "cache"), "-q", "-o", "sfres"]
    assert run(*args).exit_code == 0
    r = run(*args, "--force")
    assert r.exit_code == 0, r.output


def test_refit_and_benchmark_refuse_an_output_that_holds_their_cache(
    toy, artifact: Path, tmp_path: Path, fake_calls: list[int]
) -> None:
    task, data = toy
    new = tmp_path / "new"
    one_error(run("refit", str(artifact), "--llm", "fake:logprobs=0", "--data", str(data), "-o", str(new),
                  "--cache-dir", str(new / "cache"), "-q"), f"-o {new} holds --cache-dir {new / 'cache'}")
    one_error(run("benchmark", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1",
                  "--methods", "direct", "-o", str(new), "--cache-dir", str(new / "cache"), "-q"),
              f"-o {new} holds --cache-dir {new / 'cache'}")
    assert fake_calls == [] and not new.exists()


def test_train_into_an_empty_directory_is_fine(toy, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert run(*train_args(toy, tmp_path, tmp_path / "empty")).exit_code == 0
    assert Evaluator.load(tmp_path / "empty").path == tmp_path / "empty"


def test_default_output_directories_are_checked_before_training(toy, tmp_path: Path, monkeypatch,
                                                                fake_calls: list[int]) -> None:
    monkeypatch.chdir(tmp_path)
    task, data = toy
    (tmp_path / "artifacts" / "toy_qa-rf").mkdir(parents=True)
    (tmp_path / "artifacts" / "toy_qa-rf" / "keep.txt").write_text("mine")
    # --aggregator auto may pick rf: that default directory is somebody's, so stop now
    one_error(run("train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1",
                  "--cache-dir", str(tmp_path / "cache")), "artifacts/toy_qa-rf", "not an hdeval artifact")
    assert fake_calls == []
    assert (tmp_path / "artifacts" / "toy_qa-rf" / "keep.txt").read_text() == "mine"


def test_unwritable_location_is_refused_before_any_call(toy, tmp_path: Path, fake_calls: list[int]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    one_error(run(*train_args(toy, tmp_path, a_file / "art")), "is not a directory")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        try:
            one_error(run(*train_args(toy, tmp_path, locked / "art")), f"cannot write to {locked}")
        finally:
            locked.chmod(0o755)
    else:  # root writes through permission bits; /sys refuses new entries even to root
        if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and _can_create("/sys"):
            pytest.skip("no read-only location to try")
        one_error(run(*train_args(toy, tmp_path, "/sys/hdeval-artifact")), "cannot write to /sys")
    assert fake_calls == []


def _can_create(d: str) -> bool:
    try:
        os.rmdir(__import__("tempfile").mkdtemp(dir=d))
        return True
    except OSError:
        return False


# ------------------------------------------------------------------ atomic replacement


def test_interrupt_between_the_two_renames_keeps_the_old_artifact(
    trained: Evaluator, artifact: Path, monkeypatch
) -> None:
    import hdeval.artifact.directory as evaluator

    before = created(artifact)
    monkeypatch.setattr(evaluator, "_exchange", lambda a, b: False)  # a system without renameat2
    real = os.replace
    seen: list[tuple] = []

    def replace(src, dst):  # the first rename (old -> aside) happens, then Ctrl-C
        seen.append((src, dst))
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(evaluator.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        trained.save(artifact, force=True)
    monkeypatch.setattr(evaluator.os, "replace", real)
    assert Path(seen[0][1]).name == f".art{ASIDE}"  # it did get between the renames
    assert created(artifact) == before
    assert siblings(artifact) == []
    trained.save(artifact, force=True)  # and the fallback path itself works
    assert created(artifact) != before and siblings(artifact) == []


def test_interrupt_right_after_the_exchange_keeps_the_new_artifact(
    trained: Evaluator, artifact: Path, monkeypatch
) -> None:
    import hdeval.artifact.directory as evaluator

    before = created(artifact)
    real = evaluator._exchange

    def exchange(a, b):
        if not real(a, b):
            pytest.skip("this system cannot swap directories atomically (no renameat2)")
        raise KeyboardInterrupt  # stop just after the swap

    monkeypatch.setattr(evaluator, "_exchange", exchange)
    with pytest.raises(KeyboardInterrupt):
        trained.save(artifact, force=True)
    assert created(artifact) != before and Evaluator.load(artifact).feature_keys == trained.feature_keys
    assert siblings(artifact) == []  # the previous artifact, swapped aside, was removed


def test_symlinked_output_is_refused(trained: Evaluator, artifact: Path, tmp_path: Path) -> None:
    link = tmp_path / "latest"
    link.symlink_to(artifact)
    with pytest.raises(ConfigError, match="symbolic link"):
        trained.save(link, force=True)
    assert link.is_symlink() and Evaluator.load(link).feature_keys == trained.feature_keys


def _killed_save(artifact: Path, cache: Path, toy, how: str) -> subprocess.CompletedProcess:
    """Run a replacing save in a child that dies (os._exit: no finally, no cleanup) at a point."""
    task, data = toy
    code = textwrap.dedent(f"""
        import os
        import hdeval.artifact.directory as evaluator
        from hdeval.run.train import train
        ev = train(task={str(task)!r}, data={str(data)!r}, llm="fake", layers=2, aggregator="lr",
                   cache_dir={str(cache)!r})
        real_replace, real_exchange = os.replace, evaluator._exchange
        if {how!r} == "between renames":
            evaluator._exchange = lambda a, b: False
            calls = []
            def replace(src, dst):
                calls.append(1)
                if len(calls) == 2:
                    os._exit(9)
                return real_replace(src, dst)
            evaluator.os.replace = replace
        else:
            def exchange(a, b):
                assert real_exchange(a, b)
                os._exit(9)
            evaluator._exchange = exchange
        ev.save({str(artifact)!r}, force=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("how", ["between renames", "after the exchange"])
def test_a_killed_replacement_leaves_an_artifact_and_is_cleaned_up(
    how: str, trained: Evaluator, artifact: Path, toy, tmp_path: Path
) -> None:
    before = created(artifact)
    child = _killed_save(artifact, tmp_path / "cache", toy, how)
    assert child.returncode == 9, child.stderr
    if how == "between renames":
        assert not artifact.exists() and (tmp_path / f".art{ASIDE}").is_dir()
        # the next reader puts the previous artifact back
        assert Evaluator.load(artifact).feature_keys == trained.feature_keys
        assert created(artifact) == before and f".art{ASIDE}" not in siblings(artifact)
    else:
        assert created(artifact) != before  # the new one is in place
        assert any(n.startswith(f".art{NEW}") for n in siblings(artifact))  # the old one, aside
    trained.save(artifact, force=True)  # the next save removes what the dead one left
    assert siblings(artifact) == []
    assert Evaluator.load(artifact).feature_keys == trained.feature_keys


def test_save_leaves_no_temporary_directory(trained: Evaluator, artifact: Path) -> None:
    trained.save(artifact, force=True)
    assert siblings(artifact) == []


# -------------------------------------------------------------------- artifact trust


def edit_manifest(artifact: Path, change) -> None:
    data = json.loads((artifact / MANIFEST).read_text())
    change(data)
    (artifact / MANIFEST).write_text(json.dumps(data))


def swap_first_two(lst: list) -> None:
    lst[0], lst[1] = lst[1], lst[0]


def _set_groups(m: dict) -> None:
    m["state"]["aggregator"]["groups"] = [["clarity"], ["clarity", "accuracy"]]


def _drop_group(m: dict) -> None:
    m["state"]["aggregator"]["groups"] = [["clarity"]]


def _ranges(m: dict) -> None:
    m["state"]["aggregator"]["ranges"][0] = [0, 10]


def _aspects_swapped(m: dict) -> None:
    swap_first_two(m["state"]["aggregator"]["aspects"])
    swap_first_two(m["task"]["aspects"])


def _needed(m: dict) -> None:
    m["state"]["needed_criteria"] = m["state"]["needed_criteria"] + ["no/such"]


def _kind(m: dict) -> None:
    m["state"]["aggregator"]["kind"] = "rf"


def _outside(m: dict) -> None:
    m["files"]["../escape.txt"] = "0" * 64


def _absolute(m: dict) -> None:
    m["files"]["/etc/hostname"] = "0" * 64


TAMPER = {
    "features reordered": (lambda m: swap_first_two(m["state"]["features"]), "not in the order the aggregator was trained on"),
    "aspect in two groups": (_set_groups, "each aspect exactly once"),
    "aspect in no group": (_drop_group, "each aspect exactly once"),
    "range changed": (_ranges, "differs from the task's"),
    "aspects reordered with the task": (_aspects_swapped, "aspects are not in the order"),
    "needed criterion unknown": (_needed, "'needed_criteria'"),
    "kind does not match the model": (_kind, "the manifest says aggregator 'rf'"),
    "file outside the artifact": (_outside, "outside the artifact directory"),
    "absolute file name": (_absolute, "outside the artifact directory"),
    "groups not lists": (lambda m: m["state"]["aggregator"].update(groups="clarity"), "must be lists of aspect names"),
    "features not text": (lambda m: m["state"].update(features=[1, 2]), "'features' must be distinct"),
}


@pytest.mark.parametrize("tamper", TAMPER, ids=list(TAMPER))
def test_inconsistent_manifest_is_refused(tamper: str, artifact: Path, tmp_path: Path, toy,
                                          fake_calls: list[int]) -> None:
    change, expected = TAMPER[tamper]
    edit_manifest(artifact, change)
    with pytest.raises(ArtifactError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        Evaluator.load(artifact)
    out = tmp_path / "scored.jsonl"
    one_error(run("apply", str(artifact), str(toy[1]), "-o", str(out), "--cache-dir", str(tmp_path / "c")),
              expected)
    assert fake_calls == [] and not out.exists()


def test_aggregator_of_another_width_is_refused(toy, artifact: Path, tmp_path: Path) -> None:
    import numpy as np
    import skops.io as sio

    from hdeval.data.tasks import load_task
    from hdeval.learn.aggregate import Aggregator

    narrow = Aggregator.for_task("lr", load_task(str(toy[0])))
    narrow.fit(np.random.default_rng(0).random((20, 3)), np.random.default_rng(1).random((20, 2)) * 4 + 1)
    sio.dump(narrow.models_, artifact / MODEL)
    edit_manifest(artifact, lambda m: m["files"].update({MODEL: sha256_file(artifact / MODEL)}))
    with pytest.raises(ArtifactError, match="takes 3 criterion scores"):
        Evaluator.load(artifact)


def test_symlink_inside_an_artifact_is_refused_unread(artifact: Path) -> None:
    link = artifact / "prompts" / "x.toml"
    link.symlink_to("/dev/zero")  # reading it would never end
    edit_manifest(artifact, lambda m: m["files"].update({"prompts/x.toml": "0" * 64}))
    with pytest.raises(ArtifactError, match="prompts/x.toml is a symbolic link"):
        Evaluator.load(artifact)


def test_unlisted_prompt_files_are_not_read(artifact: Path) -> None:
    (artifact / "prompts" / "extra.toml").write_text("not = [valid toml")
    assert "extra" not in Evaluator.load(artifact).templates


def test_oversized_file_is_refused(artifact: Path, monkeypatch) -> None:
    import hdeval.artifact.directory as evaluator

    limit = (artifact / MANIFEST).stat().st_size + 100  # the manifest itself is within the bound
    monkeypatch.setattr(evaluator, "MAX_JSON_BYTES", limit)
    (artifact / "tree.json").write_text((artifact / "tree.json").read_text() + " " * limit)
    with pytest.raises(ArtifactError, match="tree.json is .* bytes, more than"):
        Evaluator.load(artifact)


def test_report_does_not_write_through_a_symlink(artifact: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (artifact / "report").symlink_to(elsewhere)
    one_error(run("report", str(artifact), "-q"), "symbolic link")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("name", ["report.html", "report.json"])
def test_report_replaces_a_users_file_only_with_force(name: str, artifact: Path, tmp_path: Path,
                                                      monkeypatch) -> None:
    # report -o DIR used to overwrite DIR/report.html or report.json of the user's without a word
    out = tmp_path / "rep"
    out.mkdir()
    (out / name).write_text("mine")
    with monkeypatch.context() as m:  # refused before the artifact is even loaded: nothing computed
        m.setattr("hdeval.cli.report.load_artifact", lambda *a, **k: pytest.fail("loaded the artifact"))
        result = run("report", str(artifact), "-o", str(out), "-q")
    one_error(result, f"refusing to replace {out / name}", "hdeval report did not write it", "--force")
    assert result.exit_code == 2 and sorted(os.listdir(out)) == [name] and (out / name).read_text() == "mine"
    result = run("report", str(artifact), "-o", str(out), "-q", "--force")
    assert result.exit_code == 0, result.output
    assert (out / name).read_text() != "mine"
    result = run("report", str(artifact), "-o", str(out), "-q")  # its own files: replaced without --force
    assert result.exit_code == 0, result.output
    # a page an hdeval before the marker wrote (or a plug-in's) beside hdeval's report.json is its own
    (out / "report.html").write_text("<!doctype html><p>an older hdeval's page</p>")
    result = run("report", str(artifact), "-o", str(out), "-q")
    assert result.exit_code == 0, result.output
    # ARTIFACT/report is hdeval's folder: a page written there before the marker is replaced too
    own = artifact / "report"
    own.mkdir()
    (own / name).write_text("an older hdeval's report")
    result = run("report", str(artifact), "-q")
    assert result.exit_code == 0, result.output
    assert (own / name).read_text() != "an older hdeval's report"


def test_report_of_a_file_says_it_is_no_artifact(toy, tmp_path: Path) -> None:
    # the new output check ran first: "cannot write the report to qa.jsonl/report: ... not a directory"
    _, data = toy
    one_error(run("report", str(data)), f"{data} is not an artifact directory")


@pytest.mark.parametrize("bad", ["missing", "malformed", "utf-16"])
def test_report_data_given_by_name_must_be_readable(bad: str, toy, artifact: Path, tmp_path: Path,
                                                    monkeypatch) -> None:
    # an unreadable --data used to end in exit 0, its problem only a note inside the page
    data = tmp_path / f"{bad}.jsonl"
    if bad == "malformed":
        data.write_text('{"id": "x", \n')
    elif bad == "utf-16":
        data.write_text(toy[1].read_text(encoding="utf-8"), encoding="utf-16")
    out = tmp_path / "rep"
    monkeypatch.setattr("hdeval.methods.hdeval.report.build_report",
                        lambda *a, **k: pytest.fail("computed the report first"))
    result = run("report", str(artifact), "-o", str(out), "--data", str(data), "-q")
    one_error(result, str(data), {"missing": "cannot open", "malformed": "not valid JSON",
                                  "utf-16": "not UTF-8"}[bad])
    assert result.exit_code == 2 and not out.exists()


def test_report_checks_it_can_write_before_computing(artifact: Path, tmp_path: Path, monkeypatch) -> None:
    # a read-only artifact (or -o) used to get importance, SHAP and the curve's refits computed,
    # then "cannot write the report ... Permission denied"
    monkeypatch.setattr("hdeval.methods.hdeval.report.build_report",
                        lambda *a, **k: pytest.fail("computed the report first"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = run("report", str(artifact), "-o", str(a_file / "rep"), "-q")
    one_error(result, f"cannot write the report to {a_file / 'rep'}", "is not a directory")
    assert result.exit_code == 2
    if os.geteuid() != 0:
        artifact.chmod(0o555)
        try:
            result = run("report", str(artifact), "-q")
        finally:
            artifact.chmod(0o755)
        one_error(result, f"cannot write the report to {artifact / 'report'}", "ermission denied")
    else:  # root writes through permission bits; /sys refuses new entries even to root
        if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and _can_create("/sys"):
            pytest.skip("no read-only location to try")
        result = run("report", str(artifact), "-o", "/sys/hdeval-report", "-q")
        one_error(result, "cannot write the report to /sys/hdeval-report")
    assert result.exit_code == 2 and not (artifact / "report").exists()


def test_report_files_that_are_symlinks_are_refused(artifact: Path, tmp_path: Path) -> None:
    from hdeval.cli.report import _refuse_symlinked_output

    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").symlink_to(tmp_path / "victim.html")
    with pytest.raises(ArtifactError, match="report.html is a symbolic link"):
        _refuse_symlinked_output(artifact, out)
    _refuse_symlinked_output(artifact, tmp_path / "fresh")  # a normal place is fine


# ------------------------------------------------------------------ keys and URLs


def test_no_credentials_or_query_in_the_manifest(trained: Evaluator, tmp_path: Path) -> None:
    from hdeval.llm.config import LLMConfig

    url = "http://gw-user:pw-SECRET1@127.0.0.1:9/v1?api-key=SECRET2&x=1#SECRET3"
    trained.llm = LLMConfig("m", url)
    trained.llm_identity = "openai:m@http://127.0.0.1:9/v1?api-key=SECRET2&x=1#SECRET3"
    trained.run["config"] = {**trained.run["config"], "base_url": url}
    path = trained.save(tmp_path / "art-url")
    text = (path / MANIFEST).read_text()
    assert "SECRET" not in text and "gw-user" not in text
    m = json.loads(text)
    assert m["llm"]["base_url"] == m["run"]["config"]["base_url"] == "http://127.0.0.1:9/v1"
    assert m["llm"]["identity"] == "openai:m@http://127.0.0.1:9/v1"


@pytest.fixture
def server():
    from llm_server import FaultServer

    with FaultServer(lifetime=120) as s:
        yield s


def point_at(artifact: Path, url: str) -> None:
    def change(m: dict) -> None:
        m["llm"].update(model="test-model", base_url=url, identity=f"openai:test-model@{url}")
    edit_manifest(artifact, change)


def test_apply_sends_nothing_to_a_server_only_the_artifact_names(server, artifact: Path, toy,
                                                                 tmp_path: Path) -> None:
    point_at(artifact, server.url)
    out = tmp_path / "s.jsonl"
    env = {"OPENAI_API_KEY": "sk-test-do-not-send"}
    args = ["apply", str(artifact), str(toy[1]), "-o", str(out), "--cache-dir", str(tmp_path / "c"),
            "--max-retries", "0"]
    one_error(run(*args, env=env), server.url, "--base-url", "OPENAI_API_KEY")
    assert server.calls == 0 and not out.exists()
    # an HDEVAL_BASE_URL naming another server does not count as agreeing
    one_error(run(*args, env={**env, "HDEVAL_BASE_URL": "http://127.0.0.1:9/v1"}), "--base-url")
    assert server.calls == 0
    # named on the command line: used
    result = run(*args, "--base-url", server.url, env=env)
    assert result.exit_code == 0, result.output
    assert server.calls > 0 and out.is_file()


@pytest.mark.parametrize("answer", ["n", "y"])
def test_apply_asks_on_a_terminal(answer: str, server, artifact: Path, toy, tmp_path: Path, monkeypatch) -> None:
    import hdeval.cli.artifacts as cli_mod

    monkeypatch.setattr(cli_mod, "_stdin_is_tty", lambda: True)
    point_at(artifact, server.url)
    out = tmp_path / "s.jsonl"
    result = run("apply", str(artifact), str(toy[1]), "-o", str(out), "--cache-dir", str(tmp_path / "c"),
                 input=answer + "\n")
    assert server.url in result.stderr
    if answer == "n":
        one_error(result, "not sending anything")
        assert server.calls == 0 and not out.exists()
    else:
        assert result.exit_code == 0, result.output
        assert server.calls > 0 and out.is_file()


def test_environment_does_not_swap_the_artifacts_llm(artifact: Path, toy, tmp_path: Path,
                                                     fake_calls: list[int]) -> None:
    # if apply used these, it would need an OpenAI key and fail; it must use the artifact's fake LLM
    env = {"HDEVAL_LLM": "gpt-4o-mini", "HDEVAL_BASE_URL": "http://127.0.0.1:9/v1"}
    result = run("apply", str(artifact), str(toy[1]), "-o", str(tmp_path / "s.jsonl"),
                 "--cache-dir", str(tmp_path / "c2"), env=env)
    assert result.exit_code == 0, result.output
    assert "ignoring HDEVAL_LLM" in result.stderr and "warning: scoring with" not in result.stderr
    assert len(fake_calls) > 0
    # on the command line it does swap it (and then fails for want of a key, before any call)
    result = run("apply", str(artifact), str(toy[1]), "-o", str(tmp_path / "t.jsonl"),
                 "--cache-dir", str(tmp_path / "c2"), "--llm", "other-model", "--max-retries", "0",
                 "--timeout", "2", env=env)
    assert result.exit_code != 0 and not (tmp_path / "t.jsonl").exists()


# ------------------------------------------------------------------ apply output


def apply_to(artifact: Path, toy, tmp_path: Path, output: str, *extra: str, env: dict | None = None) -> Result:
    return run("apply", str(artifact), str(toy[1]), "-o", output, "--cache-dir", str(tmp_path / "c"), *extra, env=env)


def test_apply_to_stdout_writes_only_jsonl_there(artifact: Path, toy, tmp_path: Path) -> None:
    result = apply_to(artifact, toy, tmp_path, "-")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 36 and set(rows[0]["scores"]) == {"clarity", "accuracy"}
    assert "correlation with the human scores" in result.stderr and "LLM calls made" in result.stderr
    assert not (tmp_path / "-").exists()


def test_apply_writes_csv(artifact: Path, toy, tmp_path: Path) -> None:
    import pandas as pd

    out = tmp_path / "scored.CSV"
    result = apply_to(artifact, toy, tmp_path, str(out))
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out)
    assert len(frame) == 36 and {"id", "scores.clarity", "scores.accuracy", "human.clarity"} <= set(frame.columns)
    assert frame["scores.clarity"].between(1, 5).all()


def test_apply_writes_parquet_or_says_what_to_install(artifact: Path, toy, tmp_path: Path, monkeypatch,
                                                      fake_calls: list[int]) -> None:
    import importlib.util

    out = tmp_path / "scored.parquet"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("pyarrow", "fastparquet") else real(name, *a))
    one_error(apply_to(artifact, toy, tmp_path, str(out)), "pip install pyarrow")
    assert fake_calls == [] and not out.exists()
    monkeypatch.undo()
    if not any(importlib.util.find_spec(m) for m in ("pyarrow", "fastparquet")):
        pytest.skip("no parquet library installed")
    import pandas as pd

    result = apply_to(artifact, toy, tmp_path, str(out))
    assert result.exit_code == 0, result.output
    assert len(pd.read_parquet(out)) == 36


@pytest.mark.parametrize("name", ["scored.txt", "scored", "scored.json"])
def test_apply_refuses_an_unknown_extension_before_any_call(name: str, artifact: Path, toy, tmp_path: Path,
                                                            fake_calls: list[int]) -> None:
    one_error(apply_to(artifact, toy, tmp_path, str(tmp_path / name)), ".jsonl, .csv or .parquet")
    assert fake_calls == [] and not (tmp_path / name).exists()


def test_apply_output_is_atomic(artifact: Path, toy, tmp_path: Path, monkeypatch) -> None:
    import pandas as pd

    out = tmp_path / "scored.csv"
    out.write_text("previous results\n")

    def broken(self, target, *a, **k):
        target.write(b"id,scores.cla")  # a partial write to the temporary file, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    one_error(apply_to(artifact, toy, tmp_path, str(out), "--force"), "No space left on device")
    assert out.read_text() == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".scored")) == []


@pytest.mark.parametrize("failure", ["bad line", "--max-calls 0", "failure rate"])
@pytest.mark.parametrize("ext", ["jsonl", "csv"])
def test_a_failed_apply_leaves_no_folder_it_made(failure: str, ext: str, artifact: Path, toy,
                                                 tmp_path: Path) -> None:
    # apply -o a/b/out.jsonl made a/b first and left them behind, empty, when the run failed
    data, extra = toy[1], []
    if failure == "bad line":
        data = tmp_path / "bad.jsonl"
        data.write_text(toy[1].read_text() + "{not json\n")
    elif failure == "--max-calls 0":
        extra = ["--max-calls", "0"]
    else:
        extra = ["--llm", "fake:garbage=1"]  # every reply unreadable
    mine = tmp_path / "mine"
    mine.mkdir()
    for out in (tmp_path / "a" / "b" / f"out.{ext}", mine / "new" / f"out.{ext}"):
        result = run("apply", str(artifact), str(data), "-o", str(out), "--cache-dir", str(tmp_path / "c"), *extra)
        one_error(result, {"bad line": "not valid JSON", "--max-calls 0": "--max-calls 0",
                           "failure rate": "could not be read"}[failure])
    assert not (tmp_path / "a").exists()
    assert mine.is_dir() and list(mine.iterdir()) == []  # a folder that was there stays
    out = tmp_path / "a" / "b" / f"out.{ext}"
    assert apply_to(artifact, toy, tmp_path, str(out)).exit_code == 0 and out.is_file()


@pytest.mark.parametrize("top", ["-1", "0"])
def test_top_is_one_rule_checked_before_any_call(top: str, artifact: Path, toy, tmp_path: Path,
                                                 fake_calls: list[int]) -> None:
    # apply --explain --top -1 was refused only after scoring, and --top 0 accepted there while
    # explain --top 0 was refused
    out = tmp_path / "out.jsonl"
    for args in (["apply", str(artifact), str(toy[1]), "-o", str(out), "--explain", "--top", top],
                 ["explain", str(artifact), "--sample", "toy-0-0", "--data", str(toy[1]), "--top", top]):
        result = run(*args, "--cache-dir", str(tmp_path / "c"))
        one_error(result, "--top", f"{top} is not in the range x>=1")
        assert result.exit_code == 2
    from hdeval.run.apply import apply_file

    with pytest.raises(ConfigError, match="--top must be a whole number of criteria, at least 1"):
        apply_file(str(artifact), str(toy[1]), str(out), explain=True, top=int(top), cache_dir=str(tmp_path / "c"))
    assert fake_calls == [] and not out.exists()


def test_apply_warns_when_the_input_is_of_another_task(artifact: Path, toy, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in toy[1].read_text().splitlines()]
    for r in rows:
        r["task"] = "summeval"
    data = tmp_path / "other.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run("apply", str(artifact), str(data), "-o", str(tmp_path / "s.jsonl"), "--cache-dir", str(tmp_path / "c"))
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert "warning:" in err and "summeval" in err and "toy_qa" in err
    assert err.index("warning:") < err.index("LLM calls per sample")  # before anything is paid for
    same = run("apply", str(artifact), str(toy[1]), "-o", str(tmp_path / "t.jsonl"), "--cache-dir", str(tmp_path / "c"))
    # the artifact's own training file: no task warning (the training-row warning is test_intervals')
    assert "holds samples of task" not in same.stderr
