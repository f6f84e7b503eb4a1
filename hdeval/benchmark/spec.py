"""What a benchmark sweeps: the spec, its validation, method options from the command line,
the run artifacts' names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hdeval.benchmark.statistics import N_RESAMPLES
from hdeval.core.errors import ConfigError
from hdeval.methods.options import convert_option

DEFAULT_METHODS = ("direct", "hdeval")
# method options the benchmark gives every run from its own flags (the aggregator: the sweep's)
SWEEP_FLAGS = {
    "aggregator": "--aggregators",
    "layers": "--layers",
    "children": "--children",
    "top_k": "--top-k",
}


@dataclass(frozen=True)
class Entry:
    """What ``--methods`` may name: a registered method, or one of its variants (the method with
    some options fixed, e.g. dna-direct: DnA's `--dna-mode direct` baseline)."""

    name: str
    method: str  # the registered method it trains
    fixed: Mapping[str, Any]
    baseline: bool  # run first: its calls are the others' too
    learned: bool  # fits an aggregator: run once per --aggregators kind


def entries() -> dict[str, Entry]:
    """Every method the benchmark may run, from the registry and what each method declares
    (``benchmark``, ``baseline``, ``variants``, an ``aggregator`` option), baselines first."""
    from hdeval.methods.registry import methods

    found = []
    for m in methods():
        if not m.benchmark:
            continue
        learned = "aggregator" in m.options.specs()
        found.append(Entry(m.name, m.name, {}, m.baseline, learned))
        found += [
            Entry(v.name, m.name, dict(v.options), v.baseline, learned and "aggregator" not in v.options)
            for v in m.variants
        ]
    found.sort(key=lambda e: not e.baseline)  # stable: registration order within each group
    return {e.name: e for e in found}


@dataclass(frozen=True)
class BenchmarkSpec:
    """What to sweep. ``options``: TrainConfig fields shared by every run (llm, cache_dir,
    layers, limit, preset, test_frac, ...)."""

    task: str
    methods: tuple[str, ...] = DEFAULT_METHODS
    aggregators: tuple[str, ...] = ("lr",)
    seeds: int = 1
    train_fracs: tuple[float, ...] = (0.5,)
    resamples: int = N_RESAMPLES
    options: Mapping[str, Any] = field(default_factory=dict)
    # per benchmark method (as in --methods): its method options, e.g. {"paireval": {"comparisons": 3}}
    method_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def validate(self) -> None:
        from hdeval.learn.aggregate import CANDIDATES

        known = entries()
        unknown = [m for m in self.methods if m not in known]
        if unknown or not self.methods:
            raise ConfigError(
                f"--methods: unknown or unsupported {', '.join(unknown) or '(none given)'}; "
                f"benchmark runs {', '.join(known)}"
            )
        bad = [a for a in self.aggregators if a not in CANDIDATES + ("auto",)]
        if bad or not self.aggregators:
            raise ConfigError(
                f"--aggregators: unknown {', '.join(bad) or '(none given)'}; choose from "
                f"{', '.join(CANDIDATES)}, auto"
            )
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {self.seeds}")
        if not self.train_fracs or not all(0 < f < 1 for f in self.train_fracs):
            raise ConfigError(f"--train-fracs must be numbers in (0, 1), got {list(self.train_fracs)}")
        if self.resamples < 1:
            raise ConfigError(f"--resamples must be at least 1, got {self.resamples}")
        for flag, values in (
            ("--methods", self.methods),
            ("--aggregators", self.aggregators),
            ("--train-fracs", self.train_fracs),
        ):
            twice = sorted({str(v) for v in values if list(values).count(v) > 1})
            if twice:  # a setting run twice would count as two seeds
                raise ConfigError(f"{flag} lists {', '.join(twice)} more than once")
        for name in ("method", "aggregator", "seed", "train_frac", "task", "method_options"):
            if name in self.options:
                raise ConfigError(
                    f"benchmark sets {name} itself"
                    + (" (give --method-option METHOD.NAME=VALUE)" if name == "method_options" else "")
                )
        check_method_options(self.method_options, self.methods)

    def artifact_names(self) -> list[str]:
        """The directory under ``runs/`` of every run's artifact (--keep-artifacts)."""
        return [artifact_name(*run) for run in self.runs()]

    def runs(self) -> list[tuple[str, str | None, float, int]]:
        """(method, aggregator or None for a method without one, train_frac, seed) of every run,
        baselines first (direct's calls are HD-Eval's layer 1)."""
        known = entries()
        order = list(known)
        return [
            (method, agg, frac, seed)
            for seed in range(self.seeds)
            for frac in self.train_fracs
            for method in sorted(self.methods, key=order.index)
            for agg in (self.aggregators if known[method].learned else (None,))
        ]


def _option_of(entry: str, name: str) -> tuple[Any, str]:
    """(the registry's Option, its name) of ``entry``'s option ``name``; one line if unknown or fixed."""
    from hdeval.methods.registry import get_method

    known = entries()
    if entry not in known:
        raise ConfigError(
            f"--method-option {entry}.{name}: unknown method {entry!r}; benchmark runs {', '.join(known)}"
        )
    base, fixed = known[entry].method, known[entry].fixed
    key = name.replace("-", "_")
    options = get_method(base).options.specs()
    if key not in options:
        known = ", ".join(sorted(k for k in options if k not in fixed)) or "none"
        raise ConfigError(
            f"--method-option {entry}.{name}: {entry} takes no option {name!r} (its options: {known})"
        )
    if key in fixed:
        raise ConfigError(
            f"--method-option {entry}.{name}: {entry} is {base} with {key} = {fixed[key]} (benchmark sets it)"
        )
    if key in SWEEP_FLAGS:  # the sweep's own value would silently win over this one
        raise ConfigError(
            f"--method-option {entry}.{name}: benchmark sets {key} for every run; give {SWEEP_FLAGS[key]}"
        )
    return options[key], key


def parse_method_options(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Repeated ``--method-option METHOD.NAME=VALUE`` -> {method: {name: value}}, each value typed
    by the click type the CLI gives the same option (a flag's true/false, a whole number, a finite
    number, a choice); an option given twice is an error (the later one would silently win)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        head, eq, raw = (part.strip() for part in item.partition("="))
        entry, _, name = head.partition(".")
        if not eq or not raw or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*\.[A-Za-z0-9_-]+", head):
            raise ConfigError(
                f"--method-option {item!r}: expected METHOD.NAME=VALUE, e.g. paireval.comparisons=3"
            )
        opt, key = _option_of(entry, name)
        value = convert_option(raw, opt, f"--method-option {head}")
        if key in out.get(entry, {}):
            raise ConfigError(f"--method-option {entry}.{key} is given more than once")
        out.setdefault(entry, {})[key] = value
    return out


def check_method_options(method_options: Mapping[str, Mapping[str, Any]], methods: Sequence[str]) -> None:
    """Every method's options name a method among ``methods`` and one of its options, and hold
    values the method accepts (DnA's settings and PairEval's comparison count are checked here,
    before any run, not when that method's first run starts)."""
    from hdeval.methods.registry import get_method

    for entry, opts in method_options.items():
        for key in opts:
            _option_of(entry, key)
        if entry not in methods:
            raise ConfigError(
                f"--method-option {entry}.{next(iter(opts), '')}: {entry} is not among --methods "
                f"({', '.join(methods)})"
            )
        base, fixed = entries()[entry].method, entries()[entry].fixed
        merged = {**opts, **fixed}
        try:
            get_method(base).build_options(merged)  # the method's own checks, as train makes them
        except ConfigError as exc:
            raise ConfigError(f"--method-option {entry}: {exc}") from None


def artifact_name(method: str, agg: str | None, frac: float, seed: int) -> str:
    """``<setting>-seed<k>``: e.g. ``hdeval-lr-frac0.5-seed0``, ``dna-direct-frac0.5-seed1``."""
    short = f"{frac:g}"  # the exact value when 6 significant digits would merge two fractions
    return f"{method}{'' if agg is None else '-' + agg}-frac{short if float(short) == frac else repr(frac)}-seed{seed}"


def check_shapes(spec: BenchmarkSpec) -> str:
    """The task's shape (pointwise / pairwise); a method that does not run on it is a one-line
    error before anything is read or called."""
    from hdeval.data.tasks import load_task
    from hdeval.methods.registry import get_method

    shape = load_task(spec.task).shape
    fits = [name for name, e in entries().items() if shape in get_method(e.method).shapes]
    wrong = [m for m in spec.methods if m not in fits]
    if wrong:
        raise ConfigError(
            f"--methods: {', '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not run on "
            f"{shape} tasks (task {spec.task}); "
            f"for a {shape} task choose from {', '.join(fits)}"
        )
    return shape
