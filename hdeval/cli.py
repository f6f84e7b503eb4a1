"""Command line: parse options -> one library call -> output. All terminal I/O lives here."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import click

from hdeval import __version__
from hdeval.errors import ConfigError, HdevalError
from hdeval.progress import Progress

INTERRUPTED = "interrupted: every finished LLM call is cached; rerun the same command to resume"


class TerminalProgress(Progress):
    """Progress on stderr: a redrawn line on a terminal, a few plain lines otherwise."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._lock = threading.Lock()
        self.label, self.total, self.done, self.hits = "", 0, 0, 0
        self.t0 = time.monotonic()
        self._last = 0.0
        self._next_pct = 0.0

    def stage(self, label: str, total: int) -> None:
        with self._lock:
            self.label, self.total, self.done, self.hits = label, total, 0, 0
            self.t0 = time.monotonic()
            self._next_pct = 0.0
        self._draw(force=True)

    def advance(self, n: int = 1, cached: bool = False) -> None:
        with self._lock:
            self.done += n
            self.hits += n if cached else 0
        self._draw()

    def end_stage(self) -> None:
        self._draw(force=True, final=True)

    def message(self, text: str) -> None:
        if not self.quiet:
            click.echo(text, err=True)

    def _draw(self, force: bool = False, final: bool = False) -> None:
        if self.quiet:
            return
        with self._lock:
            now = time.monotonic()
            pct = self.done / self.total if self.total else 1.0
            if not force and now - self._last < 0.2 and self.tty:
                return
            if not self.tty and not force and pct < self._next_pct:
                return
            self._next_pct = pct + 0.25
            self._last = now
            elapsed = now - self.t0
            fresh = self.done - self.hits
            eta = ""
            if 0 < fresh and self.done < self.total:
                rate = elapsed / fresh
                eta = f", ETA {_duration(rate * (self.total - self.done))}"
            line = f"{self.label}: {self.done}/{self.total} done ({self.hits} cached){eta}"
            if self.tty:
                sys.stderr.write("\r\033[K" + line + ("\n" if final else ""))
                sys.stderr.flush()
            elif final or force:
                sys.stderr.write(line + "\n")


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run_command(fn: Callable[[], Any]) -> Any:
    """Turn library errors into one line on stderr and an exit code."""
    try:
        return fn()
    except HdevalError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo(f"\n{INTERRUPTED}", err=True)
        sys.exit(130)


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
@llm_options
def train(dry_run: bool, price_in: float | None, price_out: float | None, out: str | None,
          force: bool, quiet: bool, **options: Any) -> None:
    """Train an evaluator: decompose criteria, score samples, fit the aggregator, save the artifact.

    \b
    Example:
      hdeval train --task summeval --layers 3 --llm gpt-4o-mini
      hdeval train --task my_task.toml --data my.jsonl --llm fake --limit 64
    """
    from hdeval.train import TrainConfig, plan, train as run_train

    def go() -> None:
        config = TrainConfig.from_options(**options)
        if dry_run:
            _print_plan(*plan(config), price_in=price_in, price_out=price_out)
            return
        _check_outputs(config, out, force)  # before any LLM call: never after paying for them
        progress = TerminalProgress(quiet)
        _notice_local(_resolved(config.llm))
        ev = run_train(config, progress=progress)
        path = Path(out) if out else Path("artifacts") / f"{ev.task.name}-{ev.aggregator.kind}"
        try:
            ev.save(path, force=force)
        except HdevalError as exc:
            raise type(exc)(f"{exc} (every LLM reply of this run is cached: rerunning costs no calls)") from None
        u = ev.metrics["usage"]
        click.echo(
            f"LLM calls made: {u['calls']}, cache hits: {u['cache_hits']}, "
            f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion", err=True)
        avg = ev.metrics["final"]["average"]
        click.echo(f"held-out average: pearson {avg['pearson']}, spearman {avg['spearman']}, "
                   f"kendall {avg['kendall']}")
        click.echo(f"artifact written to {path}")

    run_command(go)


def _check_outputs(config, out: str | None, force: bool) -> None:
    """Refuse an --out that save would refuse (a non-artifact directory, an artifact without
    --force, the working directory, an unwritable place). Without --out, every default the
    run may pick (artifacts/<task>-<kind>; with auto, any kind) is checked."""
    from hdeval.aggregate import KINDS
    from hdeval.evaluator import check_destination
    from hdeval.tasks import load_task

    if out:
        check_destination(out, force=force)
        return
    name = load_task(config.task).name
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
    """Load an artifact and show its warnings (e.g. an edited tree.json)."""
    from hdeval.evaluator import Evaluator

    ev = Evaluator.load(path)
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
    from hdeval.backends.factory import LLMSpec, make_backend
    from hdeval.cache import CachedBackend
    from hdeval.evaluator import public_identity
    from hdeval.paths import default_cache_dir

    model, url = _artifact_llm(ev, llm, base_url)
    spec = LLMSpec(model, url, timeout, max_retries)
    _notice_local(spec.model)
    backend = CachedBackend(make_backend(spec), cache_dir or default_cache_dir(), max_calls)
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
    from hdeval.evaluator import check_writable

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
    from hdeval.data import read_samples

    def go() -> None:
        fmt = _output_format(output)
        to_stdout = output == "-"
        ev = load_artifact(artifact)
        samples = read_samples(input_file, ev.task, require_scores=False)
        other = sorted(_input_tasks(input_file) - {ev.task.name})
        if other:
            click.echo(f"warning: {input_file} holds samples of task {', '.join(other)}, but the artifact was "
                       f"trained on task {ev.task.name}; its scores will mean little there", err=True)
        needed = len(ev.needed_criteria)
        click.echo(f"{len(samples)} samples, {needed} of {len(ev.feature_keys)} criteria used by the "
                   f"aggregator: {needed} LLM calls per sample", err=True)
        res = score_with_artifact(ev, samples, llm=llm, base_url=base_url, timeout=timeout,
                                  max_retries=max_retries, cache_dir=cache_dir, max_calls=max_calls,
                                  concurrency=concurrency, quiet=quiet)
        fail = {}
        for f in res.criteria.failures:
            fail.setdefault(f.sample_id, []).append({"criterion": f.criterion_key, "reason": f.reason})
        rows = []
        for i, s in enumerate(samples):
            row = {
                "id": s.id, "doc_id": s.doc_id, "system": s.system,
                "scores": {a: round(float(res.predictions[i, j]), 6) for j, a in enumerate(res.aspects)},
                "criteria": {k: (None if math.isnan(v) else round(float(v), 6))
                             for k, v in zip(res.criteria.criterion_keys, res.criteria.values[i])
                             if k in ev.needed_criteria},
            }
            if s.scores:
                row["human"] = dict(s.scores)
            if s.id in fail:
                row["failures"] = fail[s.id]
            rows.append(row)
        if explain:
            from hdeval.explain import explain_samples

            for row, expl in zip(rows, explain_samples(ev, res, top=top)):
                row["explanation"] = expl
        _write_output(output, fmt, rows)
        u = res.usage
        click.echo(f"LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}, tokens: "
                   f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion", err=True)
        corr = res.correlations(samples)
        if corr is not None:
            click.echo("correlation with the human scores in the input:", err=to_stdout)
            for a, row in corr.items():
                click.echo(f"  {a:<18} pearson {row['pearson']}  spearman {row['spearman']}  kendall {row['kendall']}",
                           err=to_stdout)
        click.echo(f"wrote {len(rows)} scored samples to {'stdout' if to_stdout else output}", err=to_stdout)

    run_command(go)


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
            click.echo(f"{name}: {task.description}")
            for a in task.aspects:
                click.echo(f"  - {a.key} [{a.low:g}-{a.high:g}]: {a.definition}")
            click.echo(f"  {status}")

    run_command(go)


@cli.group()
def cache() -> None:
    """Inspect or clear the LLM reply cache."""


@cache.command("stats")
@click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False))
def cache_stats_cmd(cache_dir: str | None) -> None:
    """Show the number of cached replies and their size."""
    from hdeval.cache import cache_stats
    from hdeval.paths import default_cache_dir

    st = cache_stats(cache_dir or default_cache_dir())
    click.echo(f"cache {st['path']}: {st['entries']} entries, {int(st['bytes']) / 1e6:.2f} MB")


@cache.command("clear")
@click.option("--cache-dir", envvar="HDEVAL_CACHE_DIR", default=None, type=click.Path(file_okay=False))
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def cache_clear_cmd(cache_dir: str | None, yes: bool) -> None:
    """Delete every cached reply (they cost money to make again)."""
    from hdeval.cache import cache_stats, clear_cache
    from hdeval.paths import default_cache_dir

    path = cache_dir or default_cache_dir()
    n = cache_stats(path)["entries"]
    if not yes and not click.confirm(f"delete {n} cached LLM replies in {path}?", default=False):
        click.echo("nothing deleted")
        return
    click.echo(f"deleted {clear_cache(path)} cached replies from {path}")


def _register_optional() -> None:
    # Commands that live in their own modules (each owns one capability).
    import importlib

    for module, names in (("hdeval.cli_data", ("data",)), ("hdeval.cli_report", ("report", "explain"))):
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
