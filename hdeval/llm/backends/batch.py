"""The OpenAI Batch API (``--batch``): a stage's uncached requests at half the price, each result
cached under the key a normal call uses; what a job leaves without a result is resubmitted once,
then sent normally. Nothing paid for is lost or paid twice: ``batches.json`` names each job before
it is created, so a rerun resumes it. What the server returns, and that file, are untrusted."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence

import httpx2
import openai

from hdeval.core.errors import BackendError, BudgetExceeded, CacheError, ConfigError, one_line
from hdeval.core.progress import Progress
from hdeval.llm import aio
from hdeval.llm.backends.base import Backend, Completion, CompletionRequest
from hdeval.llm.backends.openai_compat import (
    _RETRY_STATUSES,
    BATCH_ENDPOINT,
    OpenAICompatBackend,
    ReplyTooLarge,
    _error_detail,
    _Transient,
    _within,
    read_completion,
    result_outcome,
    retry_after_seconds,
    retry_policy,
    retry_wait,
)
from hdeval.llm.config import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

POLL_ENV = "HDEVAL_BATCH_POLL_INTERVAL"  # seconds between status checks of a batch job
DEFAULT_POLL = 30.0
COMPLETION_WINDOW = "24h"
# The API's limits per input file: 50,000 requests and 200 MB (a little kept in reserve)
MAX_FILE_REQUESTS = 50_000
MAX_FILE_BYTES = 190 * 10**6
MAX_REPLY_BYTES = 2 * 2**20  # a batch or file object is a few KB
MAX_LINE_BYTES = 8 * 2**20  # one result line: a chat completion with logprobs
MAX_RESULT_BYTES = 2 * 2**30  # one output or error file
DOWNLOAD_SECONDS = 3600.0  # one output or error file, as a whole
MAX_LIST_PAGES = 20  # looking for a job by its input file
META_INPUT = "hdeval_input"  # the job's metadata names its input file, so a listed job is found by it
STATE_FILE = "batches.json"
LOCK_FILE = "batches.lock"  # held (flock) by the one process running a batch in a cache directory
MAX_STATE_BYTES = 64 * 2**20
STATE_VERSION = 1
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
RESUBMIT_ROUNDS = 1  # requests a finished job left without a result are resubmitted this often

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
_KEY = re.compile(r"[0-9a-f]{64}\Z")
MIN_POLL = 1.0  # a job takes minutes to hours: polling faster only loads the server


def poll_interval() -> float:
    """Seconds between status checks: ``$HDEVAL_BATCH_POLL_INTERVAL`` (at least ``MIN_POLL``) or 30."""
    raw = os.environ.get(POLL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_POLL
    return max(value, MIN_POLL) if 0 <= value < 86_400 else DEFAULT_POLL


def _check_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        shown = one_line(repr(value))[:60]
        raise BackendError(f"the Batch API answered a {what} that is not an id: {shown}")
    return value


class BatchAPI:
    """``/v1/files`` and ``/v1/batches`` through the SDK's resources, on the LLM loop. JSON replies
    are read raw (bounded by the client) and parsed here; transient failures are retried
    ``max_retries`` times on the chat path's policy; anything else is a one-line :class:`BackendError`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        # the URL's credentials, its query (Azure's api-version), the proxy: as for a normal call
        server = OpenAICompatBackend("batch", base_url=base_url, api_key=api_key, timeout=timeout)
        self._sdk = server.sdk_client(max_reply_bytes=MAX_REPLY_BYTES, socket_timeout=timeout)
        self._files = server.sdk_client(max_reply_bytes=MAX_RESULT_BYTES, socket_timeout=timeout)
        self.redact = server.redact  # the key, and the URL's credentials and query
        self.display_url = server.shown_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._used = False  # its connections (if any) belong to the LLM loop

    def close(self) -> None:
        if self._used:
            self._used = False
            aio.run(self.aclose())

    async def aclose(self) -> None:
        """Close both SDK clients' connections (on the loop that opened them)."""
        await self._sdk.close()
        await self._files.close()

    async def upload(self, jsonl: bytes, name: str = "hdeval-batch.jsonl") -> str:
        """Upload a batch input file; its id."""
        reply = await self._json(
            "POST",
            "files",
            lambda api: api.files.with_raw_response.create(
                file=(name, jsonl, "application/jsonl"), purpose="batch"
            ),
        )
        return _check_id(reply.get("id"), "file id")

    async def create(self, input_file_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        """Create one batch job (tried once: a retry could create a second paid job; the
        caller looks for the job by its input file instead). A failure after which the server
        may have made the job anyway (5xx, a timeout, a dropped connection) is :class:`MaybeCreated`."""
        return await self._json(
            "POST",
            "batches",
            lambda api: api.batches.with_raw_response.create(
                input_file_id=input_file_id,
                endpoint=BATCH_ENDPOINT,
                completion_window=COMPLETION_WINDOW,
                metadata=metadata,
            ),
            retries=0,
            uncertain=MaybeCreated,
        )

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        batch_id = _check_id(batch_id, "batch id")
        return await self._json(
            "GET", f"batches/{batch_id}", lambda api: api.batches.with_raw_response.retrieve(batch_id)
        )

    async def find(self, input_file_id: str) -> dict[str, Any] | None:
        """The job whose input is ``input_file_id`` (and whose metadata, when it has hdeval's,
        names that file too), if the server lists one; a :class:`BackendError` when it cannot list."""
        after: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await self._json(
                "GET",
                "batches",
                lambda api, after=after: api.batches.with_raw_response.list(
                    limit=100, **({"after": after} if after else {})
                ),
            )
            data = page.get("data")
            if not isinstance(data, list):
                return None
            for job in data:
                meta = job.get("metadata") if isinstance(job, dict) else None
                named = meta.get(META_INPUT, input_file_id) if isinstance(meta, dict) else input_file_id
                if (
                    isinstance(job, dict)
                    and job.get("input_file_id") == input_file_id
                    and named == input_file_id
                ):
                    return job
            last = data[-1].get("id") if data and isinstance(data[-1], dict) else None
            if not page.get("has_more") or not isinstance(last, str) or not _ID.match(last):
                return None
            after = last
        return None

    async def download(self, file_id: str, dest: Path) -> None:
        """A file's content into ``dest`` (at most MAX_RESULT_BYTES: the files client's bound)."""
        file_id = _check_id(file_id, "file id")

        async def read() -> None:
            async with self._files.files.with_streaming_response.content(file_id) as response:
                with open(dest, "wb") as fh:
                    async for chunk in response.iter_bytes():
                        fh.write(chunk)

        await self._request(
            "GET",
            f"files/{file_id}/content",
            read,
            f"{MAX_RESULT_BYTES // 2**20} MB",
            seconds=max(self.timeout, DOWNLOAD_SECONDS),
        )

    async def _json(
        self,
        method: str,
        path: str,
        send: Callable[[Any], Awaitable[Any]],
        retries: int | None = None,
        uncertain: type[BackendError] = BackendError,
    ) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            raw = await send(self._sdk)
            try:
                parsed = json.loads(raw.http_response.content)
            except (ValueError, RecursionError):
                raise _Transient("a reply that is not JSON") from None
            if not isinstance(parsed, dict):
                raise _Transient("a reply that is not a JSON object")
            return parsed

        return await self._request(
            method, path, read, f"{MAX_REPLY_BYTES // 1024} KB", retries=retries, uncertain=uncertain
        )

    async def _request(
        self,
        method: str,
        path: str,
        read: Callable[[], Awaitable[Any]],
        cap: str,
        *,
        retries: int | None = None,
        seconds: float | None = None,
        uncertain: type[BackendError] = BackendError,
    ) -> Any:
        """``read()`` (a request and its reply, bounded by its client at ``cap``) within ``seconds``;
        the last of transient failures (the server may have acted on the request) is ``uncertain``."""
        retries = self.max_retries if retries is None else retries
        seconds = self.timeout if seconds is None else seconds
        where = f"{method} {self.display_url}/{path}"
        self._used = True

        async def attempt() -> Any:
            try:
                return await _within(seconds, read())
            except (asyncio.TimeoutError, openai.APITimeoutError):
                raise _Transient(f"no complete reply within the {seconds:g}s timeout") from None
            except openai.APIStatusError as exc:
                status = exc.status_code
                if 300 <= status < 400:
                    raise BackendError(
                        f"the Batch API ({where}) redirects (HTTP {status}); hdeval does not "
                        "follow redirects: give the final address as --base-url"
                    ) from None
                detail = _error_detail(status, exc.body)[1]
                if not (status >= 500 or status in _RETRY_STATUSES):
                    hint = (
                        "; does this server offer the Batch API? run without --batch"
                        if status in (404, 405) and not path.startswith("batches/")
                        else ""
                    )
                    raise BackendError(
                        self.redact(f"the Batch API ({where}) answered HTTP {status}: {detail}{hint}")
                    ) from None
                wait = retry_after_seconds(exc.response.headers)
                raise _Transient(f"HTTP {status}: {detail}", retry_after=wait) from None
            except (openai.APIConnectionError, httpx2.TransportError) as exc:
                # the SDK wraps what fails while sending; a streamed body fails while read, unwrapped
                cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) else exc
                if isinstance(cause, ReplyTooLarge):
                    raise _Transient(f"a reply larger than {cap}") from None
                what = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
                raise _Transient(one_line(what)) from None

        try:
            return await retry_policy(retries, self.backoff_base, self.backoff_cap)(attempt)
        except _Transient as last:
            raise uncertain(
                self.redact(
                    f"the Batch API ({where}) kept failing after {retries + 1} attempt(s), last: {last}; "
                    "every finished result is cached and the jobs are kept in the cache directory, so "
                    "rerunning the same command resumes"
                )
            ) from None


class MaybeCreated(BackendError):
    """A job's create failed in a way that may have left the job made (and paid for) anyway."""


def job_identity(identity: str) -> str:
    """What ``batches.json`` records of a backend identity: its hash, since the identity may
    quote a secret (a key in ``--base-url``'s query)."""
    return "sha256:" + hashlib.sha256(identity.encode("utf-8")).hexdigest()


@dataclasses.dataclass
class Job:
    """One submitted input file: its job id once the server named it, and the keys it holds."""

    identity: str
    input_file_id: str
    keys: list[str]
    id: str | None = None


def read_jobs(path: Path) -> list[Job]:
    """The jobs in ``batches.json`` (none when absent); a one-line :class:`CacheError` naming the
    file and entry when it is not one hdeval wrote."""

    def bad(why: str) -> CacheError:
        return CacheError(
            f"{path}: {why}: not a batch list hdeval wrote; move it aside to go on "
            "(requests of jobs it names would then be submitted again)"
        )

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_STATE_BYTES + 1)
    if len(raw) > MAX_STATE_BYTES:
        raise bad(f"larger than {MAX_STATE_BYTES // 2**20} MB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise bad("not JSON") from None
    if (
        not isinstance(data, dict)
        or data.get("version") != STATE_VERSION
        or not isinstance(data.get("batches"), list)
    ):
        raise bad(f"no version {STATE_VERSION} 'batches' list")
    jobs = []
    for i, e in enumerate(data["batches"]):
        where = f"batches[{i}]"
        if not isinstance(e, dict):
            raise bad(f"{where} is not an object")
        if not isinstance(e.get("identity"), str) or len(e["identity"]) > 2000:
            raise bad(f"{where}.identity is not a string")
        if not isinstance(e.get("input_file_id"), str) or not _ID.match(e["input_file_id"]):
            raise bad(f"{where}.input_file_id is not an id")
        if e.get("id") is not None and (not isinstance(e["id"], str) or not _ID.match(e["id"])):
            raise bad(f"{where}.id is not an id")
        keys = e.get("keys")
        if (
            not isinstance(keys, list)
            or not keys
            or len(keys) > MAX_FILE_REQUESTS
            or not all(isinstance(k, str) and _KEY.match(k) for k in keys)
        ):
            raise bad(f"{where}.keys is not a list of request hashes")
        jobs.append(Job(e["identity"], e["input_file_id"], list(keys), e.get("id")))
    return jobs


def write_jobs(path: Path, jobs: Sequence[Job]) -> None:
    """Replace ``batches.json`` atomically (a temporary file renamed into place)."""
    rows = [dataclasses.asdict(j) for j in jobs]
    for row in rows:  # an older hdeval's plain identity goes at the first write
        if not row["identity"].startswith("sha256:"):
            row["identity"] = job_identity(row["identity"])
    blob = json.dumps({"version": STATE_VERSION, "batches": rows}, separators=(",", ":"))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise CacheError(
            f"cannot write {path} ({exc.strerror or exc}): the batch jobs could not be "
            "recorded; free space or pass another --cache-dir"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def batch_lock(cache_dir: Path) -> Iterator[Path]:
    """Hold the exclusive ``flock`` on ``<cache_dir>/batches.lock`` (not waiting), so two runs
    sharing a cache directory never submit the same requests twice; the system releases it when
    the process dies however it ends."""
    path = Path(cache_dir) / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = -1
    try:
        try:
            fd = os.open(path, flags, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CacheError(
                f"another hdeval process is running a batch in the cache directory {cache_dir} "
                f"(it holds {path}): wait until it ends, or pass another --cache-dir"
            ) from None
        except OSError as exc:
            raise CacheError(
                f"cannot lock the batch lock file {path} ({exc.strerror or exc}); pass another --cache-dir"
            ) from None
        yield path
    finally:
        if fd >= 0:
            os.close(fd)


class BatchStrategy:
    """The Batch API as the client's strategy for a stage's misses: run as batch jobs on the LLM
    loop, each result committed through the client's writer under the key a normal call uses.
    ``inner`` (an :class:`~hdeval.llm.backends.openai_compat.OpenAICompatBackend`) builds each body
    and reads each result exactly as for a normal call."""

    def __init__(self, inner: Any, cache_dir: str | Path, config: Any) -> None:
        self.inner = inner  # an OpenAICompatBackend (check_batch)
        self.identity = job_identity(inner.identity)
        self._plain_identity = inner.identity  # as an older hdeval recorded it: its jobs are ours too
        self.cache_dir = Path(cache_dir)
        # the server an injected backend talks to, credentials and query included (never shown)
        url, key = inner.endpoint()
        self.api = BatchAPI(
            (config.base_url or url).strip(),
            key,
            timeout=config.timeout,
            max_retries=config.max_retries,
        )
        self.poll = poll_interval()
        self.state_path = self.cache_dir / STATE_FILE
        self._client: Any = None
        self._halt: list | None = None
        self._received: dict[str, Completion] = {}
        self._failures: dict[str, str] = {}  # key -> why it has no batch result
        self._commits: list[Awaitable[None]] = []  # results handed to the writer, not yet awaited

    def close(self) -> None:
        self.api.close()

    async def prefetch(
        self,
        client: Any,
        want: dict[str, CompletionRequest],
        progress: Progress | None = None,
        halt: list | None = None,
    ) -> dict[str, Completion]:
        """Get ``want`` (key -> request, none cached) into the cache through batch jobs; the
        replies received, by key."""
        self._client, self._halt, self._received, self._failures = client, halt, {}, {}
        progress = progress or Progress()
        try:
            with batch_lock(self.cache_dir):
                await self._drop_answered(want, progress)
                # a batch another process ended just before this one took the lock cached these already
                left = set(await self._unanswered(list(want)))
                if left:
                    await self._rounds({k: r for k, r in want.items() if k in left}, progress)
        finally:
            await self._committed()
        return self._received

    async def tidy(self, client: Any, progress: Progress | None = None) -> None:
        """With nothing to submit: drop jobs whose requests are all answered (unless another
        process holds the batch lock: it tidies up itself)."""
        if not self.state_path.exists():
            return
        self._client, self._received = client, {}
        try:
            with batch_lock(self.cache_dir):
                await self._drop_answered({}, progress or Progress())
        except CacheError:
            pass

    async def _unanswered(self, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` neither received now nor in the cache (read on the store's thread)."""
        rest = [k for k in keys if k not in self._received]
        if rest:
            found = await self._client.read_many(rest)
            rest = [k for k in rest if k not in found]
        return rest

    async def _committed(self) -> None:
        """Wait until every result handed to the writer is committed."""
        commits, self._commits = self._commits, []
        if commits:
            await asyncio.gather(*commits)

    def _save(self, key: str, completion: Completion) -> None:
        """Count one result and hand it to the client's writer (a result file's lines share transactions)."""
        self._commits.append(self._client.take(key, completion))
        self._received[key] = completion

    async def _wait(self) -> None:
        """Sleep until the next status check; an interrupt of the caller ends the wait."""
        end = time.monotonic() + self.poll
        while True:
            if self._halt:
                raise KeyboardInterrupt
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.5))

    async def _drop_answered(self, want: dict[str, CompletionRequest], progress: Progress) -> None:
        """Drop the jobs this stage does not need whose requests a run without --batch answered since."""
        for job in read_jobs(self.state_path):
            if (
                self._ours(job)
                and not any(k in want for k in job.keys)
                and not await self._unanswered(job.keys)
            ):
                self._record(job, drop=True)
                progress.message(
                    f"batch {job.id or job.input_file_id}: every request it holds is answered "
                    f"already; dropped from {self.state_path}"
                )

    async def _rounds(self, want: dict[str, CompletionRequest], progress: Progress) -> None:
        for round_ in range(RESUBMIT_ROUNDS + 1):
            jobs = [j for j in read_jobs(self.state_path) if self._ours(j)]
            active = [j for j in jobs if any(k in want for k in j.keys)]
            covered = {k for j in active for k in j.keys}
            new = [k for k in want if k not in covered]
            if active:
                n = sum(len(j.keys) for j in active)
                progress.message(
                    f"resuming {len(active)} batch job(s) of an earlier run ({n} requests; "
                    "nothing is submitted again)"
                )
            if new:
                self._check_budget(len(new))
                active += await self._submit([(k, want[k]) for k in new], progress)
            await self._wait_and_collect(active, want, progress)
            left = await self._unanswered(list(want))
            if not left:
                return
            reasons = _summarise({k: self._failures.get(k, "no result") for k in left})
            if round_ < RESUBMIT_ROUNDS:
                progress.message(
                    f"{len(left)} of {len(want)} requests have no batch result ({reasons}); "
                    "resubmitting only those"
                )
            else:
                progress.message(
                    f"{len(left)} requests still have no batch result ({reasons}); they are "
                    "sent through the normal API"
                )
            want = {k: want[k] for k in left}

    def _check_budget(self, n: int) -> None:
        limit, left = self._client.max_calls, self._client.calls_left()
        if left is None:
            return
        if n > left:
            raise BudgetExceeded(
                f"--batch would submit {n} new requests, more than the {max(0, left)} left under --max-calls "
                f"{limit}: every finished call is cached; rerun with a higher limit to continue"
            )

    async def _submit(self, items: list[tuple[str, CompletionRequest]], progress: Progress) -> list[Job]:
        jobs = []
        for chunk in _chunks([(k, self.inner.request_line(k, r)) for k, r in items]):
            keys = [k for k, _ in chunk]
            file_id = await self.api.upload(b"".join(line for _, line in chunk))
            job = Job(self.identity, file_id, keys)
            self._record(job)  # before the job exists: a kill from here on cannot lose it
            await self._create(job, look_first=False)
            progress.message(f"batch {job.id}: submitted {len(keys)} requests")
            jobs.append(job)
        return jobs

    def _ours(self, job: Job) -> bool:
        if job.identity == self._plain_identity:
            job.identity = self.identity
        return job.identity == self.identity

    async def _create(self, job: Job, look_first: bool = True) -> None:
        """Create ``job``'s batch, or adopt the one an earlier attempt or a killed process created.
        Before creating again after a create that may have made the job, the job is looked for
        by its input file; a server that cannot say stops the run rather than pay twice."""
        meta = {"hdeval": "1", "requests": str(len(job.keys)), META_INPUT: job.input_file_id}
        made: dict[str, Any] | None = None
        for attempt in range(self.api.max_retries + 1):
            if look_first or attempt:
                try:
                    made = await self.api.find(job.input_file_id)
                except BackendError as exc:
                    raise BackendError(
                        f"cannot tell whether the Batch API made a job for input file {job.input_file_id} "
                        f"(a create may have made it, and listing jobs failed: {exc}): check the server's jobs "
                        f'for that input file; if one exists, write its id as "id" of that file\'s entry in '
                        f"{self.state_path} and rerun, if none, remove that entry and rerun "
                        "(hdeval does not create another job it might pay for twice)"
                    ) from None
                if made is not None:
                    break
            try:
                made = await self.api.create(job.input_file_id, meta)
                break
            except MaybeCreated:
                if attempt == self.api.max_retries:
                    raise
                await asyncio.sleep(
                    retry_wait(attempt + 1, None, self.api.backoff_base, self.api.backoff_cap)
                )
        assert made is not None
        job.id = _check_id(made.get("id"), "batch id")
        self._record(job)

    def _record(self, job: Job, drop: bool = False) -> None:
        """Add, update or (``drop``) remove one job in ``batches.json``."""
        others = [
            j
            for j in read_jobs(self.state_path)
            if not (self._ours(j) and j.input_file_id == job.input_file_id)
        ]
        write_jobs(self.state_path, others if drop else others + [job])

    async def _wait_and_collect(
        self, jobs: list[Job], want: dict[str, CompletionRequest], progress: Progress
    ) -> None:
        pending = list(jobs)
        shown: dict[str, tuple] = {}
        while pending:
            for job in list(pending):
                if job.id is None:  # recorded, then killed before the server named it
                    await self._create(job)
                try:
                    status = await self.api.retrieve(job.id)
                except BackendError as exc:
                    raise BackendError(
                        f"{exc} (batch {job.id} is named in {self.state_path}: if the server "
                        "no longer has it, move that file aside and its requests are "
                        "submitted again)"
                    ) from None
                state = status.get("status") if isinstance(status.get("status"), str) else "unknown"
                counts = (
                    status.get("request_counts") if isinstance(status.get("request_counts"), dict) else {}
                )
                done, total, failed = (_count(counts.get(x)) for x in ("completed", "total", "failed"))
                line = (state, done, total, failed)
                if shown.get(job.id) != line:
                    shown[job.id] = line
                    extra = f", {failed} failed" if failed else ""
                    progress.message(
                        f"batch {job.id}: {done}/{total or len(job.keys)} done{extra} ({one_line(state)[:40]})"
                    )
                if state in TERMINAL:
                    await self._collect(job, status, want)
                    pending.remove(job)
            if pending:
                await self._wait()

    async def _collect(self, job: Job, status: dict[str, Any], want: dict[str, CompletionRequest]) -> None:
        keys = set(job.keys)
        seen: set[str] = set()
        unreadable: list[str] = []  # lines that name no request of this job
        for name in ("output_file_id", "error_file_id"):
            file_id = status.get(name)
            if file_id is None or file_id == "":
                continue
            try:
                file_id = _check_id(file_id, name)
            except BackendError as exc:
                # never into a URL; the job has nothing else to give: out of batches.json, so the
                # next run is not stuck on it, and its requests are asked again
                unreadable.append(str(exc))
                continue
            with tempfile.TemporaryDirectory(prefix="hdeval-batch-", dir=self.cache_dir) as d:
                path = Path(d) / "result.jsonl"
                await self.api.download(file_id, path)
                for n, line in enumerate(_lines(path), 1):
                    problem = self._take(line, keys, seen, want, f"{name.split('_')[0]} file line {n}")
                    if problem:
                        unreadable.append(problem)
        missing = keys - seen
        if missing:
            if unreadable:
                why = f"no readable result ({unreadable[0]}{f', and {len(unreadable) - 1} more' if len(unreadable) > 1 else ''})"
            else:
                why = (
                    self.api.redact(_job_error(status))
                    or f"no result (the batch ended {one_line(str(status.get('status')))[:20]})"
                )
            for k in missing:
                self._failures.setdefault(k, why)
        # its results are committed, its failures reported: only then out of batches.json (a
        # kill before this resumes the job, and the results already cached cost nothing)
        await self._committed()
        self._record(job, drop=True)

    def _take(
        self, line: bytes, keys: set[str], seen: set[str], want: dict[str, CompletionRequest], where: str
    ) -> str | None:
        """One result line into the cache or a recorded failure; what is wrong with one naming no request."""
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            return f"{where}: not JSON"
        key = row.get("custom_id") if isinstance(row, dict) else None
        if not isinstance(key, str) or key not in keys or key in seen:
            return f"{where}: no custom_id of this job"
        seen.add(key)
        body, why = result_outcome(row)
        if body is None:
            self._failures[key] = self.api.redact(why) if why != "no response" else f"{where}: no response"
            return None
        request = want.get(key)
        try:  # the reader of a normal call's reply
            self._save(
                key, read_completion(body, request is None or bool(request.top_logprobs), self.api.redact)
            )
        except (ValueError, RecursionError):  # this request's failure, recorded
            self._failures[key] = f"{where}: not a chat completion"
        return None


def _lines(path: Path) -> Iterator[bytes]:
    """Non-blank result file lines; one past MAX_LINE_BYTES becomes a placeholder naming no request."""
    with open(path, "rb") as fh:
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                while line and not line.endswith(b"\n"):  # skip the rest of this line
                    line = fh.readline(MAX_LINE_BYTES + 1)
                yield b"<a line longer than the limit>"
                continue
            if line.strip():
                yield line


def _chunks(lines: list[tuple[str, bytes]]) -> Iterator[list[tuple[str, bytes]]]:
    """Consecutive runs within the API's per-file limits."""
    chunk: list[tuple[str, bytes]] = []
    size = 0
    for key, line in lines:
        if len(line) > MAX_FILE_BYTES:
            raise ConfigError(
                f"one request is {len(line) // 10**6} MB, over the Batch API's file limit; "
                "run without --batch"
            )
        if chunk and (len(chunk) >= MAX_FILE_REQUESTS or size + len(line) > MAX_FILE_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append((key, line))
        size += len(line)
    if chunk:
        yield chunk


def _count(value: Any) -> int:
    return value if type(value) is int and 0 <= value < 10**9 else 0


def _job_error(status: dict[str, Any]) -> str:
    errors = status.get("errors")
    data = errors.get("data") if isinstance(errors, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return f"the batch failed: {one_line(str(data[0].get('message') or data[0].get('code') or ''))[:150]}"
    return ""


def _summarise(reasons: dict[str, str]) -> str:
    return "; ".join(f"{n} x {r}" for r, n in collections.Counter(reasons.values()).most_common(3))


def check_batch(inner: Backend, model: str | None) -> None:
    """A one-line :class:`ConfigError` unless ``inner`` is an OpenAI-compatible backend."""
    if not isinstance(inner, OpenAICompatBackend):
        raise ConfigError(
            f"--batch needs an OpenAI-compatible backend (--llm MODEL, with --base-url for "
            f"another server), not --llm {model}"
        )


__all__ = ["BatchAPI", "BatchStrategy", "Job", "check_batch", "read_jobs", "write_jobs"]
