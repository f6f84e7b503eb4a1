"""``apply`` on Ray Data, on a local Ray cluster of 2 CPUs started once for
this module: the output is byte-identical to a single-process ``hdeval apply``, the LLM is
reached through the same cache keys (a single-process rerun on the Ray run's cache pays for
nothing) and the same endpoint, and bad input or a bad artifact stops before any worker starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOY_TASK, calls_made, toy_rows, write_jsonl
from llm_server import FaultMix, FaultServer

from hdeval.cli import cli
from hdeval.core.errors import ConfigError, DataError, HdevalError, ScoringError
from hdeval.run.train import train

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
        # the chat requests (a worker may also ask GET /models once, to tell the server's dialect)
        direct = sorted(r.body for r in server.requests if r.body)
        assert len(direct) == calls_made(one) > 0
        seen = len(server.requests)
        apply_on_ray(art, new, str(tmp_path / "ray.jsonl"), workers=2, batch_size=8, llm=MODEL,
                     base_url=server.url, cache_dir=str(tmp_path / "c2" / "{worker}"))
        on_ray = sorted(r.body for r in server.requests[seen:] if r.body)
    assert on_ray == direct
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    # one cache per worker that scored (Ray may give every batch of a small input to one worker)
    assert len([p for p in (tmp_path / "c2").iterdir() if p.is_dir()]) in (1, 2)
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


def test_bad_input_in_the_first_chunk_pays_for_nothing(art, tmp_path) -> None:
    rows = toy_rows(n_docs=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "id": rows[0]["id"]}) + "\n",
                   encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: id .* already used on line 1"):
        apply_on_ray(art, bad, str(tmp_path / "out.jsonl"), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "out.jsonl").exists()
    assert not (tmp_path / "c").exists()  # no worker opened a cache: nothing was scored


def _break(data: Path, dest: Path, *indexes: int) -> Path:
    lines = data.read_text().splitlines()
    for i in indexes:
        lines[i] = json.dumps({**json.loads(lines[i]), "scores": {"clarity": 9}})  # outside [1, 5]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def test_bad_lines_in_a_later_chunk_are_apply_s_error_and_write_nothing(art, new, tmp_path, monkeypatch) -> None:
    """One reading pass, as apply: the same one-line error (every bad line, file:line), no
    output, an existing file untouched, and nothing after the first bad line paid for (what
    was, is cached: a subset of what the chunks before it cost)."""
    monkeypatch.setenv("HDEVAL_APPLY_CHUNK", "7")
    bad = _break(new, tmp_path / "bad.jsonl", 19, 21)
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    result = CliRunner().invoke(cli, ["apply", str(art), str(bad), "-o", str(out), "--cache-dir", str(tmp_path / "c1"),
                                      "--force"])
    assert result.exit_code != 0
    expected = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert len(expected) == 1 and "2 bad line(s): lines 20, 22" in expected[0]
    with pytest.raises(DataError) as caught:
        apply_on_ray(art, bad, str(out), workers=2, batch_size=5, cache_dir=str(tmp_path / "c2"))
    assert f"error: {caught.value}" == expected[0]
    assert out.read_text() == "previous results\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    head = tmp_path / "head.jsonl"
    head.write_text("".join(line + "\n" for line in new.read_text().splitlines()[:14]))
    single(art, head, tmp_path / "head-out.jsonl", tmp_path / "c3")  # chunks 1 and 2: before line 20
    from conftest import cache_entries

    paid = set(cache_entries(tmp_path / "c2")) if (tmp_path / "c2").exists() else set()
    assert paid <= set(cache_entries(tmp_path / "c3"))


def test_the_driver_does_not_read_the_input(art, new, tmp_path, monkeypatch) -> None:
    """No second, validating pass: the one reading pass is the Ray read task's."""
    import hdeval.data.samples as data_mod

    def refuse(*a, **k):
        raise AssertionError("the driver parsed a row of the input")

    monkeypatch.setattr(data_mod, "_sample_from_row", refuse)
    monkeypatch.setattr(data_mod, "iter_task_chunks", refuse)
    assert apply_on_ray(art, new, str(tmp_path / "ray.jsonl"), workers=2, batch_size=9,
                        cache_dir=str(tmp_path / "c")) == 30


@pytest.mark.parametrize("extra, kwargs", [(["--max-interval-width", "1"], {"max_interval_width": 1.0}),
                                           (["--explain", "--top", "2"], {"explain": True, "top": 2})])
def test_apply_options_give_the_single_process_output(art, new, tmp_path, extra, kwargs) -> None:
    single(art, new, tmp_path / "default.jsonl", tmp_path / "c1")
    single(art, new, tmp_path / "one.jsonl", tmp_path / "c1", *extra)
    # the option changes the output (or this test would prove nothing)
    assert (tmp_path / "one.jsonl").read_bytes() != (tmp_path / "default.jsonl").read_bytes()
    apply_on_ray(art, new, str(tmp_path / "ray.jsonl"), workers=2, batch_size=7, cache_dir=str(tmp_path / "c2"),
                 **kwargs)
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


def test_options_it_cannot_honour_are_refused_in_one_line(art, new, tmp_path) -> None:
    from test_paireval import TOY_DIALOGUE

    for kwargs, what in (({"max_interval_width": 0}, "interval"), ({"max_interval_width": "wide"}, "interval")):
        with pytest.raises(ConfigError, match=what):
            apply_on_ray(art, new, str(tmp_path / "out.jsonl"), cache_dir=str(tmp_path / "c"), **kwargs)
    with pytest.raises(ConfigError, match="shared filesystem"):
        apply_on_ray(art, "s3://bucket/new.jsonl", str(tmp_path / "out.jsonl"))
    task = tmp_path / "dialogue.toml"
    task.write_text(TOY_DIALOGUE, encoding="utf-8")
    rows = toy_rows(aspects=("overall", "engagingness"))
    for r in rows:
        r["scores"]["engagingness"] = 1 + r["scores"]["engagingness"] % 3  # the task's range, [1, 3]
    data = write_jsonl(tmp_path / "dialogue.jsonl", rows)
    pair = train(task=str(task), data=str(data), llm="fake", method="paireval", aggregator="lr",
                 cache_dir=str(tmp_path / "tc"), all_vs_all=True).save(tmp_path / "pair")
    with pytest.raises(ConfigError, match="all-vs-all PairEval .* apply_on_ray scores it in batches apart"):
        apply_on_ray(pair, data, str(tmp_path / "out.jsonl"), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "c").exists()


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


def test_a_workers_error_is_raised_as_hdeval_s_own(art, new, tmp_path) -> None:
    """An error in a worker (here its --max-calls budget) reaches the caller as the hdeval
    error, with apply's one-line message, not Ray's wrapper and traceback; nothing written."""
    from hdeval.core.errors import BudgetExceeded

    with pytest.raises(BudgetExceeded) as caught:
        apply_on_ray(art, new, str(tmp_path / "out.jsonl"), workers=2, batch_size=8, max_calls=1,
                     cache_dir=str(tmp_path / "c"))
    assert type(caught.value) is BudgetExceeded
    text = str(caught.value)
    assert "max-calls" in text and "\n" not in text and "ray::" not in text
    assert not (tmp_path / "out.jsonl").exists()


def test_a_pairwise_row_with_a_lone_surrogate_is_refused_as_apply_refuses_it(faireval40, tmp_path) -> None:
    """Ray's rows get apply's checks for both shapes: a pairwise row whose text holds a lone
    surrogate (not text) is the same one-line DataError, not a pair sent to the LLM."""
    from conftest import train_artifact

    pair_art = train_artifact("faireval", faireval40, tmp_path, "--method", "dna")
    row = json.loads(faireval40.read_text(encoding="utf-8").splitlines()[0])
    row["output_a"] = "fine \ud800 broken"
    line = json.dumps(row)  # json escapes the surrogate as \ud800, as a file would hold it
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line + "\n", encoding="utf-8")
    r = CliRunner().invoke(cli, ["apply", str(pair_art), str(bad), "-o", str(tmp_path / "one.jsonl"),
                                 "--cache-dir", str(tmp_path / "c1")])
    assert r.exit_code != 0 and "lone surrogate" in r.stderr, r.output
    scorer = ArtifactScorer(str(pair_art), cache_dir=str(tmp_path / "c2"))
    with pytest.raises(DataError, match=r"line 7: field 'output_a' holds a lone surrogate"):
        scorer({"text": np.array([line], dtype=object), "line": np.array([7])})
    assert not (tmp_path / "c2").exists()  # refused before any LLM was opened
