"""HD-Eval (Liu et al., 2024): hierarchical criteria decomposition + a learned white-box aggregator."""

from __future__ import annotations

from hdeval.methods.base import Method, Option, register


def _fit(ctx):
    if ctx.prep.task.shape == "pairwise":  # both responses scored per criterion, a classifier
        from hdeval.methods.hdeval.pairwise import run_pairwise

        return run_pairwise(ctx)
    from hdeval.methods.hdeval.loop import run_hdeval

    return run_hdeval(ctx)


def _load(reader):
    task = reader.manifest.get("task")
    if isinstance(task, dict) and task.get("shape") == "pairwise":
        from hdeval.methods.hdeval.pairwise import PairEvaluator

        return PairEvaluator.from_artifact(reader)
    from hdeval.methods.hdeval.evaluator import Evaluator

    return Evaluator.from_artifact(reader)


METHOD = register(Method(
    name="hdeval",
    summary="criteria tree decomposed by the LLM, scored per criterion, learned aggregator (HD-Eval)",
    shapes=("pointwise", "pairwise"),
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
