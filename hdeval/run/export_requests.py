"""``apply --export-requests``: a run's uncached requests written as an OpenAI batch-format file
(:mod:`hdeval.llm.request_files`), on apply's own validation, shards and artifact-LLM policy."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from hdeval.core.errors import ConfigError
from hdeval.llm.request_files import export_requests


def export_apply_requests(
    artifact: str | Path,
    input_file: str | Path,
    export_file: str | Path,
    *,
    shard: str | None = None,
    llm: str | None = None,
    base_url: str | None = None,
    concurrency: int | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
    cache_dir: str | None = None,
    replace: bool = True,
    **policy: Any,
) -> int:
    """``apply --export-requests``: the requests scoring ``input_file`` with ``artifact`` still
    needs (not cached), written to ``export_file``; how many. Nothing is paid for. ``policy``:
    ``llm_given``, ``base_url_given``, ``confirm``, ``notify`` as for
    :func:`hdeval.run.apply.apply_file`. ``replace=False``: an existing ``export_file`` is
    refused; a file inside the reply cache always is."""
    from hdeval.artifact.directory import check_writable
    from hdeval.data.samples import DiskIds, check_readable
    from hdeval.methods.registry import load_artifact
    from hdeval.run.apply import ApplyInput, chunk_size
    from hdeval.run.artifact_llm import open_artifact_llm
    from hdeval.run.output import check_output
    from hdeval.run.shards import parse_shard

    which = parse_shard(shard) if shard is not None else None
    check_output(
        export_file, [input_file, artifact], option="--export-requests", replace=replace, cache_dir=cache_dir
    )
    near = Path(os.path.abspath(export_file)).parent
    check_writable(near)
    check_readable(input_file)
    size = chunk_size()
    ev = load_artifact(artifact)
    refusal = ev.export_refusal()
    if refusal:
        raise ConfigError(refusal)
    # one reading pass, as apply's: each chunk validated (ids through the on-disk index) as it is
    # exported; a bad line anywhere raises at the end of the pass and the export file is not written
    with DiskIds(near) as seen:
        chunks = ApplyInput(str(input_file), ev, size, which).chunks(seen)
        first = next(chunks, None)  # as apply: a bad first chunk is reported before the LLM is opened
        # max_calls=0: whatever a scorer asks, nothing is paid for while exporting
        backend = open_artifact_llm(
            ev,
            llm=llm,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            cache_dir=cache_dir,
            max_calls=0,
            concurrency=concurrency,
            **policy,
        )
        try:
            read = itertools.chain([first] if first is not None else [], chunks)
            return len(export_requests(ev, read, backend, export_file).written)
        finally:
            chunks.close()
            backend.close()
