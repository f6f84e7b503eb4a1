"""HD-Eval (Liu et al., 2024): hierarchical criteria decomposition + a learned white-box aggregator."""

from __future__ import annotations

from hdeval.methods.base import Method, register


def _fit(ctx):
    from hdeval.train import run_hdeval

    return run_hdeval(ctx)


def _load(reader):
    from hdeval.evaluator import Evaluator

    return Evaluator.from_artifact(reader)


METHOD = register(Method(
    name="hdeval",
    summary="criteria tree decomposed by the LLM, scored per criterion, learned aggregator (HD-Eval)",
    shapes=("pointwise",),
    fit=_fit,
    load=_load,
    editable=("tree.json",),
))
