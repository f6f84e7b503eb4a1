"""Command line: parse options -> one library call -> output. All terminal I/O lives here."""

from __future__ import annotations

import dataclasses
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
from pathlib import Path
from typing import Any, Callable

import click

from hdeval import __version__
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

    def stage(self, label: str, total: int) -> None:
        self._stop_ticker()
        with self._lock:
            self.label, self.total, self.done, self.hits = label, total, 0, 0
            self.t0 = time.monotonic()
        self._draw(force=True)
        if not self.tty and not self.quiet and self.interval > 0:
            # A line every interval even while one slow call (a local model) is running.
            self._stop = threading.Event()
            threading.Thread(target=self._tick, args=(self._stop,), daemon=True).start()

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


def run_command(fn: Callable[[], Any]) -> Any:
    """Turn library errors into one line on stderr and an exit code; library warnings into one
    summarised line each (never raw); Ctrl-C and SIGTERM into one line saying that what finished
    is cached (exit 130 and 143, as the shell reports)."""
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
        _show_warnings(seen)
        _end_open_line()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        if previous is not None:  # a second SIGTERM from here on ends the process the usual way
            signal.signal(signal.SIGTERM, previous)
            previous = None
        _show_warnings(seen)
        _line_open_reset()
        click.echo(f"\n{TERMINATED if terminated else INTERRUPTED}", err=True)
        sys.exit(128 + signal.SIGTERM if terminated else 130)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _show_warnings(seen)


def _line_open_reset() -> None:
    # Ctrl-C: the message below starts with its own newline.
    global _line_open
    _line_open = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hdeval")
def cli() -> None:
    """hdeval: train aligned LLM evaluators by hierarchical criteria decomposition (HD-Eval)."""


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


def method_options(f):
    """``--method`` and every method-specific option, declared once from the method registry."""
    from hdeval.methods.base import all_options, method_names

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


@cli.command()
@click.option("--task", required=True, help="Built-in task (see `hdeval tasks`) or path to a task .toml.")
@click.option("--data", type=click.Path(dir_okay=False), default=None,
              help="Samples JSONL. Default: <task>.jsonl in HDEVAL_DATA_DIR or the per-user data dir.")
@click.option("--aspects", default=None, help="Comma-separated subset of the task's aspects.")
@click.option("--layers", default=3, show_default=True, type=int, help="Depth of the criteria tree.")
@click.option("--children", default=4, show_default=True, type=int, help="Max sub-criteria per criterion.")
@click.option("--top-k", default=4, show_default=True, type=int, help="Criteria expanded per layer from layer 3.")
@click.option("--aggregator", default="auto", show_default=True,
              help="lr, dt, rf, nn, or auto (best cross-validated Spearman on the training split).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--test-frac", default=0.5, show_default=True, type=float, help="Share of samples held out.")
@click.option("--train-frac", default=0.5, show_default=True, type=float, help="Share of all samples used to train.")
@click.option("--limit", default=None, type=int, help="Use only N samples (whole documents) for a quick run.")
@click.option("--max-failure-rate", default=0.2, show_default=True, type=float,
              help="Stop when a larger share of criterion scores cannot be read.")
@click.option("--out", "-o", default=None, type=click.Path(file_okay=False),
              help="Artifact directory. Default: artifacts/<task>-<aggregator>.")
@click.option("--force", is_flag=True,
              help="Replace an existing artifact at --out (never a directory that is not an artifact).")
@click.option("--dry-run", is_flag=True, help="Print calls, cache hits, tokens and cost; call no LLM.")
@click.option("--price-in", default=None, type=float, help="With --dry-run: price per 1M prompt tokens.")
@click.option("--price-out", default=None, type=float, help="With --dry-run: price per 1M completion tokens.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option("--offline", is_flag=True, envvar="HDEVAL_OFFLINE",
              help="Never download a built-in task's data (by default it is fetched on first use).")
@method_options
@llm_options
def train(dry_run: bool, price_in: float | None, price_out: float | None, out: str | None,
          force: bool, quiet: bool, offline: bool, **options: Any) -> None:
    """Train an evaluator: decompose criteria, score samples, fit the aggregator, save the artifact.

    \b
    Example:
      hdeval train --task summeval --layers 3 --llm gpt-4o-mini
      hdeval train --task my_task.toml --data my.jsonl --llm fake --limit 64
    """
    from hdeval.train import TrainConfig, plan, train as run_train

    def go() -> None:
        from hdeval.cli_data import fetch_missing_task_data

        config = TrainConfig.from_options(**options)
        if config.data is None:
            fetch_missing_task_data(config.task, offline=offline)
        if dry_run:
            if _resolved(config.llm) is None:
                from hdeval.backends.factory import DEFAULT_OPENAI_MODEL

                # Counting calls and tokens needs no LLM; price the default one.
                click.echo(f"note: no LLM configured; estimating for {DEFAULT_OPENAI_MODEL} "
                           "(the default with OPENAI_API_KEY); pass --llm to estimate another", err=True)
                config = dataclasses.replace(config, llm=DEFAULT_OPENAI_MODEL)
            _print_plan(*plan(config), price_in=price_in, price_out=price_out)
            return
        _check_outputs(config, out, force)  # before any LLM call: never after paying for them
        progress = TerminalProgress(quiet)
        _notice_local(_resolved(config.llm))
        ev = run_train(config, progress=progress)
        kind = ev.aggregator.kind if ev.method == "hdeval" else ev.method
        path = Path(out) if out else Path("artifacts") / f"{ev.task.name}-{kind}"
        try:
            ev.save(path, force=force)
        except HdevalError as exc:
            raise type(exc)(f"{exc} (every LLM reply of this run is cached: rerunning costs no calls)") from None
        _print_train_summary(ev, path)

    run_command(go)


def _print_train_summary(ev, path: Path) -> None:
    """Usage, the final evaluator against the direct baseline, sample-size warnings, next step."""
    m = ev.metrics
    u = m["usage"]
    click.echo(
        f"LLM calls made: {u['calls']}, cache hits: {u['cache_hits']}, "
        f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion", err=True)
    if ev.method != "hdeval":
        if hasattr(ev, "summary_line"):  # a method whose held-out figure is not a correlation
            click.echo(ev.summary_line())
        else:
            avg = m["final"]["average"]
            click.echo(f"held-out average: pearson {avg['pearson']}, spearman {avg['spearman']}, "
                       f"kendall {avg['kendall']}")
        click.echo(f"artifact written to {path}")
        return
    layers = ev.manifest_extra.get("layers") or [{}]
    final_layer = layers[-1].get("layer", "?")
    avg = m["final"]["average"]
    click.echo(f"final evaluator: layer {final_layer}, aggregator {ev.aggregator.kind}, "
               f"{len(ev.feature_keys)} criteria")
    click.echo(f"held-out average: pearson {avg['pearson']}, spearman {avg['spearman']}, "
               f"kendall {avg['kendall']}")
    direct = (m.get("direct_layer1") or {}).get("average", {}).get("spearman")
    if direct is not None and avg["spearman"] is not None:
        diff = avg["spearman"] - direct
        click.echo(f"direct baseline (layer-1 scores used as they are): held-out spearman {direct}; "
                   f"the trained evaluator is {diff:+.3f}")
    n_train, n_test = m["split"]["train"], m["split"]["test"]
    n_crit = len(ev.feature_keys)
    if n_train < 2 * n_crit:
        click.echo(f"warning: {n_train} training samples for {n_crit} criteria: the aggregator may "
                   "overfit; use more data (--limit, --train-frac) or fewer criteria (--layers, --top-k)",
                   err=True)
    if n_test < 30:
        click.echo(f"warning: only {n_test} held-out samples: the correlations above are noisy "
                   "(use more data or a larger --test-frac)", err=True)
    click.echo(f"artifact written to {path}")
    click.echo(f"next: hdeval report {path}")


def _check_outputs(config, out: str | None, force: bool) -> None:
    """Refuse an --out that save would refuse (a non-artifact directory, an artifact without
    --force, the working directory, an unwritable place). Without --out, every default the
    run may pick (artifacts/<task>-<kind>; with auto, any kind) is checked."""
    from hdeval.aggregate import KINDS
    from hdeval.artifact import check_destination
    from hdeval.tasks import load_task

    if out:
        check_destination(out, force=force)
        return
    name = load_task(config.task).name
    if config.method != "hdeval":
        kinds: tuple[str, ...] = (config.method,)
    else:
        kinds = KINDS if config.aggregator == "auto" else (config.aggregator,)
    for kind in kinds:
        check_destination(Path("artifacts") / f"{name}-{kind}", force=force)


def _resolved(llm: str | None) -> str | None:
    from hdeval.backends.factory import resolve_llm

    try:
        return resolve_llm(llm)
    except HdevalError:
        return None


def _print_plan(prep, plans, identity: str, price_in: float | None, price_out: float | None) -> None:
    click.echo(f"dry run for task {prep.task.name}: {len(prep.samples)} samples "
               f"({len(prep.split.train_ids)} train, {len(prep.split.test_ids)} test), LLM {identity}")
    click.echo("layer  decompose  score-calls  cached  est.prompt-tok  est.completion-tok")
    tot_calls = tot_p = tot_c = 0
    for p in plans:
        calls = p.decompose_calls + p.score_calls
        tot_calls += calls
        tot_p += p.prompt_tokens
        tot_c += p.completion_tokens
        bound = "<=" if p.upper_bound else "  "
        cached = "?" if p.cached is None else str(p.cached)
        click.echo(f"{p.layer:>5}  {p.decompose_calls:>9}  {bound}{p.score_calls:>9}  {cached:>6}  "
                   f"{p.prompt_tokens:>14}  {p.completion_tokens:>18}")
    known_cached = sum(p.cached or 0 for p in plans)
    click.echo(f"total: <= {tot_calls} LLM calls ({known_cached} already cached), "
               f"~{tot_p} prompt + ~{tot_c} completion tokens (estimated from characters)")
    if price_in is not None or price_out is not None:
        cost = tot_p / 1e6 * (price_in or 0) + tot_c / 1e6 * (price_out or 0)
        click.echo(f"estimated cost: at most {cost:.2f} (at {price_in or 0}/{price_out or 0} per 1M tokens)")


def load_artifact(path: str):
    """Load an artifact of any method and show its warnings (e.g. an edited tree.json)."""
    from hdeval.artifact import load_artifact as load

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
                        concurrency: int, quiet: bool):
    """Score samples with the artifact's LLM (or the one given), cached; warn on a mismatch."""
    from hdeval.config import LLMConfig
    from hdeval.llm import open_llm
    from hdeval.urls import public_identity

    _check_llm_options(concurrency=concurrency, timeout=timeout, max_retries=max_retries, max_calls=max_calls)
    model, url = _artifact_llm(ev, llm, base_url)
    config = LLMConfig(model, url, timeout, max_retries, concurrency, cache_dir, max_calls)
    _notice_local(model)
    backend = open_llm(config)
    if public_identity(backend.identity, url) != ev.llm_identity:
        click.echo(f"warning: scoring with {public_identity(backend.identity, url)}, but the evaluator was "
                   f"trained with {ev.llm_identity}; scores may not match its metrics", err=True)
    try:
        return ev.score(samples, backend=backend, concurrency=concurrency, progress=TerminalProgress(quiet))
    finally:
        backend.close()


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
    if output == "-":
        for r in rows:
            click.echo(json.dumps(r, ensure_ascii=False))
        return
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if fmt == "jsonl":
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                for r in rows:
                    fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        else:
            os.close(fd)
            import pandas as pd

            frame = pd.DataFrame([_flat(r) for r in rows])
            if fmt == "csv":
                frame.to_csv(tmp, index=False)
            else:
                frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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


@cli.command()
@click.argument("artifact", type=click.Path())
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path())
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Where to write the scores: .jsonl, .csv or .parquet (by extension); - for JSONL on stdout.")
@click.option("--quiet", "-q", is_flag=True)
@click.option("--explain", is_flag=True,
              help="Add, per sample and aspect, the top contributing criteria with SHAP values.")
@click.option("--top", default=3, show_default=True, type=int, help="With --explain: criteria per aspect.")
@llm_options
def apply(artifact: str, input_file: str, output: str, quiet: bool, explain: bool, top: int,
          llm: str | None, base_url: str | None,
          concurrency: int, timeout: float, max_retries: int, cache_dir: str | None,
          max_calls: int | None) -> None:
    """Score new samples with a trained evaluator (same criteria, prompts and LLM; cached).

    \b
    Example:
      hdeval apply artifacts/summeval-nn new.jsonl -o scored.jsonl
      hdeval apply artifacts/summeval-nn new.jsonl -o - | jq .scores
    """
    from hdeval.data import read_task_samples

    def go() -> None:
        _check_llm_options(concurrency=concurrency, timeout=timeout, max_retries=max_retries, max_calls=max_calls)
        fmt = _output_format(output)
        to_stdout = output == "-"
        ev = load_artifact(artifact)
        if explain and ev.method != "hdeval":
            raise ConfigError(f"--explain reads HD-Eval artifacts; {artifact} was made by method {ev.method!r}")
        samples = read_task_samples(input_file, ev.task, require_labels=False)
        other = sorted(_input_tasks(input_file) - {ev.task.name})
        if other:
            click.echo(f"warning: {input_file} holds samples of task {', '.join(other)}, but the artifact was "
                       f"trained on task {ev.task.name}; its scores will mean little there", err=True)
        needed = ev.columns_needed()
        if ev.method == "hdeval":
            click.echo(f"{len(samples)} samples, {len(needed)} of {len(ev.feature_keys)} criteria used by the "
                       f"aggregator: {len(needed)} LLM calls per sample", err=True)
        else:
            click.echo(f"{len(samples)} samples; method {ev.method}: {len(needed)} LLM-filled column(s) "
                       "per sample", err=True)
        res = score_with_artifact(ev, samples, llm=llm, base_url=base_url, timeout=timeout,
                                  max_retries=max_retries, cache_dir=cache_dir, max_calls=max_calls,
                                  concurrency=concurrency, quiet=quiet)
        rows = ev.output_rows(samples, res)
        if explain:
            from hdeval.methods.hdeval.explain import explain_samples

            for row, expl in zip(rows, explain_samples(ev, res, top=top)):
                row["explanation"] = expl
        _write_output(output, fmt, rows)
        u = res.usage
        click.echo(f"LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}, tokens: "
                   f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion", err=True)
        agreement = res.agreement(samples) if hasattr(res, "agreement") else None
        if agreement:
            click.echo(f"agreement with the human labels in the input: {json.dumps(agreement)}", err=to_stdout)
        corr = res.correlations(samples)
        if corr is not None:
            click.echo("correlation with the human scores in the input:", err=to_stdout)
            for a, row in corr.items():
                click.echo(f"  {a:<18} pearson {row['pearson']}  spearman {row['spearman']}  kendall {row['kendall']}",
                           err=to_stdout)
        click.echo(f"wrote {len(rows)} scored samples to {'stdout' if to_stdout else output}", err=to_stdout)

    run_command(go)


@cli.command("methods")
def methods_cmd() -> None:
    """List the methods `hdeval train --method` can build, with their own options."""
    from hdeval.methods.base import METHODS, method_names

    for name in method_names():
        m = METHODS[name]
        click.echo(f"{name} ({'/'.join(m.shapes)} data): {m.summary}")
        for opt_name, opt in m.options.items():
            click.echo(f"  --{opt_name.replace('_', '-')} (default {opt.default}): {opt.help}")


@cli.command("tasks")
def tasks_cmd() -> None:
    """List the built-in tasks, their aspects and whether their data is found."""
    from hdeval.data import data_candidates
    from hdeval.tasks import builtin_tasks, load_task

    def go() -> None:
        for name in builtin_tasks():
            task = load_task(name)
            found = next((p for p in data_candidates(task) if p.is_file()), None)
            status = f"data: {found}" if found else (
                "data: not found (set HDEVAL_DATA_DIR, pass --data, or run `hdeval data download`)")
            click.echo(f"{name} ({task.shape}): {task.description}")
            for a in task.aspects:
                click.echo(f"  - {a.key} [{a.low:g}-{a.high:g}]: {a.definition}")
            click.echo(f"  {status}")

    run_command(go)


@cli.group()
def cache() -> None:
    """Inspect, check, repair or clear the LLM reply cache."""


@cache.command("stats")
@click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False))
def cache_stats_cmd(cache_dir: str | None) -> None:
    """Show the number of cached replies and their size."""
    from hdeval.cache import cache_stats
    from hdeval.paths import default_cache_dir

    def go() -> None:
        st = cache_stats(cache_dir or default_cache_dir())
        click.echo(f"cache {st['path']}: {st['entries']} entries, {int(st['bytes']) / 1e6:.2f} MB")

    run_command(go)


@cache.command("clear")
@click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False))
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def cache_clear_cmd(cache_dir: str | None, yes: bool) -> None:
    """Delete every cached reply (they cost money to make again)."""
    from hdeval.cache import DBNAME, CacheCorrupted, cache_stats, clear_cache
    from hdeval.paths import default_cache_dir

    def go() -> None:
        path = Path(cache_dir or default_cache_dir())
        try:
            question = f"delete {cache_stats(path)['entries']} cached LLM replies in {path}?"
        except CacheCorrupted:
            question = (f"{path / DBNAME} is corrupted (`hdeval cache repair` could keep its readable "
                        f"entries); delete it?")
        if not yes and not click.confirm(question, default=False):
            click.echo("nothing deleted")
            return
        n = clear_cache(path)
        if n < 0:
            click.echo(f"deleted the corrupted {path / DBNAME}; the next run starts an empty cache")
        else:
            click.echo(f"deleted {n} cached replies from {path}")

    run_command(go)


@cache.command("check")
@click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False))
def cache_check_cmd(cache_dir: str | None) -> None:
    """Read every entry: count readable, unreadable and foreign ones (writes nothing).

    Exits 1 when the database or any entry is unreadable, or it holds entries hdeval never
    writes (e.g. pickled values); `hdeval cache repair` keeps only the readable ones.
    """
    from hdeval.cache import DBNAME, check_cache
    from hdeval.paths import default_cache_dir

    def go() -> None:
        path = Path(cache_dir or default_cache_dir())
        r = check_cache(path)
        click.echo(f"cache {path}: {r.readable} readable, {r.unreadable} unreadable, "
                   f"{r.foreign} foreign (not written by hdeval) entries")
        for e in r.examples:
            click.echo(f"  {e}")
        if r.database_error is not None:
            click.echo(f"error: the database {path / DBNAME} is damaged ({r.database_error}); "
                       f"`hdeval cache repair --cache-dir {path}` keeps the readable entries", err=True)
        elif not r.ok:
            click.echo(f"error: {r.unreadable + r.foreign} entries cannot be used (each is asked again "
                       f"when needed); `hdeval cache repair --cache-dir {path}` keeps only the readable ones",
                       err=True)
        if not r.ok:
            sys.exit(1)

    run_command(go)


@cache.command("repair")
@click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False))
def cache_repair_cmd(cache_dir: str | None) -> None:
    """Copy every readable entry into a fresh cache; keep the old database aside.

    The old database is renamed cache.db.corrupt-<timestamp> (never deleted). Run it while no
    other hdeval command uses this cache.
    """
    from hdeval.cache import repair_cache
    from hdeval.paths import default_cache_dir

    def go() -> None:
        r = repair_cache(cache_dir or default_cache_dir())
        damaged = f" (the old database was damaged: {r.database_error})" if r.database_error else ""
        click.echo(f"repaired {r.path}: copied {r.copied} readable entries into a fresh cache; "
                   f"left out {r.unreadable} unreadable and {r.foreign} foreign entries{damaged}")
        click.echo(f"the old database is kept as {r.kept_as} (delete it when you no longer need it)")

    run_command(go)


def _register_optional() -> None:
    # Commands that live in their own modules (each owns one capability).
    import importlib

    for module, names in (("hdeval.cli_data", ("data",)), ("hdeval.cli_report", ("report", "explain")),
                         ("hdeval.cli_paireval", ("paireval",))):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        for name in names:
            if hasattr(mod, name):
                cli.add_command(getattr(mod, name))


_register_optional()


def main() -> None:
    cli(prog_name="hdeval")


if __name__ == "__main__":
    main()
