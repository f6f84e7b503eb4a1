"""hdeval: train aligned LLM evaluators with hierarchical criteria decomposition (HD-Eval)."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["HdevalError", "Metrics", "TrainConfig", "TrainedEvaluator", "__version__", "load", "train"]

# The public names load on first use, so `hdeval --help` does not pay for scikit-learn,
# pandas and numpy (module __getattr__, PEP 562). Evaluator (the pointwise HD-Eval class) stays
# importable for code written before hdeval.load.
_LAZY = {
    "load": "hdeval.run.api",
    "TrainedEvaluator": "hdeval.run.api",
    "Metrics": "hdeval.run.api",
    "TrainConfig": "hdeval.run.train",
    "train": "hdeval.run.train",
    "HdevalError": "hdeval.core.errors",
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
