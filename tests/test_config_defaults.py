"""The LLM settings' defaults (timeout, retries, concurrency) are declared once, in
hdeval.llm.config: every other signature takes None for "the configured default"."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hdeval.core.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent.parent / "hdeval"


def _literal_defaults(names: set[str]) -> list[str]:
    """``name: type = <number>`` parameters and fields anywhere in the package but config.py."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pos = a.posonlyargs + a.args
                pairs += list(zip(pos[len(pos) - len(a.defaults):], a.defaults))
                pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                pairs = [(arg.arg, d) for arg, d in pairs]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs = [(node.target.id, node.value)]
            for name, default in pairs:
                if name in names and isinstance(default, ast.Constant) and isinstance(default.value, (int, float)) \
                        and not isinstance(default.value, bool):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{default.lineno} {name}={default.value}")
    return found


def test_the_llm_defaults_are_written_once_in_config():
    assert _literal_defaults({"concurrency", "timeout", "max_retries"}) == []


def test_concurrency_none_means_the_configured_default(monkeypatch):
    import hdeval.llm.config as config
    from hdeval.run.artifact_llm import check_llm_options

    assert config.LLMConfig.from_options(concurrency=None).concurrency == config.DEFAULT_CONCURRENCY
    check_llm_options(concurrency=None, timeout=None, max_retries=None, max_calls=None)
    with pytest.raises(ConfigError, match="--concurrency must be at least 1, got 0"):
        check_llm_options(concurrency=0, timeout=None, max_retries=None, max_calls=None)


def test_a_training_run_holds_the_llm_settings_declared_once():
    # TrainConfig is made of LLMSettings' fields (not copies of them), and the run's LLMConfig is
    # one merge of the run's model and server with those settings as they are
    from hdeval.llm.config import LLMSettings
    from hdeval.methods.run import llm_config
    from hdeval.run.train import TrainConfig

    assert issubclass(TrainConfig, LLMSettings)
    given = dict(timeout=5.0, max_retries=1, concurrency=3, cache_dir="c", max_calls=7, batch=True)
    llm = llm_config(TrainConfig(task="summeval", llm="fake", base_url="http://127.0.0.1:9/v1", **given))
    assert (llm.model, llm.base_url) == ("fake", "http://127.0.0.1:9/v1")
    assert {k: getattr(llm, k) for k in given} == given


def test_run_settings_refuse_unknown_fields_and_take_none_as_not_set():
    from hdeval.llm.config import LLMConfig
    from hdeval.run.train import TrainConfig

    plain = TrainConfig(task="summeval")
    assert TrainConfig.from_options(task="summeval", seed=None, timeout=None, test_frac=None) == plain
    assert TrainConfig(task="summeval", seed=None, concurrency=None) == plain
    assert LLMConfig("fake", timeout=None, max_retries=None) == LLMConfig("fake")
    for make, message in (
        (lambda: TrainConfig(task="summeval", timeuot=5), "unknown option(s): --timeuot"),
        (lambda: TrainConfig(task="summeval", seed="first"), "--seed must be a whole number, got 'first'"),
        (lambda: LLMConfig("fake", concurrency="many"), "--concurrency must be a whole number, got 'many'"),
        (lambda: LLMConfig("fake", retries=2), "unknown option(s): --retries"),
        (lambda: plain.replace(batch=[1]), "--batch must be true or false, got [1]"),
    ):
        with pytest.raises(ConfigError) as err:
            make()
        assert str(err.value) == message


def test_the_manifest_records_every_run_setting():
    from hdeval.run.train import TrainConfig

    config = TrainConfig(task="summeval", judges=("b",), jury="j.toml", prune_judges=True)
    assert set(config.public()) == set(TrainConfig.model_fields)


def test_train_help_shows_the_models_defaults():
    from conftest import run_cli
    from hdeval.llm.config import LLMSettings
    from hdeval.run.train import TrainConfig

    r = run_cli("train", "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for model, names in ((TrainConfig, ("seed", "test_frac", "train_frac", "max_failure_rate")),
                         (LLMSettings, ("timeout", "max_retries", "concurrency"))):
        for name in names:
            spec = model.model_fields[name]
            flag = "--" + name.replace("_", "-")
            assert f"{flag} {' '.join(spec.description.split())} [default: {spec.default}]" in text.replace(
                f"{flag} INTEGER", flag).replace(f"{flag} FLOAT", flag), name
