"""``apply`` on Ray Data (issue #23 item 1), on a local Ray cluster of 2 CPUs started once for
this module: the output is byte-identical to a single-process ``hdeval apply``, the LLM is
reached through the same cache keys (a single-process rerun on the Ray run's cache pays for
nothing) and the same endpoint, and bad input or a bad artifact stops before any worker starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import TOY_TASK, calls_made, toy_rows, write_jsonl
from hdeval.cli import cli
from hdeval.errors import ConfigError, DataError, HdevalError, ScoringError
from hdeval.train import train
from llm_server import FaultMix, FaultServer

MODEL = "test-model"


ray = pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')
pytest.importorskip("ray.data", reason='the Ray tests need Ray Data: pip install -e ".[ray]"')

from hdeval.integrations.ray import ArtifactScorer, apply_on_ray  # noqa: E402

# one local cluster for the module (conftest.ray_cluster)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("art")
    task = d / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(d / "toy.jsonl", toy_rows())
    ev = train(task=str(task), data=str(data), llm="fake", layers=2, aggregator="lr", cache_dir=str(d / "tc"))
    return ev.save(d / "art")


@pytest.fixture
def new(tmp_path: Path) -> Path:
    rows = toy_rows(n_docs=10)
    for r in rows:
        r["id"] = "new-" + r["id"]
        r["output"] += " (again)"
    path = write_jsonl(tmp_path / "new.jsonl", rows)
    with path.open("a", encoding="utf-8") as fh:
        fh.write("\n")  # a blank line, as apply skips it
    return path


def single(art: Path, data: Path, out: Path, cache: Path, *extra: str):
    result = CliRunner().invoke(cli, ["apply", str(art), str(data), "-o", str(out), "--cache-dir", str(cache),
                                      *extra])
    assert result.exit_code == 0, result.stderr
    return result


def test_output_identical_to_a_single_process(art, new, tmp_path) -> None:
    single(art, new, tmp_path / "one.jsonl", tmp_path / "c1")
    # 30 samples in batches of 7 over 2 workers: several batches each, out of order internally
    rows = apply_on_ray(art, new, str(tmp_path / "ray.jsonl"), workers=2, batch_size=7,
                        cache_dir=str(tmp_path / "c2"))
    assert rows == 30
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    # the workers cached every reply under the keys a single process uses: a rerun pays nothing
    again = single(art, new, tmp_path / "again.jsonl", tmp_path / "c2")
    assert calls_made(again) == 0


def test_csv_output_identical_too(art, new, tmp_path) -> None:
    single(art, new, tmp_path / "one.csv", tmp_path / "c1")
    apply_on_ray(art, new, str(tmp_path / "ray.csv"), workers=2, batch_size=11, cache_dir=str(tmp_path / "c2"))
    assert (tmp_path / "ray.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()


def test_workers_reach_the_same_endpoint(art, new, tmp_path) -> None:
    """An OpenAI-compatible server on 127.0.0.1: the workers send it exactly the requests a
    single process sends, once each, with a per-worker cache each."""
    with FaultServer(lifetime=600) as server:
        llm = ["--llm", MODEL, "--base-url", server.url]
        one = single(art, new, tmp_path / "one.jsonl", tmp_path / "c1", *llm)
        direct = sorted(r.body for r in server.requests)
        assert len(direct) == calls_made(one) > 0
        apply_on_ray(art, new, str(tmp_path / "ray.jsonl"), workers=2, batch_size=8, llm=MODEL,
                     base_url=server.url, cache_dir=str(tmp_path / "c2" / "{worker}"))
        on_ray = sorted(r.body for r in server.requests[len(direct):])
    assert on_ray == direct
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert len([p for p in (tmp_path / "c2").iterdir() if p.is_dir()]) == 2  # one cache per worker
    assert len(on_ray) == len(set(on_ray))  # no request paid twice


def test_scorer_in_a_users_own_pipeline(art, new, tmp_path) -> None:
    """The callable class on a dataset the user built: rows with ids, in any order."""
    single(art, new, tmp_path / "one.jsonl", tmp_path / "c1")
    expected = {json.loads(x)["id"]: json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()}
    ds = ray.data.read_text(str(new)).map_batches(
        ArtifactScorer, fn_constructor_args=(str(art),), fn_constructor_kwargs={"cache_dir": str(tmp_path / "c3")},
        batch_size=5, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=2), num_cpus=0.5)
    got = {r["id"]: json.loads(r["row"]) for r in ds.take_all()}
    assert got == expected


def test_bad_input_stops_before_any_worker(art, tmp_path) -> None:
    rows = toy_rows(n_docs=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "id": rows[0]["id"]}) + "\n",
                   encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: id .* already used on line 1"):
        apply_on_ray(art, bad, str(tmp_path / "out.jsonl"), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "out.jsonl").exists()
    assert not (tmp_path / "c").exists()  # no worker opened a cache: nothing was scored


def test_a_tampered_artifact_is_refused(art, new, tmp_path) -> None:
    import shutil

    copy = tmp_path / "art"
    shutil.copytree(art, copy)
    models = sorted(copy.glob("*.skops"))
    assert models
    models[0].write_bytes(models[0].read_bytes() + b"\0")
    with pytest.raises(HdevalError, match="skops"):
        apply_on_ray(copy, new, str(tmp_path / "out.jsonl"), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "out.jsonl").exists()


def test_options_checked(art, new, tmp_path) -> None:
    for kwargs, what in (({"workers": 0}, "workers"), ({"batch_size": 0}, "batch_size"),
                         ({"concurrency": 0}, "concurrency")):
        with pytest.raises(ConfigError, match=what):
            apply_on_ray(art, new, str(tmp_path / "out.jsonl"), **kwargs)


def test_unreadable_scores_past_the_threshold_write_nothing(art, new, tmp_path) -> None:
    """As apply's --max-failure-rate: every reply prose, so every score unreadable."""
    with FaultServer(FaultMix(1.0, ("prose",)), lifetime=600) as server:
        with pytest.raises(ScoringError, match=r"could not be read .*no output written"):
            apply_on_ray(art, new, str(tmp_path / "out.jsonl"), workers=2, batch_size=8, llm=MODEL,
                         base_url=server.url, max_retries=0, cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "out.jsonl").exists()
