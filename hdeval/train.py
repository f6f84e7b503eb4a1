"""The HD-Eval training loop (paper Algorithm 1): decompose, score, aggregate, prune; per layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hdeval.aggregate import KINDS
from hdeval.backends.base import Backend
from hdeval.cache import CachedBackend
from hdeval.config import DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, LLMConfig
from hdeval.data import Split, find_data, limit_samples, read_task_samples, split_samples
from hdeval.errors import ConfigError, DataError, HdevalError
from hdeval.llm import open_llm
from hdeval.methods.base import FitContext, check_shape, get_method
from hdeval.progress import Progress
from hdeval.tasks import apply_preset, load_task, select_aspects
from hdeval.types import Sample, Task

if TYPE_CHECKING:  # pragma: no cover
    from hdeval.methods.base import Fitted

MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run. Unknown fields are rejected."""

    task: str  # built-in task name or path to a task .toml
    method: str = "hdeval"  # hdeval | direct | ... (see `hdeval methods`)
    # options of the chosen method that are not fields here, e.g. {"comparisons": 3}
    method_options: Mapping[str, Any] | None = None
    data: str | None = None  # JSONL of samples; default: the task's file in HDEVAL_DATA_DIR / user data dir
    aspects: tuple[str, ...] | None = None  # train on a subset of the task's aspects
    preset: str | None = None  # a task file's [presets.NAME]: its aspects, some with their own regressor
    layers: int = 3  # depth of the criteria tree (1 = the aspects only)
    children: int = 4  # max sub-criteria per decomposed criterion
    top_k: int = 4  # criteria expanded per layer from layer 3 on (attribution pruning)
    aggregator: str = "auto"  # lr | dt | rf | nn | auto
    llm: str | None = None  # see hdeval.backends.factory.resolve_llm
    base_url: str | None = None  # OpenAI-compatible server, e.g. http://localhost:8000/v1
    # the LLM settings as LLMConfig declares them (llm_config() builds it; it validates them)
    timeout: float = DEFAULT_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES
    concurrency: int = DEFAULT_CONCURRENCY
    cache_dir: str | None = None  # default: HDEVAL_CACHE_DIR or the per-user cache dir
    seed: int = 0  # split, model and CV randomness
    test_frac: float = 0.5  # share of samples held out for testing
    train_frac: float = 0.5  # share of all samples used for training
    limit: int | None = None  # use only N samples (whole documents, seeded) for quick runs
    max_failure_rate: float = 0.2  # stop when more criterion scores than this fail to parse
    max_calls: int | None = None  # stop cleanly before making more new LLM calls than this
    batch: bool = False  # scoring requests through the OpenAI Batch API (see LLMConfig.batch)
    # HD-Eval: the LLM that decomposes criteria (None: the scoring LLM) and its server
    decompose_llm: str | None = None
    decompose_base_url: str | None = None
    tree: str | None = None  # HD-Eval: start from this criteria tree (tree.json or an artifact dir)

    @classmethod
    def from_options(cls, **options: Any) -> "TrainConfig":
        from hdeval.methods.base import all_options

        given = dict(options.pop("method_options", None) or {})
        for name in all_options():
            if name in options:
                value = options.pop(name)
                if value is not None:  # None: not given on the command line
                    given[name] = value
        options["method_options"] = given
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown training option(s): {', '.join(unknown)}")
        if isinstance(options.get("aspects"), str):
            options["aspects"] = tuple(a.strip() for a in options["aspects"].split(",") if a.strip())
        return cls(**options)

    def validate(self) -> None:
        checks = [
            (self.layers >= 1, f"--layers must be at least 1, got {self.layers}"),
            (self.children >= 1, f"--children must be at least 1, got {self.children}"),
            (self.top_k >= 1, f"--top-k must be at least 1, got {self.top_k}"),
            (self.aggregator in KINDS + ("auto",),
             f"unknown aggregator {self.aggregator!r}: choose from {', '.join(KINDS)} or auto"),
            (0 <= self.max_failure_rate <= 1, "--max-failure-rate must be between 0 and 1"),
            # numpy and scikit-learn take seeds in [0, 2**32): fail here, not after paid calls
            (0 <= self.seed <= MAX_SEED, f"--seed must be between 0 and {MAX_SEED}, got {self.seed}"),
            (self.limit is None or self.limit >= 1, f"--limit must be at least 1, got {self.limit}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        llm_config(self).validate()
        if self.decompose_base_url and not self.decompose_llm:
            raise ConfigError("--decompose-base-url needs --decompose-llm MODEL (the model that server runs)")
        for name, value in (("--tree", self.tree), ("--decompose-llm", self.decompose_llm)):
            if value and self.method != "hdeval":
                raise ConfigError(f"{name} is an option of --method hdeval, not {self.method}")

    def public(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["aspects"] = list(self.aspects) if self.aspects else None
        return d


@dataclass
class Prepared:
    task: Task
    samples: list[Sample]  # the samples used (train + test), in file order
    split: Split
    data_path: Path
    tree: Any = None  # HD-Eval --tree: the GivenTree to start from (checked against the task)


def prepare(config: TrainConfig) -> Prepared:
    """Validate options, load the task and every sample, split. No LLM call happens here."""
    config.validate()
    task = load_task(config.task)
    if config.preset:
        if config.aspects:
            raise ConfigError("--preset and --aspects cannot be combined: the preset chooses the aspects")
        task = apply_preset(task, config.preset)
    task = select_aspects(task, list(config.aspects) if config.aspects else None)
    method = get_method(config.method)
    method.check_options(config.method_options or {})
    check_shape(method, task)  # before reading: a pairwise file read as pointwise is no help
    given = None
    if config.tree:  # before the data and any LLM call: a bad tree file costs nothing
        from hdeval.methods.hdeval.tree_file import read_tree

        given = read_tree(config.tree, task)
        if given.depth > config.layers:
            raise ConfigError(f"{config.tree}: the tree has {given.depth} layers but --layers is "
                              f"{config.layers}: pass --layers {given.depth} to score it as given, or more "
                              "to expand it")
    path = find_data(task, config.data)
    samples = read_task_samples(path, task, require_labels=True)
    samples = limit_samples(samples, config.limit, config.seed)
    try:
        split = split_samples(samples, config.test_frac, config.train_frac, config.seed)
    except DataError as exc:  # too few samples or documents: say which file
        raise DataError(f"{path}: {exc}") from exc
    keep = set(split.train_ids) | set(split.test_ids)
    return Prepared(task, [s for s in samples if s.id in keep], split, path, given)


def llm_config(config: TrainConfig) -> LLMConfig:
    """The run's LLM settings as the one typed config every command uses."""
    return LLMConfig(config.llm, config.base_url, config.timeout, config.max_retries,
                     config.concurrency, config.cache_dir, config.max_calls, config.batch)


def open_backend(
    config: TrainConfig, backend: Backend | None = None, offline: bool = False
) -> CachedBackend:
    """The cached backend for a run; ``backend`` lets tests and the API inject their own."""
    return open_llm(llm_config(config), backend, offline)


def decompose_llm_config(config: TrainConfig) -> LLMConfig | None:
    """The decomposing LLM's settings (``--decompose-llm``), or None: the scoring LLM decomposes.
    Same cache dir and budget settings; its own identity, so its own cache keys."""
    if not config.decompose_llm:
        return None
    return LLMConfig(config.decompose_llm, config.decompose_base_url, config.timeout, config.max_retries,
                     config.concurrency, config.cache_dir, config.max_calls)


def open_decompose_backend(
    config: TrainConfig, llm: CachedBackend, backend: Backend | None = None, offline: bool = False
) -> CachedBackend:
    """The cached backend that decomposes: ``llm`` itself unless ``--decompose-llm`` (or an
    injected ``backend``) names another. Opened before any call, so a decompose LLM that cannot
    be opened (no key, no model file, no runtime) stops the run before anything is paid for."""
    dc = decompose_llm_config(config)
    if dc is None and backend is None:
        return llm
    try:
        return open_llm(dc or llm_config(config), backend, offline)
    except HdevalError as exc:
        raise ConfigError(f"--decompose-llm {config.decompose_llm or getattr(backend, 'identity', '')}: {exc}") from None


def train(
    config: TrainConfig | None = None,
    *,
    progress: Progress | None = None,
    backend: Backend | None = None,
    decompose_backend: Backend | None = None,
    **options: Any,
) -> "Fitted":
    """Train an HD-Eval evaluator; see :class:`TrainConfig` for the options.

    ``train(task="summeval", llm="fake", layers=2, limit=64)`` or ``train(TrainConfig(...))``.
    ``backend`` / ``decompose_backend``: LLMs to use instead of the ones the options name.
    """
    if config is None:
        config = TrainConfig.from_options(**options)
    elif options:
        config = dataclasses.replace(config, **options)
    progress = progress or Progress()
    prep = prepare(config)
    method = get_method(config.method)
    # An injected backend is recorded by what the caller named it (or its identity).
    spec = llm_config(config).resolved() if backend is None else LLMConfig(config.llm or backend.identity, config.base_url)
    llm = open_backend(config, backend)
    try:
        dec = open_decompose_backend(config, llm, decompose_backend)
        try:
            return method.fit(FitContext(config, prep, llm, spec, progress, decompose_llm=dec))
        finally:
            if dec is not llm:
                dec.close()
    finally:
        llm.close()


# ---------------------------------------------------------------------- dry run
@dataclass
class LayerPlan:
    layer: int
    decompose_calls: int
    score_calls: int
    cached: int | None  # None when the requests are not known before earlier layers run
    upper_bound: bool
    prompt_tokens: int  # all of the layer's calls (decomposition included)
    completion_tokens: int
    stage: str = ""  # a method whose steps are not criteria layers names them (dna)
    decompose_prompt_tokens: int = 0  # of which decomposition (priced apart: --decompose-llm)
    decompose_completion_tokens: int = 0


def plan(config: TrainConfig, backend: Backend | None = None) -> tuple[Prepared, list[LayerPlan], str]:
    """What a run would cost, without calling the LLM. Token counts are estimates (chars/4).

    Layer 1 and the layer-2 decompositions are known exactly; later layers depend on LLM
    replies, so their counts are upper bounds (every decomposition yields ``children``).
    """
    if config.method not in ("hdeval", "direct", "paireval", "direct-yesno", "dna"):
        # the plans below count these methods' requests; for another one they would mislead
        raise ConfigError(f"--dry-run has no plan for method {config.method!r} yet")
    prep = prepare(config)
    if config.method == "dna":
        from hdeval.methods.dna.impl import plan_dna

        return prep, plan_dna(config, prep, backend), _offline_identity(config, backend)
    if config.method == "hdeval" and prep.task.shape == "pairwise":
        from hdeval.methods.hdeval.pairwise import plan_pairwise

        return prep, plan_pairwise(config, prep, backend), _offline_identity(config, backend)
    if (config.method_options or {}).get("scorer") == "pairwise":
        raise ConfigError("--dry-run does not count --scorer pairwise yet: it makes samples x criteria x "
                          "--comparisons x 2 calls per layer")
    if config.method in ("paireval", "direct-yesno"):
        return prep, [_plan_requests(config, prep, backend)], _offline_identity(config, backend)
    from hdeval.methods.hdeval.loop import plan_hdeval

    return prep, plan_hdeval(config, prep, backend), _offline_identity(config, backend)


def _plan_requests(config: TrainConfig, prep: Prepared, backend: Backend | None) -> LayerPlan:
    """A method whose every request is known before the run (PairEval, DIRECTEVAL): exact counts."""
    from hdeval.methods.paireval import MAX_TOKENS, planned_requests

    reqs = planned_requests(config, prep)
    llm = open_backend(config, backend, offline=True)
    try:
        distinct = {llm.key(r): r for r in reqs}  # identical pairs cost one call
        cached = sum(llm.is_cached(r) for r in distinct.values())
        return LayerPlan(1, 0, len(distinct), cached, False, sum(prompt_chars(r) for r in distinct.values()) // 4,
                         len(distinct) * MAX_TOKENS)
    finally:
        llm.close()


def _offline_identity(config: TrainConfig, backend: Backend | None) -> str:
    llm = open_backend(config, backend, offline=True)
    try:
        dec = open_decompose_backend(config, llm, offline=True)
        if dec is not llm:
            dec.close()
            return f"{llm.identity}, decomposition LLM {dec.identity}"
        return llm.identity
    finally:
        llm.close()


def prompt_chars(req) -> int:
    """Characters of a request's messages (token estimates are chars / 4)."""
    return sum(len(m.content) for m in req.messages)
