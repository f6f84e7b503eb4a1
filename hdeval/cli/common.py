"""What every command shares: one error boundary, terminal progress, the LLM and method options
declared once, loading an artifact and scoring with its LLM, writing outputs."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable

import click

from hdeval.errors import ConfigError, HdevalError
from hdeval.progress import Progress

INTERRUPTED = "interrupted: every finished LLM call is cached; rerun the same command to resume"
TERMINATED = "terminated (SIGTERM): every finished LLM call is cached; rerun the same command to resume"


#: Seconds between progress lines when stderr is not a terminal (logs, nohup, `| tee`, CI).
PROGRESS_INTERVAL_ENV = "HDEVAL_PROGRESS_INTERVAL"
DEFAULT_PROGRESS_INTERVAL = 10.0

# True while a redrawn progress line on a terminal has no newline yet: whatever is printed
# next must start on a fresh line.
_line_open = False


def _end_open_line() -> None:
    global _line_open
    if _line_open:
        sys.stderr.write("\n")
        sys.stderr.flush()
        _line_open = False


def progress_interval() -> float:
    raw = os.environ.get(PROGRESS_INTERVAL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_PROGRESS_INTERVAL
    return value if math.isfinite(value) and value >= 0 else DEFAULT_PROGRESS_INTERVAL


TICKER_THREAD = "hdeval-progress"


class TerminalProgress(Progress):
    """Progress on stderr: a redrawn line on a terminal; otherwise plain lines at the start and
    end of each stage and, between them, one every HDEVAL_PROGRESS_INTERVAL seconds (10)."""

    def __init__(self, quiet: bool = False, interval: float | None = None):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.interval = progress_interval() if interval is None else interval
        self._lock = threading.Lock()
        self.label, self.total, self.done, self.hits = "", 0, 0, 0
        self.t0 = time.monotonic()
        self._last = 0.0
        self._stop: threading.Event | None = None
        _LIVE.add(self)

    def stage(self, label: str, total: int) -> None:
        self._stop_ticker()
        with self._lock:
            self.label, self.total, self.done, self.hits = label, total, 0, 0
            self.t0 = time.monotonic()
        self._draw(force=True)
        if not self.tty and not self.quiet and self.interval > 0:
            # A line every interval even while one slow call (a local model) is running.
            self._stop = threading.Event()
            threading.Thread(target=self._tick, args=(self._stop,), name=TICKER_THREAD, daemon=True).start()

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self._draw(stop=stop)

    def _stop_ticker(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def advance(self, n: int = 1, cached: bool = False) -> None:
        with self._lock:
            self.done += n
            self.hits += n if cached else 0
        self._draw()

    def end_stage(self) -> None:
        self._stop_ticker()
        self._draw(force=True, final=True)

    def close(self) -> None:
        """Stop the ticker of a stage an error cut short, without drawing (the error line follows)."""
        self._stop_ticker()

    def message(self, text: str) -> None:
        if not self.quiet:
            with self._lock:
                _end_open_line()
            click.echo(text, err=True)

    def line(self) -> str:
        """``label: done/total done (hits cached), rate, ETA`` for the current stage."""
        elapsed = time.monotonic() - self.t0
        fresh = self.done - self.hits
        extra = ""
        if fresh > 0 and elapsed > 0:
            rate = fresh / elapsed
            extra = f", {rate:.2f} calls/s" if rate < 10 else f", {rate:.0f} calls/s"
            if self.done < self.total:
                extra += f", ETA {_duration((self.total - self.done) / rate)}"
        return f"{self.label}: {self.done}/{self.total} done ({self.hits} cached){extra}"

    def _draw(self, force: bool = False, final: bool = False, stop: threading.Event | None = None) -> None:
        global _line_open
        if self.quiet:
            return
        with self._lock:
            if stop is not None and stop.is_set():
                return  # a ticker of a stage that has ended
            now = time.monotonic()
            if not force and now - self._last < (0.2 if self.tty else self.interval):
                return
            self._last = now
            line = self.line()
            if self.tty:
                sys.stderr.write("\r\033[K" + line + ("\n" if final else ""))
                _line_open = not final
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()


# Every TerminalProgress made in this process: run_command stops their tickers when a command
# ends, however it ends, so a stage cut short by an error never goes on printing.
_LIVE: "weakref.WeakSet[TerminalProgress]" = weakref.WeakSet()


def _stop_all_tickers() -> None:
    for progress in list(_LIVE):
        progress._stop_ticker()


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _count_warning(seen: dict, message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    key = (category.__name__, text[:160])
    seen[key] = seen.get(key, 0) + 1


def _show_warnings(seen: dict) -> None:
    """Python warnings from libraries (scikit-learn, ...): one summarised line each."""
    if seen:
        _end_open_line()
    for (category, text), n in seen.items():
        click.echo(f"warning: {text} ({category}{f', {n} times' if n > 1 else ''})", err=True)
    seen.clear()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread. A KeyboardInterrupt, so every cleanup that Ctrl-C
    gets (queued LLM calls dropped, running ones finished and cached, temp files removed)
    runs for it too."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def run_command(fn: Callable[[], Any], interrupted: str = INTERRUPTED,
                before_error: Callable[[], None] | None = None) -> Any:
    """The one error boundary: library errors become one line on stderr and an exit code;
    library warnings one summarised line each (never raw); Ctrl-C and SIGTERM one line saying
    what was kept (``interrupted``; exit 130 and 143, as the shell reports). ``before_error``
    ends whatever a command drew on the terminal (a byte counter) before the message."""
    seen: dict = {}
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # count every one; show each once, below
            for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", quiet)  # hidden by Python's defaults too
            warnings.showwarning = functools.partial(_count_warning, seen)
            return fn()
    except HdevalError as exc:
        _stop_all_tickers()
        _show_warnings(seen)
        _end_open_line()
        if before_error is not None:
            before_error()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _stop_all_tickers()
        terminated = isinstance(exc, Terminated)
        if previous is not None:  # a second SIGTERM from here on ends the process the usual way
            signal.signal(signal.SIGTERM, previous)
            previous = None
        _show_warnings(seen)
        _line_open_reset()
        click.echo(f"\n{TERMINATED if terminated else interrupted}", err=True)
        sys.exit(128 + signal.SIGTERM if terminated else 130)
    finally:
        _stop_all_tickers()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _show_warnings(seen)


def _line_open_reset() -> None:
    # Ctrl-C: the message below starts with its own newline.
    global _line_open
    _line_open = False


def llm_options(f):
    f = click.option("--llm", envvar="HDEVAL_LLM", default=None,
                     help="Model: an OpenAI(-compatible) model name, 'local', 'llamacpp:/path.gguf' or "
                          "'fake'. Default: HDEVAL_LLM, else OpenAI if OPENAI_API_KEY is set, else local.")(f)
    f = click.option("--base-url", envvar="HDEVAL_BASE_URL", default=None,
                     help="OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), "
                          "http://localhost:11434/v1 (Ollama).")(f)
    f = click.option("--concurrency", default=8, show_default=True, type=int, help="LLM requests in flight.")(f)
    f = click.option("--timeout", default=60.0, show_default=True, type=float, help="Seconds per LLM request.")(f)
    f = click.option("--max-retries", default=6, show_default=True, type=int,
                     help="Retries per request on 429/5xx/timeouts.")(f)
    f = click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False),
                     help="LLM reply cache. Default: HDEVAL_CACHE_DIR or the per-user cache dir.")(f)
    f = click.option("--max-calls", default=None, type=int,
                     help="Stop cleanly before making more than N new LLM calls (cached calls are free).")(f)
    return f


def batch_option(f):
    """``--batch`` (train, apply): scoring requests through the OpenAI Batch API."""
    return click.option("--batch", is_flag=True,
                        help="Send each scoring stage's uncached requests through the OpenAI Batch API: half "
                             "the price, results within 24 h; a killed run resumes its jobs (OpenAI-compatible "
                             "servers only).")(f)


def method_options(f):
    """``--method`` and every method-specific option, declared once from the method registry."""
    from hdeval.methods.registry import all_options, method_names

    for name, (opt, owners) in sorted(all_options().items(), reverse=True):
        flag = "--" + name.replace("_", "-")
        where = f"[{', '.join(owners)}] "
        if isinstance(opt.default, bool):
            f = click.option(f"{flag}/--no-{flag[2:]}", name, default=None,
                             help=f"{where}{opt.help} (default: {'on' if opt.default else 'off'})")(f)
        else:
            kind = click.Choice(opt.choices) if opt.choices else type(opt.default)
            f = click.option(flag, name, default=None, type=kind,
                             help=f"{where}{opt.help} (default: {opt.default})")(f)
    return click.option("--method", default="hdeval", show_default=True, type=click.Choice(method_names()),
                        help="How the evaluator is built: see `hdeval methods`.")(f)


def _notice_local(model: str | None) -> None:
    from hdeval.backends.factory import DEFAULT_LOCAL_NOTICE

    if model == "local":
        click.echo(DEFAULT_LOCAL_NOTICE, err=True)


def _resolved(llm: str | None) -> str | None:
    from hdeval.backends.factory import resolve_llm

    try:
        return resolve_llm(llm)
    except HdevalError:
        return None


def load_artifact(path: str):
    """Load an artifact of any method and show its warnings (e.g. an edited tree.json)."""
    from hdeval.methods.registry import load_artifact as load

    ev = load(path)
    for w in ev.warnings:
        click.echo(f"warning: {w}", err=True)
    return ev


def _check_llm_options(*, concurrency: int, timeout: float, max_retries: int, max_calls: int | None) -> None:
    """The LLM options of ``apply`` and ``explain`` (``train`` checks its own in TrainConfig)."""
    from hdeval.errors import ConfigError

    for ok, msg in (
        (concurrency >= 1, f"--concurrency must be at least 1, got {concurrency}"),
        (timeout > 0, f"--timeout must be positive, got {timeout}"),
        (max_retries >= 0, f"--max-retries must be 0 or more, got {max_retries}"),
        (max_calls is None or max_calls >= 0, f"--max-calls must be 0 or more, got {max_calls}"),
    ):
        if not ok:
            raise ConfigError(msg)


def _from_command_line(name: str) -> bool:
    """Whether option ``name`` was typed on the command line (not taken from the environment)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is None or ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


def _stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def _artifact_llm(ev, llm: str | None, base_url: str | None) -> tuple[str, str | None]:
    """The model and server to score with: the artifact's, unless --llm/--base-url are typed
    on the command line (HDEVAL_LLM/HDEVAL_BASE_URL do not silently swap an artifact's LLM).
    A server named only by the artifact gets no key and no sample before the user agrees."""
    if _from_command_line("llm") and llm:
        # another model: the server is whatever the user gave for it (option or environment)
        return llm, base_url
    if llm and llm != ev.llm.model:
        click.echo(f"note: ignoring HDEVAL_LLM={llm} from the environment: apply uses the artifact's LLM "
                   f"({ev.llm.model}); pass --llm to use another", err=True)
    if base_url and _from_command_line("base_url"):
        return ev.llm.model, base_url
    url = ev.llm.base_url
    if base_url and url and base_url.rstrip("/") == url.rstrip("/"):
        return ev.llm.model, url  # the user's environment names the artifact's server
    if base_url:
        click.echo("note: ignoring HDEVAL_BASE_URL from the environment: apply uses the artifact's "
                   "server; pass --base-url to use another", err=True)
    if not url:
        return ev.llm.model, None
    what = "your samples and OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else "your samples"
    if _stdin_is_tty():
        if click.confirm(f"the artifact asks to send {what} to {url}; do that?", default=False, err=True):
            return ev.llm.model, url
        raise ConfigError(f"not sending anything to {url}; pass --base-url URL to choose the server")
    raise ConfigError(f"the artifact names the LLM server {url}: hdeval sends {what} there only if you say "
                      f"so; pass --base-url {url} (or another server)")


def score_with_artifact(ev, samples, *, llm: str | None, base_url: str | None, timeout: float,
                        max_retries: int, cache_dir: str | None, max_calls: int | None,
                        concurrency: int, quiet: bool, batch: bool = False):
    """Score samples with the artifact's LLM (or the one given), cached; warn on a mismatch."""
    backend = open_artifact_llm(ev, llm=llm, base_url=base_url, timeout=timeout, max_retries=max_retries,
                                cache_dir=cache_dir, max_calls=max_calls, concurrency=concurrency, batch=batch)
    progress = TerminalProgress(quiet)
    try:
        return ev.score(samples, backend=backend, concurrency=concurrency, progress=progress)
    finally:
        progress.close()
        backend.close()


def open_artifact_llm(ev, *, llm: str | None, base_url: str | None, timeout: float, max_retries: int,
                      cache_dir: str | None, max_calls: int | None, concurrency: int, batch: bool = False):
    """The cached backend to score ``ev``'s samples with (the artifact's LLM, or the one given);
    warns on a mismatch. The caller closes it (``apply`` scores chunk after chunk with one)."""
    from hdeval.config import LLMConfig
    from hdeval.llm import open_llm
    from hdeval.urls import public_identity

    _check_llm_options(concurrency=concurrency, timeout=timeout, max_retries=max_retries, max_calls=max_calls)
    model, url = _artifact_llm(ev, llm, base_url)
    config = LLMConfig(model, url, timeout, max_retries, concurrency, cache_dir, max_calls, bool(batch))
    _notice_local(model)
    backend = open_llm(config)
    if public_identity(backend.identity, url) != ev.llm_identity:
        click.echo(f"warning: scoring with {public_identity(backend.identity, url)}, but the evaluator was "
                   f"trained with {ev.llm_identity}; scores may not match its metrics", err=True)
    return backend


OUTPUT_FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def _output_format(output: str) -> str:
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
        if k in ("scores", "criteria", "human") and isinstance(v, dict):
            out.update({f"{k}.{a}": x for a, x in v.items()})
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v, ensure_ascii=False)
        else:
            out[k] = v
    return out


def _write_output(output: str, fmt: str, rows: list[dict]) -> None:
    """Write the scored rows atomically (temp file renamed into place) or to stdout."""
    with OutputWriter(output, fmt) as out:
        out.write(rows)
        out.commit()


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
        self._done = False
        if output == "-":
            return
        self.path = Path(output)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._tmp.append(tmp)
        self._fh = os.fdopen(fd, "w", encoding="utf-8")

    def __enter__(self) -> "OutputWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()

    def write(self, rows: list[dict]) -> None:
        if self.output == "-":
            for r in rows:
                click.echo(json.dumps(r, ensure_ascii=False))
            sys.stdout.flush()
            self.rows += len(rows)
            return
        try:
            for r in rows:
                if self.fmt != "jsonl":
                    r = _flat(r)
                    self._columns.update(dict.fromkeys(r))
                self._fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.rows += len(rows)

    def commit(self) -> None:
        """Put the output in place (the one moment the destination changes)."""
        if self.output == "-":
            self._done = True
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
            self._done = True
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        finally:
            self.discard()

    def _convert(self, spool: str) -> str:
        import pandas as pd

        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._tmp.append(tmp)
        columns = list(self._columns)
        with open(spool, encoding="utf-8") as fh:
            if self.fmt == "parquet":  # buffers the rows (not the samples): see `hdeval apply --help`
                pd.DataFrame([json.loads(line) for line in fh], columns=columns).to_parquet(tmp, index=False)
                return tmp
            first, batch = True, []
            for line in fh:
                batch.append(json.loads(line))
                if len(batch) >= self.CONVERT_ROWS:
                    pd.DataFrame(batch, columns=columns).to_csv(tmp, index=False, header=first, mode="w" if first else "a")
                    first, batch = False, []
            if batch or first:
                pd.DataFrame(batch, columns=columns).to_csv(tmp, index=False, header=first, mode="w" if first else "a")
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


def _input_tasks(path: str) -> set[str]:
    """The ``task`` names the input's rows declare (rows written by hdeval carry one)."""
    found: set[str] = set()
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("task"), str):
                    found.add(row["task"])
    except (OSError, UnicodeDecodeError):
        pass
    return found


