"""``direct``: each aspect scored directly by the LLM, nothing learned (the G-Eval-style baseline).
Registration only: :mod:`.evaluator` loads when the method is used, so ``hdeval --help`` stays light."""

from __future__ import annotations

from hdeval.methods.base import Method, later

METHOD = Method(
    name="direct",
    summary="each aspect scored directly by the LLM, nothing learned (G-Eval-style baseline)",
    shapes=("pointwise",),
    fit=later("hdeval.methods.direct.evaluator:fit"),
    load=later("hdeval.methods.direct.evaluator:DirectEvaluator.from_artifact"),
    plan=later("hdeval.methods.direct.evaluator:plan"),
    baseline=True,
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
