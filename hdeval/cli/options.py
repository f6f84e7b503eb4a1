"""The options commands share, declared once: the LLM's (defaults from :mod:`hdeval.config`),
``--batch``, and ``--method`` with every method's options (from the methods' options models)."""

from __future__ import annotations

import click

#: the names that never go to a server: a name a typo away from one is refused, not sent to OpenAI
BUILTIN_LLMS = ("fake", "local")


def _edits(a: str, b: str) -> int:
    """Levenshtein distance (the names compared are a few characters long)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def did_you_mean(llm: str | None, base_url: str | None) -> str | None:
    """``--llm fak`` would go to OpenAI as a model named "fak": the built-in it is a typo of."""
    if not llm or base_url or any(c in llm for c in ":/@"):
        return None
    name = llm.strip().lower()
    close = [b for b in BUILTIN_LLMS if name != b and _edits(name, b) <= (1 if len(b) <= 4 else 2)]
    return close[0] if close else None


def _check_llm_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Called for --llm and --base-url (both, given or not): the second checks the pair."""
    ctx.meta[f"hdeval.{param.name}"] = value
    if {"hdeval.llm", "hdeval.base_url"} <= ctx.meta.keys():
        llm = ctx.meta["hdeval.llm"]
        guess = did_you_mean(llm, ctx.meta["hdeval.base_url"])
        if guess:
            raise click.BadParameter(f"{llm!r} is no built-in LLM and would be sent to OpenAI as a model name: "
                                     f"did you mean {guess!r}? (a server's model of that name: give --base-url)",
                                     ctx=ctx, param_hint="--llm")
    return value


def llm_options(f):
    f = click.option("--llm", envvar="HDEVAL_LLM", default=None, callback=_check_llm_name,
                     help="Model: an OpenAI(-compatible) model name, 'local', 'llamacpp:/path.gguf' or "
                          "'fake'. Default: HDEVAL_LLM, else OpenAI if OPENAI_API_KEY is set, else local.")(f)
    f = click.option("--base-url", envvar="HDEVAL_BASE_URL", default=None, callback=_check_llm_name,
                     help="OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), "
                          "http://localhost:11434/v1 (Ollama).")(f)
    from hdeval.config import DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

    f = click.option("--concurrency", default=DEFAULT_CONCURRENCY, show_default=True, type=int,
                     help="LLM requests in flight.")(f)
    f = click.option("--timeout", default=DEFAULT_TIMEOUT, show_default=True, type=float,
                     help="Seconds per attempt of an LLM request (each retry gets its own).")(f)
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
    """``--method`` and every method's options, declared from the methods' options models: one
    flag per name, its help giving each method's own default."""
    from hdeval.methods.registry import all_options, method_names

    for name, owners in sorted(all_options().items(), reverse=True):
        flag = "--" + name.replace("_", "-")
        first = owners[0][1]
        text = f"[{', '.join(m for m, _ in owners)}] {first.help}{_defaults_help(owners)}"
        if isinstance(first.default, bool):
            f = click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=text)(f)
        else:
            kind = click.Choice(first.choices) if first.choices else first.kind or (
                None if first.default is None else type(first.default))
            f = click.option(flag, name, default=None, type=kind, help=text)(f)
    return click.option("--method", default="hdeval", show_default=True, type=click.Choice(method_names()),
                        help="How the evaluator is built: see `hdeval methods`.")(f)


def _defaults_help(owners) -> str:
    """`` (default: on for dna; off for hdeval, paireval)``; nothing for a default of "not set"."""
    shown: dict[str, list[str]] = {}
    for method, opt in owners:
        value = opt.shown_default()
        if value is not None:
            shown.setdefault(value, []).append(method)
    if not shown:
        return ""
    if len(shown) == 1 and len(next(iter(shown.values()))) == len(owners):
        return f" (default: {next(iter(shown))})"
    return " (default: " + "; ".join(f"{v} for {', '.join(ms)}" for v, ms in shown.items()) + ")"
