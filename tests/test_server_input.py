"""Server input is untrusted: every value a reply carries is parsed with bounds, a request is
bounded in time and size, and one request the server refuses does not stop the others.

Unit tests for ``parse_score``, ``Completion.from_dict`` and the OpenAI-compatible backend's
reply parsing, then the backend against the local test server (127.0.0.1 only).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

import pytest
from conftest import close_after_test
from llm_server import SCORE_HOSTILE, LLMServer, Reply, _hostile_body

from hdeval.core.errors import BackendError, ConfigError, RequestRejected
from hdeval.judge.scoring import parse_score
from hdeval.llm.backends.base import Completion, CompletionRequest, Message, TokenLogprob, token_count
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.llm.cache.client import CachedBackend
from hdeval.methods.hdeval.decompose import reply_schema

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

KEY = "sk-test-SECRET-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as s:
        yield s


def make(url: str, **kwargs: object) -> OpenAICompatBackend:
    options: dict = {"api_key": KEY, "timeout": 5.0, "max_retries": 2, "backoff_base": 0.01}
    options.update(kwargs)
    return close_after_test(OpenAICompatBackend(model="test-model", base_url=url, **options))


def req(**kwargs: object) -> CompletionRequest:
    return CompletionRequest(messages=(Message("user", "Rate this text."),), **kwargs)


def lp(*alts: tuple[str, float]) -> tuple[tuple[TokenLogprob, ...], ...]:
    return (tuple(TokenLogprob(t, v) for t, v in alts),)


# -- parse_score ----------------------------------------------------------------------------


def test_only_ascii_digits_are_scores() -> None:
    # "²".isdigit() is True but int("²") raises; "٤" is an Arabic-Indic 4 that int() reads as 4
    assert math.isnan(parse_score(Completion("²", lp(("²", -0.01))))[0])
    value, reason = parse_score(Completion("٤"))
    assert math.isnan(value) and "no score" in reason
    value, reason = parse_score(Completion("٤", lp(("٤", -0.01))))
    assert math.isnan(value) and reason
    # a superscript beside real digits is ignored, the digits still count
    assert parse_score(Completion("4", lp(("²", -0.5), ("4", -1.0))))[0] == 4.0


@pytest.mark.parametrize("bad", [1000.0, math.inf, math.nan])
def test_an_unreadable_logprob_is_a_recorded_failure(bad: float) -> None:
    value, reason = parse_score(Completion("4", lp(("4", bad), ("3", -2.0))))
    assert math.isnan(value)
    assert reason is not None and "unreadable logprob" in reason


def test_minus_infinity_is_probability_zero() -> None:
    assert parse_score(Completion("3", lp(("3", -0.01), ("4", -math.inf))))[0] == pytest.approx(3.0)
    # no digit mass at all: the text decides
    assert parse_score(Completion("2", lp(("4", -math.inf), ("3", -math.inf))))[0] == 2.0


def test_a_5000_digit_reply_is_out_of_range_not_a_traceback() -> None:
    value, reason = parse_score(Completion("5" * 5000))
    assert math.isnan(value) and "5000 digits" in reason and len(reason) < 200
    assert parse_score(Completion("0" * 5000 + "4"))[0] == 4.0  # leading zeros are still 4


def test_text_that_is_not_a_string_is_a_failure() -> None:
    value, reason = parse_score(Completion({"score": 4}))  # type: ignore[arg-type]
    assert math.isnan(value) and "no score" in reason


# -- Completion.from_dict (what the cache hands back) ---------------------------------------


@pytest.mark.parametrize("raw, expected", [
    (12, 12), (12.0, 12), ("12", 12), (None, 0), (-5, 0), (math.inf, 0), (math.nan, 0), (1e999, 0),
    (10**400, 0), ("1e999", 0), ("abc", 0), ("٤", 0), (True, 0), ([1], 0), (2.5, 0),
])
def test_token_counts_are_bounded(raw: object, expected: int) -> None:
    assert token_count(raw) == expected
    c = Completion.from_dict({"text": "4", "prompt_tokens": raw, "completion_tokens": raw})
    assert c.prompt_tokens == expected and c.completion_tokens == expected


def test_from_dict_survives_hostile_values() -> None:
    c = Completion.from_dict({
        "text": ["not", "a", "string"],
        "top_logprobs": [[{"token": "4", "logprob": 1000}, {"token": 5, "logprob": -1}, "junk",
                          {"token": "3", "logprob": "x"}], "not a position"],
        "prompt_tokens_evaluated": "lots",
    })
    assert c.text == ""
    assert c.prompt_tokens_evaluated == 0
    (first, second) = c.top_logprobs
    assert [t.token for t in first] == ["4", "3"]  # alternatives without a string token dropped
    assert all(math.isnan(t.logprob) for t in first)  # unreadable: NaN, so the scorer fails it
    assert second == ()
    assert math.isnan(parse_score(c)[0])
    with pytest.raises(ValueError, match="JSON object"):
        Completion.from_dict(["text"])  # type: ignore[arg-type]


def test_a_nan_logprob_survives_the_cache_as_a_failure(tmp_path) -> None:
    c = Completion("4", lp(("4", math.nan), ("3", -1.0)))
    text = json.dumps(c.to_dict(), allow_nan=False)  # plain JSON: no NaN literal is stored
    back = Completion.from_dict(json.loads(text))
    assert math.isnan(back.top_logprobs[0][0].logprob)
    assert math.isnan(parse_score(back)[0])


# -- the backend parses replies with bounds ---------------------------------------------------


@pytest.mark.parametrize("fault", SCORE_HOSTILE)
def test_hostile_replies_parse_without_a_traceback(server: LLMServer, fault: str) -> None:
    server.plan(Reply.raw(_hostile_body(fault)))
    c = make(server.url).complete(req(top_logprobs=5, max_tokens=8))
    value, reason = parse_score(c)
    assert c.prompt_tokens >= 0 and c.completion_tokens >= 0
    if fault == "usage-1e999":
        assert (value, reason) == (4.0, None)
        assert (c.prompt_tokens, c.completion_tokens) == (0, 0)
    else:
        assert math.isnan(value) and reason, (fault, value, reason)
    # what the cache would store is plain JSON and reads back to the same outcome
    again = Completion.from_dict(json.loads(json.dumps(c.to_dict(), allow_nan=False)))
    assert math.isnan(parse_score(again)[0]) == math.isnan(value)


def test_usage_with_a_cached_count_larger_than_the_prompt(server: LLMServer) -> None:
    server.plan(Reply.ok("4", usage={"prompt_tokens": 10, "completion_tokens": 1,
                                     "prompt_tokens_details": {"cached_tokens": 1e999}}))
    assert make(server.url).complete(req()).prompt_tokens_evaluated == 10
    server.plan(Reply.ok("4", usage={"prompt_tokens": 10, "completion_tokens": 1,
                                     "prompt_tokens_details": {"cached_tokens": 50}}))
    assert make(server.url).complete(req()).prompt_tokens_evaluated == 0


# -- one request refused is that request's failure --------------------------------------------


@pytest.mark.parametrize("reply, words", [
    (Reply.json({"error": {"message": "This model's maximum context length is 128 tokens.", "type":
                           "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}},
                status=400), "maximum context length"),
    (Reply.json({"error": {"message": "filtered", "type": None, "param": "prompt", "code": "content_filter"}},
                status=400), "filtered"),
    (Reply.error(400, "the request exceeds the available context size, try increasing it"), "context size"),
    (Reply.error(400, "Invalid prompt: your prompt was flagged as potentially violating our usage policy."),
     "Invalid prompt"),
    (Reply.error(413, "payload too large"), "HTTP 413"),
    (Reply.error(422, "unprocessable"), "HTTP 422"),
])
def test_a_request_specific_4xx_is_a_request_rejection(server: LLMServer, reply: Reply, words: str,
                                                       tmp_path) -> None:
    server.plan(reply)
    cached = CachedBackend(make(server.url), tmp_path / "cache")
    with pytest.raises(RequestRejected, match=words) as info:
        cached.complete(req())
    assert isinstance(info.value, BackendError) and "\n" not in str(info.value)
    assert server.calls == 1  # not retried: the same request would be refused again
    assert len(cached.store) == 0  # nothing cached: a rerun asks again
    cached.close()


@pytest.mark.parametrize("status, message", [
    (401, "bad key"), (403, "forbidden"), (404, "The model `x` does not exist"), (400, "unsupported parameter: seed"),
])
def test_endpoint_errors_still_stop_the_run(server: LLMServer, status: int, message: str) -> None:
    server.plan(Reply.error(status, message))
    with pytest.raises(BackendError) as info:
        make(server.url).complete(req())
    assert not isinstance(info.value, RequestRejected)
    assert f"HTTP {status}" in str(info.value)


# -- a request is bounded in time and size ----------------------------------------------------


def test_a_dripping_reply_is_cut_at_the_timeout(server: LLMServer) -> None:
    server.plan(Reply.dripping("4", drip=0.3), Reply.dripping("4", drip=0.3))
    b = make(server.url, timeout=1.0, max_retries=1)
    # each body takes over a minute to drip in full, so only a whole-request deadline fails here
    with pytest.raises(BackendError, match="no complete reply within the 1s timeout") as info:
        b.complete(req())
    assert "rerun" in str(info.value)
    assert server.calls == 2


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "no-length"])
def test_an_oversized_reply_is_a_rejection_not_cached(server: LLMServer, tmp_path, with_length: bool) -> None:
    # 40 MB: more than socket buffers hold, so a client that stopped reading is seen to stop
    server.plan(Reply.huge(40 * 2**20, with_length=with_length))
    cached = CachedBackend(make(server.url, timeout=10.0), tmp_path / "cache")
    with pytest.raises(RequestRejected, match="larger than 4096 KB"):
        cached.complete(req())
    assert server.calls == 1 and len(cached.store) == 0
    assert server.sent_bytes == 0  # a body without Content-Length was not read to its end
    cached.close()
    # a reply just under the cap is read
    server.plan(Reply.huge(2**20))
    assert make(server.url).complete(req()).text == "4"


# -- redirects and passwords ------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 307])
def test_a_redirect_is_reported_as_one_with_credentials_stripped(server: LLMServer, status: int) -> None:
    server.plan(Reply.redirect(status, "http://admin:hunter2pw@127.0.0.1:9/v2/chat/completions"))
    with pytest.raises(BackendError) as info:
        make(server.url).complete(req())
    msg = str(info.value)
    assert f"redirects (HTTP {status}) to http://127.0.0.1:9/v2/chat/completions" in msg
    # the redirect is not followed, so no 404 from the target is reported (the test server's
    # random port may itself contain "404", hence the "HTTP " prefix)
    assert "HTTP 404" not in msg and "hunter2pw" not in msg and "admin" not in msg
    assert server.calls == 1  # not followed


PASSWORD = "Qz9/Wx7#Kp4?Jm2"
FRAGMENTS = ("Qz9", "Wx7", "Kp4", "Jm2")


def test_a_password_with_slash_hash_question_mark_never_shows() -> None:
    url = f"http://user:{PASSWORD}@127.0.0.1:9/v1"
    with pytest.raises(ConfigError) as info:
        make(url)
    msg = str(info.value)
    assert "percent-encode" in msg
    assert not [f for f in FRAGMENTS if f in msg], msg
    # percent-encoded, the same password works and stays out of the identity
    b = make("http://user:Qz9%2FWx7%23Kp4%3FJm2@127.0.0.1:9/v1")
    assert b.identity == "openai:test-model@http://127.0.0.1:9/v1"
    assert not [f for f in FRAGMENTS if f in b.identity + repr(b)]


def test_cli_never_prints_a_piece_of_the_password(tmp_path) -> None:
    import os
    import subprocess
    import sys

    url = f"http://u:{PASSWORD}@127.0.0.1:9/v1"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "hdeval.cli", "train", "--task", str(Path(__file__).resolve().parent.parent / "examples" / "qa_task.toml"),
         "--llm", "m", "--base-url", url,
         "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "a")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert result.returncode == ConfigError.exit_code, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: --base-url")
    leaked = [f for f in FRAGMENTS if f in result.stdout + result.stderr]
    assert not leaked, result.stderr


# -- the reply schema goes to the server ------------------------------------------------------


def test_the_decomposition_schema_is_sent_and_a_rejection_falls_back_once(server: LLMServer) -> None:
    schema = reply_schema(3)
    b = make(server.url)
    server.plan(Reply.error(400, "Invalid schema for response_format 'reply': 'maxLength' is not permitted."))
    assert b.complete(req(json_mode=True, json_schema=schema)).text == "4"
    first, second = server.requests
    sent = first.json["response_format"]
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["schema"] == json.loads(schema) and sent["json_schema"]["strict"] is True
    assert sent["json_schema"]["name"]
    assert second.json["response_format"] == {"type": "json_object"}
    # remembered: the next request goes straight to plain JSON
    b.complete(req(json_mode=True, json_schema=schema))
    assert server.requests[2].json["response_format"] == {"type": "json_object"}
    assert b.schema_supported is False


def test_the_schema_is_bounded() -> None:
    item = json.loads(reply_schema(4))["properties"]["subcriteria"]
    props = item["items"]["properties"]
    assert item["maxItems"] == 4
    assert props["key"]["maxLength"] == 24
    assert props["name"]["maxLength"] <= 80 and props["definition"]["maxLength"] <= 300


def test_a_decomposition_the_server_rejects_names_the_criterion() -> None:
    from hdeval.core.errors import DecompositionError
    from hdeval.core.types import CriteriaTree
    from hdeval.data.tasks import load_task
    from hdeval.judge.prompts import load_templates
    from hdeval.methods.hdeval.decompose import decompose

    class Refusing:
        identity = "refusing"

        def complete(self, request: CompletionRequest) -> Completion:
            raise RequestRejected("the server rejected this request (HTTP 400): maximum context length is 8 tokens")

    task = load_task("sfres")
    tree = CriteriaTree.from_aspects(task.aspects)
    node = tree.layer(1)[0]
    with pytest.raises(DecompositionError) as info:
        decompose(Refusing(), load_templates()["decompose"], task, tree, node, 3)
    assert f"criterion {node.key!r}" in str(info.value) and "maximum context length" in str(info.value)


def test_a_rerun_re_asks_cached_invalid_decompositions_and_progress_says_so(tmp_path) -> None:
    from hdeval.core.errors import DecompositionError
    from hdeval.core.progress import Progress
    from hdeval.core.types import CriteriaTree
    from hdeval.data.tasks import load_task
    from hdeval.judge.prompts import load_templates
    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.methods.hdeval.decompose import decompose_nodes

    class Flaky(FakeBackend):
        broken = True
        asked = 0

        def complete(self, request: CompletionRequest) -> Completion:
            self.asked += 1
            if self.broken:
                return Completion('{"subcriteria": [{"key": "a", "name": "The summary should be a 1-5 scale, and a')
            return super().complete(request)

    class Record(Progress):
        def __init__(self) -> None:
            self.cached: list[bool] = []

        def advance(self, n: int = 1, cached: bool = False) -> None:
            self.cached.append(cached)

    task = load_task("sfres")
    tree = CriteriaTree.from_aspects(task.aspects)
    node = tree.layer(1)[0]
    inner = Flaky()
    llm = CachedBackend(inner, tmp_path / "cache")
    template = load_templates()["decompose"]
    with pytest.raises(DecompositionError, match="rerun asks again"):
        decompose_nodes(llm, template, task, tree, [node], 3)
    assert inner.asked == 3
    inner.broken = False  # the fix: another model, a server enforcing the schema
    progress = Record()
    grown = decompose_nodes(llm, template, task, tree, [node], 3, progress)
    assert len(grown.children(node.key)) == 3
    assert inner.asked == 4 and progress.cached == [False]  # asked once more, not replayed
    assert len(llm.store) == 4  # the three invalid replies are kept for inspection
    again = Record()
    decompose_nodes(llm, template, task, tree, [node], 3, again)
    assert inner.asked == 4 and again.cached == [True]
    llm.close()
