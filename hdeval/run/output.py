"""Scored rows to a file (.jsonl, .csv, .parquet) or stdout, written atomically."""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from hdeval.errors import ConfigError
from hdeval.request_files import _temp_beside

OUTPUT_FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def check_output(output: str | Path, inputs: list[str | Path | None], option: str = "-o") -> None:
    """Refuse an output that would destroy what the run reads, before anything is read or paid:
    a path that is (or links to) an input file or lies inside an input directory (an artifact),
    and a FIFO, device or socket, which an atomic rename would replace by a regular file
    (``-`` is the way to write to stdout)."""
    if str(output) == "-":
        return
    try:
        st = os.stat(output)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"{option} {output}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{option} {output} is a directory; name a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{option} {output} is not a regular file (a FIFO, device or socket); name a file, "
                          "or use - to write to stdout")
    real = os.path.realpath(output)
    for given in inputs:
        if given is None or str(given) == "-":
            continue
        try:
            ist = os.stat(given)
        except OSError:
            continue  # a missing input is reported where it is read
        if stat.S_ISDIR(ist.st_mode):
            base = os.path.realpath(given)
            if os.path.commonpath([base, real]) == base:
                raise ConfigError(f"{option} {output} is inside {given}, which this command reads; "
                                  "write the output elsewhere")
        elif st is not None and os.path.samestat(st, ist):
            raise ConfigError(f"{option} {output} is the input file {given}: writing it would destroy the input; "
                              "write the output elsewhere")


def output_format(output: str) -> str:
    """The format ``apply -o`` writes, from the extension; checked before any LLM call."""
    if output == "-":
        return "jsonl"
    fmt = OUTPUT_FORMATS.get(Path(output).suffix.lower())
    if fmt is None:
        raise ConfigError(f"cannot tell the output format of {output}: use -o with .jsonl, .csv or "
                          ".parquet, or -o - for JSONL on stdout")
    if fmt == "parquet":
        import importlib.util

        if not any(importlib.util.find_spec(m) for m in ("pyarrow", "fastparquet")):
            raise ConfigError(f"writing {output} needs a parquet library: pip install pyarrow")
    from hdeval.artifact import check_writable

    check_writable(Path(os.path.abspath(output)).parent)
    return fmt


def _flat(row: dict) -> dict:
    """One scored row as flat columns (``scores.<aspect>``, ``criteria.<key>``, ...)."""
    out: dict = {}
    for k, v in row.items():
        if k in ("scores", "criteria", "human", "lower", "upper") and isinstance(v, dict):
            out.update({f"{k}.{a}": x for a, x in v.items()})
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v, ensure_ascii=False)
        else:
            out[k] = v
    return out


class OutputWriter:
    """Scored rows written chunk by chunk, atomically: ``write`` appends rows to a temporary file
    beside the destination, ``commit`` renames it into place. Leaving the ``with`` block without
    ``commit`` (an error, Ctrl-C, SIGTERM) removes the temporary files and never touches an
    existing file at the destination. ``-``: JSONL on stdout, each chunk as it comes.

    JSONL is written as it comes; CSV rows are spooled as JSON lines first (the header is the
    union of every row's columns, known only at the end) and converted a chunk at a time;
    parquet is built in memory from the spool at the end (the scored rows, not the samples)."""

    CONVERT_ROWS = 1000  # rows per DataFrame when converting the spool to CSV

    def __init__(self, output: str, fmt: str):
        self.output, self.fmt = output, fmt
        self.rows = 0
        self._tmp: list[str] = []
        self._fh: Any = None
        self._columns: dict[str, None] = {}  # flat CSV/parquet columns in order of first appearance
        if output == "-":
            return
        self.path = Path(output)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        fd, tmp = _temp_beside(self.path)
        self._tmp.append(tmp)
        self._fh = os.fdopen(fd, "w", encoding="utf-8")

    def __enter__(self) -> "OutputWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()

    def write(self, rows: list[dict], counted: bool = True) -> None:
        """Append rows; ``counted=False`` for a line that is not a scored row (a shard's closing
        record), left out of :attr:`rows`."""
        if self.output == "-":
            for r in rows:
                sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
            sys.stdout.flush()
            self.rows += len(rows) if counted else 0
            return
        try:
            for r in rows:
                if self.fmt != "jsonl":
                    r = _flat(r)
                    self._columns.update(dict.fromkeys(r))
                self._fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.rows += len(rows) if counted else 0

    def commit(self) -> None:
        """Put the output in place (the one moment the destination changes)."""
        if self.output == "-":
            return
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            final = self._tmp[0] if self.fmt == "jsonl" else self._convert(self._tmp[0])
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(final, 0o666 & ~umask)  # as a file the user wrote (mkstemp made it private)
            os.replace(final, self.path)
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        finally:
            self.discard()

    def _convert(self, spool: str) -> str:
        import pandas as pd

        fd, tmp = _temp_beside(self.path)
        os.close(fd)
        self._tmp.append(tmp)
        columns = list(self._columns)
        with open(spool, encoding="utf-8") as fh:
            if self.fmt == "parquet":  # buffers the rows (not the samples): see `hdeval apply --help`
                pd.DataFrame([json.loads(line) for line in fh], columns=columns).to_parquet(tmp, index=False)
                return tmp
            rows = (json.loads(line) for line in fh)
            for k in itertools.count():  # the header with the first batch, even an empty one
                batch = list(itertools.islice(rows, self.CONVERT_ROWS))
                if batch or not k:
                    frame = pd.DataFrame(batch, columns=columns)
                    frame.to_csv(tmp, index=False, header=not k, mode="a" if k else "w")
                if len(batch) < self.CONVERT_ROWS:
                    return tmp

    def discard(self) -> None:
        """Remove the temporary files (after a commit, whatever is left of them)."""
        if self._fh is not None and not self._fh.closed:
            try:
                self._fh.close()
            except OSError:
                pass
        for tmp in self._tmp:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self._tmp.clear()
