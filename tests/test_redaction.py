"""One redaction for every form of every secret (hdeval.core.redaction): the key as it is, base64 at any
alignment and percent-encoded, as Azure's ``api-key`` header carries it, the proxy's
``user:password`` (sent as ``Proxy-Authorization: Basic``) and the base URL's Basic credentials and
query; applied to messages, and to a reply's text before it is cached."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pytest
from conftest import close_after_test
from llm_server import LLMServer, RecordedRequest, Reply

from hdeval.core.errors import BackendError
from hdeval.core.redaction import Redactor
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.llm.cache.client import CachedBackend

pytestmark = pytest.mark.usefixtures("no_leaked_resources")

KEY = "sk-proj-REDACT-0123456789abcdef"
PASSWORD = "proxy-PASS-w0rd"
URL_PASSWORD = "basic-PASS-9876"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def every_form(*secrets: str) -> list[str]:
    """What a search for a secret looks for: as it is, percent-encoded, base64 at each alignment."""
    forms = []
    for s in secrets:
        forms += [s, quote(s, safe=""), b64(s), b64(" " + s)[4:-4], b64("  " + s)[4:-4], b64("Bearer " + s)[8:-4]]
    return forms


def leaks(text: str, *secrets: str) -> list[str]:
    return [f for f in every_form(*secrets) if f and f in text]


@pytest.fixture
def server(monkeypatch) -> Iterator[LLMServer]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    with LLMServer() as s:
        yield s


def req(text: str = "Rate this.") -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


def _echo_everything(status: int):
    """An error (or, for 200, a reply) quoting every header it got, raw, base64 and percent-encoded."""
    def reply(r: RecordedRequest) -> Reply:
        said = " | ".join(f"{k}: {v} b64={b64(v)} pct={quote(v, safe='')} "
                          f"inner={b64(v.split(' ', 1)[-1])} dec={base64.b64decode(v.split(' ', 1)[-1] + '==').decode('latin-1') if v.startswith('Basic ') else ''}"
                          for k, v in r.headers.items() if k in ("authorization", "api-key", "proxy-authorization"))
        said += f" path={r.path} key-b64={b64(KEY)} key-pct={quote(KEY, safe='')} azure={b64('api-key: ' + KEY)}"
        return Reply.ok(f"4 {said}") if status == 200 else Reply.error(status, said)
    return reply


@pytest.mark.parametrize("status", [400, 403, 404, 503])
def test_the_key_echoed_base64_or_percent_encoded_never_reaches_a_message(server: LLMServer, status: int) -> None:
    server.default = _echo_everything(status)
    b = close_after_test(OpenAICompatBackend("m", base_url=server.url + "?api-key=QSECRET-4711", api_key=KEY,
                                             max_retries=1, backoff_base=0.01))
    with pytest.raises(BackendError) as err:
        b.complete(req())
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    msg = str(err.value)
    assert "***" in msg and leaks(msg, KEY, "QSECRET-4711") == []


def test_the_proxys_credentials_are_never_printed(server: LLMServer, monkeypatch) -> None:
    """The proxy (here the test server itself, which sees the whole URL) quotes the request headers,
    Proxy-Authorization among them, in its error body."""
    monkeypatch.setenv("HTTP_PROXY", server.url.replace("http://", f"http://puser:{PASSWORD}@").rsplit("/v1", 1)[0])
    server.default = _echo_everything(502)
    b = close_after_test(OpenAICompatBackend("m", base_url="http://llm.invalid:8000/v1", api_key=KEY,
                                             max_retries=0))
    with pytest.raises(BackendError) as err:
        b.complete(req())
    assert server.requests[0].headers["proxy-authorization"] == "Basic " + b64(f"puser:{PASSWORD}")
    msg = str(err.value)
    assert "proxy-authorization" in msg and leaks(msg, PASSWORD, f"puser:{PASSWORD}", KEY) == []


def test_basic_auth_of_the_base_url_in_any_form_is_never_printed(server: LLMServer) -> None:
    server.default = _echo_everything(403)
    url = server.url.replace("http://", f"http://gw:{URL_PASSWORD}@")
    b = close_after_test(OpenAICompatBackend("m", base_url=url, api_key=KEY, max_retries=0))
    with pytest.raises(BackendError) as err:
        b.complete(req())
    assert leaks(str(err.value), URL_PASSWORD, f"gw:{URL_PASSWORD}", KEY) == []


def test_a_reply_quoting_the_key_is_cached_without_it(server: LLMServer, tmp_path: Path) -> None:
    server.default = _echo_everything(200)
    b = close_after_test(OpenAICompatBackend("m", base_url=server.url, api_key=KEY, max_retries=0))
    client = CachedBackend(b, tmp_path / "cache")
    try:
        got = client.complete(req())
    finally:
        client.close()
    assert got.text.startswith("4 ") and "***" in got.text and leaks(got.text, KEY) == []
    for f in (tmp_path / "cache").rglob("*"):
        if f.is_file():
            data = f.read_bytes().decode("latin-1")
            assert leaks(data, KEY) == [], f


def test_the_azure_api_key_form_and_every_alignment_is_masked() -> None:
    redact = Redactor(KEY, "https://r.openai.azure.com/openai?api-version=2024-06-01")
    for text in (f"api-key: {KEY}", b64(f"api-key: {KEY}"), b64(f"x-api-key={KEY};"), quote(KEY, safe=""),
                 quote(KEY, safe="").lower(), repr(KEY), base64.urlsafe_b64encode(f"?{KEY}>".encode()).decode()):
        assert leaks(redact(text), KEY) == [], text
    assert redact("a short word and 12345 stay") == "a short word and 12345 stay"


def test_the_cli_masks_a_known_secret_in_any_error_line(monkeypatch) -> None:
    """The error boundary's last net: a message that quotes the environment's key or the proxy's
    password (a server's id echoed back, say) is printed with them masked."""
    import click
    from click.testing import CliRunner

    from hdeval.cli.boundary import guarded

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HTTPS_PROXY", f"http://puser:{PASSWORD}@127.0.0.1:3128")

    @click.command()
    @click.option("--base-url")
    @guarded
    def cmd(base_url: str | None) -> None:
        raise BackendError(f"the server answered an id {KEY} via {b64('puser:' + PASSWORD)} at {base_url}")

    r = CliRunner().invoke(cmd, ["--base-url", "http://h/v1?api-key=QSECRET-4711"])
    assert r.exit_code == BackendError.exit_code and "error: the server answered an id ***" in r.stderr
    assert leaks(r.stderr, KEY, PASSWORD, f"puser:{PASSWORD}", "QSECRET-4711") == []


@pytest.mark.parametrize("key", ["test", "EMPTY", "none"])
def test_a_short_key_is_masked_as_a_token_and_leaves_words_and_paths_whole(key: str) -> None:
    """Local servers are often given a word for a key (vLLM's docs say EMPTY): the words and
    paths that merely contain it are not the key and must reach the user as they are."""
    redact = Redactor(key)
    for text in (f"/tmp/latest_{key}s/task.toml: not found", f"{key}ing {key}s Co{key}", f"x{key}y"):
        assert redact(text) == text
    for text in (f"Bearer {key}", f'"api-key": "{key}"', f"?api-key={key}&x=1", f"api-key%3D{key}%26"):
        assert key not in redact(text) and "***" in redact(text), text


def test_the_cli_keeps_a_path_that_holds_a_short_key_word(monkeypatch, tmp_path: Path) -> None:
    from conftest import run_cli

    monkeypatch.setenv("OPENAI_API_KEY", "test")
    where = tmp_path / "latest_test" / "task.toml"
    r = run_cli("train", "--task", where, "--llm", "fake", "-o", tmp_path / "a")
    assert r.exit_code != 0 and "latest_test" in r.stderr and "***" not in r.stderr, r.stderr
