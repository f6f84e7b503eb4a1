"""A training stage builds its prompts as the client sends them: the first
request goes out once one window of prompts is built, not every prompt of the stage, and the
matrix is the same as scoring the whole stage at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import TOY_TASK, toy_rows, write_jsonl

from hdeval.core.types import CriteriaTree
from hdeval.data.samples import read_task_samples
from hdeval.data.tasks import load_task
from hdeval.judge import scoring
from hdeval.judge.fill import STREAM_WINDOW, Cell, fill_matrix
from hdeval.judge.prompts import load_templates
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend


@pytest.fixture
def stage(tmp_path: Path):
    task_file = tmp_path / "toy_task.toml"
    task_file.write_text(TOY_TASK, encoding="utf-8")
    task = load_task(task_file)
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows(n_docs=500, per_doc=3))  # 1,500 samples
    samples = read_task_samples(data, task, require_labels=True)
    tree = CriteriaTree.from_aspects(task.aspects)
    crit = list(tree.layer(1))
    return task, samples, tree, crit


def counting(monkeypatch) -> tuple[list[int], list[int]]:
    """(prompts built so far, prompts built when the first call was made)."""
    built: list[int] = [0]
    at_first: list[int] = []
    real_build, real_call = scoring.scoring_request, FakeBackend.complete

    def build(*a, **k):
        built[0] += 1
        return real_build(*a, **k)

    def call(self, request):
        if not at_first:
            at_first.append(built[0])
        return real_call(self, request)

    monkeypatch.setattr(scoring, "scoring_request", build)
    monkeypatch.setattr(FakeBackend, "complete", call)
    return built, at_first


def test_first_request_goes_out_after_one_window_not_the_whole_stage(stage, monkeypatch, tmp_path) -> None:
    task, samples, tree, crit = stage
    n = len(samples) * len(crit)
    assert n > 2 * STREAM_WINDOW
    built, at_first = counting(monkeypatch)
    client = CachedBackend(FakeBackend(), tmp_path / "cache", concurrency=4)
    try:
        m = scoring.score_criteria(client, load_templates()["score"], task, tree, crit, samples)
    finally:
        client.close()
    assert built[0] == n
    assert at_first and at_first[0] <= STREAM_WINDOW  # before this change: every one of n
    assert m.values.shape == (len(samples), len(crit)) and not np.isnan(m.values).any()


def test_streamed_stage_equals_the_whole_stage_at_once(stage, tmp_path) -> None:
    task, samples, tree, crit = stage
    template = load_templates()["score"]
    one = CachedBackend(FakeBackend(), tmp_path / "a")
    try:
        cells = [Cell(s.id, c.key, (scoring.scoring_request(template, task, tree, c, s),))
                 for s in samples for c in crit]
        whole = fill_matrix(one, cells, scoring.digit_score(scoring.SCALE))
        whole_stats = (one.stats.calls, one.stats.hits)
    finally:
        one.close()
    two = CachedBackend(FakeBackend(), tmp_path / "b")
    try:
        streamed = scoring.score_criteria(two, template, task, tree, crit, samples)
        assert (two.stats.calls, two.stats.hits) == whole_stats  # duplicates joined across windows
    finally:
        two.close()
    assert streamed.sample_ids == whole.sample_ids and streamed.criterion_keys == whole.criterion_keys
    np.testing.assert_array_equal(streamed.values, whole.values)


def test_a_client_with_a_batch_strategy_gets_the_whole_stage_at_once(stage, tmp_path) -> None:
    """One Batch API job (or one export) per stage, not one per window."""
    task, samples, tree, crit = stage
    seen: list[int] = []

    class Strategy:
        async def prefetch(self, client, want, progress=None, halt=None):
            seen.append(len(want))
            return {}

        async def tidy(self, client, progress=None):
            return None

        def close(self):
            return None

    client = CachedBackend(FakeBackend(), tmp_path / "cache", batch=Strategy())
    try:
        scoring.score_criteria(client, load_templates()["score"], task, tree, crit, samples)
    finally:
        client.close()
    assert seen == [len(samples) * len(crit)]
