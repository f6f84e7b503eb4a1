"""HD-Eval's answers on the fake LLM (``--llm fake``), registered for its prompt kinds:
``decompose`` gets a JSON list of sub-criteria, ``score`` a digit with a probability distribution
over the digits 1-5 as top logprobs. Scores are a deterministic function of the sample text and
the criterion, loosely tied to simple text features so that trained aggregators have something
to learn. Reading the prompt's wording is this method's business, not the fake backend's."""

from __future__ import annotations

import json
import math
import re

from hdeval.llm.backends.base import Completion, CompletionRequest, TokenLogprob
from hdeval.llm.backends.fake import FakeBackend, responder, stable_hash, stable_unit
from hdeval.methods.comparisons_fake import prompt_of

_MAX_CHILDREN = re.compile(r"at most (\d+) sub-criteria")
_CRITERION = re.compile(r"^Criterion to decompose: (.+?) \(key: ([^)]+)\)", re.M)
_SAMPLE = re.compile(r"<sample>(.*?)</sample>", re.S)


@responder("decompose")
def decompose_reply(request: CompletionRequest, fake: FakeBackend) -> Completion:
    prompt, n_prompt = prompt_of(request)
    m = _MAX_CHILDREN.search(prompt)
    n = int(m.group(1)) if m else 3
    crit = _CRITERION.search(prompt)
    name, key = (crit.group(1), crit.group(2)) if crit else ("criterion", "c")
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
    sample = _SAMPLE.search(prompt)
    body = sample.group(1) if sample else prompt
    criterion = prompt[sample.end() :] if sample else ""
    if fake.garbage and stable_unit("garbage", prompt) < fake.garbage:
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
