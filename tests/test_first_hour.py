"""A new user's first hour: files never overwritten, nothing written inside the reply cache."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import one_error, run_cli

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def qa_artifact(tmp_path_factory) -> Path:
    """The quick start's task trained with the fake LLM (once for this module's tests)."""
    from hdeval.run.train import train

    where = tmp_path_factory.mktemp("qa")
    ev = train(task=str(EXAMPLES / "qa_task.toml"), llm="fake", layers=1, aggregator="lr",
               cache_dir=str(where / "cache"))
    return ev.save(where / "art")


def test_data_import_refuses_an_existing_output_without_force(tmp_path: Path) -> None:
    mine = tmp_path / "support.jsonl"
    mine.write_text("my rated training file\n", encoding="utf-8")
    res = run_cli("data", "import", EXAMPLES / "ratings.csv", "--task", EXAMPLES / "qa_task.toml",
                  "--source-col", "question", "--output-col", "answer", "--score-col", "clarity=clear",
                  "--score-col", "accuracy=correct", "-o", mine)
    one_error(res, str(mine), "exists", "--force")
    assert mine.read_text(encoding="utf-8") == "my rated training file\n"
    res = run_cli("data", "import", EXAMPLES / "ratings.csv", "--task", EXAMPLES / "qa_task.toml",
                  "--source-col", "question", "--output-col", "answer", "--score-col", "clarity=clear",
                  "--score-col", "accuracy=correct", "-o", mine, "--force")
    assert res.exit_code == 0, res.output
    assert mine.read_text(encoding="utf-8").startswith("{")


@pytest.mark.parametrize("option", ["-o", "--export-requests"])
def test_apply_refuses_an_existing_output_without_force(qa_artifact: Path, tmp_path: Path, option: str) -> None:
    scored = tmp_path / "scored.jsonl"
    scored.write_text("an engine's paid results\n", encoding="utf-8")
    llm = ["--llm", "fake"] if option == "-o" else ["--llm", "gpt-4o-mini", "--base-url", "http://127.0.0.1:9/v1"]
    res = run_cli("apply", qa_artifact, EXAMPLES / "new_qa.jsonl", option, scored, *llm,
                  "--cache-dir", tmp_path / "cache")
    one_error(res, option, str(scored), "exists", "--force")
    assert scored.read_text(encoding="utf-8") == "an engine's paid results\n"


@pytest.mark.parametrize("command", [
    ["apply", "{art}", str(EXAMPLES / "new_qa.jsonl"), "--llm", "fake", "--force", "-o"],
    ["apply", "{art}", str(EXAMPLES / "new_qa.jsonl"), "--llm", "gpt-4o-mini", "--force", "--export-requests"],
    ["data", "import", str(EXAMPLES / "ratings.csv"), "--task", str(EXAMPLES / "qa_task.toml"), "--force", "-o"],
    ["train", "--task", str(EXAMPLES / "qa_task.toml"), "--llm", "fake", "--force", "-o"],
])
@pytest.mark.parametrize("target", ["replies.db", "new"])
def test_no_output_lands_inside_the_reply_cache(tmp_path: Path, command: list[str], target: str,
                                                monkeypatch) -> None:
    """Even with --force: replacing replies.db loses every paid reply."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "replies.db").write_bytes(b"SQLite format 3\x00 paid replies")
    if command[0] == "train" and target == "replies.db":
        target = "art"  # an artifact is a directory
    args = [a.replace("{art}", str(tmp_path / "art")) for a in command] + [cache / target]
    if command[0] == "data":  # no --cache-dir: the cache the environment names
        monkeypatch.setenv("HDEVAL_CACHE_DIR", str(cache))
    else:
        args += ["--cache-dir", cache]
    res = run_cli(*args)
    one_error(res, "inside the LLM reply cache")
    assert (cache / "replies.db").read_bytes() == b"SQLite format 3\x00 paid replies"
    assert sorted(p.name for p in cache.iterdir()) == ["replies.db"]  # nothing written, nothing opened


def test_the_default_cache_is_protected_too(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "default-cache"
    monkeypatch.setenv("HDEVAL_CACHE_DIR", str(cache))
    cache.mkdir()
    res = run_cli("data", "import", EXAMPLES / "ratings.csv", "--task", EXAMPLES / "qa_task.toml",
                  "-o", cache / "cache.db")
    one_error(res, "inside the LLM reply cache")
    assert not (cache / "cache.db").exists()


def test_rows_imported_later_never_take_a_training_rows_id(tmp_path: Path) -> None:
    """Ids were <task>-00001... in every file, so new rows read as training rows."""
    train_csv = tmp_path / "train.csv"
    train_csv.write_text("question,answer,clear,correct\nWhy?,Because.,4,3\nHow?,Like this.,2,5\n", encoding="utf-8")
    new_csv = tmp_path / "new.csv"
    new_csv.write_text("question,answer\nWhat?,That.\nWhen?,Now.\nWhy?,Because.\n", encoding="utf-8")
    common = ["--task", EXAMPLES / "qa_task.toml", "--source-col", "question", "--output-col", "answer"]
    assert run_cli("data", "import", train_csv, *common, "--score-col", "clarity=clear", "--score-col",
                   "accuracy=correct", "-o", tmp_path / "train.jsonl").exit_code == 0
    assert run_cli("data", "import", new_csv, *common, "--unscored", "-o", tmp_path / "new.jsonl").exit_code == 0
    train_ids = [json.loads(x)["id"] for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    new_ids = [json.loads(x)["id"] for x in (tmp_path / "new.jsonl").read_text().splitlines()]
    assert len(set(train_ids + new_ids)) == 4  # the two new rows are new; "Why? Because." is the same row
    assert new_ids[2] == train_ids[0] and not set(new_ids[:2]) & set(train_ids)


def init_task(tmp_path: Path, *extra: str):
    task = tmp_path / "task.toml"
    res = run_cli("init", EXAMPLES / "ratings.csv", "-o", task, "--source-col", "question", "--output-col", "answer",
                  *extra)
    assert res.exit_code == 0, res.output
    return task, res


def test_init_writes_a_task_that_reads_the_users_file_as_it_is(tmp_path: Path) -> None:
    from hdeval.data.samples import find_data, read_task_samples
    from hdeval.data.tasks import load_task

    path, res = init_task(tmp_path)
    assert "aspects clear [2, 5], correct [1, 5]" in res.stdout and "next: hdeval train --task" in res.stdout
    task = load_task(path)
    assert [f.key for f in task.fields] == ["source", "output"] and task.aspect_keys == ("clear", "correct")
    samples = read_task_samples(find_data(task, None), task)
    assert len(samples) == 24 and samples[1].fields["output"] == "Because the ocean reflects onto it."
    assert samples[1].scores == {"clear": 4.0, "correct": 1.0}
    assert samples[0].doc_id == samples[1].doc_id != samples[3].doc_id  # one question, one document
    dry = run_cli("train", "--task", path, "--llm", "fake", "--dry-run")  # no other flag
    assert dry.exit_code == 0, dry.output
    assert "dry run for task ratings: 24 samples" in dry.stdout


def test_init_in_a_script_says_which_option_is_missing(tmp_path: Path) -> None:
    data = tmp_path / "r.csv"
    data.write_text("q,a,score\nWhy?,Because.,3\nHow?,So.,4\n", encoding="utf-8")
    res = run_cli("init", data, "-o", tmp_path / "t.toml")
    one_error(res, "--output-col", "columns: q, a, score")
    assert not (tmp_path / "t.toml").exists()
    mine = tmp_path / "mine.toml"
    mine.write_text("# my task\n", encoding="utf-8")
    one_error(run_cli("init", data, "-o", mine, "--output-col", "a"), "exists", "--force")
    assert mine.read_text(encoding="utf-8") == "# my task\n"


def test_init_says_which_line_lacks_a_score_and_the_option_that_leaves_it_out(tmp_path: Path) -> None:
    data = tmp_path / "r.csv"
    data.write_text("q,a,clear,correct\nWhy?,Because.,3,4\nHow?,So.,4,\nWhat?,That.,2,5\n", encoding="utf-8")
    res = run_cli("init", data, "-o", tmp_path / "t.toml", "--output-col", "a")
    one_error(res, "line 3: no score in column 'correct'", "--score-col clear")
    assert not (tmp_path / "t.toml").exists()
    res = run_cli("init", data, "-o", tmp_path / "t.toml", "--output-col", "a", "--score-col", "clear")
    assert res.exit_code == 0 and "aspects clear [2, 4]" in res.stdout, res.output
    # the advice names only columns every row has; a JSON file's rows are rows, not lines
    data.write_text("q,a,clear,correct,fluent\nWhy?,Because.,3,4,5\nHow?,So.,,,4\nWhat?,That.,2,5,3\n")
    line = one_error(run_cli("init", data, "-o", tmp_path / "u.toml", "--output-col", "a"), "line 3")
    assert line.endswith("keep only the columns every line has: --score-col fluent")
    rows = [{"q": "Why?", "a": "B.", "s": 3}, {"q": "How?", "a": "S.", "s": None}, {"q": "W?", "a": "T.", "s": 2}]
    (tmp_path / "r.json").write_text(json.dumps(rows), encoding="utf-8")
    one_error(run_cli("init", tmp_path / "r.json", "-o", tmp_path / "v.toml", "--output-col", "a"), "r.json: row 2:")


def test_init_reads_a_file_already_in_hdevals_sample_format(tmp_path: Path) -> None:
    # its scores are one 'scores' object per row: init said "no numeric column left", and its
    # --score-col advice could not name them
    res = run_cli("init", EXAMPLES / "qa.jsonl", "-o", tmp_path / "t.toml")
    assert res.exit_code == 0, res.output
    assert "aspects clarity [2, 5], accuracy [1, 5]; 24 rated rows" in res.stdout
    assert run_cli("train", "--task", tmp_path / "t.toml", "--llm", "fake", "--dry-run").exit_code == 0
    # as hdeval's own data files are: a field no row fills ("context": null), means of three raters
    rows = [{"id": f"r{i}", "doc_id": f"d{i // 2}", "source": f"Q{i}?", "context": None, "output": f"A{i}.",
             "scores": {"coherence": [5 / 3, 2.0, 4 + 2 / 3, 3.0][i % 4]}} for i in range(8)]
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    res = run_cli("init", mine, "-o", tmp_path / "m.toml")
    assert res.exit_code == 0, res.output  # context was taken as a field; 5/3 written as 1.66667, then refused
    assert "fields source (source), output (output); aspects coherence [1.66667, 4.66667]" in res.stdout


def test_init_names_a_score_cell_that_is_no_number_rather_than_drop_its_column(tmp_path: Path) -> None:
    # the column used to vanish from the task, unsaid, for one 'n/a' (a blank cell was an error)
    data = tmp_path / "r.csv"
    data.write_text("q,a,clear,correct\nWhy?,Because.,n/a,4\nHow?,So.,4,2\nWhat?,That.,2,5\n", encoding="utf-8")
    res = run_cli("init", data, "-o", tmp_path / "t.toml", "--output-col", "a")
    line = one_error(res, "r.csv: line 2: column 'clear' holds 'n/a', not a number (1 line); fix it")
    assert line.endswith("or leave the column out by naming the others with --score-col")
    assert not (tmp_path / "t.toml").exists()
    res = run_cli("init", data, "-o", tmp_path / "t.toml", "--output-col", "a", "--score-col", "correct")
    assert res.exit_code == 0 and "aspects correct [2, 5]" in res.stdout, res.output
    # an answer column of mostly numbers is a text field, not a score column with typos
    data.write_text("q,a,correct\nSum?,42,4\nName?,Bob,2\nDiff?,7,5\n", encoding="utf-8")
    assert run_cli("init", data, "-o", tmp_path / "u.toml", "--output-col", "a").exit_code == 0


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json"])
def test_a_tasks_columns_read_csv_tsv_and_json(tmp_path: Path, fmt: str) -> None:
    """apply, train and report read a file through the task's [columns], whatever its format."""
    from hdeval.data.samples import iter_task_chunks
    from hdeval.data.tasks import load_task

    path, _ = init_task(tmp_path)
    task = load_task(path)
    rows = [{"question": "What is rain?", "answer": "Water from clouds.", "note": "n1"},
            {"question": "Why is grass green?", "answer": "Chlorophyll.", "note": "n2"}]
    data = tmp_path / f"new.{fmt}"
    if fmt == "json":
        data.write_text(json.dumps(rows), encoding="utf-8")
    else:
        sep = "\t" if fmt == "tsv" else ","
        data.write_text("".join(sep.join(r.values()) + "\n" for r in [dict(zip(rows[0], rows[0])), *rows]))
    chunks = list(iter_task_chunks(data, task, require_labels=False))
    assert [s.fields["output"] for s in chunks[0]] == ["Water from clouds.", "Chlorophyll."]
    assert [s.line for s in chunks[0]] == ([2, 3] if fmt != "json" else [1, 2])


def test_parquet_input_without_pyarrow_is_one_line_saying_how(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    from hdeval.core.errors import ConfigError
    from hdeval.data.samples import read_task_samples
    from hdeval.data.tasks import load_task

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    data = tmp_path / "new.parquet"
    data.write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match=r"new.parquet needs pyarrow: pip install pyarrow"):
        read_task_samples(data, load_task(EXAMPLES / "qa_task.toml"))


def test_a_wall_of_one_problem_is_one_line_with_a_count(tmp_path: Path) -> None:
    """The same missing score on every line was printed 20 times, the fix last."""
    from hdeval.core.errors import DataError
    from hdeval.data.samples import read_samples
    from hdeval.data.tasks import load_task

    task = load_task(EXAMPLES / "qa_task.toml")
    rows = [json.loads(x) for x in (EXAMPLES / "qa.jsonl").read_text().splitlines()]
    for r in rows:
        del r["scores"]["accuracy"]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_samples(data, task)
    text = str(err.value)
    assert text.count("scores.accuracy is missing") == 1 and len(text) < 400, text
    assert "pass --aspects clarity" in text.split("lines 1, 2, 3")[0]  # the fix first
    assert f"and {len(rows) - 3} more" in text


@pytest.mark.slow
def test_init_train_apply_csv_with_no_edit(tmp_path: Path, monkeypatch) -> None:
    """The issue's done line: init in a script, train with no other flag, apply a CSV of the same
    layout, keeping its columns."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HDEVAL_CACHE_DIR", str(tmp_path / "cache"))
    path, _ = init_task(tmp_path)
    res = run_cli("train", "--task", path, "--llm", "fake")
    assert res.exit_code == 0, res.output
    art = next((tmp_path / "artifacts").iterdir())
    new = tmp_path / "new.csv"
    new.write_text("question,answer,rater_note\nWhat is rain?,Water from clouds.,n1\n"
                   "Why is the sky blue?,Because the ocean reflects onto it.,n2\n", encoding="utf-8")
    res = run_cli("apply", art, new, "-o", tmp_path / "scored.csv", "--keep-columns", "--llm", "fake")
    assert res.exit_code == 0, res.output
    import pandas as pd

    out = pd.read_csv(tmp_path / "scored.csv")
    assert list(out.columns[:3]) == ["question", "answer", "rater_note"] and list(out["rater_note"]) == ["n1", "n2"]
    # the second row is a training row (same texts, same id): flagged, the first is not
    assert list(out["in_training"]) == [False, True]


def test_check_exits_1_below_its_threshold_and_0_above(qa_artifact: Path, tmp_path: Path) -> None:
    from hdeval.testing import assert_aligned

    cache = ["--cache-dir", qa_artifact.parent / "cache", "--llm", "fake"]
    passed = run_cli("check", qa_artifact, "--data", EXAMPLES / "qa.jsonl", "--min-spearman", "-1", *cache)
    assert passed.exit_code == 0, passed.output
    assert passed.stdout.startswith("check passed: held-out Spearman") and "on 12 rows" in passed.stdout
    failed = run_cli("check", qa_artifact, "--data", EXAMPLES / "qa.jsonl", "--min-spearman", "0.99", *cache)
    assert failed.exit_code == 1 and failed.stdout == ""
    assert [line for line in failed.stderr.splitlines() if line.startswith("check")] == [
        line for line in failed.stderr.splitlines() if "is below 0.99 on 12 rows" in line]
    with pytest.raises(AssertionError, match="is below 0.99"):
        assert_aligned(qa_artifact, EXAMPLES / "qa.jsonl", min_spearman=0.99, llm="fake",
                       cache_dir=str(qa_artifact.parent / "cache"))
    res = assert_aligned(qa_artifact, EXAMPLES / "qa.jsonl", min_spearman=-1, llm="fake",
                         cache_dir=str(qa_artifact.parent / "cache"))
    assert res.passed and res.rows == 12 and res.value is not None


def test_check_refuses_a_gate_it_cannot_make_honestly(qa_artifact: Path, tmp_path: Path,
                                                       fake_calls: list[int]) -> None:
    # an empty cache: each refusal comes before any LLM call (it used to come after scoring)
    cache = ["--cache-dir", tmp_path / "empty-cache", "--llm", "fake"]
    one_error(run_cli("check", qa_artifact, "--data", EXAMPLES / "new_qa.jsonl", "--min-spearman", "0.5", *cache),
              "no human scores")
    one_error(run_cli("check", qa_artifact, "--data", EXAMPLES / "qa.jsonl", "--min-agreement", "0.5", *cache),
              "--min-spearman")
    training = tmp_path / "train_rows.jsonl"
    manifest = json.loads((qa_artifact / "manifest.json").read_text())
    split = (manifest.get("run") or manifest)["split"]["train"]
    training.write_text("".join(x + "\n" for x in (EXAMPLES / "qa.jsonl").read_text().splitlines()
                                if json.loads(x)["id"] in split), encoding="utf-8")
    one_error(run_cli("check", qa_artifact, "--data", training, "--min-spearman", "0.5", *cache),
              "training split")
    assert fake_calls == []
    partly = tmp_path / "one_aspect_missing.jsonl"  # a held-out row without its accuracy score
    rows = [json.loads(x) for x in (EXAMPLES / "qa.jsonl").read_text().splitlines()]
    gap = next(r for r in rows if r["id"] not in split)
    del gap["scores"]["accuracy"]
    partly.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    one_error(run_cli("check", qa_artifact, "--data", partly, "--min-spearman", "0.5", *cache),
              "no human scores for every aspect", f"sample {gap['id']} has none for accuracy")
    assert fake_calls == []


def test_report_finds_the_data_the_task_named(qa_artifact: Path) -> None:
    """Trained without --data (the task's data_file found beside it), the report said
    the training data was not available and showed no sample text and no raw reply."""
    from hdeval.methods.registry import load_artifact
    from hdeval.report.samples import data_path, score_replies

    ev = load_artifact(qa_artifact)
    assert data_path(ev, None) == EXAMPLES / "qa.jsonl"
    wanted = ["qa-00-1", "qa-03-2"]
    replies, items = score_replies(ev, wanted, list(ev.columns_needed())[:1], data_path(ev, None),
                                   qa_artifact.parent / "cache")
    assert replies.note is None and set(items) == set(wanted)
    assert len(replies.texts) == 2 and all(t.strip() for t in replies.texts.values())  # the raw replies


def test_the_summary_says_what_its_numbers_mean_and_what_to_do(tmp_path: Path) -> None:
    """An unlabelled difference, unjudged intervals, lines said twice, no next step."""
    task = EXAMPLES / "qa_task.toml"
    res = run_cli("train", "--task", task, "--tree", EXAMPLES / "qa_tree.json", "--layers", "2", "--llm", "fake",
                  "-o", tmp_path / "art", "--cache-dir", tmp_path / "c")
    assert res.exit_code == 0, res.output
    out = res.stdout + res.stderr
    metrics = json.loads((tmp_path / "art" / "metrics.json").read_text())
    final, direct = metrics["final"]["average"]["spearman"], metrics["direct_layer1"]["average"]["spearman"]
    assert f"held-out Spearman: trained {final:.3f} vs direct layer-1 score {direct:.3f} (difference {final - direct:+.3f})" in out
    hw = metrics["intervals"]["half_width"]
    assert f"clarity ±{hw['clarity']:.2f}, accuracy ±{hw['accuracy']:.2f} on a 1-5 scale: too wide to use" in out
    assert "a --tree file's layers are kept whole" in out
    lines = [line for line in out.splitlines() if line.strip()]
    dups = {line for line in lines if lines.count(line) > 1 and not line.startswith(("scoring", "decomposing"))}
    assert not dups and sum("prediction intervals" in line for line in lines) == 1
    assert sum("is not kept as the evaluator" in line or "a baseline is not kept" in line for line in lines) <= 2
    assert res.stdout.rstrip().splitlines()[-1].startswith("then: train with a real LLM")


def test_next_step_follows_the_figures() -> None:
    from hdeval.report.banner import interval_verdict, next_step

    common = dict(n_train=200, n_features=10, n_test=100, path="artifacts/x")
    assert next_step(identity="gpt-4o-mini", evaluator=0.6, direct=0.4, too_wide=False, **common) == \
        "this evaluator is ready: hdeval apply artifacts/x NEW.jsonl -o scored.jsonl"
    losing = next_step(identity="gpt-4o-mini", evaluator=0.1, direct=0.5, too_wide=False, **common)
    assert "more labels (`hdeval label`" in losing and "another LLM (--llm)" in losing
    crowded = next_step(identity="gpt-4o-mini", evaluator=0.1, direct=0.5, too_wide=False,
                        **{**common, "n_train": 30})
    assert "fewer criteria" in crowded
    assert "a real LLM" in next_step(identity="local", evaluator=0.1, direct=0.5, too_wide=False, **common)
    assert "too wide" in next_step(identity="gpt-4o", evaluator=0.6, direct=0.4, too_wide=True, **common)
    assert interval_verdict({"a": 0.4}, {"a": (1, 5)}) == "a ±0.40 on a 1-5 scale: narrow enough to use"
    assert interval_verdict({"a": 2.97}, {"a": (1, 5)}).endswith("too wide to use (wider than half the scale)")


@pytest.mark.parametrize("typo, meant", [("fak", "fake"), ("Fake", "fake"), ("locl", "local"), ("loacl", "local"),
                                         ("gpt-4o-mini", None), ("lake", "fake")])
def test_an_llm_name_a_typo_away_from_a_builtin_is_refused(tmp_path: Path, typo: str, meant: str | None) -> None:
    """--llm fak became a paid OpenAI model named "fak"."""
    from hdeval.llm.backends.factory import did_you_mean

    assert did_you_mean(typo, None) == meant
    assert did_you_mean(typo, "http://127.0.0.1:8000/v1") is None  # a server's own model name
    if meant:
        res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--llm", typo, "--dry-run")
        assert res.exit_code == 2 and f"did you mean {meant!r}?" in res.stderr


@pytest.mark.parametrize("given, meant", [
    ("fake ", "fake"), (" fake", "fake"), ("FAKE", "fake"), ("Local", "local"), ("local\t", "local"),
    ("Fake:garbage=0.1", "fake:garbage=0.1"), (" fake:logprobs=0", "fake:logprobs=0"),
    ("LlamaCpp:/m.gguf", "llamacpp:/m.gguf"), ("fake", None), ("local", None), ("fake:garbage=0.1", None),
    ("llamacpp:/m.gguf", None), ("ft:gpt-4o-mini:org::x1", None), ("FAKE-model", None),
])
def test_a_builtin_llm_in_another_case_or_with_spaces_is_refused_not_sent_to_openai(
    monkeypatch, given: str, meant: str | None
) -> None:
    """--llm "fake " and --llm FAKE were OpenAI runs of models named "fake " and "FAKE"."""
    from hdeval.llm.backends.factory import did_you_mean

    assert did_you_mean(given, None) == meant
    assert did_you_mean(given, "http://127.0.0.1:9/v1") is None  # a server's own model name
    if meant:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
        res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--llm", given, "--layers", "1", "--dry-run")
        assert res.exit_code == 2 and "openai:" not in res.output
        one_error(res, f"did you mean {meant!r}?")


@pytest.mark.parametrize("llm", ["", " ", "\t"])
def test_an_empty_llm_is_one_line_not_the_default_openai_model(monkeypatch, tmp_path: Path, llm: str) -> None:
    """--llm "$LLM" with LLM unset gives --llm "": it ran gpt-4o-mini on OpenAI (with a key set)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    task = ["--task", EXAMPLES / "qa_task.toml", "--layers", "1", "--dry-run"]
    res = run_cli("train", *task, "--llm", llm)
    assert res.exit_code == 2 and "openai:" not in res.output
    one_error(res, "--llm is empty")
    one_error(run_cli("train", *task, "--llm", "fake", "--llm", llm), "--llm is empty")  # a jury
    monkeypatch.setenv("HDEVAL_LLM", llm)
    res = run_cli("train", *task)
    assert res.exit_code == 2 and "openai:" not in res.output
    one_error(res, "HDEVAL_LLM is empty")
    assert run_cli("train", *task, "--llm", "fake").exit_code == 0  # --llm given: the variable is not read


def test_an_empty_hdeval_llm_does_not_stop_commands_that_use_the_artifacts_llm(monkeypatch, tmp_path: Path) -> None:
    # apply, check, estimate and explain ignore HDEVAL_LLM: a CI gate with HDEVAL_LLM=${{ vars.X }}
    # and X unset was refused by them ("HDEVAL_LLM is empty") though nothing would use it
    art = tmp_path / "art"
    common = ["--cache-dir", tmp_path / "c", "-q"]
    assert run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--llm", "fake", "--layers", "1", "-o", art,
                   *common).exit_code == 0
    monkeypatch.setenv("HDEVAL_LLM", "")
    res = run_cli("apply", art, EXAMPLES / "new_qa.jsonl", "-o", tmp_path / "out.jsonl", *common)
    assert res.exit_code == 0, res.output
    res = run_cli("check", art, "--data", EXAMPLES / "qa.jsonl", "--min-spearman", "-1", *common)
    assert res.exit_code == 0, res.output


def test_the_library_refuses_an_empty_llm_or_a_builtin_in_another_case(monkeypatch, tmp_path: Path) -> None:
    from hdeval import train
    from hdeval.core.errors import ConfigError
    from hdeval.llm.backends.factory import make_backend, resolve_llm
    from hdeval.llm.config import LLMConfig

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    for llm, said in (("", "--llm is empty"), (" ", "--llm is empty"), ("FAKE", "did you mean 'fake'")):
        with pytest.raises(ConfigError, match=said):
            train(task=str(EXAMPLES / "qa_task.toml"), llm=llm, layers=1, cache_dir=str(tmp_path / "c"))
        with pytest.raises(ConfigError, match=said):
            make_backend(LLMConfig(model=llm), offline=True)
    with pytest.raises(ConfigError, match="--llm is empty"):
        resolve_llm("")
    with pytest.raises(ConfigError, match="HDEVAL_LLM is empty"):
        resolve_llm(None, {"HDEVAL_LLM": " ", "OPENAI_API_KEY": "sk-test-not-used"})
    assert resolve_llm(None, {"OPENAI_API_KEY": "sk-test-not-used"}) == "gpt-4o-mini"


def test_a_jury_file_judge_with_an_empty_llm_or_a_builtin_in_another_case_is_refused(tmp_path: Path) -> None:
    for llm, said in (("FAKE", "did you mean 'fake'"), (" ", "llm is empty")):
        jury = tmp_path / "jury.toml"
        jury.write_text(f'[[judge]]\nname = "a"\nllm = "{llm}"\n[[judge]]\nname = "b"\nllm = "fake"\n')
        res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--layers", "1", "--jury", jury, "--dry-run")
        assert res.exit_code == 2
        one_error(res, f"{jury}: judge 'a': ", said)


def test_the_library_refuses_a_typo_of_a_builtin_llm_as_the_cli_does(monkeypatch) -> None:
    """ev.score(..., llm="fakee") said only that OpenAI needs a key (and with one set, would have
    sent the rows to a model named "fakee")."""
    from hdeval.core.errors import ConfigError
    from hdeval.llm.backends.factory import make_backend
    from hdeval.llm.config import LLMConfig

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    with pytest.raises(ConfigError, match="did you mean 'fake'"):
        make_backend(LLMConfig(model="fakee"))
    assert make_backend(LLMConfig(model="fakee", base_url="http://127.0.0.1:9/v1"), offline=True) is not None


def test_the_dry_run_says_where_calls_would_go() -> None:
    res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--llm", "gpt-4o-mini", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "calls would go to: model gpt-4o-mini at https://api.openai.com/v1 (OpenAI's API: paid per token)" \
        in res.stdout


def test_importing_a_1_to_10_scale_into_1_to_5_says_so_in_one_short_line(tmp_path: Path) -> None:
    """A 1,936-character list of cells; now the column's range against the task's."""
    data = tmp_path / "ten.csv"
    data.write_text("question,answer,clear,correct\n" + "".join(
        f"Q{i}?,A{i}.,{1 + i % 10},{1 + i % 5}\n" for i in range(40)), encoding="utf-8")
    res = run_cli("data", "import", data, "--task", EXAMPLES / "qa_task.toml", "--source-col", "question",
                  "--output-col", "answer", "--score-col", "clarity=clear", "--score-col", "accuracy=correct",
                  "-o", tmp_path / "out.jsonl")
    line = one_error(res, "scores in column 'clear' range 1-10; the task says [1, 5] for clarity (20 outside it")
    assert len(line) < 300 and "correct" not in line


def test_root_help_says_each_summary_whole() -> None:
    """`hdeval --help` cut its summaries mid-sentence with '...'."""
    res = run_cli("--help")
    assert res.exit_code == 0 and "..." not in res.stdout.split("Commands:")[1]
    assert "Score new samples with a trained evaluator (same criteria,\n" in res.stdout  # wrapped, not cut


def test_the_benchmark_banner_never_ticks_a_method_the_baseline_beats() -> None:
    """The line "✓ best method hdeval-lr 0.067" stood beside "direct 0.232 ... does not beat it"."""
    from hdeval.report.bench import verdict

    def setting(method: str, value: float) -> dict:
        return {"method": method, "aggregator": "lr" if method == "hdeval" else None, "train_frac": 0.5,
                "dataset": {"average": {"spearman": {"mean": value}}}, "agreement": {}}

    results = {"shape": "pointwise", "settings": [setting("direct", 0.232), setting("hdeval", 0.067)], "runs": []}
    lines = {line.label: line for line in verdict(results).lines}
    assert lines["best method"].warn and "no trained method beats it" in lines["best method"].text
    assert lines["best method"].text.startswith("direct")
    results["settings"][1] = setting("hdeval", 0.4)
    lines = {line.label: line for line in verdict(results).lines}
    assert not lines["best method"].warn and lines["best method"].text.startswith("hdeval")


def test_init_asks_on_a_terminal(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    import hdeval.cli.init as init_cmd
    from hdeval.cli import cli
    from hdeval.data.tasks import load_task

    monkeypatch.setattr(init_cmd, "_on_a_terminal", lambda: True)
    answers = "\n".join(["question", "answer", "science_qa", "Short answers to science questions.",
                         "How easy the answer is to read.", "Whether the answer is correct."]) + "\n"
    res = CliRunner().invoke(cli, ["init", str(EXAMPLES / "ratings.csv"), "-o", str(tmp_path / "t.toml")],
                             input=answers)
    assert res.exit_code == 0, res.output
    task = load_task(tmp_path / "t.toml")
    assert task.name == "science_qa" and task.description == "Short answers to science questions."
    assert [a.definition for a in task.aspects] == ["How easy the answer is to read.", "Whether the answer is correct."]


@pytest.mark.slow
def test_check_gates_a_pairwise_artifact_on_agreement(tmp_path: Path) -> None:
    cache = ["--cache-dir", tmp_path / "c", "--llm", "fake"]
    art = tmp_path / "pairs-dna"
    res = run_cli("train", "--task", EXAMPLES / "pairs_task.toml", "--method", "dna", "-o", art, "-q", *cache)
    assert res.exit_code == 0, res.output
    gold = ["--data", EXAMPLES / "pairs.jsonl"]
    applied = run_cli("apply", art, EXAMPLES / "pairs.jsonl", "-o", tmp_path / "j.jsonl", *cache)
    held_out = json.loads(applied.stdout.split("training split): ")[1].splitlines()[0])["llm"]["w_ties"]
    ok = run_cli("check", art, *gold, "--min-agreement", str(held_out), *cache)
    assert ok.exit_code == 0 and f"agreement (ties counted) {held_out:.3f} >= " in ok.stdout, ok.output
    low = run_cli("check", art, *gold, "--min-agreement", str(min(1.0, held_out + 0.01)), *cache)
    assert low.exit_code == 1 and "is below" in low.stderr
    one_error(run_cli("check", art, *gold, "--min-spearman", "0.5", *cache), "--min-agreement")
    one_error(run_cli("check", art, "--data", EXAMPLES / "new_pairs.jsonl", "--min-agreement", "0.5", "--llm", "fake",
                      "--cache-dir", tmp_path / "empty-cache"), "no human labels (a/b/tie)")
    assert not (tmp_path / "empty-cache").exists()  # refused before the LLM (and its cache) was opened


def _in_a_fresh_interpreter(code: str, cwd: Path) -> subprocess.CompletedProcess:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HDEVAL_LLM", "HDEVAL_BASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES.parent), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("command", [
    ["apply", "{art}", "{missing}", "--llm", "fake", "-o", "{out}"],
    ["apply", "{art}", "{missing}", "--llm", "gpt-4o-mini", "--export-requests", "{out}"],
    ["check", "{art}", "--data", "{missing}", "--llm", "fake", "--min-spearman", "0.5"],
])
def test_a_missing_input_is_said_before_the_artifact_loads(qa_artifact: Path, tmp_path: Path,
                                                           command: list[str]) -> None:
    """The artifact (and scikit-learn, skops) was loaded first."""
    missing = tmp_path / "new.csv"
    argv = [a.format(art=qa_artifact, missing=missing, out=tmp_path / "out.jsonl") for a in command]
    code = (
        "import sys\n"
        "import hdeval.cli\n"
        "try:\n"
        f"    hdeval.cli.cli({argv!r}, prog_name='hdeval')\n"
        "except SystemExit as e:\n"
        "    print('EXIT', e.code)\n"
        "print('LOADED', sorted(m for m in ('sklearn', 'skops', 'shap', 'matplotlib') if m in sys.modules))\n"
    )
    r = _in_a_fresh_interpreter(code, tmp_path)
    assert r.stderr.startswith(f"error: cannot open data file {missing}"), r.stderr
    assert "EXIT 2" in r.stdout and "LOADED []" in r.stdout, r.stdout
    assert not (tmp_path / "out.jsonl").exists()


def test_apply_report_and_check_do_not_load_the_openai_sdk_for_files() -> None:
    """The openai SDK came with apply's output helpers (0.3-0.5 s of every apply and report, on
    the fake or embedded LLM too); it loads when an OpenAI-compatible server is used."""
    code = (
        "import sys\n"
        "import hdeval.cli.report, hdeval.run.apply, hdeval.run.check, hdeval.run.output\n"
        "print('LOADED', sorted(m for m in ('openai', 'httpx') if m in sys.modules))\n"
    )
    r = _in_a_fresh_interpreter(code, EXAMPLES)
    assert "LOADED []" in r.stdout, r.stdout + r.stderr



NEW_RATINGS = (
    "question,answer,clear,correct\n"
    "What makes rain?,Water vapour condenses into drops heavy enough to fall.,5,5\n"
    "What makes rain?,Clouds get tired.,3,1\n"
    "Why do we have seasons?,The tilt of the axis changes how directly sunlight hits.,4,5\n"
    "Why do we have seasons?,The Earth is closer to the Sun in summer.,4,2\n"
)


def test_the_columns_data_import_was_given_are_kept_for_apply(tmp_path: Path) -> None:
    """--source-col and the others served data import, then were forgotten: apply on a
    new CSV of the same layout stopped at "no column 'source'"."""
    mine = tmp_path / "mine.jsonl"
    res = run_cli("data", "import", EXAMPLES / "ratings.csv", "--task", EXAMPLES / "qa_task.toml",
                  "--source-col", "question", "--output-col", "answer", "--score-col", "clarity=clear",
                  "--score-col", "accuracy=correct", "-o", mine)
    assert res.exit_code == 0, res.output
    res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--data", mine, "--method", "direct",
                  "--llm", "fake", "-o", tmp_path / "art", "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output
    new = tmp_path / "new.csv"
    new.write_text(NEW_RATINGS, encoding="utf-8")
    res = run_cli("apply", tmp_path / "art", new, "--llm", "fake", "--cache-dir", tmp_path / "cache",
                  "-o", tmp_path / "scored.jsonl")
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 and all(set(r["scores"]) == {"clarity", "accuracy"} for r in rows)
    assert not any(r["in_training"] for r in rows)
    res = run_cli("check", tmp_path / "art", "--data", new, "--llm", "fake", "--cache-dir", tmp_path / "cache",
                  "--min-spearman", "-1")  # the human scores come through the mapping too
    assert res.exit_code == 0 and "Spearman" in res.output, res.output


CHAT_TASK = """name = "chat"
description = "A reply to a dialogue, given a fact."
output_label = "Reply"
[[fields]]
key = "source"
label = "Dialogue"
[[fields]]
key = "context"
label = "Fact"
[[fields]]
key = "output"
label = "Reply"
[[aspects]]
key = "engaging"
name = "Engaging"
definition = "Whether the reply is engaging."
range = [1, 3]
"""


def test_an_imported_file_is_not_mapped_again_by_its_recorded_columns(tmp_path: Path) -> None:
    """A layout whose column names are hdeval's fields for other texts (the dialogue in a column
    called context): the imported rows are in hdeval's schema, and reading them through the
    recorded mapping again put the fact where the dialogue was, for train and for apply."""
    from hdeval.data.samples import read_task_samples, recorded_columns
    from hdeval.data.tasks import load_task

    (tmp_path / "chat.toml").write_text(CHAT_TASK, encoding="utf-8")
    rows = [f"dialogue {d},fact {d},reply {d}-{k},{1 + (d + k) % 3}" for d in range(4) for k in range(2)]
    (tmp_path / "r.csv").write_text("context,fact,response,engaging\n" + "\n".join(rows) + "\n", encoding="utf-8")
    mine = tmp_path / "mine.jsonl"
    res = run_cli("data", "import", tmp_path / "r.csv", "--task", tmp_path / "chat.toml", "--source-col", "context",
                  "--context-col", "fact", "--output-col", "response", "-o", mine)
    assert res.exit_code == 0, res.output
    task = recorded_columns(mine, load_task(tmp_path / "chat.toml"))
    assert dict(task.columns)["source"] == "context"  # still recorded for apply on new CSVs
    first = read_task_samples(mine, task)[0]
    assert (first.fields["source"], first.fields["context"], first.fields["output"]) == (
        "dialogue 0", "fact 0", "reply 0-0")


def test_a_recorded_mapping_that_is_no_mapping_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "mine.jsonl"
    lines = (EXAMPLES / "qa.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["columns"] = {"scores": {"fluency": "f"}}  # the task has no aspect fluency
    data.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n", encoding="utf-8")
    res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--data", data, "--method", "direct",
                  "--llm", "fake", "-o", tmp_path / "art", "--cache-dir", tmp_path / "cache")
    one_error(res, f"{data}: line 1: columns.scores", "fluency")
    assert not (tmp_path / "art").exists()


def _cache_with_runs_of(tmp_path: Path, *identities: str) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "rates.json").write_text(json.dumps({i: {"seconds_per_1k_tokens": 1.0, "calls": 30}
                                                  for i in identities}), encoding="utf-8")
    return cache


@pytest.mark.parametrize("llm, base_url, meant", [
    ("gpt-4o-mnii", None, "gpt-4o-mini"),
    ("GPT-4o-mini", None, "gpt-4o-mini"),
    ("gpt-4o-mini", None, None),  # a model it has: nothing to say
    ("gpt-4o", None, None),  # five edits away: another model, not a typo
    ("qwen2.5-7b-instruct", "http://127.0.0.1:9/v1", "qwen2.5-7b-instruc"),
    ("gpt-4o-mnii", "http://127.0.0.1:9/v1", None),  # seen at OpenAI, not at this server
])
def test_a_model_name_a_typo_away_from_one_the_cache_has_run_gets_did_you_mean(
        tmp_path: Path, llm: str, base_url: str | None, meant: str | None) -> None:
    """Only the built-ins were compared; a model the cache has replies of was not."""
    cache = _cache_with_runs_of(tmp_path, "openai:gpt-4o-mini@https://api.openai.com/v1",
                                "openai:qwen2.5-7b-instruc@http://127.0.0.1:9/v1+llama", "fake:v1")
    res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--llm", llm, "--dry-run", "--cache-dir", cache,
                  *(["--base-url", base_url] if base_url else []))
    assert res.exit_code == 0, res.output  # a warning: a name one edit from another may be a real model
    warned = [line for line in res.stderr.splitlines() if "did you mean" in line]
    if meant is None:
        assert warned == []
    else:
        assert warned == [f"warning: --llm {llm!r}: the reply cache has no run of that model at "
                          f"{base_url or 'https://api.openai.com/v1'}; did you mean {meant!r}, which it has?"]


@pytest.mark.parametrize("given", ["https://h.example/v1?api-version=1,2&key=S1,S2", "https://h.example/v1/",
                                   "https://h.example/v1", "https://h.example/v1/?other=1"])
def test_did_you_mean_finds_a_run_at_a_server_named_with_a_query_or_a_slash(tmp_path: Path, given: str) -> None:
    """The run recorded at a URL whose query holds commas was filed under "https://h.example/v1,S2"
    (a piece of the query, written to rates.json), which no --base-url matched."""
    from hdeval.cli.options import seen_model_near
    from hdeval.llm.backends.openai_compat import OpenAICompatBackend
    from hdeval.llm.eta import record_rate

    ran = OpenAICompatBackend(model="qwen2.5-7b-instruct", base_url="https://h.example/v1?api-version=1,2&key=S1,S2",
                              api_key="k", dialect="vllm")
    record_rate(tmp_path, ran.identity, calls=100, prompt_tokens=10_000, seconds=5.0)
    assert "S1" not in (tmp_path / "rates.json").read_text(encoding="utf-8")
    assert "S2" not in (tmp_path / "rates.json").read_text(encoding="utf-8")
    assert seen_model_near("qwen2.5-7b-instruc", given, str(tmp_path)) == ("qwen2.5-7b-instruct", "https://h.example/v1")


@pytest.mark.parametrize("rates", ["huge", "fifo", "deep", "list", "control"])
def test_a_hostile_rates_file_is_read_bounded_for_did_you_mean(tmp_path: Path, rates: str) -> None:
    import os

    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / "rates.json"
    if rates == "huge":  # a real entry, but past the bound: not read at all
        path.write_text(json.dumps({"openai:gpt-4o-mini@https://api.openai.com/v1": {"pad": "x" * (1 << 20)}}))
    elif rates == "fifo":  # opening it would wait for a writer forever
        os.mkfifo(path)
    elif rates == "deep":
        path.write_text("[" * 200_000)
    elif rates == "list":
        path.write_text(json.dumps(["openai:gpt-4o-mini@https://api.openai.com/v1"]))
    else:  # one edit from --llm, but no model's name: never printed
        path.write_text(json.dumps({"openai:gpt-4o-mnii\x1b@https://api.openai.com/v1": {}}))
    res = run_cli("train", "--task", EXAMPLES / "qa_task.toml", "--llm", "gpt-4o-mnii", "--dry-run",
                  "--cache-dir", cache)
    assert res.exit_code == 0, res.output
    assert "did you mean" not in res.stderr
