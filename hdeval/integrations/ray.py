"""``apply`` and exported request files on a Ray cluster through Ray Data (``pip install
"hdeval[ray]"``; docs/cluster.md). Ray is imported only when used: the rest of hdeval never needs it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from hdeval.core.errors import ConfigError, DataError, HdevalError
from hdeval.learn.intervals import DEFAULT_MAX_WIDTH
from hdeval.llm.config import DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

#: In ``cache_dir``, replaced by a name of the worker: each worker then has a cache of its own.
WORKER_FIELD = "{worker}"
#: The column :func:`apply_on_ray`'s reader fills with samples it has validated (Ray carries them).
SAMPLE_COLUMN = "_hdeval_sample"


def _mark(exc: BaseException) -> None:
    """Keep an hdeval error's own message: Ray Data appends its retry advice to ``args``."""
    if getattr(exc, "hdeval_args", None) is None:
        exc.hdeval_args = exc.args  # type: ignore[attr-defined]


def _reraise(exc: BaseException, shown: tuple[str, str] | None = None) -> None:
    """Raise the hdeval error a Ray task raised as itself, naming the input as the caller did
    (``shown``: (resolved path, given path)); anything else is left to the caller."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        args = getattr(cause, "hdeval_args", None)
        # Ray's wrapper is an instance of the error's class too, but prints Ray's traceback
        if (
            isinstance(cause, HdevalError)
            and args is not None
            and not type(cause).__module__.startswith("ray.")
        ):
            if shown is not None:
                args = tuple(a.replace(shown[0], shown[1]) if isinstance(a, str) else a for a in args)
            cause.args = args
            raise cause.with_traceback(None) from None
        cause = getattr(cause, "cause", None) or cause.__cause__


def _read_samples(task: Any, path: str, size: int) -> Any:
    """The read task of :func:`apply_on_ray`: ``path`` read once as apply reads it, a chunk a block."""
    import numpy as np
    from ray.data.block import BlockAccessor

    from hdeval.data.samples import DiskIds
    from hdeval.run.apply import ApplyInput

    try:
        with DiskIds() as seen:
            for chunk in ApplyInput(path, SimpleNamespace(task=task), size, None).chunks(seen):
                column = np.empty(len(chunk), dtype=object)
                column[:] = chunk
                yield BlockAccessor.batch_to_block({SAMPLE_COLUMN: column})
    except HdevalError as exc:
        _mark(exc)
        raise


def _source(task: Any, path: str, size: int) -> Any:
    """One read task: the duplicate-id index and the line numbers need the file in order."""
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class _InputFile(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list:
            meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=[path], exec_stats=None)
            return [ReadTask(lambda: _read_samples(task, path, size), meta)]

    return _InputFile()


def _ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401 - the extra installs it; a bare ray would fail later, less clearly
    except ImportError:
        raise ConfigError('running on Ray needs the ray extra: pip install "hdeval[ray]"') from None
    return ray


def _worker_cache(cache_dir: str | None) -> str | None:
    if cache_dir is None or WORKER_FIELD not in cache_dir:
        return cache_dir
    ray = _ray()
    node = ray.get_runtime_context().get_node_id() or "local"
    return cache_dir.replace(WORKER_FIELD, f"{node[:12]}-{os.getpid()}")


def _check_whole(**values: Any) -> None:
    for name, value in values.items():
        if type(value) is not int or value < 1:
            raise ConfigError(f"{name} must be a whole number, at least 1; got {value!r}")


class ArtifactScorer:
    """Score batches of JSONL rows with an hdeval artifact, for ``Dataset.map_batches``.

    The options are ``hdeval apply``'s (docs/cluster.md); ``{worker}`` in ``cache_dir`` gives each
    worker a cache of its own, ``max_calls`` is each worker's budget, and the LLM is opened at the
    first batch. Input batches need a ``text`` column of JSONL lines (a ``line`` column, if present,
    names rows in errors). Output batches have ``id`` and ``row`` (the JSON line apply writes), and
    on a batch's first row ``failed``/``cells``, its unreadable and total LLM-filled scores, with
    ``failure`` an example reason."""

    def __init__(
        self,
        artifact: str | Path,
        *,
        max_interval_width: float = DEFAULT_MAX_WIDTH,
        explain: bool = False,
        top: int = 3,
        notify: Callable[[str], None] | None = None,
        **llm_options: Any,
    ):
        from hdeval.run.apply import load_checked
        from hdeval.run.artifact_llm import check_llm_options, log_notify

        # verified once per worker (digests, trusted types); a bad option fails here, before any call
        check_llm_options(**llm_options)
        self.ev, self.trust = load_checked(artifact, explain, max_interval_width)
        self.explain, self.top = explain, top
        self.concurrency = llm_options.get("concurrency")
        self.backend: Any = None
        self.llm_options = dict(
            llm_options,
            cache_dir=_worker_cache(llm_options.get("cache_dir")),
            confirm=None,
            notify=notify or log_notify,
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._score(batch)
        except HdevalError as exc:
            _mark(exc)  # the driver raises it with its own message
            raise

    def _samples(self, batch: dict[str, Any]) -> list:
        from hdeval.data.samples import sample_from_line

        if SAMPLE_COLUMN in batch:  # apply_on_ray's reader validated them
            return list(batch[SAMPLE_COLUMN])
        if "text" not in batch:
            raise DataError(
                f"hdeval's Ray scorer reads a 'text' column of JSONL lines; the batch has "
                f"{', '.join(sorted(batch)) or 'no columns'}"
            )
        lines = batch.get("line")
        found = (
            sample_from_line(
                self.ev.task,
                str(text),
                f"line {int(lines[i])}" if lines is not None else f"row {i + 1} of a batch",
            )
            for i, text in enumerate(batch["text"])
        )
        return [s for s in found if s is not None]

    def _score(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from hdeval.core.progress import Progress
        from hdeval.run.apply import score_rows
        from hdeval.run.artifact_llm import open_artifact_llm

        samples, rows = self._samples(batch), []
        failed, cells, example = 0, 0, None
        if samples:
            if self.backend is None:
                self.backend = open_artifact_llm(self.ev, **self.llm_options)
            rows, _, (failed, cells, example) = score_rows(
                self.ev,
                samples,
                self.backend,
                self.concurrency,
                Progress(),
                self.trust,
                self.explain,
                self.top,
            )
            self.backend.flush()  # every reply this batch paid for is on disk before it is handed on
        # the batch's unreadable LLM-filled scores on its first row: the driver sums them for
        # apply's --max-failure-rate check
        first = len(rows[:1])
        return {
            "id": np.array([s.id for s in samples], dtype=object),
            "row": np.array([json.dumps(r, ensure_ascii=False) for r in rows], dtype=object),
            "failed": np.array([failed] * first + [0] * (len(rows) - first), dtype=np.int64),
            "cells": np.array([cells] * first + [0] * (len(rows) - first), dtype=np.int64),
            "failure": np.array([example or ""] * first + [""] * (len(rows) - first), dtype=object),
        }

    def __del__(self) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()


def apply_on_ray(
    artifact: str | Path,
    input_file: str | Path,
    output: str,
    *,
    workers: int = 2,
    batch_size: int = 500,
    max_failure_rate: float = 0.2,
    max_interval_width: float = DEFAULT_MAX_WIDTH,
    explain: bool = False,
    top: int = 3,
    num_cpus: float = 0.5,
    notify: Callable[[str], None] | None = None,
    **llm_options: Any,
) -> int:
    """``hdeval apply ARTIFACT INPUT -o OUTPUT`` with the scoring spread over ``workers`` Ray
    workers (:class:`ArtifactScorer`), ``batch_size`` samples per batch; the rows written (the
    same bytes as apply). ``max_failure_rate``, ``max_interval_width``, ``explain``, ``top`` and
    the ``llm_options`` (``llm``, ``base_url``, ``cache_dir``, ...) are apply's options. Runs on
    the Ray cluster this process is connected to; the artifact and ``input_file`` must be
    readable by every node. One read task validates the input as apply
    does, so a bad line anywhere leaves no output (docs/cluster.md). ``num_cpus``: what Ray
    reserves per worker; below 1 so that workers filling every CPU of a small cluster still
    leave room for the read task (at 1, 2 workers on 2 CPUs could wait for it forever)."""
    from hdeval.run.apply import check_failures, prepare
    from hdeval.run.output import OutputWriter

    ray = _ray()
    _check_whole(workers=workers, batch_size=batch_size)
    if not isinstance(num_cpus, (int, float)) or not 0 < num_cpus <= 1024:
        raise ConfigError(f"num_cpus must be a number above 0; got {num_cpus!r}")
    if llm_options.get("batch"):
        raise ConfigError(
            "apply_on_ray does not use the Batch API: export the requests instead (docs/cluster.md)"
        )
    if "://" in str(input_file):  # apply's reader opens files; read_text would skip its checks
        raise ConfigError(
            f"apply_on_ray reads a file every node can open, not {input_file}: copy it to a "
            "shared filesystem, or score it with ArtifactScorer in a pipeline of your own"
        )
    # refused here, before any worker starts
    ev, _, fmt, size = prepare(
        artifact,
        str(input_file),
        output,
        explain=explain,
        max_interval_width=max_interval_width,
        max_failure_rate=max_failure_rate,
        rate_option="max_failure_rate",
        llm_options=llm_options,
        top=top,
    )
    if getattr(ev, "whole_input", None):  # rows compared with each other: batches would change scores
        raise ConfigError(f"{ev.whole_input}: apply_on_ray scores it in batches apart; use hdeval apply")
    if ev.llm.base_url and llm_options.get("base_url") is None and llm_options.get("llm") is None:
        raise ConfigError(
            f"the artifact names the LLM server {ev.llm.base_url}: hdeval sends your samples "
            f"there only if you say so; pass base_url={ev.llm.base_url!r} (or another server)"
        )
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # rows come back in input order
    # a worker's hdeval error reaches the driver as itself (wrapped, its cause would not travel)
    ctx.raise_original_map_exception = True
    path = str(Path(input_file).resolve())
    ds = ray.data.read_datasource(_source(ev.task, path, size))
    scored = ds.map_batches(
        ArtifactScorer,
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=num_cpus,
        fn_constructor_args=(str(Path(artifact).resolve()),),
        fn_constructor_kwargs=dict(
            llm_options, max_interval_width=max_interval_width, explain=explain, top=top
        ),
    )
    failed = cells = 0
    example = ""
    with OutputWriter(output, fmt) as out:
        try:
            for batch in scored.iter_batches(batch_size=batch_size, batch_format="numpy"):
                out.write([json.loads(text) for text in batch["row"]])
                failed += int(batch["failed"].sum())
                cells += int(batch["cells"].sum())
                example = example or next((str(e) for e in batch["failure"] if e), "")
        except Exception as exc:  # Ray wraps a task's error: raise the hdeval error as apply would
            _reraise(exc, (path, str(input_file)))
            raise
        check_failures(failed, cells, max_failure_rate, example, "max_failure_rate")
        out.commit()
    return out.rows


class RequestAnswerer:
    """Answer batches of an exported request file's lines (``ray.data.read_text``'s ``text``
    column), for ``Dataset.map_batches``: each body goes to the OpenAI-compatible ``base_url``
    through hdeval's own client (:meth:`~hdeval.llm.backends.openai_compat.OpenAICompatBackend.asend_body`:
    its retry policy, replies bounded at a result line's size, no redirect followed, no secret
    written), ``concurrency`` in flight per worker, with the workers' ``OPENAI_API_KEY``. Output
    batches have ``result``, one line of the OpenAI batch output format per request: what
    ``hdeval cache import`` reads (and checks again)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        concurrency: int = DEFAULT_CONCURRENCY,
    ):
        from hdeval.llm.backends.openai_compat import OpenAICompatBackend
        from hdeval.llm.request_files import MAX_LINE_BYTES

        # the model name is the request bodies' own; this one is never sent
        self.server = OpenAICompatBackend(
            "answerer",
            base_url=base_url,
            api_key=os.environ.get("OPENAI_API_KEY") or None,
            timeout=timeout,
            max_retries=max_retries,
            max_reply_bytes=MAX_LINE_BYTES,
            concurrency=concurrency,
            detect=False,
        )
        self.concurrency = concurrency

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from hdeval.llm import aio

        if "text" not in batch:
            raise DataError(
                f"hdeval's request answerer reads a 'text' column of request lines; the batch has "
                f"{', '.join(sorted(batch)) or 'no columns'}"
            )
        out = aio.run(self._all([str(t) for t in batch["text"]]))
        return {"result": np.array(out, dtype=object)}

    async def _all(self, texts: list[str]) -> list[str]:
        import asyncio

        slots = asyncio.Semaphore(self.concurrency)

        async def one(text: str) -> str:
            async with slots:
                return await self._one(text)

        return list(await asyncio.gather(*(one(t) for t in texts)))

    async def _one(self, text: str) -> str:
        """One request answered: a result line, with an error in place of a reply that is not a
        chat completion, so one bad reply never costs the batch's others."""
        row = json.loads(text)  # a file the driver checked (read_request_file)
        status, reply = await self.server.asend_body(row["body"])
        if isinstance(reply, dict):
            response: dict[str, Any] | None = {"status_code": status, "body": reply}
            error = None
        else:
            response = None if status is None else {"status_code": status, "body": None}
            error = {"message": reply}
        return json.dumps(
            {"custom_id": row["custom_id"], "response": response, "error": error},
            ensure_ascii=False,
            separators=(",", ":"),
        )

    def close(self) -> None:
        """Close the backend's connections (also done when the answerer is collected)."""
        server = getattr(self, "server", None)
        if server is not None:
            server.close()

    def __del__(self) -> None:
        self.close()


def answer_requests_on_ray(
    requests_file: str | Path,
    results_file: str | Path,
    base_url: str,
    *,
    workers: int = 2,
    batch_size: int = 200,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout: float = DEFAULT_TIMEOUT,
    max_retries: int = DEFAULT_MAX_RETRIES,
    num_cpus: float = 0.5,
) -> int:
    """Answer an exported request file (``hdeval train --export-requests``, or apply's) on the Ray
    cluster this process is connected to: ``workers`` :class:`RequestAnswerer` actors send the
    bodies to ``base_url``; the OpenAI batch output lines are written to ``results_file`` (a
    temporary file beside it, renamed into place at the end). Returns the lines written. Then
    ``hdeval cache import RESULTS --requests REQUESTS`` and rerun the command that exported.
    Ray schedules the work; ``requests_file`` must be readable by every worker."""
    from hdeval.llm.backends.openai_compat import check_url
    from hdeval.llm.request_files import read_request_file, write_in_place

    ray = _ray()
    check_url(base_url)
    _check_whole(workers=workers, batch_size=batch_size, concurrency=concurrency)
    asked = read_request_file(requests_file)  # not a request file hdeval wrote: refused here, nothing sent
    if not asked:
        raise ConfigError(f"{requests_file} holds no request: nothing to answer")
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ds = ray.data.read_text(str(Path(requests_file).resolve())).map_batches(
        RequestAnswerer,
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=num_cpus,
        fn_constructor_args=(base_url,),
        fn_constructor_kwargs={"timeout": timeout, "max_retries": max_retries, "concurrency": concurrency},
    )
    n = 0
    with write_in_place(Path(results_file), keep_empty=True) as fh:
        for batch in ds.iter_batches(batch_size=batch_size, batch_format="numpy"):
            fh.writelines(f"{line}\n".encode() for line in batch["result"])
            n += len(batch["result"])
    return n


__all__ = ["ArtifactScorer", "RequestAnswerer", "WORKER_FIELD", "answer_requests_on_ray", "apply_on_ray"]
