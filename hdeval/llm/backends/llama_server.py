"""What llama.cpp's server is asked for one word of a few, and how its reply is read: the
embedded xllamacpp runtime and a llama.cpp server over HTTP (the ``llama.cpp`` dialect of
:mod:`hdeval.llm.backends.openai_compat`) send the same body, so both give the same probabilities.

The first token is constrained by a grammar and read at temperature 1 with no truncation and
``post_sampling_probs``: the probabilities after the grammar (llama.cpp's plain ``logprobs`` are
from before it), the model's own over the words; the reply is the likeliest word.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from hdeval.core.errors import BackendError
from hdeval.llm.backends.base import MAX_ALTERNATIVES, Completion, CompletionRequest, TokenLogprob
from hdeval.llm.backends.constraints import Labels, Scale, first_token_word, to_gbnf


def choose_params(constraint: Scale | Labels, seed: int) -> dict[str, Any]:
    """The body fields (besides the messages) that ask for one word of ``constraint``."""
    return dict(
        max_tokens=1,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        samplers=["temperature"],
        seed=seed,
        grammar=to_gbnf(constraint),
        logprobs=True,
        top_logprobs=min(MAX_ALTERNATIVES, 4 * len(constraint.words) + 4),
        post_sampling_probs=True,
    )


def choose_completion(
    reply: Mapping,
    constraint: Scale | Labels,
    request: CompletionRequest,
    prompt_tokens: int,
    evaluated: int | None,
) -> Completion:
    """The reply to :func:`choose_params` as one word with every word's probability
    (renormalised over the words); BackendError when it gives none of them any."""
    words = constraint.words
    probs: dict[str, float] = {}
    for token, p in first_probs(reply):
        word = first_token_word(constraint, token)
        if word is not None and p > 0.0:
            probs[word] = probs.get(word, 0.0) + p
    total = sum(probs.values())
    if total <= 0.0:
        raise BackendError("llama.cpp returned no probabilities for the allowed answers")
    return word_completion(
        {w: math.log(p / total) for w, p in probs.items()}, words, request, prompt_tokens, evaluated
    )


def word_completion(
    logprobs: dict[str, float],
    words: Sequence[str],
    request: CompletionRequest,
    prompt_tokens: int,
    evaluated: int | None,
) -> Completion:
    """The likeliest word (the first on ties) as the reply, every word's logprob as its alternatives."""
    ranked = sorted(logprobs.items(), key=lambda kv: (-kv[1], words.index(kv[0])))
    top = tuple(TokenLogprob(w, lp) for w, lp in ranked)
    return Completion(
        text=ranked[0][0],
        top_logprobs=(top,) if request.top_logprobs else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=1,
        prompt_tokens_evaluated=evaluated,
    )


# reply parsing: bounded, the reply is untrusted like any server's
def first_probs(reply: Mapping) -> list[tuple[str, float]]:
    """The (token, probability) alternatives at the first generated position, best first."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise BackendError("llama.cpp reply holds no choices")
    lp = choices[0].get("logprobs")
    content = lp.get("content") if isinstance(lp, Mapping) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], Mapping):
        raise BackendError("llama.cpp reply holds no logprobs")
    alts = content[0].get("top_probs")
    out: list[tuple[str, float]] = []
    for a in alts[:MAX_ALTERNATIVES] if isinstance(alts, list) else []:
        tok, p = (a.get("token"), a.get("prob")) if isinstance(a, Mapping) else (None, None)
        if (
            isinstance(tok, str)
            and isinstance(p, (int, float))
            and not isinstance(p, bool)
            and math.isfinite(p)
        ):
            out.append((tok, float(p)))
    out.sort(key=lambda tv: -tv[1])
    return out
