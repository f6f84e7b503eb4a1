"""``--shard K/N``: which samples a shard scores, and merging the N shard outputs back into
exactly the rows an unsharded run writes."""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from typing import Iterator

from hdeval.errors import ConfigError, DataError
from hdeval.run.output import OutputWriter, output_format

#: The field ``apply --shard`` adds to each row for ``merge-shards`` (which removes it again).
SHARD_FIELD = "shard"
#: Rows the merge hands the writer at a time.
MERGE_ROWS = 1000


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


def shard_chunks(chunks: Iterator[list], which: tuple[int, int] | None, size: int) -> Iterator[list]:
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


class ShardFile:
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


def merge_shards(output: str, shards: list[str] | tuple[str, ...]) -> tuple[int, int]:
    """Join the shard outputs into ``output`` in input order, atomically; (rows, N)."""
    fmt = output_format(output)
    files = [ShardFile(p) for p in shards]
    gens = [f.rows() for f in files]
    heads: list[tuple[int, int, str, dict]] = []
    for i, g in enumerate(gens):
        first = next(g, None)
        if first is not None:
            heads.append((first[0], i, first[1], first[2]))
    check_shard_set(files)
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
            if len(batch) >= MERGE_ROWS:
                out.write(batch)
                batch = []
            nxt = next(gens[i], None)
            if nxt is not None:
                heapq.heappush(heads, (nxt[0], i, nxt[1], nxt[2]))
        out.write(batch)
        out.commit()
    n = next(f.n for f in files if f.n is not None) if any(f.n for f in files) else len(files)
    return out.rows, n


def check_shard_set(files: list[ShardFile]) -> None:
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
