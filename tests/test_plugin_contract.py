"""A method plug-in's mistakes past registration (docs/plugins.md's toy, varied): what its fit,
write and load give is checked where it is given, in one line naming the method and the field;
nothing is written, and never an artifact hdeval's own loader then refuses."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from simjudge import pointwise_rows, write_pointwise
from test_plugin_docs import _install

import hdeval.methods.registry as registry
from hdeval.core.errors import ArtifactError, MethodError
from hdeval.methods.base import METHODS

VARIANTS = textwrap.dedent('''
    import numpy as np
    import hdeval_toycalib as toy
    from hdeval.methods.base import Method

    def variant(name, fit=toy.fit, load=toy.ToyEvaluator.from_artifact, **kw):
        return Method(name=name, summary=name, shapes=("pointwise",), fit=fit, load=load,
                      options=toy.ToyOptions, **kw)

    def fit_dict(ctx):
        return {"not": "fitted"}

    # a method written from the table of docs/plugins.md alone: the three members, its metrics
    # only the split (usage and final are optional), and no run record of its own
    from pydantic import BaseModel
    from hdeval.core.types import ScoreMatrix
    from hdeval.data.tasks import task_from_dict
    from hdeval.llm.config import LLMConfig
    from hdeval.methods.base import Fitted, ScoreResult

    class MeanState(BaseModel):
        means: dict[str, float]

    class MeanEvaluator(Fitted):
        method, State = "meanbase", MeanState
        means = {}

        def score(self, samples, backend=None, cache_dir=None, concurrency=None, progress=None):
            ids, keys = [s.id for s in samples], list(self.task.aspect_keys)
            pred = np.array([[self.means[k] for k in keys] for _ in ids])
            return ScoreResult(ids, keys, pred, ScoreMatrix(ids, [], np.zeros((len(ids), 0))))

        def write(self, out):
            out.json("metrics.json", self.metrics)
            return MeanState(means=self.means).model_dump()

        @classmethod
        def from_artifact(cls, art):
            m = art.manifest
            ev = cls(task_from_dict(m["task"], where=str(art.path)), None, LLMConfig(model=m["llm"]["model"]),
                     m["llm"]["identity"], art.json("metrics.json"))
            ev.means = dict(cls.read_state(art).means)
            return ev

    def fit_mean(ctx):
        train = set(ctx.prep.split.train_ids)
        split = {"train": len(ctx.prep.split.train_ids), "test": len(ctx.prep.split.test_ids)}
        ev = MeanEvaluator(ctx.prep.task, None, ctx.llm_config, ctx.llm.identity, {"split": split})
        ev.means = {k: float(np.mean([s.scores[k] for s in ctx.prep.samples if s.id in train]))
                    for k in ctx.prep.task.aspect_keys}
        return ev

    MEAN = lambda: Method(name="meanbase", summary="the training mean", shapes=("pointwise",), fit=fit_mean,
                          load=MeanEvaluator.from_artifact)

    def mean_as(name, load):  # the mean method under another name, loaded by load
        cls = type(f"{name}Evaluator", (MeanEvaluator,), {"method": name})

        def fit(ctx):
            ev = fit_mean(ctx)
            ev.__class__ = cls
            return ev

        return Method(name=name, summary="s", shapes=("pointwise",), fit=fit, load=load(cls))

    LOAD_NONE = lambda: mean_as("loadnone", lambda cls: lambda art: None)
    MEAN_LATER = lambda: mean_as("meanlater", lambda cls: lambda art: cls.from_artifact(art))  # its class unsaid

    FIT_DICT = lambda: variant("fitdict", fit=fit_dict)
    FIT_NONE = lambda: variant("fitnone", fit=lambda ctx: None)
    MISNAMED = lambda: variant("misnamed")  # the toy's evaluator, whose method is toycalib

    def as_variant(cls, change=lambda ev: None):  # the toy's fit, its evaluator of class cls
        def fit(ctx):
            ev = toy.fit(ctx)
            new = cls.__new__(cls)
            new.__dict__.update(ev.__dict__)
            change(new)
            return new

        return variant(cls.method, fit=fit, load=cls.from_artifact)

    class Float32State(toy.ToyEvaluator):  # write() returns numpy floats JSON cannot hold
        method = "float32state"

        def write(self, out):
            return {**super().write(out), "lines": {k: [np.float32(a), b] for k, (a, b) in self.lines.items()}}

    class SetState(toy.ToyEvaluator):  # no State model, and a set in the state
        method, State = "setstate", None

        def write(self, out):
            return {**super().write(out), "tags": {"a", "b"}}

    class BadState(toy.ToyEvaluator):  # a state its own State refuses
        method = "badstate"

        def write(self, out):
            return {**super().write(out), "lines": "oops"}

    class NoUsage(toy.ToyEvaluator):
        method = "nousage"

    class NoSplit(toy.ToyEvaluator):
        method = "nosplit"

    class Float32Metrics(toy.ToyEvaluator):
        method = "float32metrics"

    class PartUsage(toy.ToyEvaluator):
        method = "partusage"

    NO_USAGE = lambda: as_variant(NoUsage, lambda ev: [ev.metrics.pop(k) for k in ("usage", "final")])
    PART_USAGE = lambda: as_variant(PartUsage, lambda ev: ev.metrics.update(usage={"cache_hits": 3}))
    FLOAT32_STATE = lambda: as_variant(Float32State)
    SET_STATE = lambda: as_variant(SetState)
    BAD_STATE = lambda: as_variant(BadState)
    NO_SPLIT = lambda: as_variant(NoSplit, lambda ev: ev.metrics.pop("split"))
    FLOAT32_METRICS = lambda: as_variant(Float32Metrics, lambda ev: ev.metrics.update(failure_rate=np.float32(0)))
''')


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The documented toy plug-in and its variants (``toy_variants``) importable; each test
    declares the entry points it wants: ``plugin(TARGET)``, a name in VARIANTS."""
    site = tmp_path / "site"
    site.mkdir()
    _install(site)
    (site / "toy_variants.py").write_text(VARIANTS)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_loaded", False)
    saved = dict(METHODS)
    declared: list[md.EntryPoint] = []
    monkeypatch.setattr(md, "entry_points", lambda group: declared if group == "hdeval.methods" else [])

    def declare(target: str) -> None:
        declared.append(md.EntryPoint(target.lower(), f"toy_variants:{target}", "hdeval.methods"))

    yield declare
    METHODS.clear()
    METHODS.update(saved)
    for module in ("hdeval_toycalib", "toy_variants"):
        sys.modules.pop(module, None)


@pytest.fixture
def sim(tmp_path: Path) -> dict[str, str]:
    """A small simulated pointwise task and its data, and a cache of its own."""
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=8, seed=1))
    return {"task": str(task), "data": str(data), "llm": "fake", "cache_dir": str(tmp_path / "cache")}


def cli_train(sim: dict[str, str], method: str, out: Path):
    from hdeval.cli import cli

    return CliRunner().invoke(cli, ["train", "--task", sim["task"], "--data", sim["data"], "--llm", "fake",
                                    "--cache-dir", sim["cache_dir"], "--method", method, "-q", "-o", str(out)])


@pytest.mark.parametrize("target, method, got", [("FIT_DICT", "fitdict", "dict"), ("FIT_NONE", "fitnone", "None")])
def test_a_fit_returning_no_fitted_evaluator_is_one_line(plugin, sim, tmp_path, target, method, got):
    # the CLI stopped with a traceback after the run (_record_rate); Python returned it as it was
    plugin(target)
    import hdeval

    with pytest.raises(MethodError, match=rf"^method '{method}': fit returned {got}, not a Fitted$"):
        hdeval.train(method=method, **sim)
    r = cli_train(sim, method, tmp_path / "out")
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [f"error: method '{method}': fit returned {got}, not a Fitted"]
    assert not (tmp_path / "out").exists()


def test_a_fit_returning_another_method_s_evaluator_is_one_line(plugin, sim, tmp_path):
    # its artifact named toycalib: load read it as toycalib's, or refused it where that is absent
    plugin("MISNAMED")
    r = cli_train(sim, "misnamed", tmp_path / "out")
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [
        "error: method 'misnamed': fit returned a ToyEvaluator of method 'toycalib', whose load would read its "
        "artifact (set method = 'misnamed' on the class)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target, message", [
    ("FLOAT32_STATE", r"method 'float32state': state\.lines\.\w+\[0\] is a numpy\.float32, which JSON cannot hold"),
    ("SET_STATE", r"method 'setstate': state\.tags is a set, which JSON cannot hold"),
    ("BAD_STATE", r"method 'badstate': its state would be refused on load: state field 'lines': Input should be a "
                  r"valid dictionary"),
    ("NO_SPLIT", r"method 'nosplit': its metrics\.json would be refused on load: 'split': Field required"),
    ("FLOAT32_METRICS", r"method 'float32metrics': metrics\.failure_rate is a numpy\.float32, which JSON cannot hold"),
])
def test_what_load_would_refuse_is_refused_at_save_in_one_line(plugin, sim, tmp_path, target, message):
    # a state or metrics its own loader refuses were saved; a value JSON cannot hold was a raw
    # TypeError from the JSON encoder, after the method's files were written
    plugin(target)
    import hdeval

    ev = hdeval.train(method=target.lower().replace("_", ""), **sim)
    with pytest.raises(MethodError, match=rf"^{message}$"):
        ev.save(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "sim_qa.jsonl", "sim_qa.toml", "site"]


def test_a_bad_state_stops_cli_train_in_one_line_and_writes_nothing(plugin, sim, tmp_path):
    plugin("BAD_STATE")
    r = cli_train(sim, "badstate", tmp_path / "out")
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [
        "error: method 'badstate': its state would be refused on load: state field 'lines': Input should be a valid "
        "dictionary (every LLM reply of this run is cached: rerunning costs no calls)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target, method, summary", [
    ("MEAN", "meanbase", "held-out average: not recorded"),  # neither usage nor final
    ("NO_USAGE", "nousage", "held-out average: not recorded"),
    ("PART_USAGE", "partusage", "held-out average: pearson "),  # usage without its calls
])
def test_cli_train_of_a_method_without_usage_or_final_figures_says_what_it_has(plugin, sim, tmp_path, target,
                                                                               method, summary):
    # the docs call usage and final optional: train stopped with a KeyError after saving
    plugin(target)
    r = cli_train(sim, method, tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{summary}") and f"\nartifact written to {tmp_path / 'out'}\n" in r.stdout
    assert not [x for x in r.stderr.splitlines() if x.startswith("LLM calls made")]
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_a_method_with_only_the_three_members_gets_its_run_record_path_and_checked_metrics(plugin, sim, tmp_path):
    # its artifact recorded "run": {} (apply could not tell its training samples); loaded, it had
    # no path, warnings or run record, and its metrics.json was read unchecked
    plugin("MEAN")
    import hdeval

    ev = hdeval.train(method="meanbase", **sim)
    assert ev.run["seed"] == 0 and ev.run["split"]["train"] and ev.run["config"]["method"] == "meanbase"
    out = ev.save(tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run"]["split"] == ev.run["split"]
    loaded = hdeval.load(out)
    assert loaded.path == out and loaded.warnings == [] and loaded.fitted.run == manifest["run"]
    assert loaded.fitted.training_ids() == frozenset(ev.run["split"]["train"])

    metrics = json.loads((out / "metrics.json").read_text())
    (out / "metrics.json").write_text(json.dumps({**metrics, "split": {"train": "many"}}))
    manifest["files"]["metrics.json"] = hashlib.sha256((out / "metrics.json").read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as err:
        hdeval.load(out)
    assert str(err.value) == f"{out / 'metrics.json'}: 'split.train' must be a whole number (0 or more), got \"many\""


def test_a_load_returning_no_fitted_evaluator_is_one_line(plugin, sim, tmp_path):
    plugin("LOAD_NONE")
    import hdeval

    out = hdeval.train(method="loadnone", **sim).save(tmp_path / "out")
    with pytest.raises(MethodError, match=r"^method 'loadnone': load returned None, not a Fitted$"):
        hdeval.load(out)


def cli_benchmark(sim: dict[str, str], methods: str, out: Path):
    from hdeval.cli import cli

    return CliRunner().invoke(cli, ["benchmark", "--task", sim["task"], "--data", sim["data"], "--llm", "fake",
                                    "--cache-dir", sim["cache_dir"], "--methods", methods, "-o", str(out)])


def test_benchmark_refuses_a_method_without_held_out_scores_before_the_sweep(plugin, sim, tmp_path):
    # the whole sweep ran, then it failed saying the evaluator "has no score table"
    plugin("MEAN")
    r = cli_benchmark(sim, "direct,meanbase", tmp_path / "bench")
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [
        "error: benchmark cannot compare method 'meanbase': its evaluator MeanEvaluator does not give HeldOutScores "
        "(hdeval.methods.base: held_out_predictions(table, test); docs/plugins.md)"]
    assert not (tmp_path / "bench" / "results.json").exists() and "run 1/2" not in r.output


def test_benchmark_names_the_missing_capability_when_it_finds_out_after_a_run(plugin, sim, tmp_path):
    # its load hides the evaluator's class: found after its run, for the right reason
    plugin("MEAN_LATER")
    r = cli_benchmark(sim, "meanlater", tmp_path / "bench")
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines()[-1] == (
        "error: benchmark cannot compare method 'meanlater': its evaluator meanlaterEvaluator does not give "
        "HeldOutScores (hdeval.methods.base: held_out_predictions(table, test); docs/plugins.md)")
