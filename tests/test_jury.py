"""A jury: several judge LLMs scoring every criterion, pooled by the aggregator.

Simulated judges (tests/simjury.py) read the hidden latent of tests/simjudge.py's samples with
noise of known size, or nothing (pure noise), and count their calls."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from simjudge import pointwise_rows, write_pointwise
from simjury import SimJudge, calls_of, jury

from hdeval.cli import cli
from hdeval.core.errors import ConfigError
from hdeval.data.samples import read_task_samples
from hdeval.data.tasks import load_task
from hdeval.llm.backends.base import Completion
from hdeval.methods.jury import read_jury
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jury.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _tables(names, **extra) -> str:
    more = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
    return "".join(f'[[judge]]\nname = "{n}"\nllm = "fake"\n{more}' for n in names)


def test_a_jury_file_is_read_with_every_field(tmp_path: Path) -> None:
    path = _file(tmp_path, '[[judge]]\nname = "big"\nllm = "gpt-4o"\nbase_url = "http://127.0.0.1:9/v1"\n'
                           'api_key_env = "BIG_KEY"\nprice_in = 2.5\nprice_out = 10\n'
                           '[[judge]]\nname = "small"\nllm = "fake"\n')
    big, small = read_jury(path)
    assert (big.name, big.llm, big.base_url, big.api_key_env, big.price_in, big.price_out) == (
        "big", "gpt-4o", "http://127.0.0.1:9/v1", "BIG_KEY", 2.5, 10)
    assert (small.name, small.base_url, small.api_key_env) == ("small", None, None)


@pytest.mark.parametrize("text, where", [
    (_tables(["a"], colour="red"), "judge[0].colour"),
    ('[[judge]]\nname = "a b"\nllm = "fake"\n', "judge[0].name"),
    ('[[judge]]\nname = "a"\n', "judge[0].llm"),
    (_tables(["a"], api_key_env="sk-1234"), "judge[0].api_key_env"),
    (_tables(["a"], price_in=-1), "judge[0].price_in"),
    (_tables(["a", "a"]), "two judges are named 'a'"),
    ("judge = 3\n", "judge"),
    ("[[judge]\n", "not a TOML file"),
    ("", "judge"),
])
def test_a_bad_jury_file_is_one_line_naming_file_and_field(tmp_path: Path, text: str, where: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        read_jury(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and where in msg and "\n" not in msg


def test_a_missing_jury_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml: cannot read the jury file"):
        read_jury(tmp_path / "nope.toml")


@pytest.mark.parametrize("args, says", [
    (["--method", "direct", "--llm", "fake", "--llm", "fake:logprobs=0"], "method 'direct' takes one LLM"),
    (["--method", "paireval", "--llm", "fake", "--llm", "fake:logprobs=0"], "method 'paireval' takes one LLM"),
    (["--method", "dna", "--llm", "fake", "--llm", "fake:logprobs=0"], "method 'dna' takes one LLM"),
    (["--llm", "fake", "--llm", "fake"], "the same model twice"),
    (["--llm", "fake", "--prune-judges"], "--prune-judges needs a jury"),
    (["--llm", "fake", "--llm", "fake:logprobs=0", "--scorer", "pairwise"], "a jury scores 1-5 digits"),
])
def test_what_takes_no_jury_refuses_it_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=8))
    res = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--cache-dir",
                                   str(tmp_path / "c"), *args])
    assert res.exit_code != 0
    err = res.output.strip().splitlines()[-1]
    assert err.startswith("error: ") and says in err
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())  # nothing asked


def test_pairwise_hdeval_refuses_a_jury(tmp_path: Path) -> None:
    from simjudge import pairwise_rows, write_pairs

    data = write_pairs(tmp_path / "pairs.jsonl", pairwise_rows(n=12))
    with pytest.raises(ConfigError, match="a jury scores pointwise data; task 'faireval' is pairwise"):
        train(task="faireval", data=str(data), llm="fake", judges=("fake:logprobs=0",),
              cache_dir=str(tmp_path / "c"))


def test_the_dry_run_counts_every_judges_calls(tmp_path: Path) -> None:
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=10))  # 30 samples, 2 aspects
    jf = _file(tmp_path, '[[judge]]\nname = "a"\nllm = "fake"\nprice_in = 1000\nprice_out = 0\n'
                         '[[judge]]\nname = "b"\nllm = "fake:logprobs=0"\n')
    res = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--jury", str(jf),
                                   "--layers", "1", "--dry-run", "--cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    layer1 = next(line for line in res.output.splitlines() if line.split()[:1] == ["1"])
    assert layer1.split()[2] == str(2 * 30 * 2)  # judges x samples x aspects
    assert "judge a (fake): <= 60 scoring calls" in res.output
    assert "judge b (fake:logprobs=0): <= 60 scoring calls" in res.output
    a_line = next(line for line in res.output.splitlines() if line.startswith("judge a"))
    assert "estimated cost at most" in a_line
    assert "estimated cost" not in next(line for line in res.output.splitlines() if line.startswith("judge b"))


def _train_jury(tmp_path: Path, judges, layers: int = 1, n_docs: int = 30, seed: int = 0, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=n_docs, seed=seed))
    jf = _file(tmp_path, _tables(judges))
    ev = train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=layers,
               aggregator="lr", cache_dir=str(tmp_path / "cache"), seed=seed, **kw)
    return ev, task, data


def test_a_jury_scores_every_criterion_with_every_judge_and_reports_each(tmp_path: Path) -> None:
    judges = jury(0.5, 1.0, 1.5)
    ev, _, _ = _train_jury(tmp_path, judges)
    assert calls_of(judges) == {"j1": 180, "j2": 180, "j3": 180}  # 90 samples x 2 aspects each
    assert ev.feature_keys == [f"{j}:{a}" for j in ("j1", "j2", "j3") for a in ("clarity", "accuracy")]
    rec = ev.metrics["jury"]
    sp = {n: v["direct"]["average"]["spearman"] for n, v in rec["baselines"]["judges"].items()}
    assert sp["j1"] > sp["j2"] > sp["j3"]  # the judges' quality, as built
    assert rec["baselines"]["learned"] == ev.metrics["final"]
    assert set(rec["agreement_alpha"]) == {"clarity", "accuracy"}
    assert all(0 < a < 1 for a in rec["agreement_alpha"].values())
    assert 1 <= rec["effective_judges"] <= 3
    assert rec["kept"] == ["j1", "j2", "j3"] and rec["dropped"] == []
    assert {n: c["calls"] for n, c in rec["cost"].items()} == {"j1": 180, "j2": 180, "j3": 180}


def test_prune_judges_drops_pure_noise_and_apply_never_calls_it(tmp_path: Path) -> None:
    judges = jury(0.9, 0.9, None)  # two judges as good: their mean is worth more than either
    ev, task, data = _train_jury(tmp_path, judges, prune_judges=True)
    assert ev.metrics["jury"]["dropped"] == ["j3"] and ev.metrics["jury"]["kept"] == ["j1", "j2"]
    assert all(not k.startswith("j3:") for k in ev.feature_keys)
    path = ev.save(tmp_path / "art")
    manifest = json.loads((path / "manifest.json").read_text())
    assert json.dumps(manifest).count('"kept": ["j1", "j2"]') == 1

    again = jury(0.9, 0.9, None)
    loaded = load_artifact(path)
    loaded.judge_backends = again
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in pointwise_rows(n_docs=4, seed=99)), encoding="utf-8")
    res = loaded.score(read_task_samples(new, load_task(str(task))), cache_dir=tmp_path / "cache")
    assert calls_of(again) == {"j1": 24, "j2": 24, "j3": 0}
    assert res.predictions.shape == (12, 2)


def test_baselines_are_compared_with_the_pruned_jury_the_artifact_keeps(tmp_path: Path) -> None:
    """On this seed the mean of all criteria (.863) beats the three-judge evaluator the layer was
    chosen with (.856), but not the two-judge one --prune-judges keeps: the verdict and the
    figure said beside it are the kept evaluator's, the figure a jury of only those judges gets."""
    ev, _, _ = _train_jury(tmp_path / "pruned", jury(0.9, 0.9, None), prune_judges=True, seed=4)
    assert ev.metrics["jury"]["dropped"] == ["j3"]
    sel = ev.metrics["selection"]
    baseline = sel["baselines_cv_spearman"][sel["strongest_baseline"]]
    assert sel["cv_train_spearman"]["1"] < baseline < sel["pruned_cv_spearman"]
    assert "baseline_beats_evaluator" not in sel and "baseline_not_kept" not in sel
    path = ev.save(tmp_path / "art")
    lines = [line for line, _ in ev.summary_lines(path)]
    assert all("beats the kept evaluator" not in line for line in lines)
    # the aggregator's figures were the three judges': said so, as they are not the kept jury's
    assert any(line.startswith("aggregator: ") and "before --prune-judges dropped j3" in line for line in lines)

    # with --aggregator fixed (lr), as here, a jury of only the kept judges gets the same figure
    two, _, _ = _train_jury(tmp_path / "two", jury(0.9, 0.9), seed=4)
    assert two.metrics["selection"]["cv_train_spearman"]["1"] == sel["pruned_cv_spearman"]


def test_pruning_can_also_make_a_baseline_beat_the_kept_jury() -> None:
    """A judge is dropped at a cost of up to PRUNE_MARGIN: a baseline below the whole jury can
    beat the pruned one, and the verdict then names the pruned figure."""
    from hdeval.methods.hdeval.loop import BASELINE_NOT_KEPT, compare_baselines

    choice = {"strongest_baseline": "mean_all_criteria", "baselines_cv_spearman": {"mean_all_criteria": 0.845}}
    assert "baseline_beats_evaluator" not in compare_baselines(choice, 0.85)
    after = compare_baselines(choice, 0.8412)
    assert after["baseline_beats_evaluator"] and after["baseline_not_kept"] == BASELINE_NOT_KEPT
    assert "baseline_beats_evaluator" not in compare_baselines(after, None)  # no figure: no verdict


def test_a_reloaded_jury_scores_its_training_samples_from_the_cache(tmp_path: Path) -> None:
    judges = jury(0.5, 1.0)
    ev, task, data = _train_jury(tmp_path, judges, n_docs=20)
    path = ev.save(tmp_path / "art")
    loaded = load_artifact(path)
    again = jury(0.5, 1.0)
    loaded.judge_backends = again
    samples = read_task_samples(data, load_task(str(task)))
    res = loaded.score(samples, cache_dir=tmp_path / "cache")
    assert calls_of(again) == {"j1": 0, "j2": 0}
    assert res.usage["cache_hits"] == 2 * len(samples) * 2


def test_an_artifact_cannot_send_a_judge_to_its_own_server(tmp_path: Path) -> None:
    from hdeval.methods.jury import Judge

    judges = jury(0.5, 1.0)
    ev, _, _ = _train_jury(tmp_path, judges, n_docs=20)
    ev.judge_backends = None
    ev.manifest_extra["jury"]["judges"][1]["base_url"] = "http://127.0.0.1:9/v1"
    with pytest.raises(ConfigError, match="judge 'j2' of this jury artifact is served by http://127.0.0.1:9/v1"):
        ev.trusted_judges(ev.kept_judges(), None)
    keyed = ev.trusted_judges([Judge("k", "fake", None, "HOME")], None)
    assert keyed[0].api_key_env is None  # an artifact never chooses which variable's value is sent


@pytest.mark.slow
def test_a_judges_key_is_written_nowhere(tmp_path: Path) -> None:
    """Two judges on a local server that insists on a key held in the variable the jury file
    names; train, apply and the dry run as real processes; then every byte written under the
    test's directory and every byte printed is searched for the key."""
    import secrets
    import subprocess
    import sys

    from conftest import data_file
    from llm_server import FaultServer

    key = f"sk-test-{secrets.token_hex(20)}"
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("HDEVAL_LLM", "HDEVAL_BASE_URL", "HDEVAL_CACHE_DIR", "OPENAI_API_KEY")}
    env.update(JURY_TEST_KEY=key, HOME=str(home), XDG_CACHE_HOME=str(home / "cache"),
               XDG_DATA_HOME=str(home / "data"), HDEVAL_DATA_DIR=str(data_file().parent))

    def run(args: list[str], **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hdeval.cli", *args], cwd=work, env={**env, **more},
                              capture_output=True, text=True, timeout=120)

    with FaultServer(lifetime=300) as server:
        server.require_key = key
        jf = work / "jury.toml"
        jf.write_text("".join(f'[[judge]]\nname = "{n}"\nllm = "{m}"\nbase_url = "{server.url}"\n'
                              'api_key_env = "JURY_TEST_KEY"\n' for n, m in (("a", "model-a"), ("b", "model-b"))),
                      encoding="utf-8")
        common = ["--task", "sfres", "--limit", "16", "--layers", "1", "--aggregator", "lr", "--jury", str(jf),
                  "--cache-dir", str(work / "cache")]
        outs = [run(["train", *common, "-o", str(work / "art")])]
        assert outs[-1].returncode == 0, outs[-1].stderr
        models = {json.loads(r.body)["model"] for r in server.requests}
        assert models == {"model-a", "model-b"}  # both judges were asked, each with the key
        new = work / "new.jsonl"
        new.write_text("".join(data_file().read_text(encoding="utf-8").splitlines(keepends=True)[-5:]))
        before = server.calls
        # an artifact names no key variable: apply sends the key any artifact's run sends
        outs.append(run(["apply", str(work / "art"), str(new), "-o", str(work / "scored.jsonl"), "--cache-dir",
                         str(work / "cache"), "--base-url", server.url], OPENAI_API_KEY=key))
        assert outs[-1].returncode == 0, outs[-1].stderr
        assert server.calls > before
        outs.append(run(["train", "--dry-run", *common]))
        assert outs[-1].returncode == 0, outs[-1].stderr
        assert {r.headers.get("authorization") for r in server.requests} == {f"Bearer {key}"}

    manifest = (work / "art" / "manifest.json").read_text()
    assert '"api_key_env": "JURY_TEST_KEY"' in manifest
    needles = [key.encode().lower(), key.removeprefix("sk-test-").encode().lower()]
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and any(n in p.read_bytes().lower() for n in needles)]
    assert leaked == []
    for out in outs:
        assert key not in out.stdout and key not in out.stderr


@pytest.mark.slow
def test_a_learned_jury_beats_its_best_judge_and_its_mean_over_five_seeds(tmp_path: Path) -> None:
    """What a jury promises, on simulated judges (benchmarks/bench_jury.md gives 10 seeds): the learned
    jury's held-out Spearman is at least the best single judge's + 0.02 on average over seeds, and
    above the jury mean; with a pure-noise judge, --prune-judges drops it on every seed."""
    import numpy as np

    gain_best, gain_mean, dropped = [], [], []
    for seed in range(5):
        ev, _, _ = _train_jury(tmp_path / f"s{seed}", jury(0.7, 0.9, 1.2), n_docs=60, seed=seed)
        b = ev.metrics["jury"]["baselines"]
        learned = b["learned"]["average"]["spearman"]
        best = max(v[k]["average"]["spearman"] for v in b["judges"].values() for k in ("direct", "hdeval"))
        gain_best.append(learned - best)
        gain_mean.append(learned - b["jury_mean"]["average"]["spearman"])
        noisy, _, _ = _train_jury(tmp_path / f"n{seed}", jury(0.7, 0.9, None), n_docs=60, seed=seed,
                                  prune_judges=True)
        dropped.append(noisy.metrics["jury"]["dropped"])
    assert np.mean(gain_best) >= 0.02, gain_best
    assert min(gain_mean) > 0, gain_mean
    assert all("j3" in d for d in dropped), dropped


def test_every_judge_spends_from_one_max_calls(tmp_path: Path) -> None:
    from hdeval.core.errors import HdevalError

    judges = jury(0.5, 1.0, 1.5)
    with pytest.raises(HdevalError, match="max-calls|budget"):
        _train_jury(tmp_path, judges, max_calls=250)  # the jury needs 3 x 180
    assert 180 <= sum(calls_of(judges).values()) <= 250


def test_a_broken_judge_fails_its_cells_as_data_under_the_runs_threshold(tmp_path: Path) -> None:
    from simjury import SimJudge

    from hdeval.core.errors import ScoringError
    from hdeval.run.apply import apply_file

    ev, task, data = _train_jury(tmp_path, jury(0.5, 1.0), n_docs=20)
    path = ev.save(tmp_path / "art")
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in pointwise_rows(n_docs=3, seed=7)), encoding="utf-8")

    def loaded():
        out = load_artifact(path)
        out.judge_backends = {"j1": SimJudge("j1", 0.5), "j2": SimJudge("j2", 1.0, broken=True)}
        return out

    out = tmp_path / "scored.jsonl"
    with pytest.raises(ScoringError, match="50%"):
        apply_file(loaded(), str(new), str(out), max_failure_rate=0.2, llm="fake",
                   cache_dir=str(tmp_path / "c2"), notify=lambda *a, **k: None)
    assert not out.exists()
    apply_file(loaded(), str(new), str(out), max_failure_rate=0.6, llm="fake", cache_dir=str(tmp_path / "c2"),
               notify=lambda *a, **k: None)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 9
    assert all({f["criterion"] for f in r["failures"]} == {"j2:clarity", "j2:accuracy"} for r in rows)
    assert all(r["criteria"]["j1:clarity"] is not None and r["criteria"]["j2:clarity"] is None for r in rows)


def _weaker(noise: float):
    from simjudge import pointwise_backend

    base = pointwise_backend(noise=noise)

    class Named(type(base)):
        @property
        def identity(self) -> str:
            return f"simjudge:noise={noise}"
    return Named(logprobs=False, responders=base.responders)


def test_refit_to_a_weaker_judge_reports_the_drop_with_an_interval_below_zero(tmp_path: Path) -> None:
    from hdeval.llm.client import open_llm
    from hdeval.llm.config import LLMConfig
    from hdeval.methods.hdeval.refit import refit

    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=60, seed=3))
    ev = train(task=str(task), data=str(data), backend=_weaker(0.5), layers=1, aggregator="lr",
               cache_dir=str(tmp_path / "c"))
    ev = load_artifact(ev.save(tmp_path / "art"))
    weak = _weaker(1.5)
    llm = open_llm(LLMConfig("weak", cache_dir=str(tmp_path / "c")), weak)
    try:
        new, change = refit(ev, read_task_samples(data, load_task(str(task))), llm, LLMConfig("weak"))
    finally:
        llm.close()
    assert weak.calls == 360  # every labelled row (90 train + 90 held out) on both aspects, no new label
    assert change["change"] < 0 and change["interval"][1] < 0 and change["verdict"] == "worse"
    assert change["spearman_before"] == ev.metrics["final"]["average"]["spearman"]
    reloaded = load_artifact(new.save(tmp_path / "art2"))
    assert reloaded.metrics["final"]["average"]["spearman"] == change["spearman_after"]
    assert reloaded.llm_identity == "simjudge:noise=1.5"


def test_refit_refuses_a_jury_and_rows_it_cannot_find(tmp_path: Path) -> None:
    ev, task, data = _train_jury(tmp_path, jury(0.5, 1.0), n_docs=12)
    jury_art = ev.save(tmp_path / "jury-art")
    res = CliRunner().invoke(cli, ["refit", str(jury_art), "--llm", "fake", "--data", str(data), "-o",
                                   str(tmp_path / "out"), "-q"])
    assert res.exit_code != 0 and "one LLM, no jury" in res.output.strip().splitlines()[-1]
    single = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr",
                   cache_dir=str(tmp_path / "c1"))
    art = single.save(tmp_path / "art")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in pointwise_rows(n_docs=4, seed=5)), encoding="utf-8")
    res = CliRunner().invoke(cli, ["refit", str(art), "--llm", "fake:logprobs=0", "--data", str(other), "-o",
                                   str(tmp_path / "out"), "-q", "--cache-dir", str(tmp_path / "c1")])
    last = res.output.strip().splitlines()[-1]
    assert res.exit_code != 0 and "refit needs every labelled row of the artifact in --data" in last
    assert not (tmp_path / "out").exists()


def test_refit_finds_rows_whose_ids_look_like_numbers(tmp_path: Path) -> None:
    from hdeval.llm.client import open_llm
    from hdeval.llm.config import LLMConfig
    from hdeval.methods.hdeval.refit import refit

    rows = pointwise_rows(n_docs=12, seed=4)
    for i, r in enumerate(rows):
        r["id"] = str(1000 + i)
    task, data = write_pointwise(tmp_path, rows)
    ev = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr", cache_dir=str(tmp_path / "c"))
    ev = load_artifact(ev.save(tmp_path / "art"))
    llm = open_llm(LLMConfig("fake:logprobs=0", cache_dir=str(tmp_path / "c")))
    try:
        _, change = refit(ev, read_task_samples(data, load_task(str(task))), llm, LLMConfig("fake:logprobs=0"))
    finally:
        llm.close()
    assert change["spearman_before"] == ev.metrics["final"]["average"]["spearman"]


def test_refit_progress_names_its_stage_and_its_total(tmp_path: Path) -> None:
    """refit advanced a stage it never started: the terminal showed ': 144/0 done'."""
    from hdeval.core.progress import Progress
    from hdeval.llm.client import open_llm
    from hdeval.llm.config import LLMConfig
    from hdeval.methods.hdeval.refit import refit

    class Seen(Progress):
        def __init__(self) -> None:
            self.stages: list[tuple[str, int]] = []
            self.done = 0

        def stage(self, label: str, total: int) -> None:
            self.stages.append((label, total))

        def advance(self, n: int = 1, cached: bool = False) -> None:
            self.done += n

    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=12, seed=4))
    ev = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr", cache_dir=str(tmp_path / "c"))
    ev = load_artifact(ev.save(tmp_path / "art"))
    llm = open_llm(LLMConfig("fake:logprobs=0", cache_dir=str(tmp_path / "c")))
    seen = Seen()
    try:
        refit(ev, read_task_samples(data, load_task(str(task))), llm, LLMConfig("fake:logprobs=0"), seen)
    finally:
        llm.close()
    n_rows = len(ev.run["split"]["train"]) + len(ev.run["split"]["test"])
    assert seen.stages == [(f"scoring {n_rows} labelled samples x 2 criteria with fake:logprobs=0", n_rows * 2)]
    assert seen.done == n_rows * 2


@pytest.mark.slow  # two layers trained, then refitted
def test_a_refitted_artifacts_banner_names_the_layer_it_refitted(tmp_path: Path) -> None:
    """A refit of an artifact that kept layer 2 said "layer 1, the last one trained"."""
    from simjudge import pointwise_backend

    from hdeval.llm.client import open_llm
    from hdeval.llm.config import LLMConfig
    from hdeval.methods.hdeval.refit import refit

    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=20, seed=0))
    deep = pointwise_backend(noise=1.2, deep_signal=True)  # layer 2's criteria carry signal: it is kept
    ev = train(task=str(task), data=str(data), backend=deep, layers=2, aggregator="lr", cache_dir=str(tmp_path / "c"))
    ev = load_artifact(ev.save(tmp_path / "art"))
    assert ev.metrics["selection"]["kept_layer"] == 2
    llm = open_llm(LLMConfig("fake:logprobs=0", cache_dir=str(tmp_path / "c")))
    try:
        new, _ = refit(ev, read_task_samples(data, load_task(str(task))), llm, LLMConfig("fake:logprobs=0"))
    finally:
        llm.close()
    refitted = load_artifact(new.save(tmp_path / "art2"))
    kept = [line.text for line in refitted.banner().lines if line.label == "layer kept"]
    assert kept == ["layer 2: the layer the refitted artifact kept, its criteria now scored by the new judge"]
    assert list(refitted.metrics["layers"]) == ["2"]


class _Constant(SimJudge):
    """A judge that answers 3 to everything: its columns rank nothing."""

    def __init__(self, name: str):
        super().__init__(name, 0.0)

    def _reply(self, request, fake):
        return Completion("3", None, 10, 1)


def test_a_judge_that_ranks_nothing_gives_the_others_no_made_up_importance(tmp_path: Path) -> None:
    """Without the good judge the jury's columns rank nothing: that is no figure, not -1, so the good
    judge's importance is not its own figure plus one (it was 1.83, printed as +1.827)."""
    judges = {"good": jury(0.7)["j1"], "lazy": _Constant("lazy")}
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=30, seed=0))
    jf = _file(tmp_path, "".join(f'[[judge]]\nname = "{n}"\nllm = "fake"\n' for n in judges))
    ev = train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=1, aggregator="lr",
               cache_dir=str(tmp_path / "cache"), seed=0, prune_judges=True)
    rec = ev.metrics["jury"]
    assert rec["importance_cv_spearman"]["good"] is None
    assert rec["dropped"] == ["lazy"] and rec["kept"] == ["good"]


@pytest.mark.slow  # nn's penalty tuned on three and on two judges' columns: some seconds
def test_a_pruned_nn_jury_is_the_model_its_figure_is_of(tmp_path: Path) -> None:
    """nn's penalty is tuned on the kept judges' columns for the figure said; the artifact stores
    that model, as a jury of only those judges would, not the penalty tuned on all three."""
    def run(where: str, judges):
        (tmp_path / where).mkdir()
        task, data = write_pointwise(tmp_path / where, pointwise_rows(n_docs=30, seed=1))
        jf = _file(tmp_path / where, _tables(judges))
        return train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=1,
                     aggregator="nn", cache_dir=str(tmp_path / where / "cache"), seed=1, **(
                         {"prune_judges": True} if len(judges) == 3 else {}))

    pruned = run("pruned", jury(0.9, 0.9, None))
    assert pruned.metrics["jury"]["dropped"] == ["j3"]
    two = run("two", jury(0.9, 0.9))
    assert pruned.metrics["selection"]["pruned_cv_spearman"] == two.metrics["selection"]["cv_train_spearman"]["1"]
    assert pruned.metrics["final"] == two.metrics["final"]


def test_effective_judges_count_only_judges_whose_errors_are_defined() -> None:
    from hdeval.core.types import ScoreMatrix
    from hdeval.methods.jury import error_correlation

    rng = np.random.default_rng(0)
    q = rng.normal(size=(150, 2))
    Y = np.clip(np.round(3 + q), 1, 5)
    scores = {n: np.clip(np.round(3 + q + 0.7 * rng.normal(size=q.shape)), 1, 5) for n in ("a", "b")}
    scores["lazy"] = np.full_like(Y, 3.0)
    keys = [f"{n}:{a}" for n in scores for a in ("clarity", "accuracy")]
    m = ScoreMatrix([str(i) for i in range(150)], keys, np.column_stack([scores[k.split(":")[0]][:, j]
                                                                         for k, j in zip(keys, [0, 1] * 3)]))
    rows = np.arange(150)
    _, three = error_correlation(m, ["a", "b", "lazy"], Y, ["clarity", "accuracy"], rows)
    _, two = error_correlation(m, ["a", "b"], Y, ["clarity", "accuracy"], rows)
    assert three == two


def test_no_interval_is_given_from_one_held_out_document() -> None:
    from hdeval.methods.hdeval.jury import held_out_intervals

    rng = np.random.default_rng(0)
    Y = rng.normal(size=(6, 1))
    preds = {("learned",): Y + rng.normal(size=Y.shape), ("jury_mean",): Y + 2 * rng.normal(size=Y.shape)}
    out = held_out_intervals(Y, preds, ["doc1"] * 6)
    assert out["documents"] == 1 and out["learned"]["spearman"] is not None
    assert out["learned"]["low"] is None and out["jury_mean"]["learned_minus"]["low"] is None


def test_the_report_counts_only_judges_whose_errors_are_defined(tmp_path: Path) -> None:
    from hdeval.methods.hdeval.jury_report import jury_sections

    judges = {**jury(0.7, 0.7), "lazy": _Constant("lazy")}
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=30, seed=0))
    jf = _file(tmp_path, "".join(f'[[judge]]\nname = "{n}"\nllm = "fake"\n' for n in judges))
    ev = train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=1, aggregator="lr",
               cache_dir=str(tmp_path / "cache"), seed=0)
    line = jury_sections(ev)[1][1].lines[0]
    assert line.startswith("2 judges behave like ") and "Not counted: lazy" in line


def test_a_difference_with_a_judge_that_failed_cells_is_on_the_cells_it_has() -> None:
    """A judge whose failed calls left cells empty is scored on the rest; the learned jury minus it
    is taken on those same cells, not the learned jury's every row against the judge's fewer."""
    from hdeval.core.metrics import average_spearman
    from hdeval.methods.hdeval.jury import held_out_intervals

    rng = np.random.default_rng(0)
    Y = rng.normal(size=(60, 2))
    learned, judge = Y + 0.5 * rng.normal(size=Y.shape), Y + 0.5 * rng.normal(size=Y.shape)
    judge[Y[:, 0] > 0.5, 0] = np.nan  # it failed on the high rows of one aspect
    out = held_out_intervals(Y, {("learned",): learned, ("j",): judge}, [f"d{i // 3}" for i in range(60)])
    same_cells = np.where(np.isfinite(judge), learned, np.nan)
    want = average_spearman(Y, same_cells) - average_spearman(Y, judge)
    assert out["j"]["learned_minus"]["difference"] == pytest.approx(want, abs=1e-6)
    assert out["learned"]["spearman"] == pytest.approx(average_spearman(Y, learned), abs=1e-6)
    assert out["j"]["learned_minus"]["low"] < want < out["j"]["learned_minus"]["high"]
