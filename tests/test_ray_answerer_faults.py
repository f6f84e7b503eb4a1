"""``answer_requests_on_ray`` on a local Ray cluster keeps every answered result when one reply is
bad: a deeply nested JSON body (which raised RecursionError and lost the whole run, its paid
answers with it) is that request's failed line in results.jsonl, and the rest import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')
pytest.importorskip("ray.data", reason='the Ray tests need Ray Data: pip install -e ".[ray]"')

from test_ray_answerer import _Server  # noqa: E402

from conftest import write_jsonl  # noqa: E402
from hdeval.integrations.ray import answer_requests_on_ray  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


def test_one_deeply_nested_reply_does_not_lose_the_run(tmp_path: Path) -> None:
    def reply(h, srv):
        body = json.loads(h.last_body)
        text = body["messages"][0]["content"]
        data = (b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}" if text == "q7" else json.dumps(
            {"object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "a" + text}, "finish_reason": "stop"}]}
        ).encode())
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    lines = [{"custom_id": f"{i:064x}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 1}}
             for i in range(12)]
    requests = write_jsonl(tmp_path / "requests.jsonl", lines)
    results = tmp_path / "results.jsonl"
    with _Server(reply) as srv:
        n = answer_requests_on_ray(requests, results, srv.url, workers=1, batch_size=4, concurrency=2)
    assert n == 12
    rows = {r["custom_id"]: r for r in map(json.loads, results.read_text().splitlines())}
    bad = rows.pop(f"{7:064x}")
    assert bad["response"] is None and "not a chat completion" in bad["error"]["message"]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in rows.values())
