"""Plug-ins: a method registered through the entry-point group ``hdeval.methods`` and an LLM
provider through ``hdeval.providers`` are used like the built-in ones."""

from __future__ import annotations

import importlib.metadata as md
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import hdeval.backends.factory as factory
import hdeval.methods.registry as registry
from hdeval.errors import ConfigError
from hdeval.methods.base import METHODS

PLUGIN = textwrap.dedent('''
    from hdeval.backends.factory import BackendEntry
    from hdeval.methods.base import Method
    from hdeval.methods.options import Option
    from hdeval.methods.run import LayerPlan

    PLANNED = []

    def _plan(config, prep, backend):
        PLANNED.append((config.options.toy_level, len(prep.samples)))
        return [LayerPlan(1, 0, 7 * len(prep.samples), 0, False, 11, 13, stage="toy stage")]

    def _fit(ctx):
        raise RuntimeError("not needed")

    METHOD = Method(name="toy", summary="a plug-in method for the tests", shapes=("pointwise",),
                    fit=_fit, load=lambda art: None, plan=_plan,
                    options={"toy_level": Option(2, "how toy it is")})
    CLASH = Method(name="direct", summary="clash", shapes=("pointwise",), fit=_fit, load=lambda art: None)
    NOT_A_METHOD = 42

    BUILT = []

    def _backend(config, offline):
        from hdeval.backends.fake import FakeBackend
        BUILT.append((config.model, offline))
        return FakeBackend.from_spec("fake")

    PROVIDER = BackendEntry("toyllm", lambda m: m.startswith("toyllm:"), _backend)
''')


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Installs a plug-in module and lets each test choose the entry points it declares."""
    (tmp_path / "hdeval_toy_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(factory, "_plugins_loaded", False)
    monkeypatch.setattr(factory, "BACKENDS", list(factory.BACKENDS))
    saved = dict(METHODS)
    declared: dict[str, list[md.EntryPoint]] = {}

    def entry_points(group: str):
        return declared.get(group, [])

    monkeypatch.setattr(md, "entry_points", entry_points)

    def declare(group: str, name: str, target: str) -> None:
        declared.setdefault(group, []).append(md.EntryPoint(name, f"hdeval_toy_plugin:{target}", group))

    yield declare
    METHODS.clear()
    METHODS.update(saved)
    sys.modules.pop("hdeval_toy_plugin", None)


def test_a_method_from_an_entry_point_is_listed_and_its_plan_is_the_dry_run(plugin, tmp_path, data_dir):
    plugin("hdeval.methods", "toy", "METHOD")
    assert "toy" in registry.method_names() and "dna" in registry.method_names()
    from hdeval.cli import cli

    listed = CliRunner().invoke(cli, ["methods"])
    assert listed.exit_code == 0
    assert "toy (pointwise data): a plug-in method for the tests" in listed.output
    assert "--toy-level (default 2): how toy it is" in listed.output

    from hdeval.train import TrainConfig, plan

    config = TrainConfig(task="summeval", method="toy", options={"toy_level": 5}, llm="fake",
                         limit=64, cache_dir=str(tmp_path / "cache"))
    prep, layers, identity = plan(config)
    toy = sys.modules["hdeval_toy_plugin"]
    assert toy.PLANNED == [(5, len(prep.samples))]
    assert [(p.stage, p.score_calls) for p in layers] == [("toy stage", 7 * len(prep.samples))]


def test_a_plug_in_method_option_is_checked_like_a_built_in_one(plugin):
    plugin("hdeval.methods", "toy", "METHOD")
    from hdeval.train import TrainConfig

    with pytest.raises(ConfigError, match=r"method 'toy' takes no option\(s\) comparisons \(its options: toy_level\)"):
        TrainConfig.from_options(task="summeval", method="toy", comparisons=3, llm="fake")
    with pytest.raises(ConfigError, match=r"--toy-level must be a whole number, got 'high'"):
        TrainConfig(task="summeval", method="toy", options={"toy_level": "high"}, llm="fake")


@pytest.mark.parametrize("target, message", [
    ("CLASH", "method plug-in 'bad' (hdeval_toy_plugin:CLASH) reuses the method name 'direct'"),
    ("NOT_A_METHOD", "method plug-in 'bad' (hdeval_toy_plugin:NOT_A_METHOD) gave int, not a hdeval.methods"),
    ("MISSING", "method plug-in 'bad' (hdeval_toy_plugin:MISSING) could not be loaded: AttributeError"),
])
def test_a_bad_method_plug_in_is_one_line_naming_it(plugin, target, message):
    plugin("hdeval.methods", "bad", target)
    with pytest.raises(ConfigError) as err:
        registry.get_method("dna")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_provider_from_an_entry_point_serves_its_model_names(plugin):
    plugin("hdeval.providers", "toyllm", "PROVIDER")
    assert factory.backend_entry("toyllm:small").name == "toyllm"
    assert factory.backend_entry("gpt-4o-mini").name == "openai"  # the catch-all stays last
    from hdeval.config import LLMConfig

    backend = factory.make_backend(LLMConfig(model="toyllm:small"), offline=True)
    assert sys.modules["hdeval_toy_plugin"].BUILT == [("toyllm:small", True)]
    assert backend.identity == factory.make_backend(LLMConfig(model="fake")).identity


def test_a_provider_plug_in_that_is_not_an_entry_is_one_line(plugin):
    plugin("hdeval.providers", "bad", "NOT_A_METHOD")
    with pytest.raises(ConfigError, match=r"LLM provider plug-in 'bad' \(hdeval_toy_plugin:NOT_A_METHOD\) gave int"):
        factory.backend_entry("fake")


def test_a_bad_method_plug_in_fails_every_lookup_not_only_the_first(plugin):
    # a notebook or a Ray worker asks the registry many times: the second lookup must not go on
    # silently without the plug-in
    plugin("hdeval.methods", "bad", "MISSING")
    for _ in range(2):
        with pytest.raises(ConfigError, match="could not be loaded"):
            registry.get_method("dna")


def test_a_plug_in_written_against_the_seam_before_options_moved_still_loads(plugin, tmp_path):
    # plug-ins import the seam, hdeval.methods.base (docs/python-api.md); before the options
    # model moved to methods/options.py, Option, option and MethodOptions were imported from
    # there, and such a plug-in stopped every command with "could not be loaded: ImportError"
    old = PLUGIN.replace("from hdeval.methods.base import Method\nfrom hdeval.methods.options import Option\n",
                         "from hdeval.methods.base import Method, MethodOptions, Option, option\n")
    assert old != PLUGIN
    (tmp_path / "hdeval_toy_plugin.py").write_text(old)
    plugin("hdeval.methods", "toy", "METHOD")
    assert registry.get_method("toy").build_options({"toy_level": 3}).toy_level == 3
    assert registry.get_method("dna").name == "dna"
