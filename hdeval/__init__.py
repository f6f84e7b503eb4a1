"""hdeval: train aligned LLM evaluators with hierarchical criteria decomposition (HD-Eval)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

__all__ = ["HdevalError", "Metrics", "TrainConfig", "TrainedEvaluator", "__version__", "load", "train"]

# The public names load on first use, so `hdeval --help` does not pay for scikit-learn,
# pandas and numpy (module __getattr__, PEP 562). Evaluator (the pointwise HD-Eval class) stays
# importable for code written before hdeval.load.
_LAZY = {
    "load": "hdeval.api",
    "TrainedEvaluator": "hdeval.api",
    "Metrics": "hdeval.api",
    "TrainConfig": "hdeval.train",
    "train": "hdeval.train",
    "HdevalError": "hdeval.errors",
    "Evaluator": "hdeval.methods.hdeval.evaluator",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'hdeval' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API only (the submodules are reached by import)."""
    return list(__all__)


class _Package(types.ModuleType):
    # `hdeval.train` is both a submodule and the function. Importing the submodule would bind
    # the module to the attribute `train`; keep the attribute the function, as it always was
    # (the submodule stays reachable as sys.modules["hdeval.train"]).
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
