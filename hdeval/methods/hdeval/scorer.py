"""HD-Eval's choice of criterion scorer: the 1-5 digit, or ``--scorer pairwise`` (PairEval's win
probability against comparison examples, from the shared :mod:`hdeval.methods.comparisons`)."""

from __future__ import annotations

from hdeval.judge.prompts import load_template
from hdeval.methods.base import FitContext
from hdeval.methods.comparisons import PairwiseScorer, check_comparisons, draw_comparisons, history_fields


def hdeval_scorer(ctx: FitContext) -> PairwiseScorer | None:
    """The criterion scorer ``--method hdeval --scorer ...`` asks for (None: the digit scorer),
    its comparison examples drawn from the training split; checked before any call."""
    if ctx.options.scorer != "pairwise":
        return None
    task, split = ctx.prep.task, ctx.prep.split
    history_fields(task)
    n = check_comparisons(ctx.options.comparisons)
    by_id = {s.id: s for s in ctx.prep.samples}
    pool = draw_comparisons(
        [by_id[i] for i in split.train_ids], n, ctx.config.seed, task, "the training split", own_docs=True
    )
    return PairwiseScorer(load_template("pair"), pool, n, bool(ctx.options.swap))
