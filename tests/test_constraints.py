"""Requests carry their answer constraint: the mapping to each backend's parameters, the fake
backend honouring it, what an OpenAI-compatible server receives, and the cache-key rule."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import close_after_test
from llm_server import LLMServer

from hdeval.core.errors import BackendError, ConfigError
from hdeval.llm.backends.base import Completion, CompletionRequest, Message
from hdeval.llm.backends.constraints import (
    JsonObject,
    JsonSchema,
    Labels,
    Scale,
    constraint_of,
    first_token_word,
    obeys,
    to_gbnf,
    to_llama_params,
    to_openai_params,
)
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.llm.cache.client import request_key
from hdeval.methods.hdeval.decompose import reply_schema

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

MSGS = (Message("user", "Which is better?"),)
SCHEMA = json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})


# -- the mapping --------------------------------------------------------------------------------


def test_grammars_of_scales_and_labels() -> None:
    assert to_gbnf(Scale(1, 5)) == "root ::= [1-5]"
    assert to_gbnf(Scale(0, 9, count=2)) == 'root ::= [0-9] " " [0-9]'
    ten = to_gbnf(Scale(1, 10, count=2))
    assert ten.startswith('root ::= ("1" | "2" |') and ten.count('"10"') == 2 and ten.count('" "') == 1
    assert to_gbnf(Labels(("A", "B"))) == 'root ::= "A" | "B"'
    # a quote or backslash in a label cannot end the literal early
    assert to_gbnf(Labels(('say "hi"', "a\\b"))) == 'root ::= "say \\"hi\\"" | "a\\\\b"'
    for c in (None, JsonObject(), JsonSchema(SCHEMA)):
        assert to_gbnf(c) is None  # llama.cpp builds JSON grammars from the schema itself


def test_openai_params_send_structured_outputs_for_json_only() -> None:
    strict = to_openai_params(JsonSchema(SCHEMA))
    assert strict == {"response_format": {"type": "json_schema", "json_schema": {
        "name": "reply", "schema": json.loads(SCHEMA), "strict": True}}}
    assert to_openai_params(JsonSchema(SCHEMA), schema_supported=False) == {"response_format": {"type": "json_object"}}
    assert to_openai_params(JsonObject()) == {"response_format": {"type": "json_object"}}
    for c in (None, Scale(1, 5), Scale(1, 10, 2), Labels(("Yes", "No"))):
        assert to_openai_params(c) == {}


def test_llama_server_params() -> None:
    assert to_llama_params(Labels(("A", "B"))) == {"grammar": 'root ::= "A" | "B"'}
    assert to_llama_params(JsonSchema(SCHEMA))["response_format"]["json_schema"]["schema"] == json.loads(SCHEMA)
    assert to_llama_params(JsonObject()) == {"response_format": {"type": "json_object"}}
    assert to_llama_params(None) == {}


def test_the_request_names_one_constraint() -> None:
    assert constraint_of(CompletionRequest(MSGS)) is None
    assert constraint_of(CompletionRequest(MSGS, answer=Labels(("A", "B")))) == Labels(("A", "B"))
    assert constraint_of(CompletionRequest(MSGS, json_mode=True)) == JsonObject()
    both = CompletionRequest(MSGS, json_mode=True, json_schema=SCHEMA)
    assert constraint_of(both) == JsonSchema(SCHEMA)  # the schema is the tighter of the two


@pytest.mark.parametrize("constraint, good, bad", [
    (Scale(1, 5), ["1", "5"], ["0", "6", " 3", "3.", "03", "", "3 4", "٣"]),
    (Scale(1, 10, 2), ["7 4", "10 1"], ["7", "7  4", "11 2", "7 4 1", "7,4", "0 3"]),
    (Labels(("A", "B")), ["A", "B"], ["a", " A", "A.", "C", "AB", ""]),
    (JsonObject(), ['{"a": 1}'], ["[1]", "{oops", "yes"]),
])
def test_obeys(constraint, good, bad) -> None:
    assert all(obeys(constraint, t) for t in good)
    assert not any(obeys(constraint, t) for t in bad)
    assert obeys(None, "anything at all")


def test_a_first_token_counts_for_the_one_word_it_begins() -> None:
    yes_no = Labels(("Yes", "No"))
    assert [first_token_word(yes_no, t) for t in ("Y", "Ye", "Yes", "N", "No", "", "Nope", " Yes")] == \
        ["Yes", "Yes", "Yes", "No", "No", None, None, None]
    assert yes_no.single_token and Scale(1, 5).single_token
    # a word that begins another cannot be told from the first token
    assert not Labels(("No", "Nope")).single_token and first_token_word(Labels(("No", "Nope")), "No") is None
    assert not Scale(1, 10).single_token and not Scale(1, 5, count=2).single_token


@pytest.mark.parametrize("make", [
    lambda: Scale(5, 1), lambda: Scale(-1, 3), lambda: Scale(1, 5, count=0), lambda: Scale(1, 5000),
    lambda: Scale(1.0, 5), lambda: Scale(True, 5), lambda: Labels(("A",)), lambda: Labels(("A", "A")),
    lambda: Labels(["A", "B"]), lambda: Labels(("A", " B")), lambda: Labels(("A", "B\n")), lambda: Labels(("A", "")),
])
def test_malformed_constraints_are_refused(make) -> None:
    with pytest.raises(ValueError):
        make()


# -- the cache key ------------------------------------------------------------------------------


def test_a_scale_or_labels_leave_the_key_as_it_was() -> None:
    # Nothing is sent for them to an OpenAI-compatible server, so users' caches stay valid; the
    # local backends, which decode under them, changed their identity instead (test_xllamacpp).
    plain = CompletionRequest(MSGS, max_tokens=2, top_logprobs=10, kind="pair")
    for answer in (Labels(("A", "B")), Scale(1, 5)):
        constrained = dataclasses.replace(plain, answer=answer)
        assert request_key("openai:m@http://x", constrained) == request_key("openai:m@http://x", plain)
        assert constrained.key_fields() == plain.key_fields()
    # a JSON schema is sent, and stays in the key as before
    schema = dataclasses.replace(plain, json_schema=SCHEMA)
    assert request_key("i", schema) != request_key("i", plain)


# -- the fake backend ---------------------------------------------------------------------------


def _fake(reply: str, **kw) -> FakeBackend:
    return FakeBackend(responders={"k": lambda req, fake: Completion(reply)}, **kw)


def test_the_fake_names_an_unknown_option_and_a_prompt_kind_it_cannot_answer() -> None:
    with pytest.raises(ConfigError, match="unknown fake backend option 'bogus' in --llm fake:bogus=1"):
        FakeBackend.from_spec("fake:bogus=1")
    assert FakeBackend.from_spec("fake:garbage=0.5,logprobs=0").identity == "fake:v1:garbage=0.5,logprobs=0"
    with pytest.raises(BackendError, match="no responder for prompt kind 'other' .known: k;"):
        _fake("B").complete(CompletionRequest(MSGS, kind="other"))


def test_the_fake_refuses_a_reply_that_breaks_the_constraint() -> None:
    ok = _fake("B").complete(CompletionRequest(MSGS, answer=Labels(("A", "B")), kind="k"))
    assert ok.text == "B"
    with pytest.raises(BackendError, match="'k' responder broke the request's answer constraint"):
        _fake("I think B").complete(CompletionRequest(MSGS, answer=Labels(("A", "B")), kind="k"))
    with pytest.raises(BackendError, match="answer constraint"):
        _fake("11 3").complete(CompletionRequest(MSGS, answer=Scale(1, 10, 2), kind="k"))
    with pytest.raises(BackendError, match="answer constraint"):
        _fake("not json").complete(CompletionRequest(MSGS, json_mode=True, kind="k"))
    # free text is anything; garbage models an LLM that does not honour constraints
    assert _fake("I think B").complete(CompletionRequest(MSGS, kind="k")).text == "I think B"
    garbage = _fake("I think B", garbage=0.5)
    assert garbage.complete(CompletionRequest(MSGS, answer=Labels(("A", "B")), kind="k")).text == "I think B"


def test_every_method_request_gets_an_answer_its_constraint_allows() -> None:
    from hdeval.core.types import CriteriaTree, Sample
    from hdeval.data.tasks import load_task
    from hdeval.judge.prompts import load_template
    from hdeval.judge.scoring import scoring_request
    from hdeval.methods.comparisons import LABELS
    from hdeval.methods.dna.prompts import TWO_SCORES
    from hdeval.methods.paireval.yesno import YES_NO

    task = load_task("summeval")
    tree = CriteriaTree.from_aspects(task.aspects)
    sample = Sample(id="s", doc_id="d", fields={"source": "A long article.", "output": "A short summary."})
    score = scoring_request(load_template("score"), task, tree, list(tree)[0], sample)
    assert score.answer == Scale(1, 5)
    fake = FakeBackend()
    assert obeys(score.answer, fake.complete(score).text)
    assert LABELS == ("A", "B") and YES_NO == ("Yes", "No") and TWO_SCORES == Scale(1, 10, 2)


# -- what an OpenAI-compatible server receives -------------------------------------------------


def test_the_server_receives_structured_outputs_for_a_schema_and_nothing_new_otherwise() -> None:
    with LLMServer() as server:
        server.reply_text = '{"subcriteria": []}'
        backend = close_after_test(OpenAICompatBackend(model="m", base_url=server.url, api_key="k", timeout=5.0))
        schema = reply_schema(3)
        backend.complete(CompletionRequest(MSGS, json_mode=True, json_schema=schema, kind="decompose"))
        body = server.requests[-1].json
        assert body["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "reply", "schema": json.loads(schema), "strict": True}}

        server.reply_text = "A"
        plain = CompletionRequest(MSGS, max_tokens=2, top_logprobs=10, kind="pair")
        backend.complete(plain)
        backend.complete(dataclasses.replace(plain, answer=Labels(("A", "B"))))
        backend.complete(dataclasses.replace(plain, answer=Scale(1, 5)))
        bodies = [r.body for r in server.requests[-3:]]
        # the same bytes as before constraints existed: no parameter a server might reject
        assert bodies[0] == bodies[1] == bodies[2]
        assert "response_format" not in server.requests[-1].json and "grammar" not in server.requests[-1].json
