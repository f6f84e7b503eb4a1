"""``paireval`` (a response against comparison examples from other conversations, both orders)
and ``direct-yesno`` (DIRECTEVAL, its same-LLM baseline): the method, its deviations from the
paper and what it records are in docs/methods.md. This module gathers the public names of the
package's modules (one job each) for the package."""

from __future__ import annotations

from hdeval.methods.comparisons import (  # the comparison names users import from the package
    LABELS, Example, PairScores, PairwiseScorer, draw_comparisons, history_fields, pair_scores,
)
from hdeval.methods.paireval import fake  # noqa: F401  (registers the fake LLM's yesno answers)
from hdeval.methods.paireval.all_vs_all import same_doc_cells, same_doc_scores
from hdeval.methods.paireval.export import export_training
from hdeval.methods.paireval.fit import fit_paireval, fit_with_pool
from hdeval.methods.paireval.fitted import (
    METRICS, MODEL, PAIR_PROMPT, SCORES, PairEvalEvaluator, _Dialogue,
)
from hdeval.methods.paireval.plan import plan_requests, planned_requests
from hdeval.methods.paireval.sources import (
    ALL_VS_ALL, REFERENCE_FIELD, check_documents, choose_comparisons, comparison_source, comparison_text,
    overlap_text, overlap_with_test, reference_examples,
)
from hdeval.methods.paireval.yesno import YES_NO, YesNoEvaluator, _p_yes, fit_yesno, yesno_question, yesno_request

__all__ = [
    "ALL_VS_ALL", "METRICS", "MODEL", "PAIR_PROMPT", "REFERENCE_FIELD", "SCORES", "YES_NO",
    "PairEvalEvaluator", "YesNoEvaluator", "_Dialogue", "_p_yes", "check_documents", "choose_comparisons",
    "comparison_source", "comparison_text", "export_training", "fake", "fit_paireval", "fit_with_pool",
    "fit_yesno", "overlap_text", "overlap_with_test", "plan_requests", "planned_requests", "reference_examples",
    "same_doc_cells", "same_doc_scores", "yesno_question", "yesno_request",
    # comparisons.py's
    "Example", "LABELS", "PairScores", "PairwiseScorer", "draw_comparisons", "history_fields", "pair_scores",
]
