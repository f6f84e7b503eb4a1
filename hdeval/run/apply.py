"""Streaming ``apply``: score a JSONL file with any method's artifact a chunk at a time (memory
holds one chunk), optionally one shard of N, into an atomically written output."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from hdeval.core.errors import ConfigError, DataError, ScoringError
from hdeval.core.fetch import sha256_file
from hdeval.core.progress import Progress
from hdeval.data.labels_db import is_labels_file
from hdeval.data.samples import labels_file_refused
from hdeval.methods.base import Explains, check_top, explain_refusal
from hdeval.run.artifact_llm import Notify, check_llm_options, log_notify, open_artifact_llm
from hdeval.run.output import OutputWriter, check_output, output_format
from hdeval.run.ppi_rows import RowsSummary
from hdeval.run.shards import (
    SHARD_FIELD,
    artifact_sha256,
    closing_record,
    parse_shard,
    shard_of,
)
from hdeval.run.trust import DEFAULT_MAX_WIDTH, RowTrust

#: Samples read, scored and written at a time (a hidden knob for tests; memory holds one chunk).
CHUNK_ENV = "HDEVAL_APPLY_CHUNK"
DEFAULT_CHUNK = 1000


def chunk_size() -> int:
    raw = os.environ.get(CHUNK_ENV) or str(DEFAULT_CHUNK)
    if not raw.strip().isdecimal() or int(raw) < 1:
        raise ConfigError(f"{CHUNK_ENV} must be a whole number of samples, at least 1; got {raw!r}")
    return int(raw)


class _ChunkProgress(Progress):
    """The scorer's progress with its chunk in the label (``expect``, of one chunk, not passed on)."""

    def __init__(self, inner: Progress):
        self.inner, self.prefix = inner, ""
        self.advance, self.end_stage, self.message = inner.advance, inner.end_stage, inner.message

    def stage(self, label: str, total: int) -> None:
        self.inner.stage(self.prefix + label, total)


class _Summary:
    """What the closing summary needs, kept per row (numbers and labels, not samples): the
    predictions and human scores for correlations, appended to one file per aspect in
    ``scratch`` (read back an aspect at a time at the end: in memory they grew 16 B per sample
    and aspect), or the labels for pairs' agreement."""

    def __init__(self, scratch: str, name: str) -> None:
        self.scratch, self.name = scratch, name  # name: this summary's files in the shared scratch dir
        self.aspects: list[str] | None = None
        self.rows = 0
        self.all_human = True
        self.last: Any = None  # a pairwise result: the labels below replace its own at the end
        self.labels: dict[str, list] = {"labels": [], "labels_ab": [], "learned_labels": [], "learned_ab": []}
        self.learned = True
        self.human_labels: list[str | None] = []

    def add(self, samples: list, res: Any, keep: list[bool] | None = None) -> None:
        """``keep``: which rows count (None: every row)."""
        import numpy as np

        if hasattr(res, "agreement"):
            self.last = res
            kept = [True] * len(samples) if keep is None else keep
            self.human_labels.extend(s.label for s, k in zip(samples, kept) if k)
            # DnA results carry learned labels too; pairwise HD-Eval results only their own
            self.learned = self.learned and getattr(res, "learned_labels", None) is not None
            for name, values in self.labels.items():
                values.extend(v for v, k in zip(getattr(res, name, None) or (), kept) if k)
            return
        self.aspects = list(res.aspects)
        if self.all_human and all(all(a in s.scores for a in self.aspects) for s in samples):
            mask = np.ones(len(samples), bool) if keep is None else np.asarray(keep, bool)
            pred = np.asarray(res.predictions, float)[mask]
            human = np.array([[s.scores[a] for a in self.aspects] for s in samples], float).reshape(
                -1, len(self.aspects)
            )[mask]
            for j in range(len(self.aspects)):
                for name, values in (("pred", pred), ("human", human)):
                    with open(self._column(name, j), "ab") as fh:
                        fh.write(np.ascontiguousarray(values[:, j], "<f8").tobytes())
            self.rows += int(mask.sum())
        else:
            self.all_human = False

    def agreement(self) -> dict | None:
        if self.last is None or not self.human_labels:
            return None
        fields = {f.name for f in dataclasses.fields(self.last)}
        kept = {
            k: v if self.learned or not k.startswith("learned") else None
            for k, v in self.labels.items()
            if k in fields
        }
        res = dataclasses.replace(self.last, **kept)
        return res.agreement([SimpleNamespace(label=h) for h in self.human_labels])

    def _column(self, name: str, j: int) -> str:
        return os.path.join(self.scratch, f"{self.name}-{name}-{j}.f64")

    def correlations(self) -> dict | None:
        """As :func:`hdeval.core.metrics.metric_table` on every row, one aspect in memory at a time."""
        import numpy as np

        from hdeval.core.metrics import average, streamed_correlations

        if self.last is not None or not self.all_human or not self.rows or self.aspects is None:
            return None
        table = {
            a: streamed_correlations(lambda name, j=j: np.fromfile(self._column(name, j), "<f8"))
            for j, a in enumerate(self.aspects)
        }
        table["average"] = average(table)
        return table


class ApplyInput:
    """One streaming read of the input: this shard's samples a chunk at a time, every line
    validated as it is reached, the ids seen kept in an on-disk index (a duplicate id always
    falls in the shard of its first use, so each shard checks its own ids against the whole
    file). Once read: the samples in the file (``total``) and in this shard (``mine``)."""

    def __init__(self, path: str, ev: Any, size: int, shard: tuple[int, int] | None):
        self.path, self.ev, self.size, self.shard = path, ev, size, shard
        self.total = self.mine = 0

    def _keep(self, sample_id: str) -> bool:  # a sharded read counts every sample here
        self.total += 1
        return shard_of(sample_id, self.shard[1]) == self.shard[0]  # type: ignore[index]

    def chunks(self, seen: Any) -> Iterator[list]:
        from hdeval.data.samples import iter_task_chunks

        for chunk in iter_task_chunks(
            self.path,
            self.ev.task,
            require_labels=False,
            size=self.size,
            seen=seen,
            keep=self._keep if self.shard is not None else None,
        ):
            self.mine += len(chunk)
            self.total += 0 if self.shard is not None else len(chunk)
            yield chunk


class _Nothing:
    def close(self) -> None:
        pass


class _InputColumns:
    """``--keep-columns``: each scored row's own columns from the input, by a second streaming
    read of the file advanced to each sample's line (memory holds one row); an input column
    named like an output field is kept as ``input.<name>``."""

    def __init__(self, path: str) -> None:
        from hdeval.data.samples import data_rows

        self._rows = data_rows(path)

    def add(self, rows: list[dict], samples: list) -> None:
        for row, sample in zip(rows, samples):
            values: dict = {}
            for lineno, values in self._rows:  # noqa: B007 (the last row read is used after the loop)
                if lineno >= sample.line:
                    break
            kept = {k if k not in row else f"input.{k}": v for k, v in values.items()}
            _prepend(row, kept)

    def close(self) -> None:
        self._rows.close()


def _prepend(row: dict, first: dict) -> None:
    """``first``'s entries put in front of ``row``'s, in place (the input's columns lead)."""
    rest = dict(row)
    row.clear()
    row.update(first)
    row.update(rest)


def _scan_bytes(path: str, digest: bool) -> tuple[int, str | None]:
    """(lines, sha256 if asked) of the file, read as bytes: no parse and no memory, for the
    progress estimate and a shard's closing record."""
    if not os.path.isfile(path):
        return 0, None  # /dev/zero, a FIFO: never read unbounded; the bounded reading pass reports it
    h = hashlib.sha256() if digest else None
    lines, last = 0, b"\n"
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                lines += block.count(b"\n")
                last = block[-1:]
                if h is not None:
                    h.update(block)
    except OSError:
        return 0, None  # the reading pass reports a file it cannot read
    return lines + (last != b"\n"), h.hexdigest() if h is not None else None


def _input_tasks(path: str, limit: int) -> set[str]:
    """The ``task`` names the input's first ``limit`` lines declare (rows written by hdeval
    carry one): a warning before anything is paid, so the head of the file stands for it."""
    from hdeval.data.samples import bounded_lines

    found: set[str] = set()
    try:
        with open(path, encoding="utf-8") as fh:
            for line in itertools.islice(bounded_lines(fh, path), limit):
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # the reading pass names a line nested too deeply
                    continue
                if isinstance(row, dict) and isinstance(row.get("task"), str):
                    found.add(row["task"])
    except (OSError, UnicodeDecodeError, DataError):
        pass  # the reading pass reports a bad file
    return found


@dataclass
class ApplyResult:
    """What an apply did: rows written, samples in the input and in this shard, LLM usage,
    and how the scores agree with any human scores or labels the input carried."""

    rows: int
    total: int
    scored: int
    usage: dict = field(default_factory=dict)
    agreement: dict | None = None
    correlations: dict | None = None
    failed: int = 0  # LLM-filled cells (sample x column) that could not be read
    cells: int = 0
    trust: dict = field(default_factory=dict)  # run.trust.RowTrust.summary(): training rows, intervals

    @property
    def failure_rate(self) -> float:
        return self.failed / self.cells if self.cells else 0.0


def check_failures(failed: int, cells: int, max_rate: float, example: str | None, option: str) -> None:
    """Too many unreadable LLM-filled cells: no output, since imputed scores would read as real ones."""
    if cells and failed / cells > max_rate:
        raise ScoringError(
            f"{failed} of {cells} LLM-filled scores ({failed / cells:.0%}) could not be read (threshold "
            f"{max_rate:.0%}){', ' + example if example else ''}; no output written; the replies "
            f"that were read are cached; check the LLM or raise {option}"
        )


def load_checked(
    artifact: str | Path | Any, explain: bool, max_interval_width: float, notify: Notify | None = None
) -> tuple[Any, RowTrust]:
    """The evaluator (a path is loaded and verified, its warnings to ``notify``) and its row trust,
    once ``explain`` and the interval width are known to fit it: all before any call."""
    ev = artifact
    if isinstance(artifact, (str, Path)):
        from hdeval.methods.registry import load_artifact

        ev = load_artifact(artifact)
        for w in ev.warnings if notify is not None else ():
            notify(f"warning: {w}")
    if explain and not isinstance(ev, Explains):
        raise ConfigError(explain_refusal(ev, artifact, "--explain"))
    return ev, RowTrust(ev, max_interval_width)


def score_rows(
    ev: Any,
    samples: list,
    backend: Any,
    concurrency: int | None,
    progress: Progress,
    trust: RowTrust,
    explain: bool,
    top: int,
) -> tuple[list[dict], Any, tuple[int, int, str | None]]:
    """One chunk scored into the rows apply writes (trust fields, explanations), its result, and
    (cells that failed, cells, an example reason) of its LLM-filled columns."""
    import numpy as np

    res = ev.score(samples, backend=backend, concurrency=concurrency, progress=progress)
    rows = ev.output_rows(samples, res)
    trust.annotate(rows, samples, res)
    if explain:
        for row, expl in zip(rows, ev.explain(res, top=top)):
            row["explanation"] = expl
    m = res.criteria
    needed = ev.columns_needed()
    if not needed:  # e.g. HD-Eval that kept no criterion (constant human scores): nothing was asked
        return rows, res, (0, 0, None)
    values = m.columns([k for k in needed if k in m.criterion_keys] or list(m.criterion_keys))
    failed = int(np.isnan(values).sum())
    f = m.failures[0] if failed and m.failures else None
    example = f and f"e.g. sample {f.sample_id} on {f.criterion_key}: {f.reason}"
    return rows, res, (failed, int(values.size), example)


def prepare(
    artifact: str | Path | Any,
    input_file: str | Path,
    output: str,
    *,
    explain: bool,
    max_interval_width: float,
    max_failure_rate: float,
    rate_option: str,
    llm_options: dict,
    notify: Notify | None = None,
    replace: bool = True,
    top: int = 3,
) -> tuple[Any, RowTrust, str, int]:
    """What apply and apply_on_ray check before the input is read or a call paid: the LLM options,
    the failure rate, ``top`` with ``explain``, the output (an existing one only if ``replace``)
    and the artifact; (evaluator, row trust, output format, chunk size)."""
    from hdeval.data.samples import check_readable

    check_llm_options(**llm_options)
    if explain:
        check_top(top)
    if not (isinstance(max_failure_rate, (int, float)) and 0 <= max_failure_rate <= 1):
        raise ConfigError(f"{rate_option} must be between 0 and 1, got {max_failure_rate}")
    check_output(output, [input_file], cache_dir=llm_options.get("cache_dir"))
    check_readable(input_file)
    fmt, size = output_format(output), chunk_size()
    ev, trust = load_checked(artifact, explain, max_interval_width, notify)
    # after loading: a directory that is no artifact is reported as that, not as an output clash,
    # and an output inside the artifact as that, not as an existing file
    check_output(output, [ev.path], replace=replace)
    return ev, trust, fmt, size


def apply_file(
    artifact: str | Path | Any,
    input_file: str,
    output: str,
    *,
    shard: str | None = None,
    explain: bool = False,
    top: int = 3,
    max_failure_rate: float = 0.2,
    max_interval_width: float = DEFAULT_MAX_WIDTH,
    llm_given: bool | None = None,
    base_url_given: bool | None = None,
    confirm: Callable[[str], bool] | None = None,
    progress: Progress | None = None,
    notify: Notify = log_notify,
    replace: bool = True,
    keep_columns: bool = False,
    **llm_options: Any,
) -> ApplyResult:
    """Score ``input_file`` with ``artifact`` (a path or a loaded evaluator) into ``output``
    (.jsonl, .csv, .parquet, or ``-`` for JSONL on stdout).

    The input is read once, each chunk validated, scored and written in turn (ids checked for
    duplicates through an on-disk index). A bad line, a failure or a stop leaves no output and an
    existing file untouched (a bad line: every bad line of the file listed); finished LLM calls
    are cached, so a rerun resumes. ``shard="K/N"`` scores one
    shard (rows carry a ``shard`` field for :func:`hdeval.run.shards.merge_shards`). Lines of
    information and warnings go to ``notify``; ``llm_options`` are those of ``hdeval apply`` by name
    (``llm``, ``base_url``, ``concurrency``, ...; None: the configured default, :mod:`hdeval.llm.config`).
    More than ``max_failure_rate`` of the LLM-filled cells unreadable (refused requests, replies
    too large or not understood) is a :class:`ScoringError` and no output: imputed scores would
    read as real ones. ``replace=False``: an existing ``output`` is refused (``apply`` without
    ``--force``). ``keep_columns``: each row also holds the input row's own columns (CSV, JSON,
    ... as read), ahead of the scores."""
    from hdeval.data.samples import DiskIds
    from hdeval.methods.base import usage_of

    which = parse_shard(shard) if shard is not None else None
    ev, trust, fmt, size = prepare(
        artifact,
        input_file,
        output,
        explain=explain,
        max_interval_width=max_interval_width,
        max_failure_rate=max_failure_rate,
        rate_option="--max-failure-rate",
        notify=notify,
        llm_options=llm_options,
        replace=replace,
        top=top,
    )
    if which is not None and fmt != "jsonl":
        raise ConfigError(
            f"--shard writes JSONL for `hdeval merge-shards`: use -o FILE.jsonl or -o -, "
            f"not {output} (merge-shards writes .csv or .parquet)"
        )
    near = None if output == "-" else os.path.dirname(os.path.abspath(output))  # the id index's place
    if is_labels_file(input_file):  # before "up to N samples", which would count a database's lines
        raise labels_file_refused(input_file)
    lines, input_sha = _scan_bytes(input_file, digest=which is not None)
    whole = getattr(ev, "whole_input", None)  # rows compared with each other (all-vs-all PairEval)
    if whole:
        fits = which is None
        if fits and lines > size:  # the line count bounds the samples: count them only past it
            with DiskIds(near) as ids:
                chunks = ApplyInput(input_file, ev, size + 1, None).chunks(ids)
                fits = len(next(chunks, [])) <= size
                chunks.close()
        if not fits:
            raise ConfigError(
                f"{whole}: apply scores it in one piece only (at most {size} samples, no --shard)"
            )
    other = sorted(_input_tasks(input_file, size) - {ev.task.name})
    if other:
        notify(
            f"warning: {input_file} holds samples of task {', '.join(other)}, but the artifact was "
            f"trained on task {ev.task.name}; its scores will mean little there"
        )
    # the exact counts are known once the one reading pass is done (they close the run)
    expect = lines if which is None else math.ceil(lines / which[1])
    count = (
        f"up to {lines} samples"
        if which is None
        else f"about {expect} of up to {lines} samples in shard {which[0]}/{which[1]}"
    )
    notify(count + ev.cost_line())
    failed = cells = 0
    example: str | None = None
    n_chunks = max(1, math.ceil(expect / size))
    chunk_progress = _ChunkProgress(progress or Progress())
    reading = ApplyInput(input_file, ev, size, which)
    kept = _InputColumns(input_file) if keep_columns else None
    human = RowsSummary(
        list(ev.task.aspect_keys), ev.task.shape == "pairwise"
    )  # the human mean the labels give
    with OutputWriter(output, fmt) as out, DiskIds(near) as seen, contextlib.closing(kept or _Nothing()):
        # the headline figures are the held-out rows'; the training rows' are kept apart
        summary = _Summary(seen.directory, "held-out")
        training = _Summary(seen.directory, "training")
        backend = None
        try:
            for k, samples in enumerate(reading.chunks(seen), 1):
                if backend is None:
                    backend = open_artifact_llm(
                        ev,
                        llm_given=llm_given,
                        base_url_given=base_url_given,
                        confirm=confirm,
                        notify=notify,
                        **llm_options,
                    )
                if n_chunks > 1 or k > 1:
                    shown = f"{'~' if which is not None else ''}{max(n_chunks, k)}"
                    chunk_progress.prefix = f"chunk {k}/{shown}: "
                rows, res, (f, c, e) = score_rows(
                    ev, samples, backend, llm_options.get("concurrency"), chunk_progress, trust, explain, top
                )
                if kept is not None:
                    kept.add(rows, samples)
                if which is not None:
                    for row, s in zip(rows, samples):
                        row[SHARD_FIELD] = {"k": which[0], "n": which[1], "line": s.line}
                out.write(rows)
                human.add(rows)
                summary.add(samples, res, keep=[not row["in_training"] for row in rows])
                training.add(samples, res, keep=[row["in_training"] for row in rows])
                failed, cells, example = failed + f, cells + c, example or e
            mine, total = reading.mine, reading.total
            notify(
                (
                    f"{mine} samples"
                    if which is None
                    else f"{mine} of {total} samples in shard {which[0]}/{which[1]}"
                )
                + " read and scored"
            )
            if which is not None:
                out.write(
                    [
                        closing_record(
                            which[0],
                            which[1],
                            mine,
                            input_sha or sha256_file(input_file),
                            artifact_sha256(ev.path),
                        )
                    ],
                    counted=False,
                )
            usage = usage_of(backend) if backend is not None else {}
        finally:
            if backend is not None:
                backend.close()
        check_failures(failed, cells, max_failure_rate, example, "--max-failure-rate")
        agreement, correlations = summary.agreement(), summary.correlations()
        apart = {"agreement_training": training.agreement(), "correlations_training": training.correlations()}
        out.commit()
    if trust.warning():
        notify(trust.warning())
    trusted = trust.summary()
    if trust.in_training:
        trusted.update({k: v for k, v in apart.items() if v is not None})
    if human.summary() is not None:
        trusted["human_mean"] = human.summary()
    return ApplyResult(
        rows=out.rows,
        total=total,
        scored=mine,
        usage=usage,
        agreement=agreement,
        correlations=correlations,
        failed=failed,
        cells=cells,
        trust=trusted,
    )
