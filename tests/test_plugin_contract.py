"""A method plug-in's mistakes past registration (docs/plugins.md's toy, varied): what its fit,
write and load give is checked where it is given, in one line naming the method and the field;
nothing is written, and never an artifact hdeval's own loader then refuses."""

from __future__ import annotations

import importlib.metadata as md
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from simjudge import pointwise_rows, write_pointwise
from test_plugin_docs import _install

import hdeval.methods.registry as registry
from hdeval.core.errors import MethodError
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

    FIT_DICT = lambda: variant("fitdict", fit=fit_dict)
    FIT_NONE = lambda: variant("fitnone", fit=lambda ctx: None)
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
