"""How a server is told a request's answer constraint (its dialect, asked of its /models) and
what a reply that names another model gets."""

from __future__ import annotations

import math

import pytest
from llm_server import LLMServer, Reply

from hdeval.judge.scoring import parse_score
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import ModelMismatch, OpenAICompatBackend


def _one_word_reply(model="m.gguf"):
    # llama.cpp with post_sampling_probs: probabilities after the grammar, as "prob"
    alts = [{"token": "2", "prob": 0.6}, {"token": "3", "prob": 0.3}, {"token": "4", "prob": 0.1}]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "3"},
                         "logprobs": {"content": [{"token": "3", "prob": 0.3, "top_probs": alts}]}}],
            "model": model, "usage": {"prompt_tokens": 20, "completion_tokens": 1}}


def _score_request():
    from hdeval.llm.backends.constraints import Scale

    return CompletionRequest((Message("user", "Rate it 1-5."),), max_tokens=8, top_logprobs=10, answer=Scale(1, 5))


def test_a_llama_cpp_server_is_recognised_and_sent_the_embedded_runtimes_constraint():
    with LLMServer() as server:
        server.plan(Reply.json({"object": "list", "data": [{"id": "m.gguf", "owned_by": "llamacpp"}]}),
                    Reply.json(_one_word_reply()))
        llm = OpenAICompatBackend("m.gguf", base_url=server.url, dialect="auto")
        try:
            assert llm.identity.endswith("+llama.cpp")  # constrained replies are cached apart
            c = llm.complete(_score_request())
        finally:
            llm.close()
        asked = server.requests[1].json
    assert server.requests[0].path == "/v1/models"
    assert asked["grammar"] == "root ::= [1-5]" and asked["post_sampling_probs"] is True
    assert asked["max_tokens"] == 1 and asked["temperature"] == 1.0
    assert c.text == "2"  # the likeliest word, as the embedded runtime answers
    assert math.isclose(parse_score(c)[0], 0.6 * 2 + 0.3 * 3 + 0.1 * 4)


def test_an_unknown_server_gets_todays_request_and_a_vllm_one_guided_choice():
    with LLMServer() as server:  # no /models: 404
        llm = OpenAICompatBackend("test-model", base_url=server.url, dialect="auto")
        try:
            identity = llm.identity
            llm.complete(_score_request())
        finally:
            llm.close()
        asked = server.requests[1].json
    assert identity.endswith("@" + server.url) and "grammar" not in asked and "guided_choice" not in asked
    vllm = OpenAICompatBackend("m", base_url="http://127.0.0.1:9/v1", dialect="vllm")
    assert vllm._params(_score_request(), True)["guided_choice"] == ["1", "2", "3", "4", "5"]


def test_a_reply_from_another_model_is_named_once():
    with LLMServer() as server:
        server.plan(Reply.json(_one_word_reply("/models/other.gguf")), Reply.json(_one_word_reply("/models/other.gguf")))
        llm = OpenAICompatBackend("no-such-model", base_url=server.url, dialect="llama.cpp")
        try:
            with pytest.warns(ModelMismatch, match="answered with model '/models/other.gguf'") as seen:
                llm.complete(_score_request())
                llm.complete(_score_request())
        finally:
            llm.close()
    assert len([w for w in seen if w.category is ModelMismatch]) == 1
