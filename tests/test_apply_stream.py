"""``apply`` streams and shards.

* The input is validated whole before any LLM call, then read, scored and written a chunk at a
  time; the output appears only at the end (renamed into place), so a bad line, a failure or a
  stop in a later chunk leaves no output, no temporary file, and an existing file untouched.
* Chunk boundaries change nothing: rows, CSV and the closing correlations/agreement are the
  same with 7 samples per chunk as with one chunk, for every method.
* ``--shard K/N`` scores the samples whose stable id hash falls in shard K; ``merge-shards``
  joins the N outputs into exactly the unsharded output, and refuses incomplete or mixed sets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import copy_artifact, one_error, toy_rows, trained_toy_artifact, write_jsonl

from hdeval.cli import cli
from hdeval.run.apply import CHUNK_ENV
from hdeval.run.shards import shard_of
from hdeval.run.train import train

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

DIALOGUE = """
name = "toy_chat"
description = "Dialogue: a system wrote the next response."
output_label = "Response"

[[fields]]
key = "source"
label = "Dialogue history"

[[fields]]
key = "output"
label = "Response"

[[aspects]]
key = "overall"
name = "Overall quality"
definition = "How good the response is."
range = [1, 5]
"""


def run(*args: str, chunk: int | None = None) -> Result:
    env = {CHUNK_ENV: str(chunk)} if chunk is not None else {}
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)




def summary(result: Result) -> list[str]:
    """The closing lines that describe the scores (correlations / agreement), not the counts."""
    return [line for line in result.output.splitlines()
            if "pearson" in line or "agreement" in line or "correlation" in line]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory) -> Path:
    # training per test cost ~1.5 s of setup each; the tests only read it, each from its own copy
    return trained_toy_artifact(tmp_path_factory.mktemp("toy"), layers=2, aggregator="lr")


@pytest.fixture
def toy_artifact(trained_once: Path, toy, tmp_path: Path) -> Path:
    return copy_artifact(trained_once, tmp_path)


def _budget_for_one_and_a_half_chunks(artifact: Path) -> int:
    """A --max-calls that runs out in the second chunk of 7 samples, whatever layer training kept."""
    from hdeval.methods.registry import load_artifact

    return load_artifact(artifact).calls_per_sample() * 7 * 3 // 2


def new_samples(tmp_path: Path, n_docs: int = 12, aspects=("clarity", "accuracy")) -> Path:
    """36 samples with human scores (a fresh input; the cache of training does not cover it)."""
    rows = toy_rows(n_docs=n_docs, aspects=aspects)
    for r in rows:
        r["id"] = "new-" + r["id"]
        r["output"] += " (again)"
    return write_jsonl(tmp_path / "new.jsonl", rows)


def apply(artifact: Path, data: Path, out: Path | str, cache: Path, *extra: str, chunk: int | None = None) -> Result:
    return run("apply", artifact, data, "-o", out, "--cache-dir", cache, *extra, chunk=chunk)


# ------------------------------------------------------------------ chunking changes nothing
def _pairs(n: int = 24) -> list[dict]:
    return [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"question {i}" + " why" * i,
             "output_a": "answer " + "word " * i, "output_b": "reply " + "text " * (12 - i % 12),
             "label": ("a", "b")[i % 2]} for i in range(n)]


def _method_case(method: str, toy, tmp_path: Path) -> tuple[Path, Path]:
    """(artifact, new input) for ``method``, trained on a toy task with the fake LLM."""
    cache = str(tmp_path / "train-cache")
    if method in ("dna", "pairwise-hdeval"):
        options = {"method": "dna"} if method == "dna" else {"method": "hdeval", "layers": 1, "aggregator": "lr"}
        ev = train(task="faireval", data=str(write_jsonl(tmp_path / "pairs.jsonl", _pairs())), llm="fake",
                   cache_dir=cache, **options)
        new = [{**r, "id": "n" + r["id"], "output_a": r["output_a"] + " more"} for r in _pairs(20)]
        return ev.save(tmp_path / "art"), write_jsonl(tmp_path / "new.jsonl", new)
    if method in ("paireval", "direct-yesno"):
        task = tmp_path / "chat.toml"
        task.write_text(DIALOGUE, encoding="utf-8")
        rows = toy_rows(aspects=("overall",))
        data = write_jsonl(tmp_path / "chat.jsonl", rows)
        options = {"comparisons": 2, "aggregator": "lr"} if method == "paireval" else {}
        ev = train(task=str(task), data=str(data), method=method, llm="fake", cache_dir=cache, **options)
        return ev.save(tmp_path / "art"), new_samples(tmp_path, n_docs=10, aspects=("overall",))
    task, data = toy
    ev = train(task=str(task), data=str(data), method=method, llm="fake", cache_dir=cache,
               **({"layers": 2, "aggregator": "lr"} if method == "hdeval" else {}))
    return ev.save(tmp_path / "art"), new_samples(tmp_path, n_docs=10)


@pytest.mark.parametrize("method", ["hdeval", "direct", "direct-yesno", "paireval", "dna", "pairwise-hdeval"])
def test_chunk_boundaries_change_no_row_and_no_summary(method: str, toy, tmp_path: Path) -> None:
    artifact, data = _method_case(method, toy, tmp_path)
    whole = apply(artifact, data, tmp_path / "whole.jsonl", tmp_path / "c")
    assert whole.exit_code == 0, whole.output
    chunked = apply(artifact, data, tmp_path / "chunked.jsonl", tmp_path / "c", chunk=7)
    assert chunked.exit_code == 0, chunked.output
    assert "chunk 3/" in chunked.stderr and "chunk 1/" not in whole.stderr
    assert (tmp_path / "chunked.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    rows = [json.loads(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [json.loads(line)["id"] for line in data.read_text().splitlines()]
    assert summary(whole) and summary(chunked) == summary(whole)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["scored.jsonl", "scored.csv"])
def test_the_output_has_the_permissions_of_any_file_the_user_writes(name: str, toy_artifact: Path,
                                                                    tmp_path: Path) -> None:
    import os
    import stat

    umask = os.umask(0o022)
    try:
        assert apply(toy_artifact, new_samples(tmp_path), tmp_path / name, tmp_path / "c").exit_code == 0
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644  # not mkstemp's private 0o600


def test_csv_and_stdout_stream_the_same_rows_whatever_the_chunks(toy_artifact: Path, tmp_path: Path) -> None:
    import pandas as pd

    data = new_samples(tmp_path)
    one = apply(toy_artifact, data, tmp_path / "one.csv", tmp_path / "c")
    many = apply(toy_artifact, data, tmp_path / "many.csv", tmp_path / "c", chunk=5)
    assert one.exit_code == 0 and many.exit_code == 0, many.output
    assert (tmp_path / "many.csv").read_text() == (tmp_path / "one.csv").read_text()
    frame = pd.read_csv(tmp_path / "many.csv")
    assert len(frame) == 36 and {"id", "scores.clarity", "human.accuracy"} <= set(frame.columns)
    out = apply(toy_artifact, data, "-", tmp_path / "c", chunk=5)
    assert out.exit_code == 0, out.output
    assert apply(toy_artifact, data, tmp_path / "s.jsonl", tmp_path / "c").exit_code == 0
    assert out.stdout == (tmp_path / "s.jsonl").read_text()
    assert "correlation with the human scores" in out.stderr  # not on stdout, among the rows


# ------------------------------------------------------------------ nothing half-done
def _break_line(data: Path, index: int, dest: Path) -> Path:
    lines = data.read_text().splitlines()
    broken = json.loads(lines[index])
    broken["scores"] = {"clarity": 9}  # outside [1, 5]
    lines[index] = json.dumps(broken)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def test_a_bad_line_in_a_later_chunk_writes_nothing_and_loses_nothing_paid(toy_artifact: Path, tmp_path: Path,
                                                                         fake_calls: list[int]) -> None:
    """One reading pass: the chunks before a bad line are scored (their calls cached), then the
    bad line stops the run with every bad line of the file listed and no output."""
    good = new_samples(tmp_path)
    data = _break_line(_break_line(good, 29, tmp_path / "broken.jsonl"), 31, tmp_path / "broken.jsonl")
    out = tmp_path / "scored.jsonl"
    out.write_text("previous results\n")
    cache = tmp_path / "c"
    one_error(apply(toy_artifact, data, out, cache, "--force", chunk=7), "2 bad line(s)", "lines 30, 32: scores.clarity")
    assert out.read_text() == "previous results\n" and leftovers(tmp_path) == []
    paid = len(fake_calls)
    assert paid > 0  # chunks 1-4 were scored before line 30 was reached
    fresh = tmp_path / "fresh.jsonl"
    one_error(apply(toy_artifact, data, fresh, cache, chunk=7), "lines 30, 32")
    assert not fresh.exists() and len(fake_calls) == paid  # the second try paid nothing again
    fixed = apply(toy_artifact, good, out, cache, "--force", chunk=7)
    assert fixed.exit_code == 0, fixed.output
    assert f"cache hits: {paid}" in fixed.stderr  # what the failed run paid for was kept


def test_a_bad_line_in_the_first_chunk_is_reported_before_any_call(toy_artifact: Path, tmp_path: Path,
                                                                   fake_calls: list[int]) -> None:
    data = _break_line(new_samples(tmp_path), 1, tmp_path / "broken.jsonl")
    one_error(apply(toy_artifact, data, tmp_path / "s.jsonl", tmp_path / "c", chunk=7), "line 2")
    assert fake_calls == [] and leftovers(tmp_path) == []


def test_the_duplicate_id_index_is_on_disk_and_removed(toy_artifact: Path, tmp_path: Path, monkeypatch) -> None:
    """Duplicate ids are found through an index beside the output (not a dict of every id), which
    is gone when the run ends, whether it succeeded or not."""
    import hdeval.data.samples as data_mod

    rows = [json.loads(line) for line in new_samples(tmp_path).read_text().splitlines()]
    dup = write_jsonl(tmp_path / "dup.jsonl", rows + [{**rows[3], "output": "other"}])
    made: list[str] = []
    real = data_mod.DiskIds.__init__

    def spy(self, near=None):
        real(self, near)
        made.append(self._dir.name)

    monkeypatch.setattr(data_mod.DiskIds, "__init__", spy)
    monkeypatch.setattr(data_mod.DictIds, "first_line", lambda *a: pytest.fail("ids held in memory"))
    out_dir = tmp_path / "out"
    one_error(apply(toy_artifact, dup, out_dir / "s.jsonl", tmp_path / "c", chunk=7),
              f"line {len(rows) + 1}", f"id {rows[3]['id']!r} already used on line 4")
    assert made and all(Path(d).parent == out_dir and not Path(d).exists() for d in made)
    assert apply(toy_artifact, new_samples(tmp_path), out_dir / "s.jsonl", tmp_path / "c").exit_code == 0
    assert not any(Path(d).exists() for d in made) and [p.name for p in out_dir.iterdir()] == ["s.jsonl"]


def test_a_file_that_goes_bad_while_it_is_streamed_leaves_no_output(toy_artifact: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    """The first chunk was good; by the time the stream reaches line 30 it is not."""
    from hdeval.methods.hdeval.evaluator import Evaluator

    data = new_samples(tmp_path)
    good = data.read_text()
    real = Evaluator.score

    def score_then_break(self, samples, *a, **k):
        lines = good.splitlines()
        lines[29] = "{not json"
        data.write_text("\n".join(lines) + "\n")
        return real(self, samples, *a, **k)

    monkeypatch.setattr(Evaluator, "score", score_then_break)
    out = tmp_path / "scored.jsonl"
    out.write_text("previous results\n")
    one_error(apply(toy_artifact, data, out, tmp_path / "c", "--force", chunk=7), "line 30", "not valid JSON")
    assert out.read_text() == "previous results\n" and leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_running_out_of_calls_in_a_later_chunk_keeps_the_old_output_and_the_paid_calls(
        fmt: str, toy_artifact: Path, tmp_path: Path, fake_calls: list[int]) -> None:
    data = new_samples(tmp_path)
    out = tmp_path / f"scored.{fmt}"
    out.write_text("previous results\n")
    cache = tmp_path / "c"
    budget = _budget_for_one_and_a_half_chunks(toy_artifact)
    result = apply(toy_artifact, data, out, cache, "--force", "--max-calls", str(budget), chunk=7)
    assert result.exit_code != 0 and "--max-calls" in result.stderr + str(result.exception), result.output
    assert "chunk 2/" in result.stderr  # it failed after a chunk had been written to the temp file
    assert out.read_text() == "previous results\n" and leftovers(tmp_path) == []
    paid = len(fake_calls)
    assert budget * 2 // 3 < paid <= budget
    again = apply(toy_artifact, data, out, cache, "--force", chunk=7)
    assert again.exit_code == 0, again.output
    assert f"cache hits: {paid}" in again.stderr  # nothing paid for was lost
    assert out.read_text() != "previous results\n"


def test_a_failed_apply_leaves_no_progress_ticker_behind(toy_artifact: Path, tmp_path: Path) -> None:
    """A stage cut short by an error must not go on printing progress lines into whatever runs next."""
    import threading

    def tickers() -> set:
        return {t for t in threading.enumerate() if "_tick" in t.name}

    before = tickers()
    result = apply(toy_artifact, new_samples(tmp_path), tmp_path / "s.jsonl", tmp_path / "c", "--max-calls",
                   str(_budget_for_one_and_a_half_chunks(toy_artifact)), chunk=7)
    assert result.exit_code != 0 and "chunk 2/" in result.stderr
    for t in tickers() - before:
        t.join(timeout=30)  # told to stop: it ends at once
        assert not t.is_alive()


def test_ctrl_c_in_a_later_chunk_leaves_no_output(toy_artifact: Path, tmp_path: Path, monkeypatch) -> None:
    from hdeval.methods.hdeval.evaluator import Evaluator

    real, seen = Evaluator.score, []

    def stop_on_third(self, samples, *a, **k):
        seen.append(len(samples))
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real(self, samples, *a, **k)

    monkeypatch.setattr(Evaluator, "score", stop_on_third)
    out = tmp_path / "scored.jsonl"
    result = apply(toy_artifact, new_samples(tmp_path), out, tmp_path / "c", chunk=7)
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert seen == [7, 7, 7] and not out.exists() and leftovers(tmp_path) == []


# ------------------------------------------------------------------ shards
def test_shard_hash_is_stable_and_spreads_ids() -> None:
    # pinned: the same on every machine and Python (SHA-256 of the id, not Python's salted hash)
    assert [shard_of(f"id-{i}", 3) for i in range(8)] == [shard_of(f"id-{i}", 3) for i in range(8)]
    assert [shard_of(f"id-{i}", 3) for i in range(8)] == PINNED
    counts = [sum(shard_of(f"s{i}", 4) == k for i in range(4000)) for k in (1, 2, 3, 4)]
    assert all(800 < c < 1200 for c in counts), counts


PINNED = [1, 3, 2, 2, 2, 1, 3, 2]


@pytest.mark.parametrize("n", [2, 3])
def test_shards_merged_equal_the_unsharded_apply(n: int, toy_artifact: Path, tmp_path: Path) -> None:
    data = new_samples(tmp_path)
    cache = tmp_path / "c"
    assert apply(toy_artifact, data, tmp_path / "all.jsonl", cache).exit_code == 0
    assert apply(toy_artifact, data, tmp_path / "all.csv", cache).exit_code == 0
    parts, counts = [], []
    for k in range(1, n + 1):
        part = tmp_path / f"part{k}.jsonl"
        result = apply(toy_artifact, data, part, cache, "--shard", f"{k}/{n}", chunk=4)
        assert result.exit_code == 0, result.output
        *rows, closing = [json.loads(line) for line in part.read_text().splitlines()]
        assert rows and all(r["shard"]["k"] == k and shard_of(r["id"], n) == k for r in rows)
        assert closing["shard"]["rows"] == len(rows) and "id" not in closing
        assert f"of 36 samples in shard {k}/{n}" in result.stderr
        counts.append(len(rows))
        parts.append(part)
    assert sum(counts) == 36
    merged = run("merge-shards", tmp_path / "merged.jsonl", *reversed(parts))
    assert merged.exit_code == 0, merged.output
    assert (tmp_path / "merged.jsonl").read_bytes() == (tmp_path / "all.jsonl").read_bytes()
    assert run("merge-shards", tmp_path / "merged.csv", *parts).exit_code == 0
    assert (tmp_path / "merged.csv").read_text() == (tmp_path / "all.csv").read_text()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("value", ["0/2", "3/2", "2", "a/b", "1/0", "-1/2", "1/2/3", ""])
def test_bad_shard_values_are_one_error_before_any_call(value: str, toy_artifact: Path, tmp_path: Path,
                                                        fake_calls: list[int]) -> None:
    out = tmp_path / "part.jsonl"
    one_error(apply(toy_artifact, new_samples(tmp_path), out, tmp_path / "c", "--shard", value),
              "--shard must be K/N", repr(value))
    assert fake_calls == [] and not out.exists()


def test_shard_output_must_be_jsonl(toy_artifact: Path, tmp_path: Path, fake_calls: list[int]) -> None:
    one_error(apply(toy_artifact, new_samples(tmp_path), tmp_path / "p.csv", tmp_path / "c", "--shard", "1/2"),
              "-o FILE.jsonl")
    assert fake_calls == []


@pytest.fixture
def two_shards(toy_artifact: Path, tmp_path: Path) -> tuple[Path, Path]:
    data = new_samples(tmp_path)
    parts = []
    for k in (1, 2):
        part = tmp_path / f"part{k}.jsonl"
        assert apply(toy_artifact, data, part, tmp_path / "c", "--shard", f"{k}/2").exit_code == 0
        parts.append(part)
    return parts[0], parts[1]


def _edit(path: Path, dest: Path, fn) -> Path:
    """``fn`` applied to the scored rows; the closing record stays last, as written."""
    *rows, closing = [json.loads(line) for line in path.read_text().splitlines()]
    return write_jsonl(dest, fn(rows) + [closing])


@pytest.mark.parametrize("case, fragment", [
    ("missing", "shard(s) 2/2 missing"),
    ("twice", "shard 1/2 given twice"),
    ("unsharded", "not a row written by `hdeval apply --shard K/N`"),
    ("moved row", "belongs to shard"),
    ("reordered", "not in input order"),
    ("mixed n", "different splits"),
    ("duplicate id", "not in input order"),
    ("not json", "not valid JSON"),
])
def test_merge_refuses_incomplete_or_mixed_shards_and_writes_nothing(case: str, fragment: str, two_shards,
                                                                    toy_artifact: Path, tmp_path: Path) -> None:
    p1, p2 = two_shards
    third = tmp_path / "third.jsonl"
    if case == "mixed n":
        assert apply(toy_artifact, new_samples(tmp_path), third, tmp_path / "c", "--shard", "1/3").exit_code == 0
    files = {
        "missing": lambda: [p1],
        "twice": lambda: [p1, p1, p2],
        "unsharded": lambda: [_edit(p1, tmp_path / "u.jsonl", lambda rs: [{k: v for k, v in r.items() if k != "shard"}
                                                                        for r in rs]), p2],
        "moved row": lambda: [_edit(p1, tmp_path / "m.jsonl", lambda rs: rs + [{**json.loads(
            p2.read_text().splitlines()[0]), "shard": {**rs[0]["shard"], "line": 999}}]), p2],
        "reordered": lambda: [_edit(p1, tmp_path / "r.jsonl", lambda rs: rs[::-1]), p2],
        "mixed n": lambda: [p1, p2, third],
        "duplicate id": lambda: [_edit(p1, tmp_path / "d.jsonl", lambda rs: rs + rs[-1:]), p2],
        "not json": lambda: [p1, _insert_before_last(p2, "{oops\n")],
    }[case]()
    out = tmp_path / "merged.jsonl"
    out.write_text("previous\n")
    one_error(run("merge-shards", out, *files), fragment)
    assert out.read_text() == "previous\n" and leftovers(tmp_path) == []


@pytest.mark.parametrize("case", ["twice", "unreadable"])
def test_a_refused_merge_closes_every_shard_it_opened(case: str, two_shards, tmp_path: Path) -> None:
    # not left to the garbage collector, whose ResourceWarning would come at a random moment
    import gc
    import warnings

    from hdeval.core.errors import DataError
    from hdeval.run.shards import merge_shards

    p1, p2 = two_shards
    files = {"twice": [p1, p1, p2], "unreadable": [p1, p2, tmp_path / "absent.jsonl"]}[case]

    def refusal() -> str:  # the message only: a kept traceback would keep the files alive
        try:
            merge_shards(str(tmp_path / "merged.jsonl"), [str(p) for p in files])
        except DataError as exc:
            return str(exc)
        return ""

    gc.collect()  # what earlier tests left is theirs
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        assert refusal()
        gc.collect()
        assert run("merge-shards", tmp_path / "merged.jsonl", *files).exit_code != 0
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []


def _insert_before_last(path: Path, text: str) -> Path:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + text + lines[-1])
    return path


def test_an_empty_shard_is_its_closing_record_alone_and_merges(toy_artifact: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in new_samples(tmp_path).read_text().splitlines()]
    mine = [r for r in rows if shard_of(r["id"], 2) == 1][:3]  # every sample in shard 1 of 2
    data = write_jsonl(tmp_path / "few.jsonl", mine)
    cache = tmp_path / "c"
    assert apply(toy_artifact, data, tmp_path / "all.jsonl", cache).exit_code == 0
    r2 = apply(toy_artifact, data, tmp_path / "p2.jsonl", cache, "--shard", "2/2")
    assert r2.exit_code == 0 and "0 of 3 samples in shard 2/2" in r2.stderr
    assert [json.loads(line)["shard"]["rows"] for line in (tmp_path / "p2.jsonl").read_text().splitlines()] == [0]
    assert apply(toy_artifact, data, tmp_path / "p1.jsonl", cache, "--shard", "1/2").exit_code == 0
    assert run("merge-shards", tmp_path / "m.jsonl", tmp_path / "p2.jsonl", tmp_path / "p1.jsonl").exit_code == 0
    assert (tmp_path / "m.jsonl").read_bytes() == (tmp_path / "all.jsonl").read_bytes()


def test_score_with_artifact_stops_its_ticker_when_scoring_fails(toy_artifact: Path, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """``explain``/``report`` score through score_with_artifact: a failure there leaves no ticker either."""
    import threading

    from hdeval.cli.artifacts import load_artifact, score_with_artifact
    from hdeval.core.errors import ScoringError
    from hdeval.methods.hdeval.evaluator import Evaluator

    def fail_mid_stage(self, samples, backend=None, cache_dir=None, concurrency=8, progress=None):
        progress.stage("scoring", 10)
        raise ScoringError("the LLM broke")

    monkeypatch.setattr(Evaluator, "score", fail_mid_stage)
    before = {t for t in threading.enumerate() if "_tick" in t.name}
    with pytest.raises(ScoringError):
        score_with_artifact(load_artifact(str(toy_artifact)), [], llm=None, base_url=None, timeout=5,
                            max_retries=0, cache_dir=str(tmp_path / "c"), max_calls=None, concurrency=1,
                            quiet=False)
    for t in {t for t in threading.enumerate() if "_tick" in t.name} - before:
        t.join(timeout=30)
        assert not t.is_alive()


def test_a_shard_checks_and_keeps_only_its_own_rows(toy_artifact: Path, tmp_path: Path, monkeypatch) -> None:
    """A shard builds samples only of its own rows; a row of another shard is checked there.
    A duplicate id always falls in the shard of its first use, so that shard refuses it (the set
    can then never merge); a line with no usable id (not JSON) is every shard's error."""
    import hdeval.data.samples as data_mod

    rows = [json.loads(line) for line in new_samples(tmp_path).read_text().splitlines()]
    one = next(i for i, r in enumerate(rows) if shard_of(r["id"], 2) == 1)
    two = next(i for i, r in enumerate(rows) if shard_of(r["id"], 2) == 2)
    bad = [dict(r) for r in rows]
    bad[two]["scores"] = {"clarity": 9}
    bad.append({**rows[one], "output": "again"})
    data = write_jsonl(tmp_path / "bad.jsonl", bad)
    built: list[str] = []
    real = data_mod._sample_from_row

    def spy(row, *a, **k):
        got = real(row, *a, **k)
        built.append(str(row.get("id")))
        return got

    monkeypatch.setattr(data_mod, "_sample_from_row", spy)
    r1 = apply(toy_artifact, data, tmp_path / "p1.jsonl", tmp_path / "c", "--shard", "1/2", chunk=5)
    one_error(r1, f"line {len(bad)}", f"already used on line {one + 1}")
    assert built and all(shard_of(i, 2) == 1 for i in built)
    r2 = apply(toy_artifact, data, tmp_path / "p2.jsonl", tmp_path / "c", "--shard", "2/2", chunk=5)
    one_error(r2, f"line {two + 1}", "scores.clarity")
    assert not (tmp_path / "p1.jsonl").exists() and not (tmp_path / "p2.jsonl").exists()
    del bad[two], bad[-1]
    fixed = tmp_path / "bad.jsonl"
    fixed.write_text("".join(json.dumps(r) + "\n" for r in bad[:5]) + "{not json\n"
                     + "".join(json.dumps(r) + "\n" for r in bad[5:]))
    for k in (1, 2):
        one_error(apply(toy_artifact, fixed, tmp_path / f"p{k}.jsonl", tmp_path / "c", "--shard", f"{k}/2"),
                  "line 6", "not valid JSON")
    assert leftovers(tmp_path) == []


def test_an_evaluator_that_kept_no_criterion_applies(toy, tmp_path: Path) -> None:
    # constant human scores: the aggregator predicts the constant and needs no LLM score; apply
    # counted the criteria it never asked as unreadable and refused ("6 of 6 ... check the LLM")
    task, _ = toy
    rows = [{**r, "scores": {k: 3 for k in r["scores"]}} for r in toy_rows()]
    data = write_jsonl(tmp_path / "constant.jsonl", rows)
    ev = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr", cache_dir=str(tmp_path / "c"))
    assert ev.columns_needed() == []
    ev.save(tmp_path / "art")
    r = CliRunner().invoke(cli, ["apply", str(tmp_path / "art"), str(data), "-o", str(tmp_path / "out.jsonl"),
                                 "--cache-dir", str(tmp_path / "c2"), "-q"])
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(out) == len(rows) and {o["scores"]["clarity"] for o in out} == {3.0}
