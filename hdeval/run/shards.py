"""``--shard K/N``: which samples a shard scores, and merging the N shard outputs back into
exactly the rows an unsharded run writes."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import os
import re
from pathlib import Path
from typing import Iterator

from hdeval.core.errors import ConfigError, DataError
from hdeval.core.fetch import sha256_file
from hdeval.run.output import OutputWriter, check_output, output_format

#: The field ``apply --shard`` adds to each row for ``merge-shards`` (which removes it again).
SHARD_FIELD = "shard"
#: Rows the merge hands the writer at a time.
MERGE_ROWS = 1000
#: The most shards ``--shard`` accepts (9 digits), and so the most a shard output may claim.
MAX_SHARDS = 999_999_999
_SHA256 = re.compile(r"[0-9a-f]{64}")


def artifact_sha256(path: str | Path | None) -> str:
    """The artifact's identity for shard outputs: its manifest holds every file's checksum."""
    from hdeval.artifact.directory import MANIFEST

    if path is None:
        return "0" * 64  # an evaluator never saved: shards of it merge only with each other
    return sha256_file(Path(path) / MANIFEST)


def closing_record(k: int, n: int, rows: int, input_sha256: str, artifact_sha256: str) -> dict:
    """The last line of a shard output: what ``merge-shards`` checks the set against (it is not
    a scored row and never reaches the merged output)."""
    return {
        SHARD_FIELD: {
            "k": k,
            "n": n,
            "rows": rows,
            "input_sha256": input_sha256,
            "artifact_sha256": artifact_sha256,
        }
    }


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


class ShardFile:
    """One shard output of ``apply --shard``, read a row at a time with its checks."""

    def __init__(self, path: str):
        try:
            self.fh = open(path, encoding="utf-8")
        except OSError as exc:
            raise DataError(f"cannot open shard output {path}: {exc.strerror or exc}") from None
        self.path, self.lineno, self.last_line, self.count = path, 0, 0, 0
        self.k: int | None = None
        self.n: int | None = None
        self.closing: dict | None = None

    def rows(self) -> Iterator[tuple[int, str, str, dict]]:
        """(input line, path, id, row without the shard field) in the order of the file; at the end,
        the closing record checked against what came before it."""
        from hdeval.data.samples import bounded_lines

        with self.fh:
            try:
                for text in bounded_lines(self.fh, self.path, start=self.lineno):
                    self.lineno += 1
                    if not text.strip():
                        continue
                    if self.closing is not None:
                        raise DataError(
                            f"{self.path}: line {self.lineno}: a row after the closing record: "
                            "not one shard output (were files concatenated?)"
                        )
                    got = self._check(text)
                    if got is not None:
                        self.count += 1
                        yield got
            except UnicodeDecodeError:
                raise DataError(f"{self.path}: line {self.lineno + 1}: not UTF-8 text") from None
        if self.closing is None:
            what = "empty" if self.lineno == 0 else "no closing record"
            raise DataError(
                f"{self.path}: {what}: not a complete output of `hdeval apply --shard K/N` "
                "(a failed or unfinished run, or a cut file?); rerun that shard"
            )
        if self.closing["rows"] != self.count:
            raise DataError(
                f"{self.path}: {self.count} rows, but its closing record says "
                f"{self.closing['rows']}: rows were lost or added; rerun that shard"
            )

    def _check(self, text: str) -> tuple[int, str, str, dict] | None:
        """A row (None: the closing record, kept), checked against the file's shard and order."""
        where = f"{self.path}: line {self.lineno}"
        try:
            row = json.loads(text)
        except ValueError as exc:
            raise DataError(f"{where}: not valid JSON ({exc})") from None
        except RecursionError:
            raise DataError(f"{where}: not usable JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: not a JSON object")
        info, sid = row.pop(SHARD_FIELD, None), row.get("id")
        closing = not row and isinstance(info, dict) and "rows" in info
        ints = isinstance(info, dict) and all(
            type(info.get(f)) is int for f in ("k", "n", "rows" if closing else "line")
        )
        if closing:
            digests = all(
                isinstance(info.get(f), str) and _SHA256.fullmatch(info[f])
                for f in ("input_sha256", "artifact_sha256")
            )
            if not ints or not digests or info["rows"] < 0 or len(info) != 5:
                raise DataError(
                    f"{where}: a closing record without k, n, rows and the two digests: not written "
                    "by `hdeval apply --shard K/N`"
                )
        elif not ints or not isinstance(sid, str):
            raise DataError(
                f"{where}: no '{SHARD_FIELD}' field with k, n and line, or no text 'id': not a row "
                "written by `hdeval apply --shard K/N`"
            )
        k, n = info["k"], info["n"]  # type: ignore[index]
        if not 1 <= k <= n <= MAX_SHARDS:
            raise DataError(f"{where}: shard {k}/{n} is not a shard (N is 1 to {MAX_SHARDS})")
        if self.k is None:
            self.k, self.n = k, n
        elif (k, n) != (self.k, self.n):
            raise DataError(f"{where}: row of shard {k}/{n} in a file of shard {self.k}/{self.n}")
        if closing:
            self.closing = info
            return None
        if shard_of(sid, n) != k:
            raise DataError(f"{where}: id {sid!r} belongs to shard {shard_of(sid, n)}/{n}, not {k}/{n}")
        if info["line"] <= self.last_line:  # type: ignore[index]
            raise DataError(
                f"{where}: input line {info['line']} after line {self.last_line}: rows are not in "
                "input order (was the file edited or concatenated?)"
            )
        self.last_line = info["line"]  # type: ignore[index]
        return self.last_line, self.path, sid, row


def merge_shards(output: str, shards: list[str] | tuple[str, ...]) -> tuple[int, int]:
    """Join the shard outputs into ``output`` in input order, atomically; (rows, N)."""
    check_output(output, list(shards), option="OUTPUT")
    fmt = output_format(output, "OUTPUT")
    for p in shards:
        if os.path.exists(p) and not os.path.isfile(p):
            raise DataError(f"{p} is not a regular file: not a shard output of `hdeval apply --shard K/N`")
    files: list[ShardFile] = []
    try:
        files.extend(ShardFile(p) for p in shards)
        merged = heapq.merge(*(f.rows() for f in files), key=lambda r: r[0])
        head = list(itertools.islice(merged, 1))  # every file's first line read: each names its shard
        check_shard_set(files)
        seen: dict[str, str] = {}
        last_line, last_file = 0, ""
        with OutputWriter(output, fmt) as out:
            batch: list[dict] = []
            for line, path, sid, row in itertools.chain(head, merged):
                if line == last_line:
                    raise DataError(
                        f"{path} and {last_file} both hold input line {line}: shards of different runs?"
                    )
                if sid in seen:
                    raise DataError(f"id {sid!r} is in {seen[sid]} and {path}")
                seen[sid] = last_file = path
                last_line = line
                batch.append(row)
                if len(batch) >= MERGE_ROWS:
                    out.write(batch)
                    batch = []
            out.write(batch)
            _check_same_run(files)
            out.commit()
    finally:
        for f in files:  # on a refusal too: not left to the garbage collector (a ResourceWarning)
            f.fh.close()
    return out.rows, files[0].n or 0


def check_shard_set(files: list[ShardFile]) -> None:
    """Every shard 1..N exactly once (each file names its shard in its first line)."""
    ns = {f.n for f in files}
    if len(ns) > 1:
        raise DataError(
            "the files are shards of different splits: "
            + ", ".join(f"{f.path} is {f.k}/{f.n}" for f in files)
        )
    n = ns.pop()
    by_k: dict[int, str] = {}
    for f in files:
        if f.k in by_k:
            raise DataError(f"shard {f.k}/{n} given twice: {by_k[f.k]} and {f.path}")
        by_k[f.k] = f.path  # type: ignore[index]
    if len(files) < n:
        # N may be large: name the first few missing shards, found without enumerating all N
        missing = list(itertools.islice((k for k in range(1, n + 1) if k not in by_k), 10))
        more = ", ..." if n - len(files) > len(missing) else ""
        raise DataError(
            f"shard(s) {', '.join(f'{k}/{n}' for k in missing)}{more} missing: pass the outputs of "
            f"all {n} shards ({len(files)} file(s) given)"
        )


def _check_same_run(files: list[ShardFile]) -> None:
    """The shards scored one input with one artifact (known once each file is read to its end)."""
    first = files[0]
    for f in files[1:]:
        for field, what in (("input_sha256", "inputs"), ("artifact_sha256", "artifacts")):
            if f.closing[field] != first.closing[field]:  # type: ignore[index]
                raise DataError(
                    f"{first.path} and {f.path} are shards of different {what}: merge the shards of one run"
                )
