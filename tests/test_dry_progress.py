"""The dry run and the progress count the same thing, and both give the whole run's time:
"requests" are decompositions plus one scoring request per sample and
criterion, what the progress bar counts; identical requests (samples with the same text) share
one call, which is what the dry run's score-calls and the cost count."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TOY_TASK, toy_rows, write_jsonl

from hdeval.cli import cli
from hdeval.cli.progress import TerminalProgress
from hdeval.core.errors import HdevalError
from hdeval.core.progress import Progress
from hdeval.run.train import TrainConfig, plan, train


class Recorder(Progress):
    def __init__(self) -> None:
        self.stages: list[tuple[str, int]] = []
        self.expected: list[int] = []
        self.done = 0
        self.events: list[tuple[str, int]] = []

    def expect(self, units: int) -> None:
        self.expected.append(units)
        self.events.append(("expect", units))

    def stage(self, label: str, total: int) -> None:
        self.stages.append((label, total))
        self.events.append(("stage", total))

    def advance(self, n: int = 1, cached: bool = False) -> None:
        self.done += n


@pytest.fixture
def toy(tmp_path: Path) -> dict:
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    rows = toy_rows()
    for r in rows[:6]:  # six samples with one text between them: their requests are identical
        r["source"], r["output"] = rows[0]["source"], rows[0]["output"]
    data = write_jsonl(tmp_path / "toy.jsonl", rows)
    return dict(task=str(task), data=str(data), llm="fake", aggregator="lr", cache_dir=str(tmp_path / "c"))


def test_dry_run_requests_are_what_the_progress_counts(toy) -> None:
    config = TrainConfig.from_options(**toy, layers=1)
    prep, plans, _ = plan(config)
    rec = Recorder()
    train(config, progress=rec)
    (label, total), = rec.stages
    assert plans[0].requests == total == rec.done == len(prep.samples) * 2
    assert plans[0].score_calls < plans[0].requests  # the identical ones cost one call


def test_the_dry_run_prints_requests_beside_calls(toy, tmp_path: Path) -> None:
    args = ["train", "--task", toy["task"], "--data", toy["data"], "--llm", "fake", "--layers", "1",
            "--cache-dir", toy["cache_dir"], "--dry-run"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    header = next(x for x in lines if x.startswith("layer"))
    row = next(x for x in lines if x.lstrip().startswith("1 ")).split()
    assert header.split()[-1] == "requests" and header.split()[2] == "score-calls"
    assert int(row[-1]) == 36 * 2 and int(row[2]) < 36 * 2
    assert any("as the progress counts them" in x for x in lines)
    assert any(x.startswith("estimated time for the whole run (1 stage)") for x in lines)


def test_progress_is_told_the_whole_run_and_the_dry_run_agrees(toy) -> None:
    config = TrainConfig.from_options(**toy, layers=3, top_k=2)
    _, plans, _ = plan(config)
    rec = Recorder()
    train(config, progress=rec)
    assert rec.expected[0] == sum(p.requests for p in plans)  # the same upper bound, at the start
    assert rec.done <= rec.expected[0]
    # before each layer, what is left: never more than before, and at least what then ran
    assert rec.expected == sorted(rec.expected, reverse=True)
    for i, (kind, units) in enumerate(rec.events):
        if kind == "expect":
            assert units >= sum(n for k, n in rec.events[i:] if k == "stage")
    assert len(rec.stages) >= 3  # layer 1 scored, layer 2 decomposed and scored


def test_the_progress_line_gives_the_whole_run_eta() -> None:
    p = TerminalProgress(quiet=True)
    p.expect(1000)
    p.stage("layer 1: scoring", 100)
    p.advance(10)
    p.t0 = time.monotonic() - 10  # 10 requests in 10 s: 1 per second
    line = p.line()
    assert "ETA 1m30s" in line  # this stage: 90 left
    assert "whole run: at most 990 more requests, ETA <= 16m30s" in line
    p.end_stage()
    p.stage("layer 2: scoring", 900)  # no new expect: the rest of what was expected
    assert p.later == 0 and "whole run" not in p.line()
    p.close()


def _check_whole_run(rec: Recorder, first: int) -> None:
    """Told ``first`` before any stage; each later expect is what is left, at least what then ran."""
    assert rec.events[0] == ("expect", first)
    assert rec.expected == sorted(rec.expected, reverse=True)
    for i, (kind, units) in enumerate(rec.events):
        if kind == "expect":
            assert units >= sum(n for k, n in rec.events[i:] if k == "stage")


def test_pairwise_hdeval_tells_the_progress_the_dry_runs_total(tmp_path: Path) -> None:
    ex = Path(__file__).resolve().parent.parent / "examples"
    config = TrainConfig.from_options(task=str(ex / "pairs_task.toml"), data=str(ex / "pairs.jsonl"), llm="fake",
                                      aggregator="lr", layers=3, top_k=1, cache_dir=str(tmp_path / "c"))
    _, plans, _ = plan(config)
    rec = Recorder()
    train(config, progress=rec)
    total = sum(p.requests for p in plans)
    assert total > 0
    _check_whole_run(rec, total)
    # layer 1 (16 pairs x 2 responses x 2 aspects), layer 2 decomposed and scored, layer 3 too
    assert rec.stages[0][1] == 16 * 2 * 2 and len(rec.stages) == 5
    assert rec.done <= total


class _Clocked(TerminalProgress):
    """The terminal's progress line, its clock set after each call to one call a second, so the
    ETA it prints reads as the number of calls it expects still to make."""

    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.etas: list[int] = []  # the stage ETA printed after each call, in seconds

    def advance(self, n: int = 1, cached: bool = False) -> None:
        super().advance(n, cached)
        if not cached:
            self.t0 = time.monotonic() - (self.done - self.hits)
            eta = re.search(r", ETA (\d+)m(\d\d)s", self.line())
            self.etas.append(int(eta[1]) * 60 + int(eta[2]) if eta else 0)


def test_a_resumed_runs_eta_counts_only_the_calls_it_will_make(tmp_path: Path) -> None:
    # a run stopped half way, then resumed: the resumed stage finds half its replies cached, and
    # the last eight samples repeat one text (one call answers all eight); its ETA counts the
    # calls left, neither the cached replies nor the repeats
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    rows = toy_rows()
    for r in rows[-8:]:
        r["source"], r["output"] = rows[-9]["source"], rows[-9]["output"]
    run = dict(task=str(task), data=str(write_jsonl(tmp_path / "toy.jsonl", rows)), llm="fake",
               method="direct", cache_dir=str(tmp_path / "c"), concurrency=1)
    with pytest.raises(HdevalError, match="max-calls"):
        train(**run, max_calls=30)
    progress = _Clocked()
    train(**run, progress=progress)
    made = len(progress.etas)
    assert made == (len(rows) - 8) * 2 - 30  # what the first run did not pay for, the repeats apart
    # after the k-th call of the resumed run, made - k calls are left: the ETA says so, in seconds
    assert progress.etas == [made - k for k in range(1, made + 1)]
