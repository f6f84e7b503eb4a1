"""HD-Eval (Liu et al., 2024): hierarchical criteria decomposition + a learned white-box aggregator."""

from __future__ import annotations

from hdeval.methods.base import Method, Option, register


def _fit(ctx):
    from hdeval.methods.hdeval.loop import run_hdeval

    return run_hdeval(ctx)


def _load(reader):
    from hdeval.methods.hdeval.evaluator import Evaluator

    return Evaluator.from_artifact(reader)


METHOD = register(Method(
    name="hdeval",
    summary="criteria tree decomposed by the LLM, scored per criterion, learned aggregator (HD-Eval)",
    shapes=("pointwise",),
    fit=_fit,
    load=_load,
    editable=("tree.json",),
    options={
        "scorer": Option("digit", "HD-Eval: how criteria are scored: a 1-5 digit, or 'pairwise' (PairEval win "
                                  "probability against comparison examples, both orders)",
                         choices=("digit", "pairwise")),
        "comparisons": Option(3, "PairEval: comparison examples each response is compared with"),
        "swap": Option(True, "PairEval: also ask each pair in the swapped order and average"),
    },
))
