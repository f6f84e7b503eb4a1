"""Decompose and Aggregate (Li et al., 2024) on pairwise preference data. Registration only: the
modules (whose public names this package also serves) load when used, so ``hdeval --help`` stays light."""

from __future__ import annotations

import importlib
from typing import Any

from hdeval.methods.base import Method
from hdeval.methods.dna.settings import DnaOptions


def _impl(module: str) -> Any:
    return importlib.import_module(f"hdeval.methods.dna.{module}")


def __getattr__(name: str) -> Any:
    for module in ("fit", "fitted", "scoring", "decision", "replies", "prompts", "settings"):
        if hasattr(found := _impl(module), name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METHOD = Method(
    name="dna",
    summary="Decompose and Aggregate on pairs: LLM aspects, weights and per-aspect scores, "
            "external weighted sum (+ learned aggregation)",
    shapes=("pairwise",),
    fit=lambda ctx: _impl("fit").fit(ctx),
    load=lambda art: _impl("fitted").DnaEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl("scoring").plan_dna(config, prep, backend),
    options=DnaOptions,
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
