"""HD-Eval's answers on the fake LLM (``--llm fake``), registered for its prompt kinds:
``decompose`` gets a JSON list of sub-criteria, ``score`` a digit with a probability distribution
over the digits 1-5 as top logprobs. Scores are a deterministic function of the sample text and
the criterion, loosely tied to simple text features so that trained aggregators have something
to learn. Both answer from the request's declared data (:mod:`hdeval.judge.scoring`,
:mod:`hdeval.methods.hdeval.decompose`), never from the prompt's wording."""

from __future__ import annotations

import json
import math
import re

from hdeval.llm.backends.base import Completion, CompletionRequest, TokenLogprob
from hdeval.llm.backends.fake import FakeBackend, responder, stable_hash, stable_unit
from hdeval.methods.comparisons_fake import prompt_of


@responder("decompose")
def decompose_reply(request: CompletionRequest, fake: FakeBackend) -> Completion:
    _, n_prompt = prompt_of(request)
    n = int(request.data.get("max_children", 3))
    name = str(request.data.get("criterion_name", "criterion"))
    key = str(request.data.get("criterion", "c"))
    facets = ["clarity", "accuracy", "coverage", "style", "detail", "focus", "order", "tone"]
    start = stable_hash(key) % len(facets)
    picked = [facets[(start + i) % len(facets)] for i in range(n)]
    subs = [
        {
            "key": f,
            "name": f"{name}: {f}",
            "definition": f"How well the text shows {f} with respect to {name.lower()}.",
        }
        for f in picked
    ]
    text = json.dumps({"subcriteria": subs})
    return Completion(text, None, n_prompt, max(1, len(text) // 4))


@responder("score")
def score_reply(request: CompletionRequest, fake: FakeBackend) -> Completion:
    prompt, n_prompt = prompt_of(request)
    # a request that declares no sample (one built by hand) is rated as a whole
    body = str(request.data.get("sample", prompt))
    criterion = str(request.data.get("criterion", ""))
    if fake.garbage and stable_unit("garbage", body, criterion) < fake.garbage:
        return Completion("I am not able to rate this text.", None, n_prompt, 8)
    words = re.findall(r"\w+", body.lower())
    uniq = len(set(words)) / max(1, len(words))
    length = math.tanh(len(words) / 400)
    w1, w2 = stable_unit("w1", criterion), stable_unit("w2", criterion)
    noise = stable_unit("noise", body, criterion)
    x = 0.45 * (w1 * uniq + (1 - w1) * length) + 0.35 * w2 * uniq + 0.2 * noise
    score = 1.0 + 4.0 * min(1.0, max(0.0, x))
    digits = [1, 2, 3, 4, 5]
    weights = [math.exp(-((d - score) ** 2) / 0.6) for d in digits]
    total = sum(weights)
    probs = [w / total for w in weights]
    best = digits[max(range(5), key=lambda i: probs[i])]
    top = None
    if fake.logprobs and request.top_logprobs:
        alts = sorted(
            (TokenLogprob(str(d), math.log(max(p, 1e-12))) for d, p in zip(digits, probs)),
            key=lambda t: -t.logprob,
        )[: request.top_logprobs]
        top = (tuple(alts),)
    return Completion(str(best), top, n_prompt, 1)
