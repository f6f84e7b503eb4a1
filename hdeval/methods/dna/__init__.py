"""Decompose and Aggregate (Li et al., 2024) on pairwise preference data.

Registration only (the method's name, options and where its code is): the implementation in
:mod:`.impl` is imported when the method is used, so listing methods (``hdeval --help``) loads no
numerical library. Its public names are reachable from this package too (``from
hdeval.methods.dna import ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

from hdeval.methods.base import Method, Option


def _impl():
    return importlib.import_module("hdeval.methods.dna.impl")


def __getattr__(name: str) -> Any:
    return getattr(_impl(), name)


MODES = ("dna", "direct", "cot", "prompt-agg")
SOURCES = ("predefined", "dynamic")

METHOD = Method(
    name="dna",
    summary="Decompose and Aggregate on pairs: LLM aspects, weights and per-aspect scores, "
            "external weighted sum (+ learned aggregation)",
    shapes=("pairwise",),
    fit=lambda ctx: _impl().fit(ctx),
    load=lambda art: _impl().DnaEvaluator.from_artifact(art),
    plan=lambda config, prep, backend: _impl().plan_dna(config, prep, backend),
    options={
        "dna_mode": Option("dna", "dna, or a same-LLM baseline: direct, cot, prompt-agg", MODES),
        "aspect_source": Option("predefined", "the task's aspects, or k per instance from the LLM", SOURCES),
        "k": Option(4, "aspects the LLM proposes per instance with --aspect-source dynamic"),
        "tie_margin": Option(None, "totals this close are a tie (default: learned, the margin whose verdicts "
                                   "agree best with the training split's human labels)", kind=float),
        "swap": Option(False, "ask every pairwise prompt in both orders and average"),
        "logprob_scores": Option(True, "weight each 1-10 aspect score by its token's top logprobs where the "
                                       "server returns them (else the reply text)"),
    },
)

METHODS = (METHOD,)  # what hdeval.methods.registry registers
