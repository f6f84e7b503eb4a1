"""PairEval (Park et al., 2024) and DIRECTEVAL, its same-LLM baseline. Registration only: the
modules (whose public names this package also serves) load when used, so ``hdeval --help`` stays light."""

from __future__ import annotations

import importlib
from typing import Any

from hdeval.methods.base import Method
from hdeval.methods.paireval.options import PairEvalOptions


def _impl(module: str) -> Any:
    return importlib.import_module(f"hdeval.methods.{module}")


def __getattr__(name: str) -> Any:
    for module in ("paireval.fit", "paireval.yesno", "paireval.export", "paireval.options", "comparisons"):
        if hasattr(found := _impl(module), name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PAIREVAL = Method(
    name="paireval",
    summary="PairEval: win probability against comparison examples from other conversations, both orders",
    shapes=("pointwise",),
    fit=lambda ctx: _impl("paireval.fit").fit_paireval(ctx),
    load=lambda art: _impl("paireval.fitted").PairEvalEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl("paireval.fit").plan_paireval(config, prep, backend),
    check_fit=lambda ctx: _impl("paireval.sources").choose_comparisons(ctx),  # the examples can be drawn
    options=PairEvalOptions,
)


YESNO = Method(
    name="direct-yesno",
    summary="DIRECTEVAL (PairEval's baseline): P(\"Yes\") that the response is good, per aspect",
    shapes=("pointwise",),
    fit=lambda ctx: _impl("paireval.yesno").fit_yesno(ctx),
    load=lambda art: _impl("paireval.yesno").YesNoEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl("paireval.yesno").plan_yesno(config, prep, backend),
)

METHODS = (PAIREVAL, YESNO,)  # what hdeval.methods.registry registers
