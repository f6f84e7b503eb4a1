"""PairEval (Park et al., 2024) and DIRECTEVAL, its same-LLM baseline. Registration only: the
modules load when used, so ``hdeval --help`` stays light."""

from __future__ import annotations

from hdeval.methods.base import Method, later
from hdeval.methods.paireval.options import PairEvalOptions

PAIREVAL = Method(
    name="paireval",
    summary="PairEval: win probability against comparison examples from other conversations, both orders",
    shapes=("pointwise",),
    fit=later("hdeval.methods.paireval.fit:fit_paireval"),
    load=later("hdeval.methods.paireval.fitted:PairEvalEvaluator.from_artifact"),
    plan=later("hdeval.methods.paireval.fit:plan_paireval"),
    check_fit=later("hdeval.methods.paireval.sources:choose_comparisons"),  # the examples can be drawn
    options=PairEvalOptions,
    commands=later("hdeval.methods.paireval.commands:commands"),  # hdeval paireval export-training
)


YESNO = Method(
    name="direct-yesno",
    summary='DIRECTEVAL (PairEval\'s baseline): P("Yes") that the response is good, per aspect',
    shapes=("pointwise",),
    fit=later("hdeval.methods.paireval.yesno:fit_yesno"),
    load=later("hdeval.methods.paireval.yesno:YesNoEvaluator.from_artifact"),
    plan=later("hdeval.methods.paireval.yesno:plan_yesno"),
    baseline=True,
)

METHODS = (
    PAIREVAL,
    YESNO,
)  # what hdeval.methods.registry registers
