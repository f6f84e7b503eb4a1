"""The OpenAI-compatible backend's lean HTTP path: one body built per request and sent as is
by every attempt, headers kept out of the body, and error bodies read with a bound."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from conftest import close_after_test
from llm_server import LLMServer, Reply

from hdeval.core.errors import BackendError
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import OpenAICompatBackend

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

KEY = "sk-test-SECRET-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as s:
        yield s


def make(server: LLMServer, **kwargs: object) -> OpenAICompatBackend:
    options: dict = {"api_key": KEY, "timeout": 10.0, "max_retries": 2, "backoff_base": 0.01}
    options.update(kwargs)
    return close_after_test(OpenAICompatBackend(model="test-model", base_url=server.url, **options))


def req(text: str = "Rate this text.", **kwargs: object) -> CompletionRequest:
    return CompletionRequest(messages=(Message("user", text),), **kwargs)


def test_the_body_is_the_request_only_and_its_declared_kind_and_data_stay_home(server: LLMServer) -> None:
    b = make(server)
    declared = {"kind": "score", "data": {"sample": "ZZSAMPLEZZ", "criterion": "ZZCRITZZ"}}
    body = b._params(req(top_logprobs=5, **declared), True)
    # the Batch API writes this very object as a JSONL line: nothing but request fields
    assert set(body) == {"model", "messages", "temperature", "max_tokens", "logprobs", "top_logprobs"}
    b.complete(req(**declared))
    (r,) = server.requests
    assert r.json == b._params(req(), False)
    sent = r.body.decode() + repr(r.headers)
    assert not [w for w in ("zzsamplezz", "zzcritzz", "kind") if w in sent.lower()], r.headers


def test_every_retry_sends_the_same_bytes(server: LLMServer) -> None:
    server.plan(Reply.error(500, "hiccup"), Reply.rate_limited())
    text = "Rate this: caf\u00e9 \u2013 \u4e2d\u6587 \U0001f600"
    assert make(server).complete(req(text, kind="score")).text == "4"
    first, second, third = server.requests
    assert first.body == second.body == third.body
    assert json.loads(first.body)["messages"][0]["content"] == text  # UTF-8, not mangled


@pytest.mark.parametrize("status", [400, 503])
def test_a_huge_error_body_is_not_read_to_its_end(server: LLMServer, status: int) -> None:
    # 40 MB with no Content-Length: more than socket buffers hold, so reading it all shows
    server.plan(Reply(status=status, body=b'{"error": {"message": "' + b"x" * 40 * 2**20 + b'"}}',
                      no_length=True))
    with pytest.raises(BackendError, match=f"HTTP {status}") as info:
        make(server, max_retries=0).complete(req())
    assert server.sent_bytes == 0  # the client stopped reading at its bound
    assert len(str(info.value)) < 400 and "\n" not in str(info.value)


def test_an_error_body_that_is_a_json_string_or_list_still_reads(server: LLMServer) -> None:
    server.plan(Reply.json({"error": "model overloaded"}, status=400))
    with pytest.raises(BackendError, match=r"\(HTTP 400\): model overloaded"):
        make(server).complete(req())
    server.plan(Reply.json([1, 2], status=400))
    with pytest.raises(BackendError, match=r"\(HTTP 400\): Error code: 400"):
        make(server).complete(req())
