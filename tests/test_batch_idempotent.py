"""``--batch`` pays for each job once: a create that fails after the server made the job is never
followed by a second create unless the server says it has no job for that input file, and
``batches.json`` never holds a secret (a key in ``--base-url``'s query), only its hash."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from conftest import run_cli
from llm_server import RecordedRequest, Reply
from test_batch import MODEL, BatchServer, _no_waiting, server  # noqa: F401 - fixtures

from hdeval.llm.backends.batch import STATE_FILE, read_jobs


class CreateFailsAfterMaking(BatchServer):
    """Makes the job, then answers its create with 500; ``can_list`` False: GET /v1/batches is 404."""

    def __init__(self, can_list: bool) -> None:
        super().__init__()
        self.can_list = can_list

    def _route(self, req: RecordedRequest) -> Reply:
        path = req.path.split("?")[0].rstrip("/")
        if path == "/v1/batches" and req.method == "GET" and not self.can_list:
            return Reply.error(404, "listing batches is not supported")
        reply = super()._route(req)
        if path == "/v1/batches" and req.method == "POST" and reply.status == 200:
            return Reply.error(500, "internal error while creating the batch")
        return reply


def _train(toy, url: str, cache: Path, out: Path):
    task, data = toy
    return run_cli("train", "--task", task, "--data", data, "--layers", "1", "--aggregator", "lr", "--llm", MODEL,
                   "--base-url", url, "--cache-dir", cache, "-o", out, "--batch", "--max-retries", "2")


def test_a_create_that_fails_after_making_the_job_adopts_it(toy, tmp_path: Path) -> None:
    with CreateFailsAfterMaking(can_list=True) as s:
        r = _train(toy, s.url, tmp_path / "c", tmp_path / "art")
        assert r.exit_code == 0, r.output
        assert s.creates == 1  # one job made, found by its input file, and collected
        assert (tmp_path / "art").is_dir()


def test_a_server_that_cannot_list_jobs_stops_the_run_instead_of_paying_twice(toy, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    with CreateFailsAfterMaking(can_list=False) as s:
        r = _train(toy, s.url, cache, tmp_path / "art")
        assert r.exit_code != 0 and s.creates == 1, r.output
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        [job] = read_jobs(cache / STATE_FILE)
        assert len(errors) == 1 and job.input_file_id in errors[0] and str(cache / STATE_FILE) in errors[0]
        assert "Traceback" not in r.output
        # a rerun asks again and stops again: still one job
        assert _train(toy, s.url, cache, tmp_path / "art").exit_code != 0 and s.creates == 1
        # the user found the job on the server and wrote its id in, as the message says
        state = json.loads((cache / STATE_FILE).read_text())
        state["batches"][0]["id"] = next(iter(s.jobs))
        (cache / STATE_FILE).write_text(json.dumps(state))
        again = _train(toy, s.url, cache, tmp_path / "art")
        assert again.exit_code == 0, again.output
        assert s.creates == 1 and (tmp_path / "art").is_dir()


def test_a_key_in_the_base_urls_query_is_never_written_to_the_jobs_file(toy, tmp_path: Path, monkeypatch) -> None:
    secret = "sk-query-secret-4f2a9c"
    cache = tmp_path / "c"
    with CreateFailsAfterMaking(can_list=False) as s:  # leaves the job in batches.json
        r = _train(toy, f"{s.url}?api-key={secret}", cache, tmp_path / "art")
        assert r.exit_code != 0 and s.creates == 1
    blob = (cache / STATE_FILE).read_bytes()
    assert blob and read_jobs(cache / STATE_FILE)
    for form in (secret, quote(secret), base64.b64encode(secret.encode()).decode()):
        assert form.encode() not in blob
    assert secret not in r.output


def test_an_older_jobs_file_with_a_plain_identity_is_resumed_and_rewritten_hashed(toy, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    with CreateFailsAfterMaking(can_list=False) as s:
        url = f"{s.url}?api-key=sk-older-file-77"
        assert _train(toy, url, cache, tmp_path / "art").exit_code != 0
        state: dict[str, Any] = json.loads((cache / STATE_FILE).read_text())
        state["batches"][0]["identity"] = f"openai:{MODEL}@{url}"  # as an older hdeval wrote it
        state["batches"][0]["id"] = next(iter(s.jobs))
        (cache / STATE_FILE).write_text(json.dumps(state))
        r = _train(toy, url, cache, tmp_path / "art")
        assert r.exit_code == 0, r.output
        assert s.creates == 1  # the older file's job was this run's: not submitted again
