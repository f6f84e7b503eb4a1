"""``paireval``: a response scored by pairwise comparison against comparison examples, and
``direct-yesno``, the PairEval paper's DIRECTEVAL baseline.

PairEval (Park et al., 2024, Sec. 3.2): a target (history h_i, response r_i) is compared with
each of N comparison examples (h_j, r_j) from *other* conversations. One prompt shows both
conversations and asks which response is the better follow-up; the score of a comparison is the
probability of the target's label word ("A" or "B"), normalised over the two, read from the first
generated token. Every pair is asked in both orders (target first = "A", target second = "B") and
the two probabilities are averaged, which removes the LLM's position bias; the column is the mean
over the N comparisons.

Where this deviates from (or adds to) the paper:

- One column per task aspect: the "overall" aspect asks the paper's question ("the better
  follow-up"), every other aspect asks which response is better on that aspect (its definition
  in the prompt). The paper's prediction for an aspect is its own column (``metrics["direct"]``);
  a learned white-box aggregator (the method seam's, fit on the training split) maps all columns
  to the human aspects (``metrics["final"]``), which the paper does not have.
- The comparison examples are one response from each of N + 1 distinct training conversations
  (seeded); a target is compared with the first N of them that come from a conversation other
  than its own, so every training target gets exactly N, and ``apply`` reuses exactly these
  examples (recorded in ``comparisons.json``), so a rerun costs no new calls.
- A comparison counts only when both orders were read; a failed reply drops that comparison.

DIRECTEVAL asks "Is the above response a good response to the given conversation?" (or whether
it is good on an aspect) and reads P("Yes") over "Yes"/"No"; mapped linearly onto each aspect's
range, nothing learned.

The method's parts, one job per module: ``sources`` (where the comparison examples come from,
checked before any call), ``all_vs_all`` (comparing within each document), ``fitted`` (PairEval's
artifact, and what DIRECTEVAL's shares with it), ``fit`` (training), ``yesno`` (DIRECTEVAL),
``plan`` (the dry run of both), ``export`` (fine-tuning pairs) and ``fake`` (the fake LLM's
answers). This module gathers their public names for the package.
"""

from __future__ import annotations

from hdeval.methods.comparisons import (  # PairEval's names, reachable from the package
    COMPARISONS, Example, LABELS, MAX_EXAMPLE_CHARS, MAX_TOKENS, PairScores, PairwiseScorer, RESPONSE_FIELD,
    TOP_LOGPROBS, _EveryK, _p_first_label, _parse_examples, _quiet, check_comparisons, comparisons_for,
    criterion_question, draw_comparisons, hdeval_scorer, history_fields, pair_cells, pair_question,
    pair_request, pair_scores, read_comparison_file, response_label,
)
from hdeval.methods.paireval import fake  # noqa: F401  (registers the fake LLM's yesno answers)
from hdeval.methods.paireval.all_vs_all import same_doc_cells, same_doc_scores
from hdeval.methods.paireval.export import export_training
from hdeval.methods.paireval.fit import fit_paireval, fit_with_pool
from hdeval.methods.paireval.fitted import (
    METRICS, MODEL, PAIR_PROMPT, SCORES, YESNO_PROMPT, PairEvalEvaluator, _Dialogue,
)
from hdeval.methods.paireval.plan import plan_requests, planned_requests
from hdeval.methods.paireval.sources import (
    ALL_VS_ALL, REFERENCE_FIELD, check_documents, choose_comparisons, comparison_source, comparison_text,
    overlap_text, overlap_with_test, reference_examples,
)
from hdeval.methods.paireval.yesno import YES_NO, YesNoEvaluator, _p_yes, fit_yesno, yesno_question, yesno_request

__all__ = [
    "ALL_VS_ALL", "METRICS", "MODEL", "PAIR_PROMPT", "REFERENCE_FIELD", "SCORES", "YESNO_PROMPT", "YES_NO",
    "PairEvalEvaluator", "YesNoEvaluator", "_Dialogue", "_p_yes", "check_documents", "choose_comparisons",
    "comparison_source", "comparison_text", "export_training", "fake", "fit_paireval", "fit_with_pool",
    "fit_yesno", "overlap_text", "overlap_with_test", "plan_requests", "planned_requests", "reference_examples",
    "same_doc_cells", "same_doc_scores", "yesno_question", "yesno_request",
    # comparisons.py's, reachable from the package as before
    "COMPARISONS", "Example", "LABELS", "MAX_EXAMPLE_CHARS", "MAX_TOKENS", "PairScores", "PairwiseScorer",
    "RESPONSE_FIELD", "TOP_LOGPROBS", "_EveryK", "_p_first_label", "_parse_examples", "_quiet",
    "check_comparisons", "comparisons_for", "criterion_question", "draw_comparisons", "hdeval_scorer",
    "history_fields", "pair_cells", "pair_question", "pair_request", "pair_scores", "read_comparison_file",
    "response_label",
]
