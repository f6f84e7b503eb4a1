"""``--batch``: a stage's uncached requests through the OpenAI Batch API, against a local server.

:class:`BatchServer` is the fault-free :class:`llm_server.FaultServer` (answers like hdeval's
fake LLM, on 127.0.0.1) plus ``/v1/files`` (upload, content) and ``/v1/batches`` (create,
retrieve, list). A batch line is answered, as a chat call is, from the kind and data its
request declared (the server's book of the requests built in the test). Jobs answer "in_progress" to their first status check, then finish; tests script partial
failures, expiry and malformed result lines per request key.
"""

from __future__ import annotations

import asyncio
import email.parser
import json
import threading
from contextlib import closing
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from click.testing import CliRunner
from conftest import artifact_view
from llm_server import FaultServer, RecordedRequest, Reply, completion_body, fake_answer

from hdeval.cli import cli
from hdeval.core.errors import BackendError, BudgetExceeded, CacheError
from hdeval.llm.backends import batch as batch_mod
from hdeval.llm.backends.batch import STATE_FILE, BatchAPI, read_jobs
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.run.train import train

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

MODEL = "m"


class BatchServer(FaultServer):
    """FaultServer + the Batch API's files and jobs (all in memory)."""

    def __init__(self) -> None:
        super().__init__(lifetime=600)
        self.files: dict[str, bytes] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.polls: dict[str, int] = {}
        self.fail_once: set[str] = set()  # custom_ids answered by an error line (the first time)
        self.malformed_once: set[str] = set()  # custom_ids whose result line is not JSON (first time)
        self.hollow_once: set[str] = set()  # custom_ids answered 200 with a body that is no completion
        self.expire_first: int | None = None  # the first job expires after this many results
        self.batched: list[str] = []  # every custom_id submitted, in order
        self.default = self._route

    def _route(self, req: RecordedRequest) -> Reply:
        url = urlsplit(req.path)
        path = url.path.rstrip("/")
        if path == "/v1/files" and req.method == "POST":
            return self._upload(req)
        if path.startswith("/v1/files/") and path.endswith("/content"):
            data = self.files.get(path.split("/")[3])
            return Reply.raw(data, content_type="application/jsonl") if data is not None else Reply.error(404, "no file")
        if path == "/v1/batches" and req.method == "POST":
            return self._create(req.json)
        if path == "/v1/batches" and req.method == "GET":
            after = parse_qs(url.query).get("after", [None])[0]
            data = list(self.jobs.values())
            if after is not None:
                data = data[[j["id"] for j in data].index(after) + 1:]
            return Reply.json({"object": "list", "data": data, "has_more": False})
        if path.startswith("/v1/batches/"):
            return self._retrieve(path.split("/")[3])
        return self._answer(req)

    def _upload(self, req: RecordedRequest) -> Reply:
        msg = email.parser.BytesParser().parsebytes(
            b"Content-Type: " + req.headers["content-type"].encode() + b"\r\n\r\n" + req.body)
        fields = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                  for part in msg.get_payload()}
        if fields.get("purpose") != b"batch":
            return Reply.error(400, "purpose must be batch")
        fid = f"file-{len(self.files)}"
        self.files[fid] = fields["file"]
        return Reply.json({"id": fid, "object": "file", "purpose": "batch", "bytes": len(fields["file"])})

    def _create(self, body: Any) -> Reply:
        if body.get("endpoint") != "/v1/chat/completions" or body.get("completion_window") != "24h":
            return Reply.error(400, "bad batch")
        self.creates += 1
        bid = f"batch_{len(self.jobs)}"
        lines = [json.loads(line) for line in self.files[body["input_file_id"]].splitlines()]
        out, err = [], []
        expire = self.expire_first if len(self.jobs) == 0 else None
        for n, line in enumerate(lines):
            cid = line["custom_id"]
            self.batched.append(cid)
            assert line["method"] == "POST" and line["url"] == "/v1/chat/completions"
            if expire is not None and n >= expire:
                continue
            if cid in self.fail_once:
                self.fail_once.discard(cid)
                err.append(json.dumps({"id": f"r{n}", "custom_id": cid, "response": {"status_code": 500, "body": {
                    "error": {"message": "the server had an error", "type": "server_error"}}}, "error": None}))
                continue
            if cid in self.malformed_once:
                self.malformed_once.discard(cid)
                out.append('{"custom_id": "' + cid + '", "response": {"status_code": 200, "body": {"choi')
                continue
            if cid in self.hollow_once:
                self.hollow_once.discard(cid)
                out.append(json.dumps({"custom_id": cid, "response": {"status_code": 200, "body": {"choices": []}}}))
                continue
            completion = fake_answer(self.book, line["body"], self.fake)
            out.append(json.dumps({"id": f"r{n}", "custom_id": cid, "response": {
                "status_code": 200, "body": completion_body(completion, line["body"]["model"])}, "error": None}))
        job = {"id": bid, "object": "batch", "input_file_id": body["input_file_id"], "status": "validating",
               "output_file_id": None, "error_file_id": None, "metadata": body.get("metadata"),
               "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
               "_counts": {"total": len(lines), "completed": len(out), "failed": len(err)},
               "_final": "expired" if expire is not None else "completed"}
        for name, rows in (("output_file_id", out), ("error_file_id", err)):
            if rows:
                fid = f"file-{len(self.files)}"
                self.files[fid] = ("\n".join(rows) + "\n").encode()
                job["_" + name] = fid
        self.jobs[bid] = job
        return Reply.json(self._public(job))

    def _retrieve(self, bid: str) -> Reply:
        job = self.jobs.get(bid)
        if job is None:
            return Reply.error(404, "no such batch")
        self.polls[bid] = self.polls.get(bid, 0) + 1
        if self.polls[bid] == 1:
            job["status"] = "in_progress"
        else:
            job["status"] = job["_final"]
            job["output_file_id"] = job.get("_output_file_id")
            job["error_file_id"] = job.get("_error_file_id")
            job["request_counts"] = job["_counts"]
        return Reply.json(self._public(job))

    @staticmethod
    def _public(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    def chat_kinds(self) -> set[str]:
        """Prompt kinds of the chat completions that came the normal way."""
        return {a.kind for a in self.log}


@pytest.fixture
def server() -> Iterator[BatchServer]:
    with BatchServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch) -> None:
    monkeypatch.setenv(batch_mod.POLL_ENV, "0")
    monkeypatch.setattr(batch_mod, "MIN_POLL", 0.0)


def _train(toy, server: BatchServer, cache: Path, out: Path, *extra: str):
    task, data = toy
    args = ["train", "--task", str(task), "--data", str(data), "--layers", "2", "--aggregator", "lr",
            "--llm", MODEL, "--base-url", server.url, "--cache-dir", str(cache), "-o", str(out), *extra]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _backend(server: BatchServer) -> OpenAICompatBackend:
    return OpenAICompatBackend(MODEL, base_url=server.url, api_key="sk-batch-test", max_retries=1,
                               backoff_base=0.01, backoff_cap=0.05)


class _Recording(batch_mod.Progress):
    """A progress that keeps the batch path's messages, for the tests that read them."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = messages

    def message(self, text: str) -> None:
        self.messages.append(text)


def _api_train(toy, server: BatchServer, cache: Path, **options: Any):
    task, data = toy
    with closing(_backend(server)) as backend:  # an injected backend is the caller's to close
        return train(task=str(task), data=str(data), layers=1, aggregator="lr", cache_dir=str(cache),
                     batch=True, backend=backend, **options)


def _on_own_loop(api: BatchAPI, call: Any) -> Any:
    """Await ``call`` on a loop of its own, ``api``'s connections closed before that loop ends."""
    async def go() -> Any:
        try:
            return await call
        finally:
            await api.aclose()

    return asyncio.run(go())


# -- end to end ---------------------------------------------------------------------------------
def test_a_batched_training_run_scores_exactly_like_a_normal_one(toy, server: BatchServer, tmp_path: Path) -> None:
    ref = _train(toy, server, tmp_path / "c-ref", tmp_path / "ref")
    assert ref.exit_code == 0, ref.stderr
    normal_calls = len(server.log)
    assert server.chat_kinds() == {"decompose", "score"}

    r = _train(toy, server, tmp_path / "c-batch", tmp_path / "batched", "--batch")
    assert r.exit_code == 0, r.stderr
    assert artifact_view(tmp_path / "batched") == artifact_view(tmp_path / "ref")
    # the scoring went as batch jobs (one per layer), only the decompositions the normal way
    assert server.creates == 2
    assert {a.kind for a in server.log[normal_calls:]} == {"decompose"}
    assert "batch batch_0: 0/" in r.stderr and "batch batch_1: " in r.stderr
    assert "/72 done" in r.stderr  # 36 samples x 2 aspects in layer 1
    # the batch results count as calls made, not as cache hits
    assert "cache hits: 0" in r.stderr
    # every job was collected: nothing left to resume
    assert read_jobs(tmp_path / "c-batch" / STATE_FILE) == []

    # a rerun finds everything cached and submits nothing
    again = _train(toy, server, tmp_path / "c-batch", tmp_path / "again", "--batch")
    assert again.exit_code == 0, again.stderr
    assert server.creates == 2 and "LLM calls made: 0" in again.stderr


def test_batch_needs_an_openai_compatible_backend(toy, tmp_path: Path) -> None:
    task, data = toy
    r = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake", "--batch",
                                 "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        "error: --batch needs an OpenAI-compatible backend (--llm MODEL, with --base-url for another server), "
        "not --llm fake"]
    assert not (tmp_path / "out").exists()


def test_dry_run_shows_the_batch_price(toy, tmp_path: Path) -> None:
    task, data = toy
    args = ["train", "--task", str(task), "--data", str(data), "--layers", "1", "--llm", "gpt-4o-mini",
            "--cache-dir", str(tmp_path / "c"), "--dry-run", "--price-in", "1000", "--price-out", "1000"]
    normal = CliRunner().invoke(cli, args)
    batched = CliRunner().invoke(cli, [*args, "--batch"])
    assert normal.exit_code == 0 and batched.exit_code == 0, batched.stderr
    cost = float(normal.stdout.split("estimated cost: at most ")[1].split()[0])
    assert "with --batch" not in normal.stdout
    assert f"with --batch: about {cost / 2:.2f} (the Batch API's half price per token)" in batched.stdout


# -- resume, partial failure, expiry ------------------------------------------------------------
class Killed(BaseException):
    """A kill of the process, simulated: nothing in hdeval catches it."""


def _then_die(real):
    """``real`` (a BatchAPI method), then a simulated kill: the server did it, the process never heard."""
    async def call_then_die(self, *args, **kwargs):
        await real(self, *args, **kwargs)
        raise Killed()

    return call_then_die


def test_a_run_killed_after_submitting_resumes_the_same_job(toy, server: BatchServer, tmp_path: Path,
                                                            monkeypatch) -> None:
    real = BatchAPI.create
    # the server has the job (and will charge for it) and the process dies before hearing its id
    monkeypatch.setattr(BatchAPI, "create", _then_die(real))
    with pytest.raises(Killed):
        _api_train(toy, server, tmp_path / "c")
    assert server.creates == 1
    jobs = read_jobs(tmp_path / "c" / STATE_FILE)
    assert len(jobs) == 1 and jobs[0].id is None and len(jobs[0].keys) == 72  # recorded before creating
    monkeypatch.setattr(BatchAPI, "create", real)

    # killed again while polling, now that the job's id is known
    real_retrieve = BatchAPI.retrieve
    monkeypatch.setattr(BatchAPI, "retrieve", _then_die(real_retrieve))
    with pytest.raises(Killed):
        _api_train(toy, server, tmp_path / "c")
    assert read_jobs(tmp_path / "c" / STATE_FILE)[0].id == "batch_0"
    monkeypatch.setattr(BatchAPI, "retrieve", real_retrieve)

    ev = _api_train(toy, server, tmp_path / "c")
    assert server.creates == 1  # never submitted again
    assert len(server.batched) == 72
    assert ev.metrics["usage"]["calls"] == 72
    assert read_jobs(tmp_path / "c" / STATE_FILE) == []


def test_a_partly_failed_batch_resubmits_only_the_failed(toy, server: BatchServer, tmp_path: Path) -> None:
    ref = _api_train(toy, server, tmp_path / "ref")
    first = list(server.batched)
    server.batched.clear()
    server.fail_once = set(first[:5])
    ev = _api_train(toy, server, tmp_path / "c")
    assert server.batched[:72] == first and sorted(server.batched[72:]) == sorted(first[:5])
    assert server.creates == 3  # reference, the run, the resubmission of the 5
    assert ev.metrics["final"] == ref.metrics["final"]
    assert ev.metrics["usage"]["calls"] == 72


def test_an_expired_batch_resubmits_only_the_missing(toy, server: BatchServer, tmp_path: Path) -> None:
    server.expire_first = 30
    messages: list[str] = []
    ev = _api_train(toy, server, tmp_path / "c", progress=_Recording(messages))
    assert server.creates == 2
    assert server.batched[72:] == server.batched[30:72]  # the 42 it did not finish, nothing else
    assert any(m.startswith("42 of 72 requests have no batch result (42 x no result (the batch ended expired))")
               for m in messages), messages
    assert ev.metrics["usage"]["calls"] == 72
    assert server.chat_kinds() == set()  # nothing went the normal way


def test_a_malformed_result_line_is_a_recorded_failure_not_a_crash(toy, server: BatchServer,
                                                                   tmp_path: Path) -> None:
    _api_train(toy, server, tmp_path / "ref")
    keys = list(server.batched)
    # broken the first time and in the resubmission: the request ends up sent the normal way
    server.malformed_once = {keys[0]}
    real_create = server._create

    def create(body):
        if server.creates == 2:  # the resubmission
            server.malformed_once = {keys[0]}
        return real_create(body)

    server._create = create  # type: ignore[method-assign]
    messages: list[str] = []
    ev = _api_train(toy, server, tmp_path / "c", progress=_Recording(messages))
    assert any(m.startswith("1 of 72 requests have no batch result (1 x no readable result (output file line")
               for m in messages), messages
    assert any(m.startswith("1 requests still have no batch result") and "normal API" in m for m in messages)
    assert server.chat_kinds() == {"score"} and len(server.log) == 1  # that one request, the normal way
    assert ev.metrics["usage"]["calls"] == 72


def test_a_result_body_that_is_no_chat_completion_is_that_requests_failure(toy, server: BatchServer,
                                                                           tmp_path: Path) -> None:
    _api_train(toy, server, tmp_path / "ref")
    server.hollow_once = {list(server.batched)[0]}
    messages: list[str] = []
    ev = _api_train(toy, server, tmp_path / "c", progress=_Recording(messages))
    assert any(m.startswith("1 of 72 requests have no batch result (1 x output file line")
               and "not a chat completion" in m for m in messages), messages
    assert ev.metrics["usage"]["calls"] == 72 and not server.log  # the resubmission answered it


# -- the jobs file is untrusted -------------------------------------------------------------------
@pytest.mark.parametrize("content, why", [
    (b"not json", "not JSON"),
    (b'{"version": 1, "batches": [{"identity": "x", "input_file_id": "../etc", "keys": ["a"]}]}',
     "batches[0].input_file_id is not an id"),
    (b'{"version": 1, "batches": [{"identity": "x", "input_file_id": "file-1", "id": "b/../x", "keys": []}]}',
     "batches[0].id is not an id"),
    (b'{"version": 1, "batches": [{"identity": "x", "input_file_id": "file-1", "keys": ["zz"]}]}',
     "batches[0].keys is not a list of request hashes"),
])
def test_a_bad_jobs_file_is_a_one_line_error(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / STATE_FILE
    path.write_bytes(content)
    with pytest.raises(CacheError) as err:
        read_jobs(path)
    assert str(err.value).startswith(f"{path}: {why}: not a batch list hdeval wrote")
    assert "\n" not in str(err.value)


def test_a_server_id_that_is_not_an_id_never_reaches_a_url(server: BatchServer) -> None:
    api = BatchAPI(server.url, "k", max_retries=0)
    with pytest.raises(Exception) as err:
        _on_own_loop(api, api.retrieve("../files/x"))
    assert "not an id" in str(err.value)
    assert server.calls == 0


# -- the HTTP side --------------------------------------------------------------------------------
def test_the_key_goes_only_in_the_authorization_header(toy, server: BatchServer, tmp_path: Path) -> None:
    _api_train(toy, server, tmp_path / "c")
    batch_requests = [r for r in server.requests if "/chat/completions" not in r.path]
    assert {r.path.split("?")[0].rstrip("/").rsplit("/", 1)[0] for r in batch_requests} >= {"/v1", "/v1/batches"}
    for r in batch_requests:
        assert r.headers["authorization"] == "Bearer sk-batch-test"
        assert "sk-batch-test" not in r.path and b"sk-batch-test" not in r.body
        assert all("sk-batch-test" not in v for k, v in r.headers.items() if k != "authorization")
    assert "sk-batch-test" not in (tmp_path / "c" / STATE_FILE).read_text()


def test_a_redirect_is_reported_not_followed(toy, server: BatchServer, tmp_path: Path) -> None:
    server.plan(Reply.redirect(307, "http://127.0.0.1:1/v1/files"))
    with pytest.raises(BackendError) as err:
        _api_train(toy, server, tmp_path / "c")
    assert "redirects (HTTP 307)" in str(err.value) and "does not follow redirects" in str(err.value)
    assert server.calls == 1 and server.creates == 0


def test_a_job_the_server_forgot_says_which_file_names_it(toy, server: BatchServer, tmp_path: Path,
                                                         monkeypatch) -> None:
    real = BatchAPI.create
    monkeypatch.setattr(BatchAPI, "create", _then_die(real))
    with pytest.raises(Killed):
        _api_train(toy, server, tmp_path / "c")
    monkeypatch.setattr(BatchAPI, "create", real)
    jobs = read_jobs(tmp_path / "c" / STATE_FILE)
    jobs[0].id = "batch_99"
    batch_mod.write_jobs(tmp_path / "c" / STATE_FILE, jobs)
    with pytest.raises(BackendError) as err:
        _api_train(toy, server, tmp_path / "c")
    assert "HTTP 404" in str(err.value) and f"batch batch_99 is named in {tmp_path / 'c' / STATE_FILE}" in str(err.value)
    assert server.creates == 1


def test_max_calls_stops_before_submitting_more(toy, server: BatchServer, tmp_path: Path) -> None:
    with pytest.raises(BudgetExceeded) as err:
        _api_train(toy, server, tmp_path / "c", max_calls=50)
    assert "--batch would submit 72 new requests, more than the 50 left under --max-calls 50" in str(err.value)
    assert server.calls == 0 and not (tmp_path / "c" / STATE_FILE).exists()


def test_apply_with_batch_scores_like_apply_without(toy, server: BatchServer, tmp_path: Path) -> None:
    task, data = toy
    assert _train(toy, server, tmp_path / "c-train", tmp_path / "art", "--layers", "1").exit_code == 0

    def apply(cache: str, out: str, *extra: str):
        r = CliRunner().invoke(cli, ["apply", str(tmp_path / "art"), str(data), "-o", str(tmp_path / out),
                                     "--base-url", server.url, "--cache-dir", str(tmp_path / cache), *extra],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
        return r

    apply("c-normal", "normal.jsonl")
    creates = server.creates
    r = apply("c-batch", "batched.jsonl", "--batch")
    assert server.creates == creates + 1 and "batch batch_" in r.stderr
    assert (tmp_path / "batched.jsonl").read_text() == (tmp_path / "normal.jsonl").read_text()


@pytest.mark.parametrize("limit, expect", [("requests", [30, 30, 12]), ("bytes", None)])
def test_a_stage_is_split_within_the_apis_file_limits(toy, server: BatchServer, tmp_path: Path, monkeypatch,
                                                      limit: str, expect) -> None:
    ref = _api_train(toy, server, tmp_path / "ref")
    line_size = max(len(line) + 1 for line in server.files["file-0"].splitlines())
    first = server.creates
    if limit == "requests":
        monkeypatch.setattr(batch_mod, "MAX_FILE_REQUESTS", 30)
    else:
        monkeypatch.setattr(batch_mod, "MAX_FILE_BYTES", 10 * line_size)
    ev = _api_train(toy, server, tmp_path / "c")
    inputs = [server.files[j["input_file_id"]] for j in list(server.jobs.values())[first:]]
    sizes = [len(f.splitlines()) for f in inputs]
    if expect is not None:
        assert sizes == expect
    else:
        assert all(len(f) <= 10 * line_size for f in inputs) and sum(sizes) == 72 and len(sizes) >= 6
    assert ev.metrics["final"] == ref.metrics["final"]


def test_a_server_without_the_batch_api_is_a_clear_error(toy, tmp_path: Path) -> None:
    from llm_server import FaultServer

    with FaultServer() as plain:  # chat completions only, like vLLM or Ollama
        with pytest.raises(BackendError) as err:
            _api_train(toy, plain, tmp_path / "c")  # type: ignore[arg-type]
    assert "answered HTTP 404" in str(err.value)
    assert str(err.value).endswith("does this server offer the Batch API? run without --batch")
    assert not (tmp_path / "c" / STATE_FILE).exists()


# -- one batch per cache directory at a time --------------------------------------------------------
def test_a_second_batch_in_the_same_cache_dir_is_refused_while_the_first_runs(toy, server: BatchServer,
                                                                              tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "c"
    lock = cache / batch_mod.LOCK_FILE
    real = BatchAPI.retrieve
    second: list[Any] = []

    def start_another() -> None:
        with pytest.raises(CacheError) as err:
            _api_train(toy, server, cache)
        second[0] = err.value

    async def poll_and_start_another(self, *args, **kwargs):
        if not second:  # while the first run's job runs, a second run on the same cache directory
            second.append(None)
            await asyncio.to_thread(start_another)  # another thread: the LLM loop stays free for it
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(BatchAPI, "retrieve", poll_and_start_another)
    first = _api_train(toy, server, cache)
    msg = str(second[0])
    assert msg == (f"another hdeval process is running a batch in the cache directory {cache} (it holds {lock}): "
                   "wait until it ends, or pass another --cache-dir")
    assert server.creates == 1 and len(server.batched) == 72  # the second run submitted nothing
    assert first.metrics["usage"]["calls"] == 72
    # the lock went with the first run: a rerun finds everything cached and submits nothing
    monkeypatch.setattr(BatchAPI, "retrieve", real)
    again = _api_train(toy, server, cache)
    assert server.creates == 1 and again.metrics["usage"]["calls"] == 0


def test_the_batch_lock_is_released_however_the_holder_ends(toy, server: BatchServer, tmp_path: Path,
                                                            monkeypatch) -> None:
    import os
    import subprocess
    import sys

    cache = tmp_path / "c"
    cache.mkdir()
    # another process takes the lock and keeps it until it is killed
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from hdeval.llm.backends.batch import batch_lock\n"
         f"with batch_lock({str(cache)!r}):\n    print('locked', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = _train(toy, server, cache, tmp_path / "out", "--layers", "1", "--batch")
        assert r.exit_code == 1
        assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
            f"error: another hdeval process is running a batch in the cache directory {cache} "
            f"(it holds {cache / batch_mod.LOCK_FILE}): wait until it ends, or pass another --cache-dir"]
        assert server.calls == 0 and not (tmp_path / "out").exists() and not (cache / STATE_FILE).exists()
    finally:
        holder.kill()
        holder.communicate()  # waits, and closes its pipes
    # killed: the system released its lock
    r = _train(toy, server, cache, tmp_path / "out", "--layers", "1", "--batch")
    assert r.exit_code == 0, r.stderr
    assert server.creates == 1

    # a run that dies inside its batch releases the lock too, and the next run resumes its job
    real = BatchAPI.retrieve
    monkeypatch.setattr(BatchAPI, "retrieve", _then_die(real))
    with pytest.raises(Killed):
        _api_train(toy, server, tmp_path / "c2")
    monkeypatch.setattr(BatchAPI, "retrieve", real)
    with batch_mod.batch_lock(tmp_path / "c2"):  # free again
        pass
    assert _api_train(toy, server, tmp_path / "c2").metrics["usage"]["calls"] == 72 and server.creates == 2


def test_a_lock_file_that_is_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / batch_mod.LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheError) as err:
        with batch_mod.batch_lock(tmp_path / "c"):
            pass
    assert str(err.value).startswith(f"cannot lock the batch lock file {tmp_path / 'c' / batch_mod.LOCK_FILE} (")
    assert not (tmp_path / "elsewhere").exists()


# -- stuck states ---------------------------------------------------------------
def test_a_poll_interval_of_zero_is_bounded(monkeypatch) -> None:
    monkeypatch.undo()
    monkeypatch.setenv(batch_mod.POLL_ENV, "0")
    assert batch_mod.poll_interval() >= 1.0
    monkeypatch.setenv(batch_mod.POLL_ENV, "5")
    assert batch_mod.poll_interval() == 5.0


def test_a_finished_job_with_a_bad_output_file_id_is_dropped_and_its_requests_asked_again(
        toy, server: BatchServer, tmp_path: Path) -> None:
    real = server._retrieve

    def bad_output(bid: str) -> Reply:
        reply = real(bid)
        if isinstance(reply.body, dict) and reply.body.get("status") == "completed" and bid == "batch_0":
            reply.body["output_file_id"] = "../../etc/passwd"
        return reply

    server._retrieve = bad_output  # type: ignore[method-assign]
    cache = tmp_path / "c"
    ev = _api_train(toy, server, cache)  # the job is dropped; its requests go again (batch, then normal)
    assert read_jobs(cache / STATE_FILE) == []
    assert not any("etc/passwd" in r.path for r in server.requests)
    assert ev.metrics["usage"]["calls"] == 72
    again = _api_train(toy, server, cache)  # not stuck: everything is cached
    assert again.metrics["usage"]["calls"] == 0


def test_a_job_whose_requests_were_answered_without_batch_is_dropped(toy, server: BatchServer, tmp_path: Path,
                                                                     monkeypatch) -> None:
    cache = tmp_path / "c"
    real = BatchAPI.create
    monkeypatch.setattr(BatchAPI, "create", _then_die(real))
    with pytest.raises(Killed):
        _api_train(toy, server, cache)
    monkeypatch.setattr(BatchAPI, "create", real)
    assert len(read_jobs(cache / STATE_FILE)) == 1
    task, data = toy
    with closing(_backend(server)) as backend:  # the same requests, answered the normal way
        train(task=str(task), data=str(data), layers=1, aggregator="lr", cache_dir=str(cache), backend=backend)
    _api_train(toy, server, cache)  # nothing to submit; the stale job goes
    assert read_jobs(cache / STATE_FILE) == []


def test_the_batch_jobs_run_on_the_llm_loop_with_every_other_call(toy, server: BatchServer, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """Every Batch API request is made on the one LLM loop (AsyncOpenAI's files/batches), not
    on a synchronous client in a worker thread; the results are the same as without --batch."""
    from hdeval.llm import aio

    real = BatchAPI._request
    threads: list[bool] = []

    async def on_which_thread(self, *args, **kwargs):
        threads.append(threading.current_thread() is aio._thread)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(BatchAPI, "_request", on_which_thread)
    ev = _api_train(toy, server, tmp_path / "c")
    assert threads and all(threads), threads
    assert ev.metrics["usage"]["calls"] == 72 and server.creates == 1


@pytest.mark.parametrize("reply, why", [
    # each read is quick, so only a deadline on the request as a whole ends it
    (Reply(body=json.dumps({"id": "batch_0", "object": "batch", "status": "completed",
                            "pad": "x" * 40}).encode(), drip=0.05), "no complete reply within the 0.5s timeout"),
    (Reply.huge(3 * 2**20), "a reply larger than 2048 KB"),
    (Reply.raw(b"[" * 100_000), "a reply that is not JSON"),
])
def test_a_hostile_batch_api_reply_is_bounded_and_a_one_line_error(server: BatchServer, reply: Reply,
                                                                   why: str) -> None:
    server.plan(reply, reply)
    api = BatchAPI(server.url, "sk-hostile", timeout=0.5, max_retries=1, backoff_base=0.01, backoff_cap=0.01)
    with pytest.raises(BackendError) as err:
        _on_own_loop(api, api.retrieve("batch_0"))
    msg = str(err.value)
    assert msg.startswith(f"the Batch API (GET {server.url}/batches/batch_0) kept failing after 2 attempt(s), "
                          f"last: {why};") and "\n" not in msg and "sk-hostile" not in msg
    assert server.calls == 2


def test_a_result_file_cut_off_while_downloaded_is_fetched_again(server: BatchServer, tmp_path: Path) -> None:
    content = b'{"custom_id": "x"}\n' * 1000
    server.files["file-0"] = content
    server.plan(Reply(body=content, truncate=100))  # then the file whole, from the files route
    api = BatchAPI(server.url, "k", max_retries=1, backoff_base=0.01, backoff_cap=0.01)
    _on_own_loop(api, api.download("file-0", tmp_path / "out.jsonl"))
    assert (tmp_path / "out.jsonl").read_bytes() == content and server.calls == 2


def test_a_result_file_cut_off_every_time_is_a_one_line_error(server: BatchServer, tmp_path: Path) -> None:
    cut = Reply(body=b'{"custom_id": "x"}\n' * 1000, truncate=100)
    server.plan(cut, cut)
    api = BatchAPI(server.url, "sk-cut", max_retries=1, backoff_base=0.01, backoff_cap=0.01)
    with pytest.raises(BackendError) as err:
        _on_own_loop(api, api.download("file-0", tmp_path / "out.jsonl"))
    msg = str(err.value)
    assert msg.startswith(f"the Batch API (GET {server.url}/files/file-0/content) kept failing after "
                          "2 attempt(s), last: RemoteProtocolError") and "\n" not in msg and "sk-cut" not in msg
    assert server.calls == 2
