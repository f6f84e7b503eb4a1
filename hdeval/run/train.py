"""A training run of any method, and its dry run: the options, the task and data, the split and
the LLM; the method's own ``fit`` and ``plan`` (see :mod:`hdeval.methods.base`) do the rest."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import Field, model_validator

from hdeval.core.errors import ConfigError, DataError, MethodError
from hdeval.core.progress import Progress
from hdeval.core.types import Sample, Task
from hdeval.data.samples import (
    Split,
    find_data,
    limit_samples,
    read_task_samples,
    recorded_columns,
    split_samples,
)
from hdeval.data.tasks import apply_preset, load_task, select_aspects
from hdeval.llm.backends.base import Backend
from hdeval.llm.config import LLMConfig, LLMSettings
from hdeval.methods.base import FitContext, Fitted, check_shape, run_record
from hdeval.methods.registry import all_options, get_method
from hdeval.methods.run import LayerPlan, backend_for, llm_config, open_decompose_backend

MAX_SEED = 2**32 - 1
_JURY_FIELDS = ("judges", "jury", "prune_judges")


class TrainConfig(LLMSettings):
    """What every training run shares, plus the chosen method's options model: a frozen pydantic
    model. The LLM request settings are :class:`~hdeval.llm.config.LLMSettings`' fields, declared
    there once. Unknown fields are refused; :meth:`from_options` takes every option by name."""

    task: str  # built-in task name or path to a task .toml
    method: str = "hdeval"  # hdeval | direct | ... (see `hdeval methods`)
    # the chosen method's options (its MethodOptions model; a mapping name -> value or None, its
    # defaults, is built into that model here), e.g. {"layers": 2} for hdeval
    options: Any = None
    data: str | None = None  # JSONL of samples; default: the task's file in HDEVAL_DATA_DIR / user data dir
    aspects: tuple[str, ...] | None = None  # train on a subset of the task's aspects
    preset: str | None = None  # a task file's [presets.NAME]: its aspects, some with their own regressor
    llm: str | None = None  # see hdeval.llm.backends.factory.resolve_llm
    base_url: str | None = None  # OpenAI-compatible server, e.g. http://localhost:8000/v1
    seed: int = Field(0, description="Split, model and cross-validation randomness.")
    test_frac: float = Field(0.5, description="Share of samples held out.")
    train_frac: float = Field(0.5, description="Share of all samples used to train.")
    limit: int | None = None  # use only N samples (whole documents, seeded) for quick runs
    max_failure_rate: float = Field(
        0.2, description="Stop when a larger share of criterion scores cannot be read."
    )
    # a jury (HD-Eval pointwise): more judges besides ``llm`` (``--llm A --llm B``), or a jury
    # TOML file; recorded only when given, so other runs' manifests stay as they were
    judges: tuple[str, ...] = ()
    jury: str | None = None
    prune_judges: bool = False  # drop judges whose columns add nothing on grouped CV

    @model_validator(mode="before")
    @classmethod
    def _method_options(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        method = get_method(data.get("method") or "hdeval")
        options = data.get("options")
        if options is None or isinstance(options, Mapping):
            return {**data, "options": method.build_options(options)}
        if type(options) is not method.options:
            raise ConfigError(
                f"the options of method {method.name!r} are a {method.options.__name__}, "
                f"not a {type(options).__name__}"
            )
        return data

    @classmethod
    def from_options(cls, **options: Any) -> "TrainConfig":
        """Every option by name, the CLI's way: the shared ones are fields, the rest go to the
        chosen method's options model (``method_options``, a mapping, is merged in). None means
        not given (the default). A name no method takes, or one the chosen method does not, is a
        ConfigError."""
        shared = set(cls.model_fields) - {"options"}
        # paths (task, data, a method's tree file) as load and score take them
        options = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()}
        given = dict(options.pop("method_options", None) or {})
        mine = {k: options.pop(k) for k in list(options) if k not in shared}
        unknown = sorted(k for k in mine if k not in all_options())
        if unknown:
            import difflib

            method = options.get("method") or "hdeval"
            known = sorted(shared | set(all_options()))
            close = [m for k in unknown for m in difflib.get_close_matches(k, known, n=1)]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"unknown training option(s) for method {method!r}: {', '.join(unknown)}{hint}")
        given.update({k: v for k, v in mine.items() if v is not None})
        if isinstance(options.get("aspects"), str):
            options["aspects"] = tuple(a.strip() for a in options["aspects"].split(",") if a.strip())
        return cls(options=given, **{k: v for k, v in options.items() if v is not None})

    def replace(self, **options: Any) -> "TrainConfig":
        """This config with some options changed, by name (shared or the method's)."""
        shared = {name: getattr(self, name) for name in type(self).model_fields if name != "options"}
        mine = self.options.given() if "method" not in options else {}  # omitted ones stay omitted
        return TrainConfig.from_options(**{**shared, **mine, **options})

    def check(self) -> None:
        checks = [
            (0 <= self.max_failure_rate <= 1, "--max-failure-rate must be between 0 and 1"),
            # numpy and scikit-learn take seeds in [0, 2**32): fail here, not after paid calls
            (0 <= self.seed <= MAX_SEED, f"--seed must be between 0 and {MAX_SEED}, got {self.seed}"),
            (self.limit is None or self.limit >= 1, f"--limit must be at least 1, got {self.limit}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        if self.aspects is not None:  # --aspects ",," is no subset: it trained on every aspect
            if not self.aspects:
                raise ConfigError(
                    "--aspects is empty: name the aspects to train on, e.g. --aspects clarity,accuracy"
                )
            twice = next((a for i, a in enumerate(self.aspects) if a in self.aspects[:i]), None)
            if twice is not None:
                raise ConfigError(f"--aspects names {twice!r} twice")
        llm_config(self).check()
        if self.judges or self.jury or self.prune_judges:
            check_jury_options(self)

    def jury_judges(self) -> tuple[Any, ...]:
        """The jury's judges (``--jury`` file or ``--llm`` given twice or more), or ()."""
        from hdeval.methods.jury import judges_of_llms, read_jury

        if self.jury:
            return read_jury(self.jury, self.base_url)
        if self.judges:
            return judges_of_llms((self.llm or "", *self.judges), self.base_url)
        return ()

    def public(self) -> dict[str, Any]:
        """The run as the manifest records it (artifact format 3): the shared options in the
        order of ``_RECORD``, and every option of the method under ``options``
        (:meth:`MethodOptions.record`). Format 2's record is read by
        :func:`hdeval.methods.options.recorded_options`."""
        from hdeval.core.urls import public_url

        d = {name: getattr(self, name) for name in _RECORD if name not in _JURY_FIELDS or getattr(self, name)}
        return {
            **d,
            "options": self.options.record(),
            "aspects": list(self.aspects) if self.aspects else None,
            "base_url": public_url(self.base_url),
        }  # an artifact is shared: no user, password or query


# the manifest's "config", key by key: the artifact format (golden files pin it), so it does not
# follow the fields' order (the LLM settings are inherited, so they come first there)
_RECORD = (
    "task", "method", "options", "data", "aspects", "preset", "llm", "base_url", "timeout",
    "max_retries", "concurrency", "cache_dir", "seed", "test_frac", "train_frac", "limit",
    "max_failure_rate", "max_calls", "batch", *_JURY_FIELDS,
)  # fmt: skip


def check_jury_options(config: TrainConfig) -> None:
    """A jury is HD-Eval's on pointwise data (checked again once the task is read)."""
    what = "--jury" if config.jury else "--llm given more than once" if config.judges else "--prune-judges"
    if config.jury and config.judges:
        raise ConfigError(
            "--jury and --llm given more than once cannot be combined: the file names the judges"
        )
    if config.prune_judges and not (config.jury or config.judges):
        raise ConfigError("--prune-judges needs a jury (--jury FILE, or --llm given more than once)")
    if not get_method(config.method).jury:
        raise ConfigError(
            f"{what}: method {config.method!r} takes one LLM; a jury is HD-Eval's "
            "(pointwise data), see docs/juries.md"
        )
    if config.options.scorer != "digit":
        raise ConfigError(f"{what}: a jury scores 1-5 digits; --scorer {config.options.scorer} takes one LLM")
    if config.batch:
        raise ConfigError(f"{what} cannot be combined with --batch yet")
    if config.jury:
        config.jury_judges()  # a bad file costs nothing


@dataclass
class Prepared:
    task: Task
    samples: list[Sample]  # the samples used (train + test), in file order
    split: Split
    data_path: Path
    given: Any = None  # what the method's prepare() returned (HD-Eval: the --tree to start from)


def prepare(config: TrainConfig) -> Prepared:
    """Validate options, load the task and every sample, split. No LLM call happens here."""
    config.check()
    task = load_task(config.task)
    if config.preset:
        if config.aspects:
            raise ConfigError("--preset and --aspects cannot be combined: the preset chooses the aspects")
        task = apply_preset(task, config.preset)
    task = select_aspects(task, config.aspects)
    method = get_method(config.method)
    check_shape(method, task)  # before reading: a pairwise file read as pointwise is no help
    if (config.jury or config.judges) and task.shape != "pointwise":
        raise ConfigError(
            f"a jury scores pointwise data; task {task.name!r} is {task.shape}: train it with one --llm"
        )
    given = method.prepare(config, task) if method.prepare else None
    path = find_data(task, config.data)
    task = recorded_columns(path, task)
    samples = read_task_samples(path, task, require_labels=True, labels_file=True)
    samples = limit_samples(samples, config.limit, config.seed)
    try:
        split = split_samples(samples, config.test_frac, config.train_frac, config.seed)
    except DataError as exc:  # too few samples or documents: say which file
        raise DataError(f"{path}: {exc}") from exc
    keep = set(split.train_ids) | set(split.test_ids)
    return Prepared(task, [s for s in samples if s.id in keep], split, path, given)


def train(
    config: TrainConfig | None = None,
    *,
    progress: Progress | None = None,
    backend: Backend | None = None,
    decompose_backend: Backend | None = None,
    export_requests: str | Path | None = None,
    judge_backends: Mapping[str, Backend] | None = None,
    **options: Any,
) -> Fitted:
    """Train an evaluator of ``config.method``; see :class:`TrainConfig` for the options.

    ``train(task="summeval", llm="fake", layers=2, limit=64)`` or ``train(TrainConfig(...))``.
    ``backend`` / ``decompose_backend``: LLMs to use instead of the ones the options name.
    ``judge_backends``: a jury's judges to use instead of the LLMs they name, by judge name.
    ``export_requests``: a file; the first stage with uncached requests writes them there and
    :class:`~hdeval.llm.request_files.RequestsExported` is raised (nothing is paid for).
    """
    if config is None:
        config = TrainConfig.from_options(**options)
    elif not isinstance(config, TrainConfig):
        raise ConfigError(
            f"train takes a TrainConfig or options by name (train(task=..., llm=...)), got {type(config).__name__}"
        )
    elif options:
        config = config.replace(**options)
    progress = progress or Progress()
    prep = prepare(config)
    method = get_method(config.method)
    # An injected backend is recorded by what the caller named it (or its identity).
    from hdeval.llm.client import resolved

    spec = (
        resolved(llm_config(config))
        if backend is None
        else LLMConfig(model=config.llm or backend.identity, base_url=config.base_url)
    )
    with contextlib.ExitStack() as opened:  # closed in reverse: the decompose LLM first
        jury = None
        judges = config.jury_judges()
        if judges:
            from hdeval.methods.jury import open_jury

            jury = open_jury(judges, llm_config(config), backends=judge_backends)
            opened.callback(jury.close)
            llm = jury.first  # it decomposes unless --decompose-llm names another
            spec = resolved(
                llm_config(config).replace(
                    model=judges[0].llm, base_url=judges[0].base_url or config.base_url
                )
            )
        else:
            llm = opened.enter_context(backend_for(config, backend))
        dec = open_decompose_backend(config, llm, decompose_backend)
        if dec is not llm and dec is not decompose_backend:  # an injected CachedBackend is the caller's
            opened.enter_context(contextlib.closing(dec))
        ctx = FitContext(config, prep, llm, spec, progress, decompose_llm=dec, jury=jury)
        if export_requests is not None:
            if jury is not None:
                raise ConfigError(
                    "--export-requests does not export a jury's requests yet: train it with one --llm"
                )
            from hdeval.methods.run import fit_exporting

            return _fitted(method.name, fit_exporting(method, ctx, export_requests), ctx)
        return _fitted(method.name, method.fit(ctx), ctx)


def _fitted(method: str, fitted: Any, ctx: FitContext) -> Fitted:
    """What ``fit`` returned, when it is a fitted evaluator: anything else (a plug-in's dict)
    would stop the run later, far from its cause, or be returned to a notebook as it is. The run
    record is the run's when the method left it empty (a plug-in implementing only the seam's
    three members): an artifact without one cannot tell apply its training samples."""
    if not isinstance(fitted, Fitted):
        got = "None" if fitted is None else type(fitted).__name__
        raise MethodError(f"method {method!r}: fit returned {got}, not a Fitted")
    if fitted.method != method:  # the manifest names fitted.method: its load would read the artifact
        raise MethodError(
            f"method {method!r}: fit returned a {type(fitted).__name__} of method {fitted.method!r}, "
            f"whose load would read its artifact (set method = {method!r} on the class)"
        )
    if not fitted.run:
        fitted.run = run_record(ctx)
    return fitted


def plan(config: TrainConfig, backend: Backend | None = None) -> tuple[Prepared, list[LayerPlan], str]:
    """What a run would cost, without calling the LLM; token counts are estimates (chars/4). Each
    method counts its own requests (``Method.plan``); where they depend on earlier replies (HD-Eval's
    later layers) its counts are upper bounds."""
    method = get_method(config.method)
    if method.plan is None:  # a count made for another method would mislead
        raise ConfigError(f"--dry-run has no plan for method {config.method!r} yet")
    prep = prepare(config)
    judges = config.jury_judges()
    if judges:
        return prep, _jury_plan(method, config, prep, judges), ", ".join(f"{j.name} {j.llm}" for j in judges)
    return prep, method.plan(config, prep, backend), offline_identity(config, backend)


class JuryPlan(list):
    """The layers of a jury's dry run (every judge's scoring calls, the decompositions once),
    and per judge (calls, prompt tokens, completion tokens) in ``judge_calls``."""

    judge_calls: list[tuple[int, int, int]]


def _jury_plan(method: Any, config: TrainConfig, prep: Prepared, judges: Sequence[Any]) -> JuryPlan:
    import dataclasses as dc

    out = JuryPlan()
    out.judge_calls = []
    for i, j in enumerate(judges):
        one = config.replace(
            llm=j.llm, base_url=j.base_url or config.base_url, judges=(), jury=None, prune_judges=False
        )
        layers = method.plan(one, prep, None)
        score_tok = [
            (p.prompt_tokens - p.decompose_prompt_tokens, p.completion_tokens - p.decompose_completion_tokens)
            for p in layers
        ]
        out.judge_calls.append(
            (sum(p.score_calls for p in layers), sum(t[0] for t in score_tok), sum(t[1] for t in score_tok))
        )
        if i == 0:  # the first judge decomposes (unless --decompose-llm): its layers as they are
            out.extend(layers)
            continue
        for k, (p, (pt, ct)) in enumerate(zip(layers, score_tok)):
            base = out[k]
            out[k] = dc.replace(
                base,
                score_calls=base.score_calls + p.score_calls,
                cached=None if base.cached is None or p.cached is None else base.cached + p.cached,
                prompt_tokens=base.prompt_tokens + pt,
                completion_tokens=base.completion_tokens + ct,
                requests=None
                if base.requests is None or p.requests is None
                else base.requests + p.requests - p.decompose_calls,
            )
    return out


def offline_identity(config: TrainConfig, backend: Backend | None) -> str:
    with backend_for(config, backend, offline=True) as llm:
        dec = open_decompose_backend(config, llm, offline=True)
        if dec is llm:
            return llm.identity
        dec.close()
        return f"{llm.identity}, decomposition LLM {dec.identity}"
