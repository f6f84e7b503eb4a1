"""PairEval (Park et al., 2024) and DIRECTEVAL, its same-LLM baseline. Registration only: :mod:`.impl`
(whose public names this package also serves) loads when used, so ``hdeval --help`` stays light."""

from __future__ import annotations

import importlib
from typing import Any

from hdeval.methods.base import Method
from hdeval.methods.paireval.options import SOURCES, PairEvalOptions  # noqa: F401  (impl reads SOURCES here)


def _impl():
    return importlib.import_module("hdeval.methods.paireval.impl")


def __getattr__(name: str) -> Any:
    return getattr(_impl(), name)


PAIREVAL = Method(
    name="paireval",
    summary="PairEval: win probability against comparison examples from other conversations, both orders",
    shapes=("pointwise",),
    fit=lambda ctx: _impl().fit_paireval(ctx),
    load=lambda art: _impl().PairEvalEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl().plan_requests(config, prep, backend),
    check_fit=lambda ctx: _impl().choose_comparisons(ctx),  # the comparison examples can be drawn
    options=PairEvalOptions,
)


YESNO = Method(
    name="direct-yesno",
    summary="DIRECTEVAL (PairEval's baseline): P(\"Yes\") that the response is good, per aspect",
    shapes=("pointwise",),
    fit=lambda ctx: _impl().fit_yesno(ctx),
    load=lambda art: _impl().YesNoEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl().plan_requests(config, prep, backend),
)

METHODS = (PAIREVAL, YESNO,)  # what hdeval.methods.registry registers
