"""``hdeval apply``: score new samples with any method's artifact, a chunk at a time
(``--shard K/N`` for one of N processes); ``hdeval merge-shards``: join the shards' outputs."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import click

from hdeval.cli.common import (
    OutputWriter, TerminalProgress, _check_llm_options, _input_tasks, _output_format, batch_option,
    llm_options, load_artifact, open_artifact_llm, run_command,
)
from hdeval.errors import ConfigError, DataError
from hdeval.progress import Progress

#: Samples read, scored and written at a time (a hidden knob for tests; memory holds one chunk).
CHUNK_ENV = "HDEVAL_APPLY_CHUNK"
DEFAULT_CHUNK = 1000
#: The field ``apply --shard`` adds to each row for ``merge-shards`` (which removes it again).
SHARD_FIELD = "shard"


def chunk_size() -> int:
    raw = os.environ.get(CHUNK_ENV, "")
    if not raw:
        return DEFAULT_CHUNK
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{CHUNK_ENV} must be a whole number of samples, at least 1; got {raw!r}")
    return value


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N) with 1 <= K <= N."""
    m = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text)
    k, n = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not m or n < 1 or not 1 <= k <= n:
        raise ConfigError(f"--shard must be K/N with 1 <= K <= N (e.g. --shard 2/4), got {text!r}")
    return k, n


def shard_of(sample_id: str, n: int) -> int:
    """The shard (1..n) a sample id belongs to: a stable hash (SHA-256), the same on every
    machine, Python version and run (not Python's salted ``hash``)."""
    digest = hashlib.sha256(sample_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % n + 1


class _ChunkProgress(Progress):
    """The scorer's progress with the chunk it belongs to in the label."""

    def __init__(self, inner: TerminalProgress):
        self.inner = inner
        self.prefix = ""

    def stage(self, label: str, total: int) -> None:
        self.inner.stage(self.prefix + label, total)

    def advance(self, n: int = 1, cached: bool = False) -> None:
        self.inner.advance(n, cached)

    def end_stage(self) -> None:
        self.inner.end_stage()

    def message(self, text: str) -> None:
        self.inner.message(text)


class _Summary:
    """What the closing summary needs, kept per row (numbers and labels, not samples):
    the predictions and human scores for correlations, or the labels for pairs' agreement."""

    def __init__(self) -> None:
        self.aspects: list[str] | None = None
        self.pred: list[Any] = []
        self.human: list[Any] = []
        self.all_human = True
        self.last: Any = None  # a pairwise result: the labels below replace its own at the end
        self.labels: dict[str, list] = {"labels": [], "labels_ab": [], "learned_labels": [], "learned_ab": []}
        self.learned = True
        self.human_labels: list[str | None] = []

    def add(self, samples: list, res: Any) -> None:
        import numpy as np

        if hasattr(res, "agreement"):
            self.last = res
            self.human_labels.extend(s.label for s in samples)
            # DnA results carry learned labels too; pairwise HD-Eval results only their own
            self.learned = self.learned and getattr(res, "learned_labels", None) is not None
            for name, values in self.labels.items():
                values.extend(getattr(res, name, None) or ())
            return
        self.aspects = list(res.aspects)
        if self.all_human and all(all(a in s.scores for a in self.aspects) for s in samples):
            self.pred.append(np.asarray(res.predictions, float))
            self.human.append(np.array([[s.scores[a] for a in self.aspects] for s in samples], float))
        else:
            self.all_human, self.pred, self.human = False, [], []

    def agreement(self) -> dict | None:
        if self.last is None:
            return None
        lab = self.labels
        fields = {f.name for f in dataclasses.fields(self.last)}
        kept = {"labels": lab["labels"], "labels_ab": lab["labels_ab"]}
        if "learned_labels" in fields:
            kept.update(learned_labels=lab["learned_labels"] if self.learned else None,
                        learned_ab=lab["learned_ab"] if self.learned else None)
        res = dataclasses.replace(self.last, **kept)
        return res.agreement([SimpleNamespace(label=h) for h in self.human_labels])

    def correlations(self) -> dict | None:
        import numpy as np

        from hdeval.metrics import metric_table

        if self.last is not None or not self.all_human or not self.pred:
            return None
        return metric_table(np.concatenate(self.human), np.concatenate(self.pred), self.aspects)


def _count(input_file: str, ev: Any, size: int, shard: tuple[int, int] | None) -> tuple[int, int]:
    """Validate the whole input before any LLM call (every bad line reported at once, as
    before streaming); return (samples in the file, samples in this shard)."""
    from hdeval.data import iter_task_chunks

    total = mine = 0
    for chunk in iter_task_chunks(input_file, ev.task, require_labels=False, size=size):
        total += len(chunk)
        mine += len(chunk) if shard is None else sum(shard_of(s.id, shard[1]) == shard[0] for s in chunk)
    return total, mine


@click.command()
@click.argument("artifact", type=click.Path())
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path())
@click.option("--output", "-o", default=None, type=click.Path(dir_okay=False, allow_dash=True),
              help="Where to write the scores: .jsonl, .csv or .parquet (by extension); - for JSONL on stdout. "
                   "Written a chunk at a time to a temporary file beside it and renamed into place at the "
                   "end (parquet holds the scored rows in memory until then).")
@click.option("--shard", default=None, metavar="K/N",
              help="Score only shard K of N (by a stable hash of each sample's id, the same on every "
                   "machine); rows carry a 'shard' field; join the N outputs with `hdeval merge-shards`. "
                   "Needs -o FILE.jsonl or -o -.")
@click.option("--export-requests", "export_file", default=None, metavar="REQUESTS.jsonl",
              type=click.Path(dir_okay=False),
              help="Score nothing: write the requests not cached yet as OpenAI batch-format JSONL "
                   "(custom_id = the cache key) for any engine that reads it (vLLM's batch runner, Ray "
                   "Data LLM, a provider's batch API), then exit. Import the answers with `hdeval cache "
                   "import RESULTS --requests REQUESTS.jsonl` and rerun: no calls for them. "
                   "OpenAI-compatible backends (--llm MODEL, --base-url URL).")
@click.option("--quiet", "-q", is_flag=True)
@click.option("--explain", is_flag=True,
              help="Add, per sample and aspect, the top contributing criteria with SHAP values.")
@click.option("--top", default=3, show_default=True, type=int, help="With --explain: criteria per aspect.")
@llm_options
@batch_option
def apply(artifact: str, input_file: str, output: str | None, shard: str | None, export_file: str | None,
          quiet: bool, explain: bool, top: int,
          llm: str | None, base_url: str | None,
          concurrency: int, timeout: float, max_retries: int, cache_dir: str | None,
          max_calls: int | None, batch: bool) -> None:
    """Score new samples with a trained evaluator (same criteria, prompts and LLM; cached).

    The input is validated first (every bad line reported, nothing paid for), then read, scored
    and written 1,000 samples at a time: memory does not grow with the input. An apply that
    fails or is stopped leaves no output file and leaves an existing one untouched; the LLM
    calls it finished are cached, so rerunning it resumes.

    \b
    Example:
      hdeval apply artifacts/summeval-nn new.jsonl -o scored.jsonl
      hdeval apply artifacts/summeval-nn new.jsonl -o - | jq .scores
      hdeval apply artifacts/summeval-nn new.jsonl --shard 1/2 -o part1.jsonl   # machine 1
      hdeval apply artifacts/summeval-nn new.jsonl --shard 2/2 -o part2.jsonl   # machine 2
      hdeval merge-shards scored.jsonl part1.jsonl part2.jsonl
      hdeval apply artifacts/summeval-nn new.jsonl --llm M --base-url URL --export-requests requests.jsonl
    """
    from hdeval.data import iter_task_chunks
    from hdeval.methods.base import usage_of

    def go() -> None:
        _check_llm_options(concurrency=concurrency, timeout=timeout, max_retries=max_retries, max_calls=max_calls)
        which = parse_shard(shard) if shard is not None else None
        if export_file is not None:
            return _export(artifact, input_file, export_file, which, output, explain, batch, llm, base_url,
                           timeout, max_retries, cache_dir, concurrency)
        if output is None:
            raise ConfigError("apply needs --output FILE (or -o - for stdout), or --export-requests FILE")
        fmt = _output_format(output)
        if which is not None and fmt != "jsonl":
            raise ConfigError(f"--shard writes JSONL for `hdeval merge-shards`: use -o FILE.jsonl or -o -, "
                              f"not {output} (merge-shards writes .csv or .parquet)")
        size = chunk_size()
        to_stdout = output == "-"
        ev = load_artifact(artifact)
        if explain and ev.method != "hdeval":
            raise ConfigError(f"--explain reads HD-Eval artifacts; {artifact} was made by method {ev.method!r}")
        if explain and ev.task.shape == "pairwise":
            raise ConfigError(f"--explain reads pointwise HD-Eval artifacts; {artifact} judges pairs (its "
                              "criteria and their importance: hdeval report)")
        total, mine = _count(input_file, ev, size, which)
        other = sorted(_input_tasks(input_file) - {ev.task.name})
        if other:
            click.echo(f"warning: {input_file} holds samples of task {', '.join(other)}, but the artifact was "
                       f"trained on task {ev.task.name}; its scores will mean little there", err=True)
        needed = ev.columns_needed()
        count = f"{mine} samples" if which is None else f"{mine} of {total} samples in shard {which[0]}/{which[1]}"
        if ev.method == "hdeval":
            per = ev.calls_per_sample() if hasattr(ev, "calls_per_sample") else len(needed)  # pairs: 2 per criterion
            click.echo(f"{count}, {len(needed)} of {len(ev.feature_keys)} criteria used by the "
                       f"aggregator: {per} LLM calls per sample", err=True)
        else:
            click.echo(f"{count}; method {ev.method}: {len(needed)} LLM-filled column(s) "
                       "per sample", err=True)
        summary = _Summary()
        n_chunks = max(1, math.ceil(mine / size))
        progress = _ChunkProgress(TerminalProgress(quiet))  # .inner: a TerminalProgress
        with OutputWriter(output, fmt) as out:
            backend = None
            try:
                if mine:
                    backend = open_artifact_llm(ev, llm=llm, base_url=base_url, timeout=timeout,
                                                max_retries=max_retries, cache_dir=cache_dir,
                                                max_calls=max_calls, concurrency=concurrency,
                                                batch=bool(batch))
                for k, samples in enumerate(_shard_chunks(iter_task_chunks(input_file, ev.task, require_labels=False,
                                                                           size=size), which, size), 1):
                    progress.prefix = f"chunk {k}/{n_chunks}: " if n_chunks > 1 else ""
                    res = ev.score(samples, backend=backend, concurrency=concurrency, progress=progress)
                    rows = ev.output_rows(samples, res)
                    if explain:
                        from hdeval.methods.hdeval.explain import explain_samples

                        for row, expl in zip(rows, explain_samples(ev, res, top=top)):
                            row["explanation"] = expl
                    if which is not None:
                        for row, s in zip(rows, samples):
                            row[SHARD_FIELD] = {"k": which[0], "n": which[1], "line": s.line}
                    out.write(rows)
                    summary.add(samples, res)
                u = usage_of(backend) if backend is not None else {}
            finally:
                progress.inner.close()
                if backend is not None:
                    backend.close()
            out.commit()
        click.echo(f"LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}, tokens: "
                   f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion", err=True)
        agreement = summary.agreement()
        if agreement:
            click.echo(f"agreement with the human labels in the input: {json.dumps(agreement)}", err=to_stdout)
        corr = summary.correlations()
        if corr is not None:
            click.echo("correlation with the human scores in the input:", err=to_stdout)
            for a, row in corr.items():
                click.echo(f"  {a:<18} pearson {row['pearson']}  spearman {row['spearman']}  kendall {row['kendall']}",
                           err=to_stdout)
        click.echo(f"wrote {out.rows} scored samples to {'stdout' if to_stdout else output}", err=to_stdout)

    run_command(go)


def _export(artifact: str, input_file: str, export_file: str, which: tuple[int, int] | None, output: str | None,
            explain: bool, batch: bool, llm: str | None, base_url: str | None, timeout: float, max_retries: int,
            cache_dir: str | None, concurrency: int) -> None:
    """``apply --export-requests``: the uncached requests into a file, no call made."""
    from hdeval.data import iter_task_chunks
    from hdeval.request_files import export_requests

    for given, name in ((output, "--output"), (explain or None, "--explain"), (batch or None, "--batch")):
        if given is not None:
            raise ConfigError(f"--export-requests scores nothing: drop {name}")
    from hdeval.artifact import check_writable

    check_writable(Path(os.path.abspath(export_file)).parent)
    size = chunk_size()
    ev = load_artifact(artifact)
    _count(input_file, ev, size, which)  # every bad line reported before anything is written
    # max_calls=0: whatever a scorer asks, nothing is paid for while exporting
    backend = open_artifact_llm(ev, llm=llm, base_url=base_url, timeout=timeout, max_retries=max_retries,
                                cache_dir=cache_dir, max_calls=0, concurrency=concurrency)
    try:
        chunks = _shard_chunks(iter_task_chunks(input_file, ev.task, require_labels=False, size=size), which, size)
        done = export_requests(ev, chunks, backend, export_file)
    finally:
        backend.close()
    n = len(done.written)
    if not n:
        click.echo(f"every request is cached: nothing to export ({export_file} is empty); run apply with -o", err=True)
        return
    where = f" --cache-dir {cache_dir}" if cache_dir else ""
    click.echo(f"wrote {n} requests not cached yet to {export_file}; answer them with any engine that reads "
               f"the OpenAI batch format, then `hdeval cache import RESULTS.jsonl --requests {export_file}{where}` "
               "and rerun apply (a method whose later stage depends on these replies exports that stage "
               "on the next --export-requests)", err=True)


def _shard_chunks(chunks: Iterator[list], which: tuple[int, int] | None, size: int) -> Iterator[list]:
    """The chunks of this shard's samples, ``size`` at a time."""
    if which is None:
        yield from chunks
        return
    k, n = which
    buf: list = []
    for chunk in chunks:
        buf.extend(s for s in chunk if shard_of(s.id, n) == k)
        while len(buf) >= size:
            yield buf[:size]
            buf = buf[size:]
    if buf:
        yield buf


# ----------------------------------------------------------------------------- merge-shards
class _ShardFile:
    """One shard output of ``apply --shard``, read a row at a time with its checks."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.fh = open(path, encoding="utf-8")
        except OSError as exc:
            raise DataError(f"cannot open shard output {path}: {exc.strerror or exc}") from None
        self.lineno = 0
        self.k: int | None = None
        self.n: int | None = None
        self.last_line = 0

    def rows(self) -> Iterator[tuple[int, str, dict]]:
        """(input line, id, row without the shard field) in the order of the file."""
        with self.fh:
            try:
                for text in self.fh:
                    self.lineno += 1
                    if text.strip():
                        yield self._check(text)
            except UnicodeDecodeError:
                raise DataError(f"{self.path}: line {self.lineno + 1}: not UTF-8 text") from None

    def _check(self, text: str) -> tuple[int, str, dict]:
        where = f"{self.path}: line {self.lineno}"
        try:
            row = json.loads(text)
        except ValueError as exc:
            raise DataError(f"{where}: not valid JSON ({exc})") from None
        except RecursionError:
            raise DataError(f"{where}: not usable JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: not a JSON object")
        info = row.pop(SHARD_FIELD, None)
        sid = row.get("id")
        ok = isinstance(info, dict) and all(type(info.get(f)) is int for f in ("k", "n", "line"))
        if not ok or not isinstance(sid, str):
            raise DataError(f"{where}: no '{SHARD_FIELD}' field with k, n and line, or no text 'id': not a row "
                            "written by `hdeval apply --shard K/N`")
        k, n, line = info["k"], info["n"], info["line"]
        if not 1 <= k <= n:
            raise DataError(f"{where}: shard {k}/{n} is not a shard")
        if self.k is None:
            self.k, self.n = k, n
        elif (k, n) != (self.k, self.n):
            raise DataError(f"{where}: row of shard {k}/{n} in a file of shard {self.k}/{self.n}")
        if shard_of(sid, n) != k:
            raise DataError(f"{where}: id {sid!r} belongs to shard {shard_of(sid, n)}/{n}, not {k}/{n}")
        if line <= self.last_line:
            raise DataError(f"{where}: input line {line} after line {self.last_line}: rows are not in input "
                            "order (was the file edited or concatenated?)")
        self.last_line = line
        return line, sid, row


@click.command("merge-shards")
@click.argument("output", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("shards", nargs=-1, required=True, type=click.Path(dir_okay=False))
def merge_shards(output: str, shards: tuple[str, ...]) -> None:
    """Join the outputs of `hdeval apply --shard K/N` (K = 1..N, one file each) into OUTPUT.

    Rows come out in the order of the input file (each row recorded its input line), without
    the 'shard' field: the same rows an unsharded apply writes. OUTPUT is .jsonl, .csv or
    .parquet (by extension) or - for JSONL on stdout, written atomically. Refused, writing
    nothing: a shard missing or given twice, files of different N, an id in two files, a row
    not written by apply --shard.

    \b
    Example:
      hdeval merge-shards scored.jsonl part1.jsonl part2.jsonl part3.jsonl
    """

    def go() -> None:
        fmt = _output_format(output)
        files = [_ShardFile(p) for p in shards]
        gens = [f.rows() for f in files]
        heads: list[tuple[int, int, str, dict]] = []
        for i, g in enumerate(gens):
            first = next(g, None)
            if first is not None:
                heads.append((first[0], i, first[1], first[2]))
        _check_shard_set(files)
        heapq.heapify(heads)
        seen: dict[str, str] = {}
        last_line, last_file = 0, ""
        with OutputWriter(output, fmt) as out:
            batch: list[dict] = []
            while heads:
                line, i, sid, row = heapq.heappop(heads)
                if line == last_line:
                    raise DataError(f"{files[i].path} and {last_file} both hold input line {line}: "
                                    "shards of different runs?")
                if sid in seen:
                    raise DataError(f"id {sid!r} is in {seen[sid]} and {files[i].path}")
                seen[sid] = files[i].path
                last_line, last_file = line, files[i].path
                batch.append(row)
                if len(batch) >= DEFAULT_CHUNK:
                    out.write(batch)
                    batch = []
                nxt = next(gens[i], None)
                if nxt is not None:
                    heapq.heappush(heads, (nxt[0], i, nxt[1], nxt[2]))
            out.write(batch)
            out.commit()
        n = next(f.n for f in files if f.n is not None) if any(f.n for f in files) else len(files)
        click.echo(f"merged {out.rows} rows of {n} shard(s) into {'stdout' if output == '-' else output}", err=True)

    run_command(go)


def _check_shard_set(files: list[_ShardFile]) -> None:
    """Every shard 1..N exactly once (a file with no rows stands for a shard with no samples)."""
    ns = {f.n for f in files if f.n is not None}
    if len(ns) > 1:
        raise DataError("the files are shards of different splits: " + ", ".join(
            f"{f.path} is {f.k}/{f.n}" for f in files if f.n is not None))
    if not ns:
        return  # every file empty: nothing to merge
    n = ns.pop()
    by_k: dict[int, str] = {}
    for f in files:
        if f.k is not None:
            if f.k in by_k:
                raise DataError(f"shard {f.k}/{n} given twice: {by_k[f.k]} and {f.path}")
            by_k[f.k] = f.path
    empty = sum(f.k is None for f in files)
    missing = [k for k in range(1, n + 1) if k not in by_k]
    if len(missing) > empty:
        raise DataError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing: pass the outputs of all "
                        f"{n} shards ({len(files)} file(s) given)")
    if len(files) > n:
        raise DataError(f"{len(files)} files given for {n} shards: {len(files) - n} too many")
