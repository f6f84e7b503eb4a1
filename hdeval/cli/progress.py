"""Progress on the terminal: a redrawn line on a terminal, plain lines at an interval otherwise."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref

import click

from hdeval.core.progress import Progress

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
        self.shown: set[str] = set()  # the messages printed (a summary need not repeat them)
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

    close = _stop_ticker  # a stage an error cut short: no drawing, the error line follows

    def message(self, text: str) -> None:
        if not self.quiet:
            with self._lock:
                _end_open_line()
                self.shown.add(text)
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
                extra += (
                    f"; whole run: at most {self.total - self.done + self.later} more requests, "
                    f"ETA <= {_duration((self.total - self.done + self.later) / rate)}"
                )
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


def _set_line_open(value: bool) -> None:
    """A download's byte counter leaves its line open; Ctrl-C's message starts with a newline."""
    global _line_open
    _line_open = value
