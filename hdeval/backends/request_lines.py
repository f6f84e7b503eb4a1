"""One request line and one result line of the OpenAI batch format: what ``--batch``
(:mod:`hdeval.backends.batch`) and request files (:mod:`hdeval.request_files`, for any batch
engine) both write and read. Here, below the cache, so the backends need nothing above them."""

from __future__ import annotations

import json
from typing import Any

from hdeval.backends.base import CompletionRequest
from hdeval.errors import one_line

ENDPOINT = "/v1/chat/completions"


def request_line(inner: Any, key: str, request: CompletionRequest) -> bytes:
    """One batch input line for ``request``: the body ``inner`` (an OpenAI-compatible backend)
    would send for it, under ``custom_id`` = its cache key."""
    # the body the client sends (OpenAICompatBackend._params, answer constraint included); its
    # headers (X-Hdeval-Kind) are sent apart, so a batch line has none
    body = inner._params(request, bool(request.top_logprobs) and inner.logprobs_supported)
    return (json.dumps({"custom_id": key, "method": "POST", "url": ENDPOINT, "body": body},
                       ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def result_outcome(row: Any) -> tuple[dict | None, str | None]:
    """(chat completion body, None) for a successful result row; (None, why) otherwise."""
    response = row.get("response") if isinstance(row, dict) else None
    code = response.get("status_code") if isinstance(response, dict) else None
    body = response.get("body") if isinstance(response, dict) else None
    if code == 200 and isinstance(body, dict):
        return body, None
    err = row.get("error") if isinstance(row, dict) and isinstance(row.get("error"), dict) else None
    if err is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
    msg = one_line(str(err.get("message") or err.get("code") or "")) if err else ""
    return None, (f"HTTP {one_line(str(code))[:40]}: {msg}" if code else (msg or "no response"))


