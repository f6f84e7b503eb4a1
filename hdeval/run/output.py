"""Scored rows to a file (.jsonl, .csv, .parquet) or stdout, written atomically."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from hdeval.core.errors import ConfigError
from hdeval.llm.request_files import write_in_place

OUTPUT_FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def check_output(
    output: str | Path,
    inputs: list[str | Path | None],
    option: str = "-o",
    *,
    replace: bool = True,
    cache_dir: str | Path | None = None,
) -> None:
    """Refuse an output that would destroy what the run reads or what the user owns, before
    anything is read or paid: a path that is (or links to) an input file or lies inside an input
    directory (an artifact) or the LLM reply cache (``cache_dir``, else the default one), a FIFO,
    device or socket, which an atomic rename would replace by a regular file (``-`` is the way to
    write to stdout), and, unless ``replace``, any existing file (the command's ``--force``)."""
    if str(output) == "-":
        return
    refuse_in_cache(output, cache_dir, option)
    try:
        st = os.stat(output)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"{option} {output}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{option} {output} is a directory; name a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"{option} {output} is not a regular file (a FIFO, device or socket); name a file, "
            "or use - to write to stdout"
        )
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
                raise ConfigError(
                    f"{option} {output} is inside {given}, which this command reads; "
                    "write the output elsewhere"
                )
        elif st is not None and os.path.samestat(st, ist):
            raise ConfigError(
                f"{option} {output} is the input file {given}: writing it would destroy the input; "
                "write the output elsewhere"
            )
    if st is not None and not replace:
        raise ConfigError(f"{option} {output} exists: pass --force to replace it, or name another file")


def refuse_in_cache(output: str | Path, cache_dir: str | Path | None, option: str) -> None:
    """No output ever lands inside the LLM reply cache (its databases, a value file): replacing
    one would lose every paid reply, or plant a file the cache would read."""
    from hdeval.core.paths import default_cache_dir

    cache = os.path.realpath(cache_dir if cache_dir is not None else default_cache_dir())
    real = os.path.realpath(output)
    if os.path.commonpath([cache, real]) == cache:
        raise ConfigError(
            f"{option} {output} is inside the LLM reply cache {cache_dir or cache}; "
            "write the output elsewhere"
        )


def refuse_inputs_inside(
    out: str | Path, inputs: Mapping[str, str | Path | None], option: str = "-o"
) -> None:
    """Refuse an output directory ``out`` that is or holds one of the run's inputs (``inputs``:
    the option naming it -> its path, None when not given), before anything is read or paid:
    replacing the directory would delete the input, and what a run writes into it (the reply
    cache) makes a new directory one an artifact may no longer be saved into. Both the path as
    given and the one its links lead to are compared."""
    outs = {os.path.abspath(out), os.path.realpath(out)}
    for name, given in inputs.items():
        if given is None or str(given) in ("", "-"):
            continue
        for where in {os.path.abspath(given), os.path.realpath(given)}:
            if any(_within(where, base) for base in outs):
                raise ConfigError(
                    f"{option} {out} holds {name} {given}: the output directory holds only what "
                    f"hdeval writes there; keep {name} outside it, or choose another {option}"
                )


def run_inputs(options: Mapping[str, Any], *names: str) -> dict[str, str | None]:
    """The files and directories a train, refit or benchmark run reads, by option, from its
    CLI ``options``, for :func:`refuse_inputs_inside`: ``--task`` only when it is a file (else a
    built-in name), the reply cache whether given or the default one."""
    from hdeval.core.paths import default_cache_dir
    from hdeval.data.tasks import builtin_tasks

    found: dict[str, str | None] = {}
    for name in names:
        value = options.get(name)
        # a built-in name is read from the package even when a folder of that name is here (an
        # earlier run's -o sfhot): only a task file load_task would read counts
        if name == "task" and (value is None or str(value) in builtin_tasks() or not os.path.isfile(value)):
            continue
        found["--" + name.replace("_", "-")] = None if value is None else os.fspath(value)
    if "cache_dir" in names and options.get("cache_dir") is None:
        del found["--cache-dir"]
        found["the LLM reply cache"] = os.fspath(default_cache_dir())
    return found


def _within(path: str, base: str) -> bool:
    try:
        return os.path.commonpath([base, path]) == base
    except ValueError:  # another drive
        return False


def output_format(output: str, option: str = "-o") -> str:
    """The format ``apply -o`` (``merge-shards OUTPUT``) writes, from the extension; checked
    before any LLM call."""
    if output == "-":
        return "jsonl"
    fmt = OUTPUT_FORMATS.get(Path(output).suffix.lower())
    if fmt is None:
        named = f"{option} " if option.startswith("-") else ""
        raise ConfigError(
            f"cannot tell the output format of {output}: name the {option} file .jsonl, .csv or "
            f".parquet, or give {named}- for JSONL on stdout"
        )
    if fmt == "parquet":
        import importlib.util

        if not any(importlib.util.find_spec(m) for m in ("pyarrow", "fastparquet")):
            raise ConfigError(f"writing {output} needs a parquet library: pip install pyarrow")
    from hdeval.artifact.directory import check_writable

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


class _Discarded(Exception):
    """Leaves the temporary file's block without putting it in place."""


class OutputWriter:
    """Scored rows written chunk by chunk, atomically: ``write`` appends rows to a temporary file
    beside the destination, ``commit`` renames it into place. Leaving the ``with`` block without
    ``commit`` (an error, Ctrl-C, SIGTERM) removes the temporary file, and the folders made for
    it when they are empty again, and never touches an existing file at the destination. ``-``:
    JSONL on stdout, each chunk as it comes.

    JSONL is written as it comes; CSV rows are spooled as JSON lines first (the header is the
    union of every row's columns, known only at the end) and converted a chunk at a time;
    parquet is built in memory from the spool at the end (the scored rows, not the samples)."""

    CONVERT_ROWS = 1000  # rows per DataFrame when converting the spool to CSV

    def __init__(self, output: str, fmt: str):
        self.output, self.fmt, self.rows = output, fmt, 0
        self._columns: dict[str, None] = {}  # flat CSV/parquet columns in order of first appearance
        self._files = contextlib.ExitStack()
        self._made: list[Path] = []  # the folders made for the output, deepest first
        if output == "-":
            return
        self.path = Path(output)
        folder = Path(os.path.abspath(self.path.parent))
        while not os.path.lexists(folder) and folder != folder.parent:  # made here, deepest first
            self._made.append(folder)
            folder = folder.parent
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = self._files.enter_context(write_in_place(self.path, keep_empty=True))
            self._spool = (
                self._out
                if fmt == "jsonl"
                else self._files.enter_context(tempfile.TemporaryFile(dir=self.path.parent))
            )
        except BaseException as exc:
            self._discard()
            if isinstance(exc, OSError):
                raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
            raise

    def __enter__(self) -> "OutputWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._discard()  # after a commit: nothing left to do

    def _discard(self) -> None:
        """The temporary files removed, then the folders made for the output, while empty."""
        self._files.__exit__(_Discarded, _Discarded(), None)
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # something else was put there meanwhile: it stays, with its folders
                break
        self._made = []

    def write(self, rows: list[dict], counted: bool = True) -> None:
        """Append rows; ``counted=False`` for a line that is not a scored row (a shard's closing
        record), left out of :attr:`rows`."""
        self.rows += len(rows) if counted else 0
        if self.output == "-":
            sys.stdout.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            sys.stdout.flush()
            return
        try:
            for r in rows:
                if self.fmt != "jsonl":
                    r = _flat(r)
                    self._columns.update(dict.fromkeys(r))
                self._spool.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def commit(self) -> None:
        """Put the output in place (the one moment the destination changes)."""
        if self.fmt != "jsonl" and self.output != "-":
            import pandas as pd

            self._spool.seek(0)
            rows, columns = map(json.loads, self._spool), list(self._columns)
            try:
                if self.fmt == "parquet":  # buffers the rows (not the samples): see `hdeval apply --help`
                    pd.DataFrame(list(rows), columns=columns).to_parquet(self._out, index=False)
                for k in itertools.count() if self.fmt == "csv" else ():  # the header with the first batch
                    batch = list(itertools.islice(rows, self.CONVERT_ROWS))
                    if batch or not k:
                        pd.DataFrame(batch, columns=columns).to_csv(self._out, index=False, header=not k)
                    if len(batch) < self.CONVERT_ROWS:
                        break
            except OSError as exc:
                raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._files.close()  # the temporary file renamed into place
        self._made = []  # they hold the output now
