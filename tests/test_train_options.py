"""Each method's options are one typed, frozen model with its defaults declared once; the CLI,
the Python API and ``benchmark`` build it the same way, and ``train --help`` states every
method's own default."""

from __future__ import annotations

import json

import pydantic
import pytest

from conftest import one_error, run_cli
from hdeval.core.errors import ConfigError
from hdeval.methods.options import MethodOptions
from hdeval.methods.registry import all_options, get_method, method_names
from hdeval.run.train import TrainConfig


def test_every_method_has_a_frozen_options_model_whose_defaults_are_the_runs():
    for name in method_names():
        model = get_method(name).options
        built = get_method(name).build_options()
        assert issubclass(model, MethodOptions) and type(built) is model
        assert TrainConfig(task="summeval", method=name).options == built
        if model.model_fields:
            field = next(iter(model.model_fields))
            with pytest.raises(pydantic.ValidationError, match="frozen"):
                setattr(built, field, None)


def test_the_python_api_routes_options_by_name_to_the_methods_model():
    config = TrainConfig.from_options(task="summeval", llm="fake", layers=2, limit=64)
    assert config.options.layers == 2 and config.options.children == 4 and config.limit == 64
    paireval = TrainConfig.from_options(task="summeval", method="paireval", comparisons=5, swap=False)
    assert (paireval.options.comparisons, paireval.options.swap) == (5, False)
    # method_options (a mapping) is merged with options given by name
    dna = TrainConfig.from_options(task="faireval", method="dna", method_options={"dna_mode": "cot"}, k=3)
    assert (dna.options.dna_mode, dna.options.k, dna.options.swap) == ("cot", 3, False)
    assert dna.replace(seed=3).options == dna.options  # replace keeps the method's options
    assert dna.replace(k=5).options.k == 5


def test_train_takes_method_options_by_name(tmp_path):
    from hdeval import train

    ev = train(task="examples/qa_task.toml", data="examples/qa.jsonl", llm="fake", layers=1,
               aggregator="lr", cache_dir=str(tmp_path / "c"))
    assert ev.metrics["final"]["average"]
    assert ev.method_args() == {"layers": 1, "children": 4, "top_k": 4, "aggregator": "lr"}


@pytest.mark.parametrize("options, message", [
    ({"method": "direct", "layers": 2}, "method 'direct' takes no option(s) layers (its options: none)"),
    ({"method": "dna", "tree": "t.json"}, "method 'dna' takes no option(s) tree (its options: aspect_source, "),
    ({"method": "paireval", "top_k": 2}, "method 'paireval' takes no option(s) top_k"),
    ({"layrs": 2}, "unknown training option(s) for method 'hdeval': layrs (did you mean layers?)"),
    ({"layers": "2"}, "--layers must be a whole number, got '2'"),
    ({"swap": 1}, "--swap must be true or false, got 1"),
    ({"method": "dna", "tie_margin": "wide"}, "--tie-margin must be a number, got 'wide'"),
    ({"method": "dna", "k": 0}, "--k must be a whole number from 1 to"),
    ({"method": "dna", "dna_mode": "best"}, "--dna-mode must be one of dna, direct, cot, prompt-agg, got 'best'"),
    ({"layers": 0}, "--layers must be at least 1, got 0"),
    ({"aggregator": "svm"}, "unknown aggregator 'svm': choose from mean, direct, aspect_mean, shrink, nnls, ridge, lr, dt, nn, rf or auto"),
    ({"method": "paireval", "comparisons": 0}, "--comparisons must be a whole number of at least 1, got 0"),
    ({"decompose_base_url": "http://127.0.0.1:1/v1"}, "--decompose-base-url needs --decompose-llm"),
])
def test_a_bad_option_is_one_line_naming_it(options, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_options(task="summeval", **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_train_takes_paths_and_refuses_a_dict_for_its_config(tmp_path):
    from pathlib import Path

    from hdeval.run.train import train

    ev = train(task=Path("examples/qa_task.toml"), data=Path("examples/qa.jsonl"), llm="fake", method="direct",
               cache_dir=tmp_path / "c")
    assert ev.method == "direct"
    with pytest.raises(ConfigError, match=r"train takes a TrainConfig or options by name .*got dict"):
        train({"task": "examples/qa_task.toml", "llm": "fake"})


def test_the_cli_refuses_an_option_of_another_method_before_anything_else(tmp_path):
    r = run_cli("train", "--task", "examples/qa_task.toml", "--data", "examples/qa.jsonl", "--llm", "fake",
                "--method", "direct", "--layers", "2", "--cache-dir", tmp_path / "c", "-o", tmp_path / "art")
    one_error(r, "method 'direct' takes no option(s) layers")
    assert not (tmp_path / "art").exists() and not (tmp_path / "c").exists()


def test_a_model_built_elsewhere_must_be_the_chosen_methods():
    hdeval_options = get_method("hdeval").build_options({"layers": 2})
    assert TrainConfig(task="summeval", options=hdeval_options).options.layers == 2
    with pytest.raises(ConfigError, match="the options of method 'dna' are a DnaOptions, not a HDEvalOptions"):
        TrainConfig(task="faireval", method="dna", options=hdeval_options)


def test_the_manifest_records_each_methods_own_options():
    """The record's layout is the artifact format (golden files pin it): the shared options, and
    every option of the method (given or not) under options; no other method's."""
    hd = TrainConfig.from_options(task="summeval", layers=2, scorer="pairwise", swap=True).public()
    assert list(hd)[:6] == ["task", "method", "options", "data", "aspects", "preset"]
    assert hd["options"] == {**get_method("hdeval").build_options().model_dump(),
                             "layers": 2, "scorer": "pairwise"}
    dna = TrainConfig.from_options(task="faireval", method="dna", dna_mode="direct").public()
    assert dna["options"] == {**get_method("dna").build_options().model_dump(), "dna_mode": "direct"}
    assert not {"layers", "aggregator", "tree", "decompose_llm", "method_options"} & set(dna)
    paireval = TrainConfig.from_options(task="summeval", method="paireval", aggregator="lr").public()
    assert paireval["options"]["aggregator"] == "lr" and "layers" not in paireval["options"]
    assert json.loads(json.dumps(hd)) == hd


def test_help_states_each_methods_own_default():
    r = run_cli("train", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "--swap / --no-swap [dna, hdeval, paireval]" in text
    assert "(default: off for dna; on for hdeval, paireval)" in text
    assert "--layers INTEGER [hdeval] Depth of the criteria tree (1 = the aspects only). (default: 3)" in text
    # every option's help names its methods and each one's default as its model declares it
    from hdeval.cli import cli

    helps = {p.name: p.help for p in cli.commands["train"].params}
    for name, owners in all_options().items():
        head, _, defaults = helps[name].partition("(default: ")
        assert head.startswith(f"[{', '.join(m for m, _ in owners)}] "), name
        defaults = defaults.removesuffix(")")
        per_method = {m: defaults for m, _ in owners}
        for part in defaults.split("; ") if " for " in defaults else ():
            value, _, methods = part.partition(" for ")
            per_method.update({m: value for m in methods.split(", ")})
        for method, spec in owners:
            if isinstance(spec.default, bool):
                shown = "on" if spec.default else "off"
            elif spec.default in (None, ""):
                continue
            else:
                shown = str(spec.default)
            assert per_method[method] == shown, (name, method, defaults)


def test_help_follows_the_models_defaults(monkeypatch):
    """Changing a model's default changes the help: it is not written twice."""
    from hdeval.cli.options import _defaults_help
    from hdeval.methods.options import Option

    owners = [(m, spec) for m, spec in all_options()["swap"]]
    assert _defaults_help(owners) == " (default: off for dna; on for hdeval, paireval)"
    flipped = [(m, Option(not spec.default, spec.help)) for m, spec in owners]
    assert _defaults_help(flipped) == " (default: on for dna; off for hdeval, paireval)"
    assert _defaults_help([("hdeval", Option(3, "x")), ("paireval", Option(3, "x"))]) == " (default: 3)"


def test_benchmark_builds_the_same_options():
    from hdeval.benchmark.spec import BenchmarkSpec
    from hdeval.benchmark.sweep import _config

    spec = BenchmarkSpec(task="summeval", methods=("direct", "hdeval", "paireval"),
                         options={"layers": 2, "limit": 40, "llm": "fake"},
                         method_options={"paireval": {"comparisons": 4}})
    hd = _config(spec, "hdeval", "rf", 0.5, 0, None)
    assert hd.options == TrainConfig.from_options(task="summeval", layers=2, aggregator="rf").options
    # the sweep's HD-Eval options reach only the methods that take them
    direct = _config(spec, "direct", None, 0.5, 1, None)
    assert direct.options == get_method("direct").build_options() and direct.limit == 40
    pe = _config(spec, "paireval", "lr", 0.5, 0, None)
    assert pe.options == TrainConfig.from_options(task="summeval", method="paireval", comparisons=4,
                                                  aggregator="lr").options
    dna = _config(BenchmarkSpec(task="faireval", methods=("dna-direct",)), "dna-direct", None, 0.5, 0, None)
    assert dna.options.dna_mode == "direct"


def test_methods_lists_each_methods_own_defaults():
    r = run_cli("methods")
    assert r.exit_code == 0
    blocks = {b.split(" ", 1)[0]: b for b in ("\n" + r.output).split("\n") if b and not b.startswith(" ")}
    lines = r.output.splitlines()
    start = {name: lines.index(block) for name, block in blocks.items()}
    own = {name: lines[i + 1:min([j for j in start.values() if j > i] or [len(lines)])] for name, i in start.items()}
    assert any(line.startswith("  --swap (default off):") for line in own["dna"])
    assert any(line.startswith("  --swap (default on):") for line in own["paireval"])
    assert any(line.startswith("  --tree: Start from") for line in own["hdeval"])  # no default: the help says


# ------------------------------------------------------------------ given at the default vs left out
def _pairs(tmp_path):
    from conftest import write_jsonl

    rows = [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"question {i}", "output_a": f"answer a{i} " * (i + 1),
             "output_b": f"answer b{i}", "label": "ab"[i % 2]} for i in range(12)]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)


@pytest.mark.parametrize("given, name", [(("--comparisons", "3"), "--comparisons"), (("--swap",), "--swap"),
                                         (("--no-swap",), "--swap")])
def test_pairwise_hdeval_refuses_a_paireval_option_given_at_its_default(given, name, tmp_path, fake_calls):
    # 3 and on are PairEval's defaults: given explicitly, they are still an option HD-Eval does not take
    out = tmp_path / "art"
    r = run_cli("train", "--task", "faireval", "--data", _pairs(tmp_path), "--method", "hdeval", "--layers", "1",
                "--llm", "fake", "--cache-dir", tmp_path / "c", "-o", out, *given)
    one_error(r, f"{name} is a PairEval option", "faireval")
    assert not fake_calls and not out.exists()


def test_pairwise_hdeval_without_paireval_options_still_trains(tmp_path):
    from hdeval.run.train import train

    ev = train(task="faireval", data=str(_pairs(tmp_path)), method="hdeval", layers=1, llm="fake",
               cache_dir=str(tmp_path / "c"))
    assert ev.task.shape == "pairwise"
    with pytest.raises(ConfigError, match="--comparisons is a PairEval option"):  # the Python API alike
        train(task="faireval", data=str(_pairs(tmp_path)), method="hdeval", layers=1, llm="fake",
              cache_dir=str(tmp_path / "c"), comparisons=3)


def test_the_options_model_records_what_was_given_through_every_door():
    import copy
    import pickle

    from hdeval.methods.hdeval.options import HDEvalOptions

    c = TrainConfig.from_options(task="summeval", comparisons=3, layers=None)  # None: not given (the CLI's)
    assert c.options.given() == {"comparisons": 3}
    assert c.options == TrainConfig(task="summeval").options  # equal values: equal models
    assert TrainConfig(task="summeval").options.given() == {}
    # replacing another option keeps what was left out left out, and what was given given
    assert c.replace(seed=1).options.given() == {"comparisons": 3}
    assert c.replace(layers=3).options.given() == {"layers": 3, "comparisons": 3}
    assert c.replace(method="paireval").options.given() == {}
    assert HDEvalOptions(layers=3).given() == {"layers": 3}  # the constructor, as build
    for copied in (pickle.loads(pickle.dumps(c.options)), copy.deepcopy(c.options)):  # benchmark's workers
        assert copied.given() == {"comparisons": 3}


def test_replacing_options_keeps_what_was_given_and_checks_the_values(tmp_path, fake_calls):
    # replace must not count every option as given (pairwise HD-Eval would refuse PairEval's
    # options the caller never gave), and must check what it changes (model_copy would not)
    import pickle
    import re

    data, cache = str(_pairs(tmp_path)), str(tmp_path / "c")
    opts = get_method("hdeval").build_options({"layers": 2})
    one = opts.replace(layers=1)
    assert (one.layers, one.given(), opts.layers) == (1, {"layers": 1}, 2)
    assert pickle.loads(pickle.dumps(one)).given() == {"layers": 1}
    ev = train_with(task="faireval", data=data, method="hdeval", llm="fake", cache_dir=cache, options=one)
    assert ev.task.shape == "pairwise" and ev.method_args()["layers"] == 1
    before = len(fake_calls)
    with pytest.raises(ConfigError, match="--comparisons is a PairEval option"):  # given at its default
        train_with(task="faireval", data=data, method="hdeval", llm="fake", cache_dir=cache,
                   options=one.replace(comparisons=3))
    assert len(fake_calls) == before
    for bad, message in (({"layers": "1"}, "--layers must be a whole number, got '1'"),
                         ({"aggregator": "svm"}, "unknown aggregator 'svm'"),
                         ({"layrs": 1}, "HDEvalOptions takes no option(s) layrs (its options: aggregator, ")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            opts.replace(**bad)


def train_with(**config):
    from hdeval.run.train import train

    return train(TrainConfig(**config))


def test_benchmark_refuses_a_paireval_option_for_pairwise_hdeval_before_any_call(tmp_path, fake_calls):
    out = tmp_path / "bench"
    r = run_cli("benchmark", "--task", "faireval", "--data", _pairs(tmp_path), "--methods", "hdeval",
                "--layers", "1", "--method-option", "hdeval.comparisons=3", "--llm", "fake",
                "--cache-dir", tmp_path / "c", "-q", "-o", out)
    one_error(r, "--comparisons is a PairEval option")
    assert not fake_calls and not (out / "results.json").exists()


def test_a_method_declares_which_options_name_its_second_llm():
    # shared code opens the second LLM from the options the method names, whatever they are called
    from types import SimpleNamespace
    from typing import ClassVar

    from hdeval.methods.options import option
    from hdeval.methods.run import decompose_llm_config

    class JudgeOptions(MethodOptions):
        second_llm: ClassVar[tuple[str, str]] = ("judge_llm", "judge_base_url")
        judge_llm: str | None = option(None, "the judging LLM")
        judge_base_url: str | None = option(None, "its server")

    class Undeclared(MethodOptions):  # an option that happens to be called decompose_llm
        decompose_llm: str | None = option(None, "not an LLM this method opens")

    settings = dict(timeout=5.0, max_retries=0, concurrency=2, cache_dir=None, max_calls=None, batch=False)
    run = dict(llm_settings=lambda: settings)
    judge = JudgeOptions.build({"judge_llm": "big", "judge_base_url": "http://127.0.0.1:9/v1"}, "judge")
    dc = decompose_llm_config(SimpleNamespace(options=judge, **run))
    assert (dc.model, dc.base_url, dc.timeout) == ("big", "http://127.0.0.1:9/v1", 5.0)
    assert judge.second_llm_given() == ("big", "http://127.0.0.1:9/v1", "-O judge_llm")  # a plug-in option, named as -O gives it
    assert decompose_llm_config(SimpleNamespace(options=JudgeOptions(), **run)) is None
    assert decompose_llm_config(SimpleNamespace(options=Undeclared(decompose_llm="x"), **run)) is None
    hd = TrainConfig.from_options(task="summeval", decompose_llm="gpt-x")
    assert decompose_llm_config(hd).model == "gpt-x"
    assert decompose_llm_config(TrainConfig.from_options(task="summeval", method="dna")) is None


def test_an_options_model_made_directly_gets_the_same_checks_as_one_built_by_name():
    # the Python API may hand TrainConfig a model it made itself: it is checked as build checks
    for name, bad, message in (("dna", {"k": 0}, "--k must be a whole number from 1 to 10"),
                               ("dna", {"dna_mode": "vote"}, "--dna-mode must be one of"),
                               ("hdeval", {"layers": "2"}, "--layers must be a whole number"),
                               ("paireval", {"comparisons": 0}, "--comparisons must be a whole number")):
        model = get_method(name).options
        with pytest.raises(ConfigError, match=message):
            model(**bad)
        with pytest.raises(ConfigError, match=message):
            model().replace(**bad)
        with pytest.raises(ConfigError, match=f"{model.__name__} takes no option"):  # unknown names
            model(colour="blue")


def test_train_with_a_base_url_and_no_llm_says_it_needs_one(tmp_path, monkeypatch):
    """train --base-url URL without --llm ignored the URL: it trained the embedded model (or, with
    a key set, asked that server for gpt-4o-mini, a model it may not run)."""
    from pathlib import Path

    task = ["--task", Path(__file__).resolve().parent.parent / "examples" / "qa_task.toml", "--layers", "1",
            "--cache-dir", tmp_path / "c", "--base-url", "http://127.0.0.1:9/v1"]
    for extra in ([], ["--dry-run"]):
        one_error(run_cli("train", *task, *extra, "-o", tmp_path / "art"), "--base-url needs --llm MODEL")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    res = run_cli("train", *task, "--dry-run")
    assert res.exit_code == 2 and "gpt-4o-mini" not in res.output
    one_error(res, "--base-url needs --llm MODEL")
    from hdeval import train

    with pytest.raises(ConfigError, match="--base-url needs --llm MODEL"):
        train(task=str(task[1]), layers=1, base_url="http://127.0.0.1:9/v1", cache_dir=str(tmp_path / "c"))
    monkeypatch.setenv("HDEVAL_LLM", "my-model")  # the model, named another way
    assert run_cli("train", *task, "--dry-run").exit_code == 0


@pytest.mark.parametrize("aspects, said", [
    (",,", "--aspects is empty"), ("", "--aspects is empty"), (" , ", "--aspects is empty"),
    ("clarity,clarity", "--aspects names 'clarity' twice"), ("clarity, accuracy,clarity", "names 'clarity' twice"),
])
def test_an_empty_or_repeated_aspects_list_is_one_line(tmp_path, aspects, said):
    """--aspects ",," (or "") trained on every aspect, as if not given; clarity,clarity was recorded
    as ['clarity', 'clarity']."""
    from pathlib import Path

    task = Path(__file__).resolve().parent.parent / "examples" / "qa_task.toml"
    res = run_cli("train", "--task", task, "--layers", "1", "--llm", "fake", "--aspects", aspects,
                  "--cache-dir", tmp_path / "c", "--dry-run")
    assert res.exit_code == 2
    one_error(res, said)
    from hdeval import train

    with pytest.raises(ConfigError, match=said):
        train(task=str(task), llm="fake", layers=1, aspects=aspects, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match=said):
        train(task=str(task), llm="fake", layers=1, cache_dir=str(tmp_path / "c"),
              aspects=[a.strip() for a in aspects.split(",") if a.strip()])


def test_a_subset_of_aspects_is_still_taken_and_recorded_once(tmp_path):
    from pathlib import Path

    task = Path(__file__).resolve().parent.parent / "examples" / "qa_task.toml"
    config = TrainConfig.from_options(task=str(task), llm="fake", aspects=" accuracy ,")
    config.check()
    assert config.aspects == ("accuracy",) and config.public()["aspects"] == ["accuracy"]
