"""``dna``: Decompose and Aggregate (Li et al., 2024) on pairwise preference data. Its stages,
deviations from the paper, baselines (``--dna-mode``) and the learned aggregation are in
docs/methods.md. This module gathers the public names of the package's modules (one job each)
for the package."""

from __future__ import annotations

from hdeval.metrics import pair_agreement as agreement
from hdeval.methods.dna import fake  # registers the fake LLM's dna_* responders
from hdeval.methods.dna.decision import Learned, decide, fit_learned, weighted_totals
from hdeval.methods.dna.fit import fit
from hdeval.methods.dna.fitted import LEARNED, METRICS, SCORES, DnaEvaluator
from hdeval.methods.dna.plan import plan_dna
from hdeval.methods.dna.prompts import (PROMPT_FILES, TOP_LOGPROBS, TWO_SCORES, load_dna_templates,
                                        overall_request, pair_block, question_block, score_request,
                                        weights_request)
from hdeval.methods.dna.replies import (SCALE10, AspectSpec, _read_cot, _read_pair, _read_pair_weighted,
                                        validate_aspects, validate_weights)
from hdeval.methods.dna.scoring import SWAP, PairScoreResult, run_pairs
from hdeval.methods.dna.settings import MAX_K, Settings

__all__ = [
    "_read_cot", "_read_pair", "_read_pair_weighted", "agreement", "AspectSpec", "decide", "DnaEvaluator", "fake",
    "fit", "fit_learned", "Learned", "LEARNED", "load_dna_templates", "MAX_K", "METRICS", "overall_request",
    "pair_block", "PairScoreResult", "plan_dna", "PROMPT_FILES", "question_block", "run_pairs", "SCALE10",
    "score_request", "SCORES", "Settings", "SWAP", "TOP_LOGPROBS", "TWO_SCORES", "validate_aspects",
    "validate_weights", "weighted_totals", "weights_request",
]
