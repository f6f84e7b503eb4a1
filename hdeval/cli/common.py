"""What every command shares: one error boundary, terminal progress, the LLM and method options
declared once, loading an artifact and scoring with its LLM, writing outputs."""

from __future__ import annotations

import functools
import math
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable

import click

from hdeval.errors import HdevalError
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
        self.left: int | None = None  # units of the run not yet started (Progress.expect)
        self.later: int | None = None  # of which after the current stage
        _LIVE.add(self)

    def expect(self, units: int) -> None:
        with self._lock:
            self.left = units

    def stage(self, label: str, total: int) -> None:
        self._stop_ticker()
        with self._lock:
            self.label, self.total, self.done, self.hits = label, total, 0, 0
            if self.left is not None:
                self.later = self.left = max(0, self.left - total)
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
            if self.later:  # the whole run at this stage's rate; later stages' cache hits make it less
                extra += (f"; whole run: at most {self.total - self.done + self.later} more requests, "
                          f"ETA <= {_duration((self.total - self.done + self.later) / rate)}")
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
    from hdeval.config import DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

    f = click.option("--concurrency", default=DEFAULT_CONCURRENCY, show_default=True, type=int,
                     help="LLM requests in flight.")(f)
    f = click.option("--timeout", default=DEFAULT_TIMEOUT, show_default=True, type=float,
                     help="Seconds per LLM request.")(f)
    f = click.option("--max-retries", default=DEFAULT_MAX_RETRIES, show_default=True, type=int,
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


def _from_command_line(name: str) -> bool:
    """Whether option ``name`` was typed on the command line (not taken from the environment)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is None or ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


def _stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def _confirm() -> Callable[[str], bool] | None:
    """Ask the artifact-LLM question on a terminal; with no one to answer, the library refuses."""
    if not _stdin_is_tty():
        return None
    return lambda question: click.confirm(question, default=False, err=True)


def score_with_artifact(ev, samples, *, llm: str | None, base_url: str | None, timeout: float,
                        max_retries: int, cache_dir: str | None, max_calls: int | None,
                        concurrency: int, quiet: bool, batch: bool = False):
    """Score samples with the artifact's LLM (or the one given), cached; warn on a mismatch."""
    from hdeval.run.artifact_llm import open_artifact_llm

    backend = open_artifact_llm(ev, llm=llm, base_url=base_url, timeout=timeout, max_retries=max_retries,
                                cache_dir=cache_dir, max_calls=max_calls, concurrency=concurrency, batch=batch,
                                llm_given=_from_command_line("llm"), base_url_given=_from_command_line("base_url"),
                                confirm=_confirm(), notify=lambda text: click.echo(text, err=True))
    progress = TerminalProgress(quiet)
    try:
        return ev.score(samples, backend=backend, concurrency=concurrency, progress=progress)
    finally:
        progress.close()
        backend.close()
