"""The Ray request answerer (called directly, no cluster) keeps every answered result when one
reply is bad (a deeply nested JSON body becomes that request's failed line, not a RecursionError
that loses the batch), and writes no secret a server echoes back, in any form."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import numpy as np
import pytest
from test_ray_answerer import _line, _Server

from hdeval.integrations.ray import RequestAnswerer

KEY = "sk-ray-SECRET-0a1b2c3d4e5f"


def _send(h, data: bytes) -> None:
    h.send_response(200)
    h.send_header("content-type", "application/json")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _completion(text: str) -> bytes:
    return json.dumps({"object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()


def test_one_deeply_nested_reply_is_a_failed_line_and_the_others_are_kept() -> None:
    def reply(h, srv):
        deep = srv.requests == 2
        _send(h, b'{"choices": ' + b"[" * 200_000 + b"]" * 200_000 + b"}" if deep else _completion("3"))

    with _Server(reply) as srv:
        answerer = RequestAnswerer(srv.url, timeout=20, max_retries=0, concurrency=1)
        lines = np.array([_line(c * 64) for c in "abc"], dtype=object)
        out = [json.loads(x) for x in answerer({"text": lines})["result"]]
    assert [o["custom_id"][0] for o in out] == ["a", "b", "c"]
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "3" and out[0]["error"] is None
    assert out[2]["response"]["status_code"] == 200 and out[2]["error"] is None
    assert out[1]["response"] is None and "not a chat completion" in out[1]["error"]["message"]


@pytest.mark.parametrize("status", [200, 401, 500])
def test_a_server_echoing_the_key_in_any_form_gets_none_of_it_written(monkeypatch, status: int) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    forms = [KEY, base64.b64encode(KEY.encode()).decode(), quote(KEY, safe=""),
             base64.b64encode(f"Bearer {KEY}".encode()).decode()]

    def echo(h, srv):
        said = f"you sent {h.headers.get('authorization')} " + " ".join(forms)
        if status == 200:
            _send(h, _completion(said))
        else:
            data = json.dumps({"error": {"message": said}}).encode()
            h.send_response(status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)

    with _Server(echo) as srv:
        answerer = RequestAnswerer(srv.url, timeout=20, max_retries=0, concurrency=1)
        (out,) = answerer({"text": np.array([_line()], dtype=object)})["result"]
    assert "you sent" in out
    for form in [KEY, KEY[4:], base64.b64encode(KEY.encode()).decode()[:20], quote(KEY, safe="")]:
        assert form not in out, (form, out)
