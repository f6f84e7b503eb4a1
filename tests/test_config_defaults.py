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
