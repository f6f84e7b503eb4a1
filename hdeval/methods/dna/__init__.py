"""Decompose and Aggregate (Li et al., 2024) on pairwise preference data. Registration only: :mod:`.impl`
(whose public names this package also serves) loads when used, so ``hdeval --help`` stays light."""

from __future__ import annotations

import importlib
from typing import Any

from hdeval.methods.base import Method
from hdeval.methods.dna.options import MODES, SOURCES, DnaOptions  # noqa: F401  (public names)


def _impl():
    return importlib.import_module("hdeval.methods.dna.impl")


def __getattr__(name: str) -> Any:
    return getattr(_impl(), name)


METHOD = Method(
    name="dna",
    summary="Decompose and Aggregate on pairs: LLM aspects, weights and per-aspect scores, "
            "external weighted sum (+ learned aggregation)",
    shapes=("pairwise",),
    fit=lambda ctx: _impl().fit(ctx),
    load=lambda art: _impl().DnaEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl().plan_dna(config, prep, backend),
    options=DnaOptions,
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
