"""Engine-neutral request files: a run's uncached LLM requests written as OpenAI batch-format JSONL
(``custom_id`` = the cache key; lines as ``OpenAICompatBackend.request_line`` writes them), and the result
files an engine answers them with read back into the cache.

Result files are untrusted: every line is read with a size bound and checked before anything is
written, and the whole file goes into the cache in one transaction, so a bad file imports nothing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from hdeval.core.errors import BudgetExceeded, CacheError, ConfigError, DataError, one_line
from hdeval.core.redaction import Redactor
from hdeval.llm.backends.base import Completion, CompletionRequest

MAX_LINE_BYTES = 8 * 2**20  # one result line: a chat completion with logprobs
MAX_LINES = 10_000_000  # lines of one request or result file
_KEY = re.compile(r"[0-9a-f]{64}\Z")


class StageExported(Exception):
    """Raised out of a scoring stage whose uncached requests were written to the export file:
    its replies are not there yet, so the stage (and what depends on it) cannot go on."""


class RequestExport:
    """The cached client's strategy for its misses while exporting (in place of the Batch API's):
    each stage's uncached requests are written to ``out`` and the stage is stopped
    (:class:`StageExported`). Open the client with ``max_calls=0``: then nothing is paid for."""

    def __init__(self, cached: Any, out: IO[bytes], written: set[str] | None = None):
        from hdeval.llm.backends.openai_compat import OpenAICompatBackend

        if not isinstance(cached.inner, OpenAICompatBackend):  # the bodies are that backend's own
            raise ConfigError(
                f"--export-requests writes OpenAI chat completion requests: it needs an "
                f"OpenAI-compatible backend (--llm MODEL, --base-url URL), not {cached.identity}"
            )
        self.cached = cached
        self.out = out
        # a request shared by two chunks is written once; a second client (a decomposing LLM)
        # writing to the same file shares the set
        self.written: set[str] = set() if written is None else written

    def missing(self, want: dict[str, CompletionRequest], stored: set[str]) -> None:
        """Write the requests of ``want`` (cache key -> request) not in ``stored``, and stop the
        stage if there are any."""
        missing = [k for k in want if k not in stored]
        if not missing:
            return
        for k in missing:
            if k not in self.written:
                self.out.write(self.cached.inner.request_line(k, want[k]))
                self.written.add(k)
        raise StageExported(len(missing))

    async def prefetch(
        self, client: Any, want: dict[str, CompletionRequest], progress: Any = None, halt: Any = None
    ) -> dict[str, Completion]:
        # the client passes only keys it could not read back: all of them need an answer
        self.missing(want, set())
        return {}

    async def tidy(self, client: Any, progress: Any = None) -> None:
        return None

    def close(self) -> None:
        return None


def export_first_requests(client: Any, requests: Sequence[CompletionRequest]) -> None:
    """For a stage whose requests are asked one at a time (JSON with re-asks, which never reaches
    the client's strategy): while ``client`` exports, write the uncached ones of ``requests``
    (each chain's first) and stop the stage. Does nothing when ``client`` is not exporting."""
    export = getattr(client, "batch", None)
    if not isinstance(export, RequestExport) or not requests:
        return
    want = {client.key(r): r for r in requests}
    export.missing(want, client.stored(want))


def export_requests(ev: Any, chunks: Iterator[list], cached: Any, path: str | Path) -> RequestExport:
    """Write the uncached requests of scoring ``chunks`` with ``ev`` to ``path`` (an export that
    fails leaves nothing). ``cached``: the run's cached client, opened with ``max_calls=0``."""
    from hdeval.core.progress import Progress

    previous = cached.batch
    try:
        with write_in_place(Path(path), keep_empty=True) as fh:
            export = cached.batch = RequestExport(cached, fh)
            for samples in chunks:
                with contextlib.suppress(StageExported):  # this chunk's later stages need the replies first
                    ev.score(samples, backend=cached, progress=Progress())
    finally:
        cached.batch = previous
    return export


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temporary file beside ``path``, to be renamed onto it when complete."""
    try:
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def write_in_place(path: Path, keep_empty: bool) -> Iterator[IO[bytes]]:
    """A temporary file beside ``path``, renamed onto it (with the mode a plain open would give:
    mkstemp makes it 0600) when the block ends normally having written something or
    ``keep_empty``; removed otherwise. An OSError is a one-line ConfigError."""
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
            keep = keep_empty or fh.tell() > 0
        if keep:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class RequestsExported(Exception):
    """A training run stopped at a stage whose uncached requests it wrote to ``path`` (``count``
    of them): answer them, import the results, and rerun the same training to go on."""

    def __init__(self, path: Path, count: int):
        super().__init__(f"wrote {count} requests not cached yet to {path}")
        self.path, self.count = path, count


def _check_replaceable(path: Path, clients: Sequence[Any]) -> None:
    """Each rerun of ``train --export-requests FILE`` writes FILE again: an existing FILE is
    replaced only when it is a request file every request of which is cached now (a previous
    stage's, imported), so nothing not yet answered is lost."""
    if not path.exists():
        return
    try:
        asked = read_request_file(path)
    except DataError:
        raise ConfigError(
            f"--export-requests {path} exists and is not a request file hdeval wrote; name another file"
        ) from None
    left = set(asked)
    for client in clients:
        left -= client.stored(left)
    if left:
        raise ConfigError(
            f"--export-requests {path} holds {len(left)} requests not in the cache yet: import "
            f"their results first (`hdeval cache import RESULTS.jsonl --requests {path}`), or "
            "delete it to export them again"
        )


@contextlib.contextmanager
def exporting_stages(path: str | Path, clients: Sequence[Any]) -> Iterator[None]:
    """Run a training's stages with ``clients`` exporting instead of calling: the first stage
    with uncached requests writes them to ``path`` (a temporary file beside it, renamed into
    place) and :class:`RequestsExported` is raised; a training whose every stage is cached runs
    to its end and writes no file. Nothing is paid for (``max_calls`` 0 meanwhile)."""
    path = Path(path)
    clients = list({id(c): c for c in clients}.values())
    _check_replaceable(path, clients)
    before = [(c.batch, c.max_calls) for c in clients]
    written: set[str] = set()
    try:
        with write_in_place(path, keep_empty=False) as fh:
            for c in clients:
                c.batch, c.max_calls = RequestExport(c, fh, written), 0
            try:
                yield
            except StageExported:
                pass
            except BudgetExceeded:
                # only a chain of requests each built from the last reply asks past the strategy
                raise ConfigError(
                    "--export-requests: this stage asks for JSON one request at a time, re-asking with "
                    "each unusable reply (DnA's aspects and weights per pair; a decomposition whose "
                    "reply could not be used), which a batch engine cannot answer; run this stage "
                    "without --export-requests, then export again"
                ) from None
    finally:
        for c, (batch, max_calls) in zip(clients, before):
            c.batch, c.max_calls = batch, max_calls
    if written:
        raise RequestsExported(path, len(written))


def _lines(path: Path, what: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSONL file, each at most MAX_LINE_BYTES; blank lines skipped."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    with fh:
        n = 0
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            n += 1
            if n > MAX_LINES:
                raise DataError(f"{path}: more than {MAX_LINES} lines; split it")
            if len(line) > MAX_LINE_BYTES:
                raise DataError(
                    f"{path}: line {n}: longer than {MAX_LINE_BYTES // 2**20} MB; not a "
                    f"{what} line (nothing imported)"
                )
            if line.strip():
                yield n, line


def _json_object(path: Path, n: int, line: bytes) -> dict:
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{path}: line {n}: not UTF-8 text (nothing imported)") from None
    except (ValueError, RecursionError):
        raise DataError(f"{path}: line {n}: not JSON (nothing imported)") from None
    if not isinstance(row, dict):
        raise DataError(f"{path}: line {n}: not a JSON object (nothing imported)")
    return row


def read_request_file(path: str | Path, models: dict[str, str] | None = None) -> dict[str, bool]:
    """The custom_ids of a request file hdeval wrote, each with whether it asked for logprobs;
    ``models``, when given, gets each one's ``body.model``."""
    path = Path(path)
    asked: dict[str, bool] = {}
    for n, line in _lines(path, "request file"):
        row = _json_object(path, n, line)
        key, body = row.get("custom_id"), row.get("body")
        if not isinstance(key, str) or not _KEY.match(key) or not isinstance(body, dict):
            raise DataError(
                f"{path}: line {n}: no 64-hex custom_id and body object: not a request file "
                "`hdeval apply/train --export-requests` wrote (nothing imported)"
            )
        if key in asked:
            raise DataError(f"{path}: line {n}: custom_id {key[:12]}... given twice (nothing imported)")
        asked[key] = bool(body.get("logprobs"))
        if models is not None and isinstance(body.get("model"), str):
            models[key] = body["model"]
    return asked


def same_model(asked: str, answered: str) -> bool:
    """Whether a reply's ``model`` is the model asked for: the same name, or that name with a
    version after ``-`` or ``:``, digits or ``latest`` (OpenAI answers ``gpt-4o`` as
    ``gpt-4o-2024-08-06``, Ollama ``llama3`` as ``llama3:latest``); never another model whose
    name only starts with it (``gpt-4o-mini``, ``llama3:70b``)."""
    return (
        answered == asked
        or re.fullmatch(rf"{re.escape(asked)}[-:](?:latest|\d[\d.-]*)", answered) is not None
    )


@dataclass
class ImportReport:
    imported: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # custom_id -> why the engine gave no reply
    missing: int = 0  # requests of the request file the result file does not answer
    other_model: dict[str, str] = field(default_factory=dict)  # custom_id -> the model that answered, skipped


def read_results(
    results: str | Path,
    asked: dict[str, bool],
    redact: Redactor,
    models: dict[str, str] | None = None,
    skip_other_models: bool = False,
) -> tuple[dict[str, Completion], ImportReport]:
    """Every completion of a result file, checked line by line; one-line :class:`DataError`
    naming the file and line for anything that is not a result of one of ``asked``'s requests,
    or whose ``body.model`` is not the model its request (in ``models``) asked (with
    ``skip_other_models``: left out and counted instead). Each body is read as the
    OpenAI-compatible backend reads a direct reply, without any secret of ``redact``'s."""
    # here, not at the top: apply and report import this module for its file helpers, and the
    # OpenAI backend brings the openai SDK
    from hdeval.llm.backends.openai_compat import read_completion, result_outcome
    from hdeval.llm.cache.codec import MAX_ENTRY_CHARS

    path = Path(results)
    got: dict[str, Completion] = {}
    report = ImportReport()
    seen: dict[str, int] = {}
    for n, line in _lines(path, "result file"):
        where = f"{path}: line {n}"
        row = _json_object(path, n, line)
        key = row.get("custom_id")
        if not isinstance(key, str):
            raise DataError(f"{where}: no text custom_id (nothing imported)")
        if key not in asked:
            raise DataError(
                f"{where}: custom_id {one_line(key)[:70]!r} is not a request of the request "
                "file (nothing imported)"
            )
        if key in seen:
            raise DataError(
                f"{where}: custom_id {key[:12]}... already answered on line {seen[key]} (nothing imported)"
            )
        seen[key] = n
        response = row.get("response")
        if response is not None and not isinstance(response, dict):
            raise DataError(f"{where}: response is not an object (nothing imported)")
        if isinstance(response, dict):
            if type(response.get("status_code")) is not int:
                raise DataError(f"{where}: response.status_code is not a whole number (nothing imported)")
            if response.get("body") is not None and not isinstance(response["body"], dict):
                raise DataError(f"{where}: response.body is not an object (nothing imported)")
        body, why = result_outcome(row)
        if body is None:
            report.failed[key] = redact(why or "no response")
            continue
        want, got_model = (models or {}).get(key), body.get("model")
        if want is not None and isinstance(got_model, str) and not same_model(want, got_model):
            if skip_other_models:
                report.other_model[key] = redact(got_model)
                continue
            raise DataError(
                f"{where}: response.body.model {one_line(redact(got_model))[:80]!r} is not "
                f"{want!r}, the model its request asked: another model's reply would be served as "
                f"{want!r}'s (nothing imported; --skip-other-models imports the rest)"
            )
        try:
            got[key] = read_completion(body, asked[key], redact)
        except Exception as exc:  # the backend's own reading of a reply: not a chat completion
            raise DataError(
                f"{where}: response.body is not a chat completion "
                f"({one_line(str(exc))[:120]}) (nothing imported)"
            ) from None
        if len(json.dumps(got[key].to_dict())) > MAX_ENTRY_CHARS:
            raise DataError(
                f"{where}: the reply is larger than the cache keeps "
                f"({MAX_ENTRY_CHARS // 2**20} MiB) (nothing imported)"
            )
    report.missing = len(asked) - len(seen)
    return got, report


def import_results(
    results: str | Path,
    requests: str | Path,
    cache_dir: str | Path,
    skip_other_models: bool = False,
) -> ImportReport:
    """Check ``results`` whole against ``requests`` (the file the export wrote), then write every
    completion into the cache in ``cache_dir`` in one transaction: all or nothing. A reply of
    another model than its request's is refused, or with ``skip_other_models`` left out and counted.
    The secrets the environment holds (the keys, the proxies' credentials) are redacted from what
    is read."""
    from hdeval.llm.cache.codec import encode_completion
    from hdeval.llm.cache.guard import storage_error
    from hdeval.llm.cache.store import open_store

    models: dict[str, str] = {}
    asked = read_request_file(requests, models)
    got, report = read_results(results, asked, Redactor.from_env(), models, skip_other_models)
    store = open_store(cache_dir)
    try:
        # one transaction: a failure part-way (a full disk) leaves the cache as it was
        with store.transact():
            for key, completion in got.items():
                store.set(key, encode_completion(completion))
    except (CacheError, ConfigError):
        raise
    except Exception as exc:  # OSError, diskcache.Timeout, sqlite3 errors, an entry too large
        raise storage_error(cache_dir, exc, writing=True) from None
    finally:
        store.close()
    report.imported = len(got)
    return report
