"""Decompose and Aggregate (Li et al., 2024) on pairwise preference data. Registration only: the
modules load when used, so ``hdeval --help`` stays light."""

from __future__ import annotations

from hdeval.methods.base import Method, Variant, later
from hdeval.methods.dna.settings import DnaOptions

METHOD = Method(
    name="dna",
    summary="Decompose and Aggregate on pairs: LLM aspects, weights and per-aspect scores, "
    "external weighted sum (+ learned aggregation)",
    shapes=("pairwise",),
    fit=later("hdeval.methods.dna.fit:fit"),
    load=later("hdeval.methods.dna.fitted:DnaEvaluator.from_artifact"),
    plan=later("hdeval.methods.dna.scoring:plan_dna"),
    options=DnaOptions,
    # DnA's `--dna-mode direct` baseline: overall scores from the same LLM, no aspects
    variants=(Variant("dna-direct", {"dna_mode": "direct"}, baseline=True),),
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
