"""Command line: parse options -> one library call -> output. All terminal I/O lives here."""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import click

from hdeval import __version__
from hdeval.errors import HdevalError
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
@click.option("--dry-run", is_flag=True, help="Print calls, cache hits, tokens and cost; call no LLM.")
@click.option("--price-in", default=None, type=float, help="With --dry-run: price per 1M prompt tokens.")
@click.option("--price-out", default=None, type=float, help="With --dry-run: price per 1M completion tokens.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@method_options
@llm_options
def train(dry_run: bool, price_in: float | None, price_out: float | None, out: str | None,
          quiet: bool, **options: Any) -> None:
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
        progress = TerminalProgress(quiet)
        _notice_local(_resolved(config.llm))
        ev = run_train(config, progress=progress)
        kind = ev.aggregator.kind if hasattr(ev, "aggregator") else ev.method
        path = Path(out) if out else Path("artifacts") / f"{ev.task.name}-{kind}"
        ev.save(path)
        u = ev.metrics["usage"]
        click.echo(
            f"LLM calls made: {u['calls']}, cache hits: {u['cache_hits']}, "
            f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion", err=True)
        if hasattr(ev, "summary_line"):  # a method whose held-out figure is not a correlation
            click.echo(ev.summary_line())
        else:
            avg = ev.metrics["final"]["average"]
            click.echo(f"held-out average: pearson {avg['pearson']}, spearman {avg['spearman']}, "
                       f"kendall {avg['kendall']}")
        click.echo(f"artifact written to {path}")

    run_command(go)


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


def score_with_artifact(ev, samples, *, llm: str | None, base_url: str | None, timeout: float,
                        max_retries: int, cache_dir: str | None, max_calls: int | None,
                        concurrency: int, quiet: bool):
    """Score samples with the artifact's LLM (or the one given), cached; warn on a mismatch."""
    from hdeval.backends.factory import LLMSpec, make_backend
    from hdeval.cache import CachedBackend
    from hdeval.paths import default_cache_dir

    spec = LLMSpec(llm or ev.llm.model, base_url or ev.llm.base_url, timeout, max_retries)
    _notice_local(spec.model)
    backend = CachedBackend(make_backend(spec), cache_dir or default_cache_dir(), max_calls)
    if backend.identity != ev.llm_identity:
        click.echo(f"warning: scoring with {backend.identity}, but the evaluator was trained with "
                   f"{ev.llm_identity}; scores may not match its metrics", err=True)
    try:
        return ev.score(samples, backend=backend, concurrency=concurrency, progress=TerminalProgress(quiet))
    finally:
        backend.close()


@cli.command()
@click.argument("artifact", type=click.Path())
@click.argument("input_file", metavar="INPUT.jsonl", type=click.Path())
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="Scored JSONL to write.")
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
    """
    from hdeval.data import read_samples, write_jsonl

    def go() -> None:
        ev = load_artifact(artifact)
        samples = read_samples(input_file, ev.task, require_scores=False)
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
        write_jsonl(output, rows)
        u = res.usage
        click.echo(f"LLM calls made: {u.get('calls', 0)}, cache hits: {u.get('cache_hits', 0)}, tokens: "
                   f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion", err=True)
        corr = res.correlations(samples)
        if corr is not None:
            click.echo("correlation with the human scores in the input:")
            for a, row in corr.items():
                click.echo(f"  {a:<18} pearson {row['pearson']}  spearman {row['spearman']}  kendall {row['kendall']}")
        click.echo(f"wrote {len(rows)} scored samples to {output}")

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
