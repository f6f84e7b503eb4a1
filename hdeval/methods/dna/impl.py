"""``dna``: Decompose and Aggregate (Li et al., 2024) on pairwise preference data.

The paper's stages (Sec. 3), each its own prompt in ``prompts/``:

1. **Aspects**: the task's aspects (``--aspect-source predefined``), or ``k`` aspects the LLM
   proposes per instance from the question alone (``dynamic``; ``dna_aspects``, validated JSON).
2. **Weights**: a percentage weight per aspect from the question alone (``dna_weights``, validated
   JSON: one non-negative number per aspect), normalised to sum to 1.
3. **Pairwise scoring by aspect**: one prompt shows the question and both responses and asks for
   a 1-10 score per response on one aspect (``dna_score``); both sides of that one reply fill the
   ``<aspect>:a`` and ``<aspect>:b`` columns (the cache makes it one call).
4. **Aggregation**: an external weighted sum per response; the higher total wins, totals within
   ``--tie-margin`` are a tie.

Deviations from the paper: each aspect score is the probability-weighted mean over the score
tokens offered at its number's position where the server returns top logprobs and they line up
with the reply (``--logprob-scores``, on by default; the paper reads the reply text, which is the
fallback); a pair whose aspects, weights or any aspect score
stays unusable is a recorded failure (no prediction) rather than guessed. ``--swap`` asks every
pairwise prompt in both orders, averages the scores and reports position consistency.

Baselines with the same LLM (``--dna-mode``): ``direct`` (overall scores, no aspects), ``cot``
(overall scores after step-by-step reasoning, read from the last line) and ``prompt-agg`` (the
paper's ablation: the aspect scores and weights are handed back to the LLM, which states the
overall scores). Beyond the paper, with predefined aspects a logistic regression on the
per-aspect score differences is fitted to the human labels of the training split (``learned``)
and reported next to the LLM's own weights.

The method's parts, one job per module: ``settings`` (its options), ``prompts`` (the requests),
``replies`` (reading them), ``scoring`` (one run over pairs), ``decision`` (totals, ties, the
learned aggregator), ``fitted`` (the artifact), ``fit`` (training), ``plan`` (the dry run) and
``fake`` (the fake LLM's answers). This module gathers their public names for the package.
"""

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
from hdeval.methods.dna.settings import MAX_K, Settings, settings_of

__all__ = [
    "_read_cot",
    "_read_pair",
    "_read_pair_weighted",
    "agreement",
    "AspectSpec",
    "decide",
    "DnaEvaluator",
    "fake",
    "fit",
    "fit_learned",
    "Learned",
    "LEARNED",
    "load_dna_templates",
    "MAX_K",
    "METRICS",
    "overall_request",
    "pair_block",
    "PairScoreResult",
    "plan_dna",
    "PROMPT_FILES",
    "question_block",
    "run_pairs",
    "SCALE10",
    "score_request",
    "SCORES",
    "Settings",
    "settings_of",
    "SWAP",
    "TOP_LOGPROBS",
    "TWO_SCORES",
    "validate_aspects",
    "validate_weights",
    "weighted_totals",
    "weights_request",
]
