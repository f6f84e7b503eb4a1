"""Plug-ins: a method registered through the entry-point group ``hdeval.methods`` and an LLM
provider through ``hdeval.providers`` are used like the built-in ones."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import hdeval.llm.backends.factory as factory
import hdeval.methods.registry as registry
from hdeval.core.errors import ArtifactError, ConfigError
from hdeval.methods.base import METHODS

PLUGIN = textwrap.dedent('''
    from hdeval.llm.backends.factory import BackendEntry
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
                    options={"toy_level": Option(2, "how toy it is"),
                             "scorer": Option("huber", "its own loss", choices=("huber", "l2"))})
    CLASH = Method(name="direct", summary="clash", shapes=("pointwise",), fit=_fit, load=lambda art: None)
    NOT_A_METHOD = 42

    def OLD_OPTIONS():  # options declared as before they were pydantic models
        from dataclasses import dataclass
        from hdeval.methods.options import MethodOptions, option

        @dataclass(frozen=True)
        class OldOptions(MethodOptions):
            level: int = option(2, "how old")

        return Method(name="old", summary="old", shapes=("pointwise",), fit=_fit, load=lambda art: None,
                      options=OldOptions)

    def PLAIN_OPTIONS():  # a plain pydantic model, not a MethodOptions
        from pydantic import BaseModel

        class PlainOptions(BaseModel):
            level: int = 2

        return Method(name="plain", summary="plain", shapes=("pointwise",), fit=_fit, load=lambda art: None,
                      options=PlainOptions)

    from hdeval.methods.options import option

    def _options(**fields):  # a method whose options model declares ``fields`` (name -> (type, field))
        from pydantic import create_model
        from hdeval.methods.options import MethodOptions

        return Method(name="opts", summary="opts", shapes=("pointwise",), fit=_fit, load=lambda art: None,
                      options=create_model("OptsOptions", __base__=MethodOptions, **fields))

    SEED_OPTION = lambda: _options(seed=(int, option(7, "named like the run's --seed")))
    BAD_DEFAULT = lambda: _options(shrink=(float, option("x", "a default of the wrong type")))
    BAD_CHOICE = lambda: _options(mode=(str, option("z", "a default outside its choices", ("a", "b"))))
    NO_DEFAULT = lambda: _options(shrink=(float, ...))
    KINDS = lambda: _options(flag=(bool, option(False, "a bool")), maybe=(float | None, option(None, "unset")),
                             count=(int, option(2, "an int")), names=(list[str], option([], "a list")),
                             ratio=(float, option(1, "a whole number is a number")))

    def CHECKED():
        from hdeval.methods.options import MethodOptions

        class CheckedOptions(MethodOptions):
            shrink: float = option(0.0, "checked with a ValueError")

            def check(self):
                if self.shrink > 1:
                    raise ValueError(f"shrink must be at most 1, got {self.shrink}")

        return Method(name="checked", summary="s", shapes=("pointwise",), fit=_fit, load=lambda art: None,
                      options=CheckedOptions)

    RAW_MAPPING = lambda: Method(name="raw", summary="s", shapes=("pointwise",), fit=_fit, load=lambda art: None,
                                 options={"shrink": 0.1})
    SHAPES_TEXT = lambda: Method(name="text", summary="s", shapes="pointwise", fit=_fit, load=lambda art: None)
    BAD_NAME = lambda: Method(name="Bad Name/x", summary="s", shapes=("pointwise",), fit=_fit, load=lambda art: None)

    def _commands(kind):  # a method adding commands to the CLI: good ones, or a plug-in author's mistake
        import click

        def make(kit):
            if kind == "raises":
                raise RuntimeError("cannot make commands")
            if kind == "wrong":
                return ["not a command"]

            @click.command("toyhello")
            def hello():
                click.echo("hello from the toy")

            @click.command("train")
            def clash():
                click.echo("clash!")

            return [hello, clash]

        return Method(name=f"cmd{kind}", summary=kind, shapes=("pointwise",), fit=_fit, load=lambda art: None,
                      commands=make)

    COMMANDS = lambda: [_commands("good"), _commands("raises"), _commands("wrong")]

    def LONG():  # a long reason that ends with its fix
        raise RuntimeError("the toy model file was not found in any of the folders the toy plug-in looks in, " * 2
                           + "(fix: run toy-setup)")

    BUILT = []

    def _backend(config, offline):
        from hdeval.llm.backends.fake import FakeBackend
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
    assert "-O toy_level=VALUE (default 2): how toy it is" in listed.output

    from hdeval.run.train import TrainConfig, plan

    config = TrainConfig(task="summeval", method="toy", options={"toy_level": 5}, llm="fake",
                         limit=64, cache_dir=str(tmp_path / "cache"))
    prep, layers, identity = plan(config)
    toy = sys.modules["hdeval_toy_plugin"]
    assert toy.PLANNED == [(5, len(prep.samples))]
    assert [(p.stage, p.score_calls) for p in layers] == [("toy stage", 7 * len(prep.samples))]


def test_a_plug_in_method_option_is_checked_like_a_built_in_one(plugin):
    plugin("hdeval.methods", "toy", "METHOD")
    from hdeval.run.train import TrainConfig

    with pytest.raises(ConfigError, match=r"method 'toy' takes no option\(s\) comparisons \(its options: scorer, toy_level\)"):
        TrainConfig.from_options(task="summeval", method="toy", comparisons=3, llm="fake")
    # a plug-in's options are -O NAME=VALUE on the command line (it has no --toy-level flag)
    with pytest.raises(ConfigError, match=r"^-O toy_level must be a whole number, got 'high'$"):
        TrainConfig(task="summeval", method="toy", options={"toy_level": "high"}, llm="fake")
    with pytest.raises(ConfigError, match=r"^-O scorer must be one of huber, l2, got 'x'$"):
        TrainConfig(task="summeval", method="toy", options={"scorer": "x"}, llm="fake")
    with pytest.raises(ConfigError, match=r"; -O toy_level is an option of --method toy$"):
        TrainConfig.from_options(task="summeval", method="direct", toy_level=3, llm="fake")
    with pytest.raises(ConfigError, match=r"^--layers must be a whole number, got 'x'$"):  # a built-in's: its flag
        TrainConfig(task="summeval", method="hdeval", options={"layers": "x"}, llm="fake")


def test_a_plug_in_check_raising_value_error_is_its_own_words(plugin):
    # pydantic's "Value error, " came first, before the plug-in's words
    plugin("hdeval.methods", "checked", "CHECKED")
    from hdeval.run.train import TrainConfig

    with pytest.raises(ConfigError) as err:
        TrainConfig(task="summeval", method="checked", options={"shrink": 2.0}, llm="fake")
    assert str(err.value) == "shrink must be at most 1, got 2.0"


@pytest.mark.parametrize("target, message", [
    ("CLASH", "method plug-in 'bad' (hdeval_toy_plugin:CLASH) skipped: it reuses the method name 'direct'"),
    ("NOT_A_METHOD", "method plug-in 'bad' (hdeval_toy_plugin:NOT_A_METHOD) skipped: it gave int, not a hdeval.methods"),
    ("MISSING", "method plug-in 'bad' (hdeval_toy_plugin:MISSING) skipped: it could not be loaded (AttributeError"),
    ("OLD_OPTIONS", "method plug-in 'bad' (hdeval_toy_plugin:OLD_OPTIONS) skipped: it could not be loaded "
                    "(TypeError: method 'old': its options model OldOptions is a dataclass; declare it as a plain "
                    "subclass of MethodOptions"),
    ("PLAIN_OPTIONS", "method plug-in 'bad' (hdeval_toy_plugin:PLAIN_OPTIONS) skipped: it could not be loaded "
                      "(TypeError: method 'plain': its options model must be a subclass of "
                      "hdeval.methods.options.MethodOptions, not PlainOptions)"),
    ("SEED_OPTION", "method plug-in 'bad' (hdeval_toy_plugin:SEED_OPTION) skipped: method 'opts': option 'seed' "
                    "has the name of a setting every run has: rename it (the two would be mixed up)"),
    ("BAD_DEFAULT", "method plug-in 'bad' (hdeval_toy_plugin:BAD_DEFAULT) skipped: method 'opts': option 'shrink': "
                    "its default 'x' is not of its type, float"),
    ("BAD_CHOICE", "method plug-in 'bad' (hdeval_toy_plugin:BAD_CHOICE) skipped: method 'opts': option 'mode': "
                   "its default 'z' is not one of its choices (a, b)"),
    ("NO_DEFAULT", "method plug-in 'bad' (hdeval_toy_plugin:NO_DEFAULT) skipped: method 'opts': option 'shrink' "
                   "has no default: declare it as shrink: TYPE = option(DEFAULT, HELP)"),
    ("RAW_MAPPING", "method plug-in 'bad' (hdeval_toy_plugin:RAW_MAPPING) skipped: it could not be loaded "
                    "(TypeError: method 'raw': option 'shrink' must be an Option(default, help), not float)"),
    ("SHAPES_TEXT", "method plug-in 'bad' (hdeval_toy_plugin:SHAPES_TEXT) skipped: it could not be loaded "
                    "(TypeError: method 'text': shapes must be a tuple, e.g. ('pointwise',), got 'pointwise')"),
    ("BAD_NAME", "method plug-in 'bad' (hdeval_toy_plugin:BAD_NAME) skipped: it could not be loaded (TypeError: "
                 "method name 'Bad Name/x': give a letter, then letters, digits, '-' or '_' (at most 64))"),
])
def test_a_bad_method_plug_in_is_skipped_with_one_line_naming_it(plugin, target, message):
    plugin("hdeval.methods", "bad", target)
    with pytest.warns(registry.PluginWarning) as caught:
        assert registry.get_method("dna").name == "dna"
    assert [str(w.message)[:len(message)] for w in caught] == [message]
    assert "\n" not in str(caught[0].message)
    assert registry.get_method("direct").summary != "clash"  # the built-in keeps its name


def test_options_of_every_kind_declared_well_are_taken_and_the_built_in_ones_pass(plugin):
    plugin("hdeval.methods", "good", "KINDS")
    assert registry.get_method("opts").build_options({"ratio": 0.5}).ratio == 0.5
    from hdeval.methods.options import declaration_problem

    assert [declaration_problem(m.options) for m in registry.builtin_methods()] == [None] * 5


def test_the_names_refused_to_plug_in_options_are_the_run_settings():
    # a plug-in option named like one of these is mixed up with the run's (TrainConfig.replace)
    from hdeval.llm.config import LLMSettings
    from hdeval.methods.options import RUN_FIELDS
    from hdeval.run.train import TrainConfig

    assert {*RUN_FIELDS, *LLMSettings.model_fields} == {*TrainConfig.model_fields, "method_options"}


def test_a_plug_in_with_a_plain_pydantic_options_model_leaves_methods_listed(plugin):
    # registered, it stopped `hdeval methods` and every train with "AttributeError: specs"
    plugin("hdeval.methods", "bad", "PLAIN_OPTIONS")
    plugin("hdeval.methods", "toy", "METHOD")
    from hdeval.cli import cli

    listed = CliRunner().invoke(cli, ["methods"])
    assert listed.exit_code == 0, listed.output
    assert "toy (pointwise data)" in listed.output and "dna (pairwise data)" in listed.output
    warned = [line for line in listed.output.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "'bad'" in warned[0] and "not PlainOptions" in warned[0]
    assert "plain" not in registry.method_names()


def test_a_long_skip_reason_keeps_its_fix_and_the_warning_points_at_the_caller(plugin):
    # the reason was cut mid-word at 200 characters (and the CLI's line at 160), losing the fix;
    # the warning pointed into hdeval's registry, not at the line that asked for the methods
    plugin("hdeval.methods", "bad", "LONG")
    with pytest.warns(registry.PluginWarning) as caught:
        registry.method_names()
    assert str(caught[0].message).endswith("(fix: run toy-setup))")
    assert caught[0].filename == __file__
    registry._loaded = False
    from hdeval.cli import cli

    listed = CliRunner().invoke(cli, ["methods"])
    assert listed.exit_code == 0
    assert [x for x in listed.output.splitlines() if x.startswith("warning:")][0].endswith(
        "(fix: run toy-setup)) (PluginWarning)")


def test_a_plug_in_s_bad_commands_are_one_warning_line_each_and_help_works(plugin):
    # a non-command item stopped `hdeval --help` with an AttributeError; a command named like a
    # built-in one was dropped unsaid; a `commands` that raised was warned of twice by --help
    plugin("hdeval.methods", "cmds", "COMMANDS")
    from hdeval.cli import cli

    helped = CliRunner().invoke(cli, ["--help"])
    assert helped.exit_code == 0, helped.output
    assert "toyhello" in helped.stdout and "train" in helped.stdout
    assert helped.stderr.splitlines() == [
        "warning: method plug-in 'cmdgood': its command 'train' is left out: hdeval has a command of that name",
        "warning: method plug-in 'cmdraises': its commands could not be made (RuntimeError: cannot make commands)",
        "warning: method plug-in 'cmdwrong': its commands could not be made (it gave str, not a named click "
        "command)",
    ]
    ran = CliRunner().invoke(cli, ["toyhello"])
    assert ran.exit_code == 0 and "hello from the toy" in ran.stdout
    ran = CliRunner().invoke(cli, ["train", "--help"])  # the built-in train, not the plug-in's
    assert ran.exit_code == 0 and "--method-option" in ran.stdout and "clash!" not in ran.output


def test_an_artifact_of_a_plug_in_not_installed_says_so(plugin, tmp_path):
    # "(written by a newer hdeval?)" was the only guess offered
    plugin("hdeval.methods", "bad", "MISSING")
    for method in ("toycalib", "bad"):
        (tmp_path / method).mkdir()
        (tmp_path / method / "manifest.json").write_text(json.dumps({"format": "hdeval-artifact", "method": method}))
    with pytest.warns(registry.PluginWarning), pytest.raises(ArtifactError) as err:
        registry.load_artifact(tmp_path / "toycalib")
    assert str(err.value) == (
        f"{tmp_path / 'toycalib'}: unknown method 'toycalib': choose from direct, direct-yesno, dna, hdeval, paireval "
        "(written by a newer hdeval, or by a method plug-in not installed here: entry-point group hdeval.methods)")
    with pytest.raises(ArtifactError) as err:  # installed but skipped: the reason, not a guess
        registry.load_artifact(tmp_path / "bad")
    assert str(err.value).startswith(f"{tmp_path / 'bad'}: method plug-in 'bad' (hdeval_toy_plugin:MISSING) skipped: ")
    assert "newer hdeval" not in str(err.value)


def test_a_provider_from_an_entry_point_serves_its_model_names(plugin):
    plugin("hdeval.providers", "toyllm", "PROVIDER")
    assert factory.backend_entry("toyllm:small").name == "toyllm"
    assert factory.backend_entry("gpt-4o-mini").name == "openai"  # the catch-all stays last
    from hdeval.llm.config import LLMConfig

    backend = factory.make_backend(LLMConfig(model="toyllm:small"), offline=True)
    assert sys.modules["hdeval_toy_plugin"].BUILT == [("toyllm:small", True)]
    assert backend.identity == factory.make_backend(LLMConfig(model="fake")).identity


def test_a_provider_plug_in_that_is_not_an_entry_is_one_line(plugin):
    plugin("hdeval.providers", "bad", "NOT_A_METHOD")
    with pytest.raises(ConfigError, match=r"LLM provider plug-in 'bad' \(hdeval_toy_plugin:NOT_A_METHOD\) gave int"):
        factory.backend_entry("fake")


def test_a_skipped_plug_in_asked_for_by_name_says_why_each_time(plugin):
    # a notebook asks the registry many times: the warning comes once, but asking for the
    # skipped method by name says why it is missing, not only "unknown method"
    plugin("hdeval.methods", "bad", "MISSING")
    with pytest.warns(registry.PluginWarning):
        registry.method_names()
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"plug-in 'bad' .* skipped: it could not be loaded"):
            registry.get_method("bad")


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


def test_a_plug_in_option_has_its_own_namespace_and_type(plugin, tmp_path, data_dir):
    # HD-Eval's --scorer takes digit or pairwise; the toy's own --scorer takes huber or l2
    plugin("hdeval.methods", "toy", "METHOD")
    from hdeval.cli import cli

    base = ["train", "--task", "summeval", "--llm", "fake", "--limit", "20", "--dry-run",
            "--cache-dir", str(tmp_path / "cache")]
    toy = sys.modules.get("hdeval_toy_plugin")
    for given in (["-O", "scorer=huber", "-O", "toy-level=4"], ["--scorer", "l2", "--method-option", "toy_level=4"]):
        r = CliRunner().invoke(cli, [*base, "--method", "toy", *given])
        assert r.exit_code == 0, r.output
        toy = sys.modules["hdeval_toy_plugin"]
        assert toy.PLANNED[-1][0] == 4
    r = CliRunner().invoke(cli, [*base, "--method", "hdeval", "--scorer", "huber"])
    assert r.exit_code != 0 and "error: --scorer: 'huber' is not one of 'digit', 'pairwise'" in r.output
    r = CliRunner().invoke(cli, [*base, "--method", "toy", "-O", "layers=2"])
    assert r.exit_code != 0 and "error: -O layers: method 'toy' takes no option 'layers' (its options: " in r.output
    r = CliRunner().invoke(cli, [*base, "--method", "toy", "-O", "toy_level=high"])
    assert r.exit_code != 0 and "error: -O toy_level: 'high' is not a valid integer" in r.output
    r = CliRunner().invoke(cli, [*base, "--method", "toy", "-O", "toy_level"])
    assert r.exit_code != 0 and "error: -O 'toy_level': expected NAME=VALUE" in r.output


def install_dist(site: Path, name: str, entry_points: str) -> None:
    """A distribution ``name`` declaring ``entry_points`` (entry_points.txt text), found by
    importlib.metadata on a sys.path entry ``site``, as pip would install it."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def run_cli(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run([sys.executable, "-m", "hdeval.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_a_plug_in_that_raises_at_import_leaves_help_and_built_ins_working(tmp_path, data_dir):
    site = tmp_path / "site"
    site.mkdir()
    (site / "broken_plugin.py").write_text("def oops(:\n")  # a SyntaxError at import
    install_dist(site, "broken_plugin", "[hdeval.methods]\nbroken = broken_plugin:METHOD\n")
    warning = ("warning: method plug-in 'broken' (broken_plugin:METHOD) skipped: it could not be loaded "
               "(SyntaxError: invalid syntax (broken_plugin.py, line 1))")
    helped = run_cli(["--help"], site, tmp_path)  # lists the commands plug-ins add: one line for the broken one
    assert helped.returncode == 0 and "train" in helped.stdout and helped.stderr.splitlines() == [warning]
    helped = run_cli(["train", "--help"], site, tmp_path)
    assert helped.returncode == 0 and "--method-option" in helped.stdout and helped.stderr == ""
    trained = run_cli(["train", "--task", "summeval", "--method", "direct", "--llm", "fake", "--limit", "20",
                       "-q", "-o", "out", "--cache-dir", "cache"], site, tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()
    warned = [line for line in trained.stderr.splitlines() if "broken" in line]
    assert warned == [f"{warning} (PluginWarning)"]
    asked = run_cli(["train", "--task", "summeval", "--method", "broken", "--llm", "fake"], site, tmp_path)
    assert asked.returncode != 0 and asked.stderr.splitlines()[-1].startswith(
        "error: method plug-in 'broken' (broken_plugin:METHOD) skipped: it could not be loaded")
