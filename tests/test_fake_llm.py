"""The fake LLM (``--llm fake``, ``hdeval.llm.backends.fake`` and each method's responders) answers a
request from its declared kind and data, never from the prompt's wording: a reworded prompt
template gets the very same answers, and the data decides them."""

from __future__ import annotations

import re

import pytest

import hdeval.methods.dna.fake  # noqa: F401  (registers DnA's responders)
import hdeval.methods.paireval  # noqa: F401  (registers the comparison responders)
from hdeval.llm.backends.base import CompletionRequest
from hdeval.llm.backends.fake import FakeBackend
from hdeval.core.errors import BackendError
from hdeval.methods.comparisons import Example, pair_request
from hdeval.methods.dna import prompts as dna
from hdeval.methods.dna.replies import AspectSpec
from hdeval.methods.hdeval.decompose import decomposition_request
from hdeval.methods.paireval.yesno import yesno_request
from hdeval.judge.prompts import Template, load_template
from hdeval.judge.scoring import scoring_request
from hdeval.data.tasks import load_task
from hdeval.core.types import Aspect, CriteriaTree, Criterion, PairSample, Sample

# What a template edit may do to the wording around the placeholders.
_REWORDINGS = [("sub-criteria", "finer criteria"), ("aspects", "qualities"), ("Aspect", "Quality"),
               ("Response A", "the first response"), ("Response B", "the second response"),
               ("<sample>", "[[text]]"), ("</sample>", "[[/text]]"), ("Score", "Rating"), ("at most", "no more than")]


def reworded(name: str) -> Template:
    """The shipped template ``name`` with other wording: other words, every line indented."""
    t = load_template(name)

    def reword(text: str) -> str:
        parts = re.split(r"(\{\{\w+\}\})", text)  # the placeholders stay as they are
        for i in range(0, len(parts), 2):
            for old, new in _REWORDINGS:
                parts[i] = parts[i].replace(old, new)
            parts[i] = re.sub(r"(?m)^", "  ", parts[i])
        return "Read this with care.\n" + "".join(parts)

    return Template(name, reword(t.system), reword(t.user), "0" * 64, "")


def answer(request: CompletionRequest):
    c = FakeBackend().complete(request)
    return c.text, c.top_logprobs


def both(build, name: str) -> tuple[CompletionRequest, CompletionRequest]:
    shipped, other = build(load_template(name)), build(reworded(name))
    assert shipped.messages != other.messages and shipped.kind == other.kind == name.removeprefix("x")
    return shipped, other


SUMMEVAL = load_task("summeval")
TREE = CriteriaTree.from_aspects(SUMMEVAL.aspects).with_children(
    "coherence", [Criterion("coherence/order", "Logical order", "Sentences follow a logical order.", "coherence", 2)])
SAMPLES = [Sample(f"s{i}", "d", {"source": f"The article {i} says {'much ' * i}about rivers.",
                                 "output": f"A summary {i}: {'rivers and lakes ' * (i % 3)}matter."}) for i in range(6)]
LLMBAR = load_task("llmbar")
PAIRS = [PairSample(f"p{i}", "d", {f.key: f"Question {i}: why {'so ' * i}?" for f in LLMBAR.fields if f.key != "output"},
                    f"Because {'of this ' * i}.", f"No idea {i}.") for i in range(4)]
SPECS = [AspectSpec("clarity", "Clarity", "Is it clear?"), AspectSpec("depth", "Depth", "Does it go deep?")]
DIALOGUE = [Example(f"e{i}", "d", f"User: tell me about boats {i}", f"Boats {'float ' * i}on water.") for i in range(4)]
QUALITY = Aspect("engaging", "Engaging", "Is the response engaging?", 1, 5)


@pytest.mark.parametrize("sample", SAMPLES[:3], ids=lambda s: s.id)
@pytest.mark.parametrize("key", ["coherence", "coherence/order", "fluency"])
def test_a_scoring_reply_does_not_change_with_the_wording(key: str, sample: Sample) -> None:
    criterion = TREE[key]
    shipped, other = both(lambda t: scoring_request(t, SUMMEVAL, TREE, criterion, sample), "score")
    assert answer(shipped) == answer(other)


def test_scores_follow_the_sample_and_the_criterion_the_request_declares() -> None:
    template = load_template("score")
    replies = {(s.id, c.key): answer(scoring_request(template, SUMMEVAL, TREE, c, s))[1]
               for s in SAMPLES for c in TREE.layer(1)}
    assert len(set(replies.values())) > len(replies) // 2  # not one answer for every request


@pytest.mark.parametrize("children", [2, 5])
def test_a_decomposition_reply_does_not_change_with_the_wording(children: int) -> None:
    criterion = TREE["coherence"]
    shipped, other = both(lambda t: decomposition_request(t, SUMMEVAL, TREE, criterion, children), "decompose")
    assert answer(shipped) == answer(other)
    assert answer(shipped)[0].count('"key"') == children


@pytest.mark.parametrize("i", range(3))
def test_comparison_and_yes_no_replies_do_not_change_with_the_wording(i: int) -> None:
    a, b = DIALOGUE[i], DIALOGUE[i + 1]
    question = "Which response is the better follow-up to its conversation?"
    shipped, other = both(lambda t: pair_request(t, LLMBAR, question, a, b), "pair")
    assert answer(shipped) == answer(other)
    shipped, other = both(lambda t: yesno_request(t, LLMBAR, QUALITY, a), "yesno")
    assert answer(shipped) == answer(other)


@pytest.mark.parametrize("pair", PAIRS[:3], ids=lambda p: p.id)
@pytest.mark.parametrize("swapped", [False, True])
def test_dna_replies_do_not_change_with_the_wording(pair: PairSample, swapped: bool) -> None:
    built = [
        ("dna_aspects", lambda t: dna.aspects_request(t, LLMBAR, pair, 3)),
        ("dna_weights", lambda t: dna.weights_request(t, LLMBAR, pair, SPECS)),
        ("dna_score", lambda t: dna.score_request(t, LLMBAR, pair, SPECS[1], swapped)),
        ("dna_direct", lambda t: dna.overall_request(t, LLMBAR, pair, swapped, "direct")),
        ("dna_cot", lambda t: dna.overall_request(t, LLMBAR, pair, swapped, "cot")),
    ]
    for name, build in built:
        shipped, other = both(build, name)
        assert answer(shipped) == answer(other), name


def test_a_kind_without_a_responder_is_one_clear_error() -> None:
    request = CompletionRequest((), kind="no_such_prompt")
    with pytest.raises(BackendError, match="no responder for prompt kind 'no_such_prompt'"):
        FakeBackend().complete(request)


def test_declared_kind_and_data_are_not_part_of_the_request_identity() -> None:
    """They travel with the request for the fake only: two requests that differ in them alone
    are one request to the cache (same key, equal, same hash)."""
    from hdeval.llm.cache.client import request_key

    shipped = scoring_request(load_template("score"), SUMMEVAL, TREE, TREE["fluency"], SAMPLES[0])
    bare = CompletionRequest(shipped.messages, shipped.temperature, shipped.max_tokens, shipped.top_logprobs,
                             answer=shipped.answer)
    assert shipped.data and not bare.data and not bare.kind
    assert shipped == bare and hash(shipped) == hash(bare)
    assert request_key("fake:v1", shipped) == request_key("fake:v1", bare)


@pytest.mark.parametrize("spec, said", [
    ("fake:garbage=abc", "--llm fake:garbage=abc: 'abc' is not a number"),
    ("fake:garbage=", "--llm fake:garbage=: '' is not a number"),
    ("fake:garbage=1.5", "garbage is a share of replies, from 0 to 1; got 1.5"),
    ("fake:garbage=nan", "garbage is a share of replies, from 0 to 1; got nan"),
    ("fake:logprobs=maybe", "logprobs is 0 or 1 (on or off), got 'maybe'"),
    ("fake:nope=1", "unknown fake backend option 'nope'"),
])
def test_a_fake_option_of_the_wrong_kind_is_one_line(spec: str, said: str) -> None:
    """fake:garbage=abc ended in float()'s ValueError traceback; logprobs=maybe was taken as on."""
    from conftest import REPO, one_error, run_cli

    from hdeval.core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        FakeBackend.from_spec(spec)
    assert said in str(refused.value)
    res = run_cli("train", "--task", REPO / "examples" / "qa_task.toml", "--layers", "1", "--llm", spec, "--dry-run")
    assert res.exit_code == 2
    one_error(res, said)


def test_the_fake_options_that_are_right_still_work() -> None:
    assert FakeBackend.from_spec("fake:garbage=0.2,logprobs=0").identity == "fake:v1:garbage=0.2,logprobs=0"
    assert FakeBackend.from_spec("fake:logprobs=off").logprobs is False
    assert FakeBackend.from_spec("fake:logprobs").logprobs is True


def test_local_with_options_is_refused_not_sent_to_openai() -> None:
    """'local' takes no options: --llm local:x went to OpenAI as a model named "local:x"."""
    from conftest import REPO, one_error, run_cli

    from hdeval.core.errors import ConfigError
    from hdeval.llm.config import LLMConfig

    res = run_cli("train", "--task", REPO / "examples" / "qa_task.toml", "--layers", "1", "--llm", "local:x", "--dry-run")
    assert res.exit_code == 2 and "openai:" not in res.output
    one_error(res, "'local' takes no options")
    with pytest.raises(ConfigError, match="'local' takes no options"):
        LLMConfig(model="local:x").check()
    LLMConfig(model="local:x", base_url="http://127.0.0.1:9/v1").check()  # a server's own model name
