"""``direct``: each aspect scored directly by the LLM, nothing learned (the G-Eval-style baseline).
Registration only: :mod:`.evaluator` loads when the method is used, so ``hdeval --help`` stays light."""

from __future__ import annotations

import importlib

from hdeval.methods.base import Method


def _impl():
    return importlib.import_module("hdeval.methods.direct.evaluator")


METHOD = Method(
    name="direct",
    summary="each aspect scored directly by the LLM, nothing learned (G-Eval-style baseline)",
    shapes=("pointwise",),
    fit=lambda ctx: _impl().fit(ctx),
    load=lambda art: _impl().DirectEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl().plan(config, prep, backend),
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
