"""The OpenAI-compatible backend, through the real ``openai`` client, against a local server."""

from __future__ import annotations

import email.utils
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
from conftest import close_after_test
from llm_server import LLMServer, RecordedRequest, Reply, closed_port_url

from hdeval.core.errors import BackendError, ConfigError
from hdeval.llm.backends.base import Completion, CompletionRequest, Message, TokenLogprob
from hdeval.llm.backends.openai_compat import OpenAICompatBackend, retry_after_seconds
from hdeval.llm.cache.client import CachedBackend

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

KEY = "sk-test-SECRET-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as s:
        yield s


def make(server_or_url: LLMServer | str, **kwargs: object) -> OpenAICompatBackend:
    url = server_or_url.url if isinstance(server_or_url, LLMServer) else server_or_url
    options: dict = {"api_key": KEY, "timeout": 5.0, "max_retries": 3, "backoff_base": 0.01}
    options.update(kwargs)
    return close_after_test(OpenAICompatBackend(model="test-model", base_url=url, **options))


def req(text: str = "Rate this text.", **kwargs: object) -> CompletionRequest:
    return CompletionRequest(messages=(Message("system", "You rate texts 1-5."), Message("user", text)), **kwargs)


def assert_no_key(exc: BaseException) -> None:
    assert KEY not in str(exc)
    assert KEY not in repr(exc)
    # the chained exceptions would show in a traceback
    assert exc.__cause__ is None or KEY not in str(exc.__cause__)


# -- the request we send ---------------------------------------------------------------------


def test_request_parameters_and_key_only_in_authorization_header(server: LLMServer) -> None:
    c = make(server).complete(req(max_tokens=3, seed=7, json_mode=True, top_logprobs=5))
    assert c.text == "4"
    (r,) = server.requests
    assert r.path == "/v1/chat/completions"
    body = r.json
    assert body["model"] == "test-model"
    assert body["messages"] == [
        {"role": "system", "content": "You rate texts 1-5."},
        {"role": "user", "content": "Rate this text."},
    ]
    assert body["temperature"] == 0.0
    assert body["max_tokens"] == 3
    assert body["seed"] == 7
    assert body["response_format"] == {"type": "json_object"}
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    assert r.headers["authorization"] == f"Bearer {KEY}"
    assert KEY.encode() not in r.body
    assert KEY not in r.path
    assert all(KEY not in v for name, v in r.headers.items() if name != "authorization")


def test_optional_parameters_left_out(server: LLMServer) -> None:
    c = make(server).complete(req())
    body = server.requests[0].json
    for name in ("seed", "response_format", "logprobs", "top_logprobs"):
        assert name not in body
    assert c.top_logprobs is None


def test_identity_names_model_and_url_never_key() -> None:
    b = OpenAICompatBackend(model="m", base_url="http://127.0.0.1:8000/v1/", api_key=KEY)
    assert b.identity == "openai:m@http://127.0.0.1:8000/v1"
    assert KEY not in b.identity and KEY not in repr(b)
    assert OpenAICompatBackend(model="m", base_url="http://127.0.0.1:8000/v1", api_key="other").identity == b.identity
    real = OpenAICompatBackend(model="gpt-4o-mini", api_key=KEY)
    assert real.identity == "openai:gpt-4o-mini@https://api.openai.com/v1"
    creds = OpenAICompatBackend(model="m", base_url="http://user:pw@127.0.0.1:8000/v1", api_key=KEY)
    assert creds.identity == "openai:m@http://127.0.0.1:8000/v1"


def test_openai_without_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for base_url in (None, "https://api.openai.com/v1"):
        with pytest.raises(ConfigError, match="OPENAI_API_KEY.*--base-url"):
            OpenAICompatBackend(model="gpt-4o-mini", base_url=base_url, api_key=None)


def test_local_server_without_key_gets_placeholder(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-environment-must-not-be-used")
    make(server, api_key=None).complete(req())
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"


# -- parsing ---------------------------------------------------------------------------------


def test_logprobs_parsed_per_position(server: LLMServer) -> None:
    server.plan(Reply.ok("4.", logprobs=[[("4", -0.1), ("5", -2.5), ("3", -3.0)], [(".", -0.01)]]))
    c = make(server).complete(req(top_logprobs=3))
    assert c.text == "4."
    assert c.top_logprobs == (
        (TokenLogprob("4", -0.1), TokenLogprob("5", -2.5), TokenLogprob("3", -3.0)),
        (TokenLogprob(".", -0.01),),
    )
    assert (c.prompt_tokens, c.completion_tokens) == (12, 1)


def test_default_reply_logprobs_are_a_distribution(server: LLMServer) -> None:
    c = make(server).complete(req(top_logprobs=5))
    (first,) = c.top_logprobs or ()
    assert first[0].token == "4"
    assert math.isclose(sum(math.exp(t.logprob) for t in first), 1.0)


def test_logprobs_absent(server: LLMServer) -> None:
    server.logprobs = False
    c = make(server).complete(req(top_logprobs=5))
    assert c.text == "4"
    assert c.top_logprobs is None


def test_garbage_text_is_returned_as_is(server: LLMServer) -> None:
    server.reply_fn = lambda body: "I think it's pretty good"
    c = make(server).complete(req(top_logprobs=5))
    assert c.text == "I think it's pretty good"
    assert len(server.requests) == 1  # a reply we cannot score is not a transport fault


def test_garbage_text_becomes_a_recorded_scoring_failure(server: LLMServer) -> None:
    scoring = pytest.importorskip("hdeval.judge.scoring")
    server.reply_fn = lambda body: "I think it's pretty good"
    c = make(server).complete(req(top_logprobs=5))
    value, reason = scoring.parse_score(c)
    assert math.isnan(value) and reason and "pretty good" in reason


def test_base_url_must_be_http() -> None:
    with pytest.raises(ConfigError, match="http"):
        OpenAICompatBackend(model="m", base_url="localhost:8000/v1", api_key=KEY)


def test_null_content_and_missing_usage(server: LLMServer) -> None:
    server.plan(Reply.ok(None, usage=False))
    c = make(server).complete(req())
    assert c == Completion(text="", top_logprobs=None, prompt_tokens=0, completion_tokens=0)


def test_cached_prompt_tokens_reported(server: LLMServer) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 64}}
    server.plan(Reply.ok("3", usage=usage))
    c = make(server).complete(req())
    assert (c.prompt_tokens, c.prompt_tokens_evaluated) == (100, 36)


def test_logprobs_rejected_falls_back_once_and_remembers(server: LLMServer) -> None:
    server.reject_logprobs = True
    b = make(server)
    c = b.complete(req(top_logprobs=5))
    assert c.text == "4" and c.top_logprobs is None
    assert [r.asks_logprobs() for r in server.requests] == [True, False]
    assert not b.logprobs_supported
    b.complete(req("another text", top_logprobs=5))
    assert [r.asks_logprobs() for r in server.requests] == [True, False, False]


def test_other_400_is_not_mistaken_for_logprobs(server: LLMServer) -> None:
    server.plan(Reply.error(400, "context length exceeded"))
    b = make(server)
    with pytest.raises(BackendError, match="HTTP 400.*context length exceeded"):
        b.complete(req(top_logprobs=5))
    assert server.calls == 1 and b.logprobs_supported


# -- retries ---------------------------------------------------------------------------------


def test_429_with_retry_after_waits_then_succeeds(server: LLMServer) -> None:
    server.plan(Reply.rate_limited(retry_after=1))
    c = make(server, backoff_base=0.01).complete(req())
    assert c.text == "4"
    assert server.calls == 2
    # the retry came after the server's wait, not the (tiny) backoff; a lower bound only, so a
    # loaded machine cannot fail it
    assert server.requests[1].at - server.requests[0].at >= 0.9


def test_a_long_retry_wait_is_said_once_not_per_request(server: LLMServer, monkeypatch, caplog) -> None:
    # up to a minute of silence per retry read as a hang; every request that waits must not say it
    from hdeval.llm.backends import openai_compat

    monkeypatch.setattr(openai_compat, "LONG_WAIT", 0.5)
    server.plan(Reply.rate_limited(retry_after=1), Reply.rate_limited(retry_after=1))
    backend = make(server, backoff_base=0.01)
    with caplog.at_level("WARNING", logger="hdeval"):
        assert backend.complete(req()).text == "4"
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"the server at {server.url} asked to wait 1 s before retrying "
                    "(rate limited (HTTP 429): rate limit reached); waiting"]


def test_a_long_backoff_of_hdevals_own_is_not_put_on_the_server(server: LLMServer, monkeypatch, caplog) -> None:
    # a 503 without Retry-After: the wait is hdeval's backoff, which the warning said the server asked for
    from hdeval.llm.backends import openai_compat

    monkeypatch.setattr(openai_compat, "LONG_WAIT", 0.0)
    server.plan(Reply.error(503, "slow down"))
    with caplog.at_level("WARNING", logger="hdeval"):
        assert make(server, backoff_base=0.01).complete(req()).text == "4"
    (said,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said.startswith(f"the server at {server.url} keeps failing: backing off ") and "asked" not in said


def test_a_short_retry_wait_is_not_a_warning(server: LLMServer, caplog) -> None:
    server.plan(Reply.rate_limited(retry_after=1))
    with caplog.at_level("WARNING", logger="hdeval"):
        assert make(server, backoff_base=0.01).complete(req()).text == "4"
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_429_without_retry_after_uses_backoff(server: LLMServer) -> None:
    server.plan(Reply.rate_limited(), Reply.rate_limited())
    assert make(server).complete(req()).text == "4"
    assert server.calls == 3


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_then_success(server: LLMServer, status: int) -> None:
    server.plan(Reply.error(status, "upstream hiccup"))
    assert make(server).complete(req()).text == "4"
    assert server.calls == 2


def test_retries_exhausted_names_url_and_resume(server: LLMServer) -> None:
    server.default = lambda r: Reply.error(503, "overloaded")
    with pytest.raises(BackendError) as info:
        make(server, max_retries=2).complete(req())
    msg = str(info.value)
    assert server.calls == 3
    assert server.url in msg
    assert "HTTP 503" in msg and "overloaded" in msg and "3 attempts" in msg
    assert "cached" in msg and "resume" in msg
    assert "\n" not in msg
    assert_no_key(info.value)


def test_dropped_connection_then_success(server: LLMServer) -> None:
    server.plan(Reply.disconnect(), Reply.truncated())
    assert make(server).complete(req()).text == "4"
    assert server.calls == 3


@pytest.mark.parametrize(
    "bad",
    [
        Reply.raw(b"this is not json"),
        Reply.raw(b"<html>Bad Gateway</html>", content_type="text/html"),
        Reply.json({"object": "chat.completion"}),  # no choices
        Reply.json({"choices": []}),
    ],
)
def test_malformed_body_then_success(server: LLMServer, bad: Reply) -> None:
    server.plan(bad)
    assert make(server).complete(req()).text == "4"
    assert server.calls == 2


def test_malformed_body_retried_a_bounded_number_of_times(server: LLMServer) -> None:
    server.default = lambda r: Reply.raw(b'{"choices": nope')
    with pytest.raises(BackendError, match="malformed reply"):
        make(server, max_retries=10, max_malformed_retries=2).complete(req())
    assert server.calls == 3


def test_timeout_is_retried_then_fails(server: LLMServer) -> None:
    server.default = lambda r: Reply.hang(3)  # answers after 3 s: past the deadline, it would be a success
    with pytest.raises(BackendError, match="timeout") as info:
        make(server, timeout=0.3, max_retries=1).complete(req())
    assert server.calls == 2
    assert server.url in str(info.value)


def test_timeout_then_success(server: LLMServer) -> None:
    server.plan(Reply.hang(3))
    assert make(server, timeout=0.3).complete(req()).text == "4"
    assert server.calls == 2


def test_unreachable_server_fails_in_one_line_naming_it() -> None:
    url, holder = closed_port_url()
    try:
        with pytest.raises(BackendError) as info:
            make(url, max_retries=1).complete(req())
    finally:
        holder.close()
    msg = str(info.value)
    assert msg.startswith(f"cannot reach LLM server at {url}")
    assert "resume" in msg
    assert_no_key(info.value)


# -- errors that are not retried -------------------------------------------------------------


def test_401_fails_at_once_without_the_key(server: LLMServer) -> None:
    server.require_key = "sk-the-right-one"
    with pytest.raises(BackendError, match="rejected the API key") as info:
        make(server).complete(req())
    assert server.calls == 1
    assert_no_key(info.value)


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_other_4xx_fail_at_once(server: LLMServer, status: int) -> None:
    server.plan(Reply.error(status, "no such thing"))
    with pytest.raises(BackendError, match=f"HTTP {status}") as info:
        make(server).complete(req())
    assert server.calls == 1
    assert "no such thing" in str(info.value)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 429, 500])
def test_key_echoed_by_server_never_reaches_messages(server: LLMServer, status: int) -> None:
    def echo(r: RecordedRequest) -> Reply:
        auth = r.headers.get("authorization", "")
        return Reply.error(status, f"bad request from {auth}")

    server.default = echo
    with pytest.raises(BackendError) as info:
        make(server, max_retries=1).complete(req())
    assert_no_key(info.value)
    assert "\n" not in str(info.value)


# -- helpers, cache, threads -----------------------------------------------------------------


def test_retry_after_header_forms() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "0.5"}) == 0.5
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= (retry_after_seconds({"retry-after": date}, now=now) or 0) <= 31
    assert retry_after_seconds({"retry-after": email.utils.formatdate(now - 30, usegmt=True)}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_cached_backend_makes_one_request(server: LLMServer, tmp_path) -> None:
    cached = CachedBackend(make(server), tmp_path / "cache")
    try:
        first = cached.complete(req(top_logprobs=5))
        second = cached.complete(req(top_logprobs=5))
    finally:
        cached.close()
    assert server.calls == 1
    assert second.cached and not first.cached
    assert second == first


def test_concurrent_calls_share_one_backend(server: LLMServer) -> None:
    server.reply_fn = lambda body: str(len(body["messages"][-1]["content"]) % 5 + 1)
    server.plan(*[Reply.error(500) for _ in range(4)])  # some threads must retry
    b = make(server)
    texts = [f"sample {'x' * i}" for i in range(24)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda t: b.complete(req(t)), texts))
    assert [r.text for r in results] == [str(len(t) % 5 + 1) for t in texts]
    assert server.calls == 24 + 4
    assert threading.active_count() < 50


# -- Azure OpenAI --------------------------------------------------------------------------------


def _as_azure(monkeypatch: pytest.MonkeyPatch) -> None:
    # the loopback test server stands in for an Azure host (no name resolves there here)
    from hdeval.llm.backends import openai_compat

    monkeypatch.setattr(openai_compat, "AZURE_HOSTS", ("127.0.0.1",))


def test_azure_resource_url_gets_the_deployment_path(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_azure(monkeypatch)
    with pytest.raises(BackendError):  # the test server routes only /v1/chat/completions
        make(server.url.rstrip("/") + "?api-version=2024-06-01", max_retries=0).complete(req())
    r = server.requests[0]
    assert r.path.split("?")[0] == "/v1/deployments/test-model/chat/completions"
    assert "api-version=2024-06-01" in r.path
    assert r.headers.get("api-key") == KEY and "authorization" not in r.headers


def test_azure_deployment_url_is_used_as_given(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_azure(monkeypatch)
    url = server.url.rstrip("/").removesuffix("/v1") + "/v1/deployments/mine?api-version=2024-06-01"
    with pytest.raises(BackendError):
        make(url, max_retries=0).complete(req())
    assert server.requests[0].path.split("?")[0] == "/v1/deployments/mine/chat/completions"


def test_azure_needs_api_version_except_on_its_v1_api(server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_azure(monkeypatch)
    base = server.url.rstrip("/").removesuffix("/v1")
    with pytest.raises(ConfigError, match="api-version"):
        make(base + "/openai")
    with pytest.raises(BackendError):
        make(base + "/openai/v1", max_retries=0).complete(req())
    r = server.requests[0]
    assert r.path.split("?")[0] == "/openai/v1/chat/completions"
    assert r.headers["authorization"] == f"Bearer {KEY}"
