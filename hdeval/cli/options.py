"""The options commands share, declared once: the LLM's (defaults from :mod:`hdeval.llm.config`),
``--batch``, and ``--method`` with every method's options (from the methods' options models)."""

from __future__ import annotations

import os
import re
from typing import Any

import click

from hdeval.llm.config import (
    BUILTIN_LLMS,
    HDEVAL_LLM_EMPTY,
    base_url_problem,
    did_you_mean,
    edits,
    llm_problem,
    typo_refusal,
)


def seen_model_near(llm: str | None, base_url: str | None, cache_dir: str | None) -> tuple[str, str] | None:
    """(model, server) of a model the reply cache has recorded a run of at the server ``llm``
    would go to, a typo away from ``llm`` (which it has no run of); None when there is none."""
    if not llm or not llm.strip() or any(c in llm for c in ":@") or llm.strip().lower() in BUILTIN_LLMS:
        return None
    from hdeval.core.urls import public_url
    from hdeval.llm.eta import seen_models

    seen = seen_models(cache_dir)
    if base_url:
        server = (public_url(base_url.strip()) or "").rstrip("/")
        here = [m for m, url in seen if url.rstrip("/") == server]
    else:  # OpenAI's API, whatever path the run recorded
        here = [m for m, url in seen if _host(url) == "api.openai.com"]
        server = "https://api.openai.com/v1"
    if llm in here:
        return None
    name = llm.strip().lower()
    limit = 1 if len(name) <= 4 else 2
    near = sorted((edits(name, m.lower()), m) for m in here if abs(len(m) - len(name)) <= limit)
    return (near[0][1], server) if near and near[0][0] <= limit else None


def _host(url: str) -> str:
    """The host of a URL the cache recorded ("" for one urllib cannot read: the file may be anyone's)."""
    from urllib.parse import urlsplit

    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _given_as(ctx: click.Context, name: str, flag: str, env: str) -> str:
    """How the user named option ``name``: its flag, or the environment variable it came from."""
    from_env = ctx.get_parameter_source(name) == click.core.ParameterSource.ENVIRONMENT
    return env if from_env else flag


#: Commands that score with the artifact's own LLM unless --llm is typed (HDEVAL_LLM is ignored
#: there with a note), so an empty HDEVAL_LLM sends nothing anywhere it was not meant to.
ARTIFACT_LLM_COMMANDS = frozenset({"apply", "check", "estimate", "explain"})


def _check_llm_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Called for --llm, --base-url and --cache-dir (each, given or not): the last checks them."""
    ctx.meta[f"hdeval.{param.name}"] = value
    if {"hdeval.llm", "hdeval.base_url", "hdeval.cache_dir"} <= ctx.meta.keys():
        given, base_url = ctx.meta["hdeval.llm"], ctx.meta["hdeval.base_url"]
        llms = given if isinstance(given, tuple) else (given,)  # train's --llm may be given more than once
        typed = ctx.get_parameter_source("llm") == click.core.ParameterSource.COMMANDLINE
        own = ctx.command.name in ARTIFACT_LLM_COMMANDS  # these ignore HDEVAL_LLM: no default to fall to
        if not typed and not own and not os.environ.get("HDEVAL_LLM", "x").strip():
            raise click.UsageError(HDEVAL_LLM_EMPTY, ctx=ctx)
        problem = base_url_problem(base_url, _given_as(ctx, "base_url", "--base-url", "HDEVAL_BASE_URL"))
        if problem:  # before anything reads it (the cache's did-you-mean below, the redactor)
            raise click.UsageError(problem, ctx=ctx)
        for llm in llms:
            guess = did_you_mean(llm, base_url)  # None for an empty name: llm_problem says that
            if guess:
                raise click.BadParameter(
                    typo_refusal(llm, guess),
                    ctx=ctx,
                    param_hint="--llm",
                )
            problem = llm_problem(llm, base_url)
            if problem:
                raise click.UsageError(problem, ctx=ctx)
            # a warning, not a refusal: gpt-4o and gpt-4 are both real models, one edit apart
            seen = seen_model_near(llm, base_url, ctx.meta["hdeval.cache_dir"])
            if seen:
                click.echo(
                    f"warning: --llm {llm!r}: the reply cache has no run of that model at {seen[1]}; "
                    f"did you mean {seen[0]!r}, which it has?",
                    err=True,
                )
    return value


def llm_options(f, jury: bool = False):
    f = click.option(
        "--llm",
        envvar="HDEVAL_LLM",
        default=None,
        multiple=jury,
        callback=_check_llm_name,
        help="Model: an OpenAI(-compatible) model name, 'local', 'llamacpp:/path.gguf' or "
        "'fake'. Default: HDEVAL_LLM, else OpenAI if OPENAI_API_KEY is set, else local."
        + (
            " Given more than once: a jury of judges behind one server (HD-Eval, pointwise; docs/juries.md)."
            if jury
            else ""
        ),
    )(f)
    f = click.option(
        "--base-url",
        envvar="HDEVAL_BASE_URL",
        default=None,
        callback=_check_llm_name,
        help="OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), "
        "http://localhost:11434/v1 (Ollama).",
    )(f)
    from hdeval.llm.config import LLMSettings

    for name, kind in (("concurrency", int), ("timeout", float), ("max_retries", int)):
        spec = LLMSettings.model_fields[name]
        f = click.option(
            "--" + name.replace("_", "-"),
            default=spec.default,
            show_default=True,
            type=kind,
            help=spec.description,
        )(f)
    f = click.option(
        "--cache-dir",
        envvar="HDEVAL_CACHE_DIR",
        default=None,
        type=click.Path(file_okay=False),
        callback=_check_llm_name,
        help=LLMSettings.model_fields["cache_dir"].description,
    )(f)
    f = click.option(
        "--max-calls", default=None, type=int, help=LLMSettings.model_fields["max_calls"].description
    )(f)
    return f


class ModelOption(click.Option):
    """An option whose default and help a pydantic model declares: read when help is shown, as
    the model's module may be slow to import (``model`` is ``"module:Class"``). The option's value
    stays None when not given, and None is "not set": the model's default applies."""

    def __init__(self, *args: Any, model: str, **kwargs: Any) -> None:
        super().__init__(*args, default=None, **kwargs)
        self.model = model

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        import importlib

        module, _, name = self.model.partition(":")
        spec = getattr(importlib.import_module(module), name).model_fields[self.name]
        self.help = self.help or spec.description
        record = super().get_help_record(ctx)
        if record is None or spec.default is None:
            return record
        return record[0], f"{record[1]}  [default: {spec.default}]"


def batch_option(f):
    """``--batch`` (train, apply): scoring requests through the OpenAI Batch API."""
    from hdeval.llm.config import LLMSettings

    return click.option("--batch", is_flag=True, help=LLMSettings.model_fields["batch"].description)(f)


def server_options(port: int):
    """``--host``, ``--port`` and ``--open`` (label, view): where a local page is served."""

    def add(f):
        f = click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")(f)
        f = click.option(
            "--port", default=port, show_default=True, type=int, help="Port (0 picks a free one)."
        )(f)
        return click.option(
            "--host",
            default="127.0.0.1",
            show_default=True,
            help="Address to serve on. Any other than 127.0.0.1, localhost or ::1 requires the printed token.",
        )(f)

    return add


def method_options(f):
    """``--method``, ``-O/--method-option NAME=VALUE`` (any method's option, typed by the chosen
    method's own declaration) and one flag per built-in method's option, its help giving each
    method's own default. Declared from the built-in methods only: a plug-in is never loaded
    outside the error boundary, so a broken one cannot break ``--help``. The values stay text
    here; :func:`chosen_method_options` types them by the chosen method."""
    from hdeval.methods.registry import builtin_methods

    owned: dict[str, list] = {}
    for method in sorted(builtin_methods(), key=lambda m: m.name):
        for name, opt in method.options.specs().items():
            owned.setdefault(name, []).append((method.name, opt))
    for name, owners in sorted(owned.items(), reverse=True):
        flag = "--" + name.replace("_", "-")
        first = owners[0][1]
        text = (
            f"[{', '.join(m for m, _ in owners)}] {first.help}{_choices_help(owners)}{_defaults_help(owners)}"
        )
        if all(isinstance(opt.default, bool) for _, opt in owners):
            f = click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=text)(f)
        else:
            f = click.option(flag, name, default=None, metavar=_metavar(first), help=text)(f)
    f = click.option(
        "--method-option",
        "-O",
        "method_option",
        multiple=True,
        metavar="NAME=VALUE",
        help="An option of the chosen method (repeatable), typed as that method declares it: "
        "the way to give a plug-in method's options; `hdeval methods` lists them.",
    )(f)
    return click.option(
        "--method",
        default="hdeval",
        show_default=True,
        metavar="NAME",
        help="How the evaluator is built: see `hdeval methods` (built-in and plug-in methods).",
    )(f)


def chosen_method_options(options: dict[str, Any]) -> None:
    """Type, in place, the method options ``options`` holds as text (the flags of
    :func:`method_options` and ``-O NAME=VALUE``) by the chosen method's declaration, and merge
    the ``-O`` ones into ``method_options``; one-line ConfigError for a malformed, repeated or
    unknown one. Called inside the command's error boundary (it loads the registry)."""
    from hdeval.core.errors import ConfigError
    from hdeval.methods.options import convert_option
    from hdeval.methods.registry import builtin_methods, get_method

    method = get_method(options.get("method") or "hdeval")
    specs = method.options.specs()
    flags = {n for m in builtin_methods() for n in m.options.specs()}
    for name in flags:
        raw = options.get(name)
        if isinstance(raw, str) and name in specs:
            options[name] = convert_option(raw, specs[name], "--" + name.replace("_", "-"))
    given: dict[str, Any] = {}
    for item in options.pop("method_option", ()) or ():
        head, eq, raw = (part.strip() for part in item.partition("="))
        name = head.replace("-", "_")
        if not eq or not raw or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", head):
            raise ConfigError(f"-O {item!r}: expected NAME=VALUE, e.g. -O layers=2")
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise ConfigError(
                f"-O {head}: method {method.name!r} takes no option {head!r} (its options: {known})"
            )
        if name in given or options.get(name) is not None:
            raise ConfigError(f"-O {head}: the option is given more than once")
        given[name] = convert_option(raw, specs[name], f"-O {head}")
    if given:
        options["method_options"] = {**(options.get("method_options") or {}), **given}


def _metavar(opt) -> str:
    kind = opt.kind or (None if opt.default is None else type(opt.default))
    return "CHOICE" if opt.choices else {int: "INTEGER", float: "FLOAT"}.get(kind, "TEXT")


def _choices_help(owners) -> str:
    """`` (one of: a, b)`` for an option whose owners all offer the same choices."""
    choices = {opt.choices for _, opt in owners}
    if len(choices) != 1 or not next(iter(choices)):
        return ""
    return f" (one of: {', '.join(next(iter(choices)))})"


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
