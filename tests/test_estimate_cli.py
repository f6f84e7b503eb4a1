"""``hdeval estimate``: the PPI++ table from rows scored through an artifact (cached) or from an
apply output, its JSON records, groups and their differences, and the labels it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TOY_TASK, run_cli, toy_rows

from hdeval.learn.ppi import difference, ppi_mean

KEYS = {"aspect", "group", "estimate", "low", "high", "classical_low", "classical_high", "evaluator_mean",
        "n_labelled", "n"}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    """A `direct` artifact of the toy task and 120 new rows (two systems), one in four labelled."""
    d = tmp_path_factory.mktemp("estimate")
    (d / "task.toml").write_text(TOY_TASK, encoding="utf-8")
    _write(d / "train.jsonl", toy_rows())
    r = run_cli("train", "--task", d / "task.toml", "--data", d / "train.jsonl", "--method", "direct",
                "--llm", "fake", "--cache-dir", d / "cache", "-o", d / "art", "-q")
    assert r.exit_code == 0, r.output
    rows = toy_rows(n_docs=40, per_doc=3)
    for i, row in enumerate(rows):
        row.update(id=f"new-{i}", doc_id=f"new-doc-{i // 3}", system="A" if i % 2 else "B")
        if i % 4 > 1:
            del row["scores"]
    _write(d / "rows.jsonl", rows)
    r = run_cli("apply", d / "art", d / "rows.jsonl", "--llm", "fake", "--cache-dir", d / "cache",
                "-o", d / "scored.jsonl", "-q")
    assert r.exit_code == 0, r.output
    return {"dir": d, "art": d / "art", "rows": d / "rows.jsonl", "scored": d / "scored.jsonl", "cache": d / "cache"}


def _records(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def _expected(scored: Path, aspect: str, keep=lambda row: True):
    y, f, rest = [], [], []
    for line in scored.read_text().splitlines():
        row = json.loads(line)
        if not keep(row):
            continue
        if aspect in (row.get("human") or {}):
            y.append(row["human"][aspect])
            f.append(row["scores"][aspect])
        else:
            rest.append(row["scores"][aspect])
    return ppi_mean(y, f, rest)


def test_samples_are_scored_through_the_cache_and_estimated(work):
    r = run_cli("estimate", work["art"], "--data", work["rows"], "--llm", "fake", "--cache-dir", work["cache"],
                "--json", "-q")
    assert "LLM calls made: 0" in r.stderr  # apply scored these rows already
    records = _records(r)
    assert [x["aspect"] for x in records] == ["clarity", "accuracy"]
    for rec in records:
        assert KEYS <= set(rec) and rec["group"] == "all" and (rec["n_labelled"], rec["n"]) == (60, 120)
        want = _expected(work["scored"], rec["aspect"])
        assert (rec["estimate"], rec["low"], rec["high"]) == pytest.approx((want.estimate, want.low, want.high))
        assert (rec["classical_low"], rec["classical_high"]) == pytest.approx((want.classical_low, want.classical_high))
        assert rec["evaluator_mean"] == pytest.approx(want.evaluator_mean)


def test_an_apply_output_is_read_without_an_llm_and_printed_as_a_table(work):
    r = run_cli("estimate", work["art"], "--data", work["scored"], "--llm", "http-not-used", "--alpha", "0.05")
    assert r.exit_code == 0, r.output
    assert "LLM calls" not in r.stderr
    out = r.stdout
    assert "PPI++ estimate [95%]" in out and "classical (labels only)" in out and "(biased)" in out
    want = _expected(work["scored"], "clarity")
    assert f"{want.estimate:.3f}" in out
    assert "label about" in out or "already within" in out or "out of reach" in out


def test_groups_and_their_difference(work):
    records = _records(run_cli("estimate", work["art"], "--data", work["scored"], "--by", "system", "--json"))
    means = {(x["aspect"], x["group"]): x for x in records if x["kind"] == "mean"}
    assert set(means) == {(a, g) for a in ("clarity", "accuracy") for g in ("A", "B")}
    assert all(x["n"] == 60 and x["n_labelled"] == 30 for x in means.values())
    diffs = [x for x in records if x["kind"] == "difference"]
    assert {(x["aspect"], x["group"], x["baseline"]) for x in diffs} == {("clarity", "B", "A"), ("accuracy", "B", "A")}
    for x in diffs:
        want = difference(_expected(work["scored"], x["aspect"], lambda row: row["system"] == "B"),
                          _expected(work["scored"], x["aspect"], lambda row: row["system"] == "A"))
        assert (x["estimate"], x["low"], x["high"]) == pytest.approx((want.estimate, want.low, want.high))
    again = _records(run_cli("estimate", work["art"], "--data", work["scored"], "--by", "system", "--baseline", "B",
                             "--json"))
    assert {x["baseline"] for x in again if x["kind"] == "difference"} == {"B"}
    bad = run_cli("estimate", work["art"], "--data", work["scored"], "--by", "system", "--baseline", "C")
    assert bad.exit_code == 2 and "--baseline 'C' is no group of 'system'" in bad.stderr
    # without --by there are no groups to compare: refused, not ignored
    bad = run_cli("estimate", work["art"], "--data", work["scored"], "--baseline", "A")
    assert bad.exit_code == 2 and bad.stdout == "" and "--baseline A names a group" in bad.stderr


def test_a_difference_of_ten_labels_a_group_is_printed_wider_than_the_normal_interval(work):
    """With 10 labels a system the printed difference reaches further than the estimate plus or
    minus 1.645 standard errors: the normal quantile covered 0.83-0.84 for 90% at 10 labels a
    group (benchmarks/ppi.md), the interval printed now comes from a studentised bootstrap."""
    def ten_each(i, row):
        if i >= 40:
            row.pop("human", None)  # rows 0-39 keep their labels: 10 a system
    path = _edited(work, "ten.jsonl", ten_each)
    records = _records(run_cli("estimate", work["art"], "--data", path, "--by", "system", "--json"))
    assert {x["n_labelled"] for x in records if x["kind"] == "mean"} == {10}
    diffs = {x["aspect"]: x for x in records if x["kind"] == "difference"}
    table = run_cli("estimate", work["art"], "--data", path, "--by", "system")
    assert table.exit_code == 0, table.output
    for aspect, x in diffs.items():
        line = next(s for s in table.stdout.splitlines() if s.strip().startswith(aspect) and " - A:" in s)
        low, high = (float(v) for v in line.split("[", 1)[1].split("]", 1)[0].split(","))
        assert (low, high) == pytest.approx((x["low"], x["high"]), abs=6e-4)
        assert high - low > 2 * 1.645 * x["se"] * 1.05


def _edited(work, name: str, change) -> Path:
    rows = [json.loads(line) for line in work["scored"].read_text().splitlines()]
    for i, row in enumerate(rows):
        change(i, row)
    return _write(work["dir"] / name, rows)


def test_actively_selected_labels_are_refused_without_their_probabilities(work):
    def picked(i, row):
        if "human" in row:
            row["selection"] = "uncertainty"
    path = _edited(work, "active.jsonl", picked)
    r = run_cli("estimate", work["art"], "--data", path)
    assert r.exit_code == 2 and r.stdout == ""
    assert f"{path}: line 1: this label was picked by the 'uncertainty' strategy" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    def mixed(i, row):
        if "human" in row and i > 10:
            row["sampling_prob"] = 0.5
    r = run_cli("estimate", work["art"], "--data", _edited(work, "mixed.jsonl", mixed))
    assert r.exit_code == 2 and "labelled rows with and without 'sampling_prob'" in r.stderr

    def bad_prob(i, row):
        if "human" in row:
            row["sampling_prob"] = 0 if i == 5 else 0.5
    r = run_cli("estimate", work["art"], "--data", _edited(work, "badprob.jsonl", bad_prob))
    assert r.exit_code == 2 and "line 6: field 'sampling_prob' is 0, not a probability" in r.stderr


def test_samples_are_checked_before_any_llm_call(work, tmp_path):
    """Samples whose labels an active strategy picked were scored first (160 LLM calls on an empty
    cache) and refused after: every check that needs no scores now comes before the calls."""
    rows = [json.loads(line) for line in work["rows"].read_text().splitlines()]
    for row in rows:
        if "scores" in row:
            row["selection"] = "diversity"
    cache = tmp_path / "cache"
    opts = ("--llm", "fake", "--cache-dir", cache)
    r = run_cli("estimate", work["art"], "--data", _write(tmp_path / "active.jsonl", rows), *opts)
    assert r.exit_code == 2 and r.stdout == "" and "LLM calls" not in r.stderr
    assert "active.jsonl: line 1: this label was picked by the 'diversity' strategy" in r.stderr
    for i, row in enumerate(rows):
        row.pop("selection", None)
        if "scores" in row and i > 10:
            row["sampling_prob"] = 0.5
    r = run_cli("estimate", work["art"], "--data", _write(tmp_path / "mixed.jsonl", rows), *opts)
    assert r.exit_code == 2 and "LLM calls" not in r.stderr and "with and without 'sampling_prob'" in r.stderr
    r = run_cli("estimate", work["art"], "--data", work["rows"], *opts, "--by", "topic")
    assert r.exit_code == 2 and "LLM calls" not in r.stderr and "--by topic: no row of" in r.stderr
    r = run_cli("estimate", work["art"], "--data", work["rows"], *opts, "--by", "system", "--baseline", "C")
    assert r.exit_code == 2 and "LLM calls" not in r.stderr and "--baseline 'C' is no group" in r.stderr
    # a group only the artifact's training rows have is no group of the estimate either
    from hdeval.methods.registry import load_artifact

    ids = load_artifact(work["art"]).training_ids()
    trained = [r for r in map(json.loads, (work["dir"] / "train.jsonl").read_text().splitlines()) if r["id"] in ids]
    trained = trained[:5]
    assert len(trained) == 5
    for row in trained:
        row["system"] = "Z"
    both = _write(tmp_path / "with-training.jsonl", trained + [json.loads(x) for x in work["rows"].read_text().splitlines()])
    r = run_cli("estimate", work["art"], "--data", both, *opts, "--by", "system", "--baseline", "Z")
    assert r.exit_code == 2 and "LLM calls" not in r.stderr and "--baseline 'Z' is no group" in r.stderr
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_labels_with_their_probabilities_are_weighted(work):
    def chosen(i, row):
        if "human" in row:
            row.update(selection="uncertainty", sampling_prob=0.25 if i % 8 < 2 else 0.75)
    records = _records(run_cli("estimate", work["art"], "--data", _edited(work, "weighted.jsonl", chosen), "--json"))
    probs = np.array([0.25 if i % 8 < 2 else 0.75 for i in range(120) if i % 4 < 2])
    for rec in records:
        assert rec["weighted"] is True
        rows = [json.loads(line) for line in work["scored"].read_text().splitlines()]
        y = np.array([row["human"][rec["aspect"]] for row in rows if "human" in row])
        assert rec["classical"] == pytest.approx(float((y / probs).sum() / (1 / probs).sum()))


def test_training_rows_are_left_out(work):
    r = run_cli("apply", work["art"], work["dir"] / "train.jsonl", "--llm", "fake", "--cache-dir", work["cache"],
                "-o", work["dir"] / "train_scored.jsonl", "-q")
    assert r.exit_code == 0, r.output
    scored = [json.loads(x) for x in (work["dir"] / "train_scored.jsonl").read_text().splitlines()]
    seen = sum(row["in_training"] for row in scored)
    assert 0 < seen < len(scored)
    mixed = _write(work["dir"] / "both.jsonl", scored + [json.loads(x) for x in work["scored"].read_text().splitlines()])
    r = run_cli("estimate", work["art"], "--data", mixed, "--json")
    assert f"{seen} rows were in the artifact's training split: left out" in r.stderr
    assert all(x["n"] == 120 + len(scored) - seen for x in _records(r))
    only = _write(work["dir"] / "only.jsonl", [row for row in scored if row["in_training"]])
    r = run_cli("estimate", work["art"], "--data", only)
    assert r.exit_code == 2 and "no rows to estimate on" in r.stderr


def test_bad_options_and_files(work):
    r = run_cli("estimate", work["art"], "--data", work["scored"], "--alpha", "1.5")
    assert r.exit_code == 2 and "--alpha must be between 0 and 1" in r.stderr
    empty = _write(work["dir"] / "empty.jsonl", [])
    r = run_cli("estimate", work["art"], "--data", empty, "--llm", "fake", "--cache-dir", work["cache"])
    assert r.exit_code != 0 and r.stdout == ""
    broken = work["dir"] / "broken.jsonl"
    broken.write_text(work["scored"].read_text().splitlines()[0] + "\n{not json\n", encoding="utf-8")
    r = run_cli("estimate", work["art"], "--data", broken)
    assert r.exit_code == 2 and f"{broken}: line 2: not valid JSON" in r.stderr


def test_by_a_field_that_holds_objects_is_refused_not_one_group_per_object(work):
    r = run_cli("estimate", work["art"], "--data", work["scored"], "--by", "scores")
    assert r.exit_code == 2 and r.stdout == ""
    assert "--by scores: the field holds an object; group by a field of text or numbers" in r.stderr


def test_a_row_given_twice_or_a_label_off_the_scale_is_refused(work):
    # both used to pass: a labelled row appended five times counted as five more labels (a
    # narrower, wrong interval), and a clarity of 500 on a 1-5 scale moved the estimate to 45
    rows = [json.loads(line) for line in work["scored"].read_text().splitlines()]
    labelled = next(i for i, r in enumerate(rows) if r.get("human"))
    twice = _write(work["dir"] / "twice.jsonl", [*rows, rows[labelled]])
    r = run_cli("estimate", work["art"], "--data", twice)
    assert r.exit_code == 2 and r.stdout == ""
    assert (f"{twice}: line {len(rows) + 1}: id {rows[labelled]['id']!r} already used on line "
            f"{labelled + 1}") in r.stderr
    aspect = next(iter(rows[labelled]["human"]))

    def off_scale(i, row):
        if i == labelled:
            row["human"] = {**row["human"], aspect: 500}

    r = run_cli("estimate", work["art"], "--data", _edited(work, "off.jsonl", off_scale))
    assert r.exit_code == 2 and r.stdout == ""
    assert f"line {labelled + 1}: human score {aspect} = 500 is outside the task's range [" in r.stderr


@pytest.mark.slow
def test_pairwise_rows_give_the_win_rate_of_a_over_b(tmp_path):
    from conftest import REPO

    r = run_cli("train", "--task", REPO / "examples" / "pairs_task.toml", "--method", "dna", "--llm", "fake",
                "--cache-dir", tmp_path / "cache", "-o", tmp_path / "art", "-q")
    assert r.exit_code == 0, r.output
    pairs = [json.loads(line) for line in (REPO / "examples" / "pairs.jsonl").read_text().splitlines()]
    rows = []
    for k in range(5):
        for p in pairs:
            row = {**p, "id": f"{k}-{p['id']}", "doc_id": f"{k}-{p['doc_id']}"}
            if k >= 2:
                row.pop("label")
            rows.append(row)
    data = _write(tmp_path / "pairs.jsonl", rows)
    records = _records(run_cli("estimate", tmp_path / "art", "--data", data, "--llm", "fake", "--cache-dir",
                               tmp_path / "cache", "--json", "-q"))
    (rec,) = records
    assert rec["aspect"] == "win_rate" and (rec["n_labelled"], rec["n"]) == (2 * len(pairs), 5 * len(pairs))
    wins = [{"a": 1, "tie": 0.5, "b": 0}[p["label"]] for p in pairs] * 2
    assert rec["classical"] == pytest.approx(np.mean(wins))
    assert rec["low"] < rec["estimate"] < rec["high"] and 0 <= rec["evaluator_mean"] <= 1


def test_apply_summary_gives_the_human_mean_and_the_labels_behind_it(work):
    r = run_cli("apply", work["art"], work["rows"], "--llm", "fake", "--cache-dir", work["cache"],
                "-o", work["dir"] / "again.jsonl", "-q")
    assert r.exit_code == 0, r.output
    records = _records(run_cli("estimate", work["art"], "--data", work["scored"], "--json"))
    for rec in records:
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"human mean of {rec['aspect']}:"))
        assert (f"{rec['estimate']:.3f} [{rec['low']:.3f}, {rec['high']:.3f}] (90%, PPI++ from 60 labels over "
                f"120 rows; the evaluator alone: {rec['evaluator_mean']:.3f}, biased)") in line
        rows = [json.loads(x) for x in work["scored"].read_text().splitlines()]
        inside = [row["lower"][rec["aspect"]] <= row["human"][rec["aspect"]] <= row["upper"][rec["aspect"]]
                  for row in rows if "human" in row]
        assert f"{sum(inside) / len(inside):.0%} of those 60 labels inside their prediction interval" in line


def test_metrics_json_records_the_held_out_human_mean_and_its_labels(work):
    """The test split's labels, their mean with its interval and the evaluator's mean there: what
    `hdeval estimate` says of the same rows (every one labelled)."""
    test = json.loads((work["art"] / "metrics.json").read_text())["intervals"]["test"]
    r = run_cli("apply", work["art"], work["dir"] / "train.jsonl", "--llm", "fake", "--cache-dir", work["cache"],
                "-o", work["dir"] / "held_out.jsonl", "-q")
    assert r.exit_code == 0, r.output
    for rec in _records(run_cli("estimate", work["art"], "--data", work["dir"] / "held_out.jsonl", "--json")):
        a = rec["aspect"]
        assert test["labels"][a] == rec["n_labelled"] == rec["n"] == test["rows"]
        got = test["human_mean"][a]
        assert (got["estimate"], got["low"], got["high"], got["evaluator_mean"]) == pytest.approx(
            (rec["estimate"], rec["low"], rec["high"], rec["evaluator_mean"]), abs=1e-5)


def test_the_report_banner_shows_the_coverage_and_the_labels_behind_it():
    from types import SimpleNamespace

    from hdeval.report.pointwise import verdict

    data = {"artifact": {"llm": "gpt-x", "split": {"train": 80, "test": 40}, "needed_criteria": 4},
            "correlations": {}}
    metrics = {"intervals": {"level": 0.9, "test": {
        "rows": 40, "coverage": {"clarity": 0.875, "accuracy": "lots", "average": 0.875},
        "labels": {"clarity": 40, "accuracy": 40},
        "human_mean": {"clarity": {"estimate": 3.2, "low": 3.0, "high": 3.4, "evaluator_mean": 3.55},
                       "accuracy": None}}}}
    task = SimpleNamespace(aspects=[SimpleNamespace(key=k, low=1.0, high=5.0) for k in ("clarity", "accuracy")])
    lines = [x.text for x in verdict(SimpleNamespace(metrics=metrics, task=task), data).lines
             if x.label == "interval coverage"]
    # a figure that is not a number (an edited artifact) is left out, not shown or crashed on
    assert lines == [("clarity: the 90% intervals held 88% of 40 held-out labels; their human mean 3.20 "
                     "[3.00, 3.40], the evaluator's 3.55 on the same rows")]


def test_a_group_name_cannot_drive_the_terminal(work):
    def ansi(i, row):
        row["system"] = "\x1b[2Jevil" if i % 2 else "B"
    r = run_cli("estimate", work["art"], "--data", _edited(work, "ansi.jsonl", ansi), "--by", "system")
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout and "\\x1b[2Jevil" in r.stdout


def test_by_a_field_no_row_has_is_refused_not_one_group(work):
    """An apply output keeps id, doc_id and system, not a sample's meta: --by topic on it put every
    row in one group "(none)" and printed that as the estimate by topic."""
    r = run_cli("estimate", work["art"], "--data", work["scored"], "--by", "topic")
    assert r.exit_code == 2 and r.stdout == ""
    assert f"--by topic: no row of {work['scored']} has a field 'topic'" in r.stderr and "samples file" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_apply_with_labels_on_an_artifact_without_interval_bounds(tmp_path):
    """Trained on too few rows for a 90% bound, the artifact's rows have lower/upper None: apply's
    human-mean summary compared None with the label and died with a TypeError."""
    (tmp_path / "task.toml").write_text(TOY_TASK, encoding="utf-8")
    _write(tmp_path / "train.jsonl", toy_rows(n_docs=4, per_doc=2))
    r = run_cli("train", "--task", tmp_path / "task.toml", "--data", tmp_path / "train.jsonl", "--method", "direct",
                "--llm", "fake", "--cache-dir", tmp_path / "cache", "-o", tmp_path / "art", "-q")
    assert r.exit_code == 0, r.output
    rows = [{**row, "id": f"new-{i}", "doc_id": f"new-doc-{i}"} for i, row in enumerate(toy_rows(n_docs=6, per_doc=1))]
    r = run_cli("apply", tmp_path / "art", _write(tmp_path / "rows.jsonl", rows), "--llm", "fake",
                "--cache-dir", tmp_path / "cache", "-o", tmp_path / "scored.jsonl", "-q")
    assert r.exit_code == 0, r.output
    assert "human mean of clarity:" in r.stdout and "inside their prediction interval" not in r.stdout


def test_rows_whose_llm_calls_failed_are_left_out_not_the_whole_file(work):
    """apply writes a failed score as NaN (null for pairwise) and goes on under --max-failure-rate;
    estimate refused that whole file ("scores.clarity is nan, not a number")."""
    failed = {1, 6}  # a labelled row and an unlabelled one

    def fail(i, row):
        if i in failed:
            row["scores"]["clarity"] = float("nan")
            row["failures"] = [{"criterion": "clarity", "reason": "the server rejected this request"}]
    path = _edited(work, "failed.jsonl", fail)
    r = run_cli("estimate", work["art"], "--data", path, "--json")
    records = {x["aspect"]: x for x in _records(r)}
    assert "2 rows have no clarity score (an LLM call failed): left out of its estimate" in r.stderr
    assert records["clarity"]["n"] == 118 and records["accuracy"]["n"] == 120
    kept = _expected(path, "clarity", lambda row: row["scores"]["clarity"] == row["scores"]["clarity"])
    assert records["clarity"]["estimate"] == pytest.approx(kept.estimate)

    def absent(i, row):
        if i == 4:
            del row["scores"]["clarity"]
    r = run_cli("estimate", work["art"], "--data", _edited(work, "absent.jsonl", absent))
    assert r.exit_code == 2 and "line 5: no scores.clarity (the artifact scores other aspects?)" in r.stderr


def test_labels_that_all_agree_give_no_zero_width_interval(work):
    """Two labels of 3 in a group gave the interval [3.000, 3.000] (90% certainty of the mean
    from two rows) and '±0 is out of reach'; the difference from it claimed that precision too."""
    def few(i, row):
        if i < 4:
            row["system"] = "D"
            row["human"] = {"clarity": 3.0, "accuracy": 3.0} if i < 2 else None
        if row.get("human") is None:
            row.pop("human", None)
    r = run_cli("estimate", work["art"], "--data", _edited(work, "agree.jsonl", few), "--by", "system", "--json")
    records = _records(r)
    d = [x for x in records if x["kind"] == "mean" and x["group"] == "D"]
    assert len(d) == 2 and all(x["estimate"] is None and "all 2 labels are 3" in x["reason"] for x in d)
    assert not [x for x in records if x["kind"] == "difference" and "D" in (x["group"], x["baseline"])]


def test_a_baseline_without_an_estimate_says_why_there_are_no_differences(work):
    """With the baseline's labels all equal there is no estimate of it, and the differences from
    it vanished without a word from the table and the JSON."""
    def base_agrees(i, row):
        if row["system"] == "A" and "human" in row:
            row["human"] = {**row["human"], "clarity": 5.0}
    path = _edited(work, "base_agrees.jsonl", base_agrees)
    records = _records(run_cli("estimate", work["art"], "--data", path, "--by", "system", "--json"))
    diffs = {x["aspect"]: x for x in records if x["kind"] == "difference"}
    assert set(diffs) == {"clarity", "accuracy"} and diffs["accuracy"]["estimate"] is not None
    clarity = diffs["clarity"]
    assert (clarity["group"], clarity["baseline"], clarity["estimate"]) == ("B", "A", None)
    assert clarity["reason"] == "the baseline group A has no estimate (all 30 labels are 5: no spread to build an " \
        "interval on)"
    table = run_cli("estimate", work["art"], "--data", path, "--by", "system")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[-1] == f"no clarity differences from group A: {clarity['reason']}"
    assert any(" accuracy" in line and "B - A:" in line for line in lines)


def test_samples_in_a_csv_are_estimated_as_their_jsonl(work):
    """A CSV samples file (any format apply reads) gives the same groups and figures as its JSONL."""
    import csv

    path = work["dir"] / "rows.csv"
    rows = [json.loads(line) for line in work["rows"].read_text().splitlines()]
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "doc_id", "system", "source", "output", "clarity", "accuracy"])
        for r in rows:
            s = r.get("scores", {})
            out.writerow([r["id"], r["doc_id"], r["system"], r["source"], r["output"],
                          s.get("clarity", ""), s.get("accuracy", "")])
    opts = ("--by", "system", "--llm", "fake", "--cache-dir", work["cache"], "--json", "-q")
    from_csv = _records(run_cli("estimate", work["art"], "--data", path, *opts))
    assert from_csv == _records(run_cli("estimate", work["art"], "--data", work["rows"], *opts))
    assert {x["group"] for x in from_csv} == {"A", "B"}
    # apply's CSV output is not mistaken for samples (its human scores would be dropped)
    r = run_cli("apply", work["art"], path, "--llm", "fake", "--cache-dir", work["cache"], "-o",
                work["dir"] / "scored.csv", "-q")
    assert r.exit_code == 0, r.output
    bad = run_cli("estimate", work["art"], "--data", work["dir"] / "scored.csv", *opts)
    assert bad.exit_code == 2 and bad.stdout == "" and "scored.csv: an apply output written as a table" in bad.stderr
