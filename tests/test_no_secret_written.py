"""Nothing the tool writes or prints holds a secret, in any form: after train, train --batch,
apply, report, apply --export-requests, the Ray request answerer and cache import, all against a
server that echoes every secret it gets (the Bearer key, the base URL's Basic credentials and
query, the proxy's Proxy-Authorization) raw, base64- and percent-encoded in its errors, in
replies and in Batch API error lines, no written file (every cache entry decoded, every zip
member read) and no command's output holds any form of any of them."""

from __future__ import annotations

import base64
import dataclasses
import json
import sqlite3
import zipfile
from pathlib import Path
from urllib.parse import quote, urlsplit

import numpy as np
import pytest
from llm_server import RecordedRequest, Reply
from test_batch import BatchServer, _no_waiting  # noqa: F401 - the fixture: no poll interval

from conftest import cache_entries, run_cli

KEY = "sk-proj-LEAKTEST-0a1b2c3d4e5f6789"
QUERY_SECRET = "qs-LEAKTEST-77aa88bb"
GW_PASSWORD = "gw-LEAKTEST-pass-42"
PROXY_PASSWORD = "px-LEAKTEST-pass-99"
SECRETS = (KEY, QUERY_SECRET, GW_PASSWORD, f"gw:{GW_PASSWORD}", PROXY_PASSWORD, f"puser:{PROXY_PASSWORD}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def forms_of(secret: str) -> set[str]:
    """How a secret may be found: as it is, percent-encoded, base64 (standard and URL-safe) at
    each alignment inside a longer text (the characters that depend on the secret alone)."""
    found = {secret, quote(secret, safe=""), quote(secret, safe="").lower()}
    raw = secret.encode()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for pad in range(3):
            text = encode(b"\0" * pad + raw).decode()
            found.add(text[-(-8 * pad // 6): 8 * (pad + len(raw)) // 6])
    return found


FORMS = sorted(set().union(*(forms_of(s) for s in SECRETS)), key=len)


def leaks(text: str) -> list[str]:
    return [f for f in FORMS if f in text]


def echo_of(req: RecordedRequest) -> str:
    """Every credential the request carried, raw, base64- and percent-encoded, and decoded."""
    parts = []
    for name in ("authorization", "proxy-authorization", "api-key"):
        value = req.headers.get(name, "")
        if not value:
            continue
        token = value.split(" ", 1)[-1]
        decoded = base64.b64decode(token + "==").decode("latin-1") if value.startswith("Basic ") else token
        parts.append(f"{name}: {value} b64={_b64(value.encode())} pct={quote(value, safe='')} decoded={decoded} "
                     f"decoded-b64={_b64(decoded.encode())} decoded-pct={quote(decoded, safe='')}")
    return f"you sent {req.path} " + " ; ".join(parts)


class EchoServer(BatchServer):
    """The Batch test server (also the proxy: it takes the absolute-form requests a proxy gets)
    echoing every credential: a 500 quoting them the first time each chat body comes, a reply
    quoting them for every fifth scoring request, and Batch API error lines quoting them."""

    def __init__(self) -> None:
        super().__init__()
        self.first_seen: set[bytes] = set()
        self.scored = 0
        self.last_echo = ""

    def _route(self, req: RecordedRequest) -> Reply:
        url = urlsplit(req.path)
        req = dataclasses.replace(req, path=url.path)  # the proxy's absolute form, query apart
        self.last_echo = echo_of(dataclasses.replace(req, path=f"{url.path}?{url.query}"))
        if url.path.rstrip("/") == "/v1/chat/completions":
            if req.body not in self.first_seen:
                self.first_seen.add(req.body)
                return Reply.error(500, self.last_echo)
            reply = super()._route(req)
            body = reply.body
            if self.kind_of(req) == "score" and isinstance(body, dict):
                self.scored += 1
                if self.scored % 5 == 0:
                    message = body["choices"][0]["message"]
                    message["content"] = f"{message['content']} ({self.last_echo})"
            return reply
        if url.path.rstrip("/") == "/v1/batches" and req.method == "POST" and not self.jobs:
            lines = self.files[req.json["input_file_id"]].splitlines()
            self.fail_once |= {json.loads(line)["custom_id"] for line in lines[:2]}  # error lines: echoes
        reply = super()._route(req)
        if url.path.rstrip("/") == "/v1/batches" and req.method == "POST":
            job = self.jobs[f"batch_{len(self.jobs) - 1}"]
            fid = job.get("_error_file_id")
            if fid:
                self.files[fid] = self.files[fid].replace(b"the server had an error",
                                                          json.dumps(self.last_echo)[1:-1].encode())
        return reply


def _written(root: Path, skip: set[Path]) -> list[tuple[str, str]]:
    """(where, text) of every file under ``root``: raw bytes, zip members, cache entries decoded."""
    out: list[tuple[str, str]] = []
    for f in sorted(root.rglob("*")):
        if not f.is_file() or f in skip:
            continue
        out.append((str(f), f.read_bytes().decode("latin-1")))
        if zipfile.is_zipfile(f):
            with zipfile.ZipFile(f) as z:
                out += [(f"{f}!{n}", z.read(n).decode("latin-1")) for n in z.namelist()]
        if f.name == "replies.db":
            out += [(f"{f}#{k}", json.dumps(c.to_dict())) for k, c in cache_entries(f.parent).items()]
            with sqlite3.connect(f) as con:
                assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    return out


@pytest.mark.slow
def test_no_command_writes_or_prints_a_secret_in_any_form(toy, tmp_path: Path, monkeypatch) -> None:
    from hdeval.integrations.ray import RequestAnswerer

    task, data = toy
    with EchoServer() as server:
        port = urlsplit(server.url).port
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
            monkeypatch.delenv(name.lower(), raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://puser:{PROXY_PASSWORD}@127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        keyed = f"http://llm.invalid:8000/v1?api-key={QUERY_SECRET}"  # reached through the proxy only
        basic = f"http://gw:{GW_PASSWORD}@llm.invalid:8000/v1"
        art, out = tmp_path / "art", tmp_path / "out"
        out.mkdir()
        llm = ("--llm", "m", "--max-retries", "3")
        runs = [
            run_cli("train", "--task", task, "--data", data, *llm, "--base-url", keyed, "--layers", "1",
                    "--aggregator", "lr", "--cache-dir", tmp_path / "c1", "-o", art),
            run_cli("train", "--task", task, "--data", data, *llm, "--base-url", keyed, "--layers", "1",
                    "--aggregator", "lr", "--cache-dir", tmp_path / "c2", "-o", tmp_path / "art-batch", "--batch"),
            run_cli("apply", art, data, "-o", out / "scored.jsonl", *llm, "--base-url", basic,
                    "--cache-dir", tmp_path / "c1"),
            run_cli("report", art, "-o", out / "report", "--cache-dir", tmp_path / "c1", "--base-url", keyed,
                    "--max-samples", "10", "--repeats", "1", "--curve-points", "2"),
            run_cli("apply", art, data, "--export-requests", out / "requests.jsonl", *llm, "--base-url", keyed,
                    "--cache-dir", tmp_path / "c3"),
        ]
        for r in runs:
            assert r.exit_code == 0, r.output
        # the Ray answerer's work, as each of its workers does it, and the import of its results
        answerer = RequestAnswerer(keyed, timeout=20, max_retries=0, concurrency=2)
        lines = (out / "requests.jsonl").read_text().splitlines()
        results = answerer({"text": np.array(lines, dtype=object)})["result"]
        (out / "results.jsonl").write_text("".join(f"{x}\n" for x in results))
        answerer.close()
        runs.append(run_cli("cache", "import", out / "results.jsonl", "--requests", out / "requests.jsonl",
                            "--cache-dir", tmp_path / "c3"))
        assert runs[-1].exit_code == 0, runs[-1].output
        assert server.creates >= 1 and server.scored >= 5  # every echo path was taken
    # the server did echo them: what follows would find them if they got through
    assert leaks(server.last_echo) and any("you sent" in x for x in results), results[:2]
    assert any("***" in r.output for r in runs)
    inputs = {Path(task), Path(data)}
    found = [(where, leaks(text)) for where, text in _written(tmp_path, inputs) if leaks(text)]
    found += [(f"output of run {i}", leaks(r.output)) for i, r in enumerate(runs) if leaks(r.output)]
    assert found == [], found[:5]
