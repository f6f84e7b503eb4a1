"""DnA's dry run: the calls of each stage, counted without calling the LLM."""

from __future__ import annotations

import numpy as np

from hdeval.backends.base import CompletionRequest
from hdeval.methods.dna.prompts import (aspects_request, load_dna_templates, overall_request, score_request,
                                        weights_request)
from hdeval.methods.dna.replies import AspectSpec
from hdeval.types import PairSample

# Completion tokens a stage's reply is estimated to take (its max_tokens bounds the real figure).
_PLAN_COMPLETION = {"aspects": 40, "weights": 8, "score": 2, "direct": 2, "cot": 300, "prompt_agg": 2}


def plan_dna(config, prep, backend=None) -> list:
    """DnA's calls per stage without calling the LLM (``hdeval train --method dna --dry-run``).

    Stages whose requests are known before the run (predefined aspects' weights and scores, the
    direct and chain-of-thought baselines, dynamic aspects) are counted exactly, identical
    requests once, with how many are cached. With dynamic aspects the weights and scores depend on
    the proposed aspects: k per pair is counted and their cache state is unknown. Re-asks of
    unusable JSON replies are not counted.
    """
    from hdeval.methods.run import LayerPlan, exact_plan, open_backend, prompt_chars

    settings = config.options.settings()
    task, pairs = prep.task, list(prep.samples)
    templates = load_dna_templates(settings.prompt_roles)
    orders = (False, True) if settings.swap else (False,)
    llm = open_backend(config, backend, offline=True)
    plans: list = []

    def exact(n: int, stage: str, role: str, reqs: list) -> None:
        plans.append(exact_plan(llm, reqs, _PLAN_COMPLETION[role], n, stage))

    def estimated(n: int, stage: str, role: str, calls: int, chars_per_call: float) -> None:
        plans.append(LayerPlan(n, 0, calls, None, False, int(calls * chars_per_call / 4),
                               calls * _PLAN_COMPLETION[role], stage=stage))

    try:
        if not settings.uses_aspects:
            role = settings.mode
            exact(1, settings.scoring_stage(1), role, [
                overall_request(templates[role], task, p, sw, role)  # as run_pairs asks
                for p in pairs for sw in orders])
            return plans
        fixed = [AspectSpec(a.key, a.name, a.definition) for a in task.aspects]

        def weights_req(p: PairSample, specs: list[AspectSpec]) -> CompletionRequest:
            return weights_request(templates["weights"], task, p, specs)

        def score_req(p: PairSample, spec: AspectSpec, sw: bool) -> CompletionRequest:
            return score_request(templates["score"], task, p, spec, sw, settings.logprobs)

        n_orders = len(orders)
        if settings.dynamic:
            exact(1, "aspects", "aspects",
                  [aspects_request(templates["aspects"], task, p, settings.k) for p in pairs])
            # the proposed aspects are not known yet: size a weights / score prompt with generic ones
            generic = [AspectSpec(f"aspect {i + 1:<5}", f"aspect {i + 1:<5}", "y" * 80) for i in range(settings.k)]
            w_chars = np.mean([prompt_chars(weights_req(p, generic)) for p in pairs])
            s_chars = np.mean([prompt_chars(score_req(p, generic[0], False)) for p in pairs])
            estimated(2, "weights", "weights", len(pairs), w_chars)
            estimated(3, settings.scoring_stage(settings.k), "score",
                      len(pairs) * settings.k * n_orders, s_chars)
        else:
            exact(1, "weights", "weights", [weights_req(p, fixed) for p in pairs])
            exact(2, settings.scoring_stage(len(fixed)), "score",
                  [score_req(p, spec, sw) for p in pairs for spec in fixed for sw in orders])
        if settings.mode == "prompt-agg":
            chars = np.mean([prompt_chars(score_req(p, fixed[0], False)) for p in pairs]) + 60 * (
                settings.k if settings.dynamic else len(fixed))
            estimated(len(plans) + 1, settings.aggregation_stage, "prompt_agg",
                      len(pairs) * n_orders, chars)
        return plans
    finally:
        llm.close()
