"""Secrets and odd values on the LLM call path: a key with a
control character, Basic credentials and a URL query never shown in any form, a query kept as a
query, bounded timeouts, a base URL with a space, an unreachable proxy named as such, and a
Retry-After of 0 that does not turn backoff off."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner
from conftest import close_after_test
from llm_server import LLMServer, RecordedRequest, Reply, closed_port_url

from hdeval.cli import cli
from hdeval.core.errors import BackendError, ConfigError, RequestRejected
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import OpenAICompatBackend, retry_wait
from hdeval.llm.cache.client import CachedBackend
from hdeval.llm.config import LLMConfig

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

# a task the repository ships with its data (the built-in sfres needs a download or
# HDEVAL_DATA_DIR, and a missing data file is reported before the checks tested here)
QA_TASK = str(Path(__file__).resolve().parent.parent / "examples" / "qa_task.toml")

KEY = "sk-proj-SECRET-0123456789abcdef"
PASSWORD = "hunter2-PASS-word"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as s:
        yield s


def req(text: str = "Rate this.") -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


def secret_free(text: str, *secrets: str) -> None:
    for s in secrets:
        assert s not in text, f"{s!r} in {text!r}"


@pytest.mark.parametrize("bad", ["\r", "\n", "\x00", "\x1b", " \t", "\u00e9"])
def test_a_key_with_a_control_character_is_refused_at_once_without_quoting_it(server: LLMServer, bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        OpenAICompatBackend("m", base_url=server.url, api_key=KEY + bad)
    msg = str(err.value)
    assert "control character" in msg and "\n" not in msg
    secret_free(msg, KEY[:12], repr(KEY)[1:12])
    assert server.calls == 0


def test_a_key_read_from_a_windows_env_file_stops_the_cli_with_one_line(server: LLMServer, tmp_path) -> None:
    result = CliRunner().invoke(cli, ["train", "--task", QA_TASK, "--llm", "m", "--base-url", server.url,
                                      "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "a")],
                                env={"OPENAI_API_KEY": KEY + "\r"})
    assert result.exit_code == ConfigError.exit_code, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "control character" in errors[0]
    secret_free(result.output, KEY[:12])
    assert server.calls == 0


def _echo(status: int):
    def reply(r: RecordedRequest) -> Reply:
        return Reply.error(status, f"bad credentials: {r.headers.get('authorization', '')} for {r.path}")
    return reply


@pytest.mark.parametrize("status", [400, 401, 403, 404, 503])
def test_basic_credentials_echoed_by_the_server_never_reach_a_message(server: LLMServer, status: int) -> None:
    url = server.url.replace("http://", f"http://user:{PASSWORD}@")
    server.default = _echo(status)
    b = close_after_test(OpenAICompatBackend("m", base_url=url, api_key=KEY, max_retries=1, backoff_base=0.01))
    with pytest.raises(BackendError) as err:
        b.complete(req())
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert server.requests[0].headers["authorization"] == f"Basic {basic}"
    secret_free(str(err.value), PASSWORD, basic, KEY)
    assert "\n" not in str(err.value)


def test_a_request_rejection_echoing_credentials_is_redacted_in_the_recorded_failure(server: LLMServer) -> None:
    from hdeval.judge.fill import Cell, fill_matrix

    url = server.url.replace("http://", f"http://user:{PASSWORD}@") + "?api-key=QUERY-SECRET-1234"
    server.default = lambda r: Reply.error(
        400, f"maximum context length exceeded for {r.headers.get('authorization')} at {r.path}")
    b = close_after_test(OpenAICompatBackend("m", base_url=url, api_key=KEY, max_retries=0))
    m = fill_matrix(CachedBackend(b, None), [Cell("s1", "c", (req(),))], lambda got: (1.0, None))
    (failure,) = m.failures
    assert math.isnan(m.values[0, 0]) and "context length" in failure.reason
    secret_free(failure.reason, PASSWORD, base64.b64encode(f"user:{PASSWORD}".encode()).decode(), "QUERY-SECRET")


def test_a_query_in_the_base_url_stays_a_query_and_is_never_shown(server: LLMServer) -> None:
    url = server.url + "?api-version=2024-06-01&api-key=QUERY-SECRET-1234"
    server.default = lambda r: Reply.ok("4")  # (the test server's default route has no query)
    b = close_after_test(OpenAICompatBackend("m", base_url=url, api_key=KEY, max_retries=1, backoff_base=0.01))
    assert b.complete(req()).text == "4"
    path = server.requests[0].path
    assert path.startswith("/v1/chat/completions?")  # the path goes before the query
    assert "api-version=2024-06-01" in path and "api-key=QUERY-SECRET-1234" in path
    server.default = lambda r: Reply.error(503, f"overloaded at {r.path}")
    with pytest.raises(BackendError) as err:
        b.complete(req("another"))
    secret_free(str(err.value) + repr(b), "QUERY-SECRET", "api-version")
    assert server.url in str(err.value)


@pytest.mark.parametrize("timeout", [math.inf, 1e10, math.nan, 0.0, -1.0])
def test_an_unbounded_timeout_is_refused_at_validation(timeout: float) -> None:
    with pytest.raises(ConfigError, match="--timeout must be above 0 and at most 3600 seconds"):
        LLMConfig(model="fake", timeout=timeout).check()


def test_the_cli_refuses_timeout_inf_with_one_line(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["train", "--task", QA_TASK, "--llm", "fake", "--timeout", "inf",
                                      "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "a")])
    assert result.exit_code == ConfigError.exit_code
    assert result.stderr.strip().splitlines()[-1].startswith("error: --timeout must be above 0")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1 ", "http://127.0.0.1:8000/ v1", "http://127.0.0.1 :80/v1"])
def test_a_base_url_with_a_space_is_refused_at_once(url: str) -> None:
    with pytest.raises(ConfigError, match="space or a control character"):
        OpenAICompatBackend("m", base_url=url + "?api-key=QUERY-SECRET", api_key=KEY)


def test_an_unreachable_proxy_is_named_as_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy, holder = closed_port_url()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", f"http://puser:{PASSWORD}@").rsplit("/v1", 1)[0])
        b = close_after_test(OpenAICompatBackend("m", base_url="http://llm.example:8000/v1", api_key=KEY, max_retries=0))
        with pytest.raises(BackendError) as err:
            b.complete(req())
    finally:
        holder.close()
    msg = str(err.value)
    assert msg.startswith("cannot reach the proxy http://127.0.0.1:") and "llm.example" in msg
    secret_free(msg, PASSWORD)


@pytest.mark.parametrize("retry_after", [0.0, None])
def test_a_retry_after_of_zero_or_a_past_date_does_not_turn_backoff_off(retry_after) -> None:
    # a past HTTP-date reads as 0 s (test_openai_backend: test_retry_after_header_forms)
    for attempt in (1, 2, 5):
        assert retry_wait(attempt, retry_after, 0.5, 30.0) >= min(0.5 * 2 ** (attempt - 1), 30.0)
    assert retry_wait(1, 5.0, 0.5, 30.0) == 5.0  # a longer wait the server asks for is honoured
    assert retry_wait(1, 1e9, 0.5, 30.0) == 60.0  # capped


def test_a_request_rejection_is_still_one_cells_failure_through_the_client(server: LLMServer) -> None:
    server.plan(Reply.error(413, "too large"))
    cb = CachedBackend(close_after_test(OpenAICompatBackend("m", base_url=server.url, api_key=KEY, max_retries=0)), None)
    got = cb.complete_many([req("a"), req("b")], keep_rejected=True)
    rejected = [g for g in got if isinstance(g, RequestRejected)]  # either may get the planned 413
    assert len(rejected) == 1 and "HTTP 413" in str(rejected[0])
    assert [g.text for g in got if not isinstance(g, RequestRejected)] == ["4"]
