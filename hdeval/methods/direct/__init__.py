"""``direct``: each aspect scored directly by the LLM, nothing learned (the G-Eval-style baseline).

Registration only; the implementation (:mod:`.evaluator`) is imported when the method is used,
so listing methods (``hdeval --help``) loads no numerical library.
"""

from __future__ import annotations

from hdeval.methods.base import Method


def _fit(ctx):
    from hdeval.methods.direct.evaluator import fit

    return fit(ctx)


def _plan(config, prep, backend):
    from hdeval.methods.direct.evaluator import plan

    return plan(config, prep, backend)


def _load(reader):
    from hdeval.methods.direct.evaluator import DirectEvaluator

    return DirectEvaluator.from_artifact(reader)


METHOD = Method(
    name="direct",
    summary="each aspect scored directly by the LLM, nothing learned (G-Eval-style baseline)",
    shapes=("pointwise",),
    fit=_fit,
    load=_load,
    plan=_plan,
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
