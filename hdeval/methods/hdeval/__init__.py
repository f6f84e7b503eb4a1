"""HD-Eval (Liu et al., 2024): hierarchical criteria decomposition + a learned white-box aggregator."""

from __future__ import annotations

from hdeval.methods.base import Method
from hdeval.methods.hdeval import fake as _fake  # noqa: F401 - registers HD-Eval's fake responders
from hdeval.methods.hdeval.options import HDEvalOptions


def _fit(ctx):
    if ctx.prep.task.shape == "pairwise":  # both responses scored per criterion, a classifier
        from hdeval.methods.hdeval.pairwise import run_pairwise

        _check_pairwise_aggregator(ctx)
        return run_pairwise(ctx)
    from hdeval.methods.hdeval.loop import run_hdeval

    return run_hdeval(ctx)


def _prepare(config, task):
    """``--tree``: read and check the starting tree before the data and any LLM call (a bad tree
    file costs nothing)."""
    opts = config.options
    if not opts.tree:
        return None
    from hdeval.core.errors import ConfigError
    from hdeval.methods.hdeval.tree_file import read_tree

    given = read_tree(opts.tree, task)
    if given.depth > opts.layers:
        raise ConfigError(
            f"{opts.tree}: the tree has {given.depth} layers but --layers is "
            f"{opts.layers}: pass --layers {given.depth} to score it as given, or more "
            "to expand it"
        )
    return given


def _plan(config, prep, backend):
    if prep.task.shape == "pairwise":
        from hdeval.methods.hdeval.pairwise import plan_pairwise

        return plan_pairwise(config, prep, backend)
    if config.options.scorer == "pairwise":
        from hdeval.core.errors import ConfigError

        raise ConfigError(
            "--dry-run does not count --scorer pairwise yet: it makes samples x criteria x "
            "--comparisons x 2 calls per layer"
        )
    from hdeval.methods.hdeval.loop import plan_hdeval

    return plan_hdeval(config, prep, backend)


def _artifact_suffixes(config):
    from hdeval.learn.aggregate import CANDIDATES

    kind = config.options.aggregator
    return CANDIDATES if kind == "auto" else (kind,)


def _check_pairwise_aggregator(ctx):
    from hdeval.core.errors import ConfigError
    from hdeval.learn.aggregate import KINDS

    kind = ctx.config.options.aggregator
    if kind not in KINDS + ("auto",):  # the means and constrained linear models are pointwise only
        raise ConfigError(
            f"--aggregator {kind}: a pairwise task's classifier is one of {', '.join(KINDS)} or auto"
        )


def _check_fit(ctx):
    if ctx.prep.task.shape == "pairwise":
        from hdeval.methods.hdeval.pairwise import check_pairwise_options

        _check_pairwise_aggregator(ctx)

        return check_pairwise_options(ctx)  # e.g. a PairEval option given, at its default or not
    from hdeval.methods.hdeval.scorer import hdeval_scorer

    hdeval_scorer(ctx)


def _load(reader):
    task = reader.manifest.get("task")
    if isinstance(task, dict) and task.get("shape") == "pairwise":
        from hdeval.methods.hdeval.pairwise import PairwiseTreeEvaluator

        return PairwiseTreeEvaluator.from_artifact(reader)
    state = getattr(reader, "state", None)
    if isinstance(state, dict) and state.get("jury") is not None:  # (judge, criterion) columns
        from hdeval.methods.hdeval.jury import JuryEvaluator

        return JuryEvaluator.from_artifact(reader)
    from hdeval.methods.hdeval.evaluator import Evaluator

    return Evaluator.from_artifact(reader)


METHOD = Method(
    name="hdeval",
    summary="criteria tree decomposed by the LLM, scored per criterion, learned aggregator (HD-Eval)",
    shapes=("pointwise", "pairwise"),
    fit=_fit,
    load=_load,
    editable=("tree.json",),
    plan=_plan,
    prepare=_prepare,
    artifact_suffixes=_artifact_suffixes,
    check_fit=_check_fit,
    options=HDEvalOptions,
    jury=True,
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
