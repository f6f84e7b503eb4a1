"""A method's options as one typed, validated model: :class:`MethodOptions` (a method declares a
subclass whose fields, made with :func:`option`, are its options), how one option is offered
(:class:`Option`), and reading an artifact's record of them back."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from dataclasses import replace as dataclass_replace
from typing import Any, ClassVar, Mapping

from hdeval.core.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """How one option is offered: its default, help and allowed values. A plug-in may still
    declare its options as a mapping name -> Option (turned into a :class:`MethodOptions`)."""

    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    kind: type | None = None  # the value's type where the default is None (the method decides)

    def shown_default(self) -> str | None:
        """The default as help shows it (on/off for a flag); None for "not set" (the help says)."""
        if self.default is None or self.default == "":
            return None
        return ("on" if self.default else "off") if isinstance(self.default, bool) else str(self.default)


def option(default: Any, help: str, choices: tuple[str, ...] | None = None, kind: type | None = None) -> Any:
    """A field of a method's options model: its one default, its help, its allowed values, and
    (where the default is None) the type of a given value. The CLI offers it as ``--name``."""
    return field(default=default, metadata={"help": help, "choices": choices, "kind": kind})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def convert_option(raw: str, spec: Option, where: str) -> Any:
    """A command-line value (``--name VALUE`` or ``-O name=VALUE``) as the kind the method
    declares for it: a flag's true/false, a whole number, a finite number, one of its choices,
    or text. ``where`` names the option in the one-line ConfigError."""
    import math

    import click

    kind = click.Choice(spec.choices) if spec.choices else click.types.convert_type(spec.kind, spec.default)
    try:
        value = kind.convert(raw, None, None)
        if isinstance(value, float) and not math.isfinite(value):
            kind.fail(f"{raw!r} is not a finite number.")
    except click.BadParameter as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    return value


@dataclass(frozen=True)
class MethodOptions:
    """A method's options as one typed, frozen model. A method declares a subclass whose fields
    (made with :func:`option`) are its options; :meth:`build` is the one way the CLI, the Python
    API and ``benchmark`` make it, so every caller gets the same defaults and the same checks.
    The model records which options were given (:meth:`given`): an option given at its default
    is not one left out, and a method may refuse it."""

    # the options naming a second LLM the method opens (its model, its server), e.g. HD-Eval's
    # decomposing LLM: the run opens it from them without knowing their names
    second_llm: ClassVar[tuple[str, str] | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "MethodOptions":
        # __new__ sees the constructor's arguments; pickling and copying restore the record
        self = super().__new__(cls)
        names = [f.name for f in fields(cls)]
        object.__setattr__(self, "_given", frozenset(names[: len(args)]) | frozenset(kwargs))
        return self

    def __post_init__(self) -> None:
        # every way of making the model (build, the constructor, replace) gets the same checks
        for name, spec in self.specs().items():
            # None is "not given" only where that is the default (build drops it); an artifact's
            # null for an option that has a value is refused as any other wrong value
            if (value := getattr(self, name)) is not None or spec.default is not None:
                _check_value(name, value, spec)
        self.validate()

    def validate(self) -> None:
        """Checks beyond a field's type and choices: a one-line ConfigError naming the option."""

    @classmethod
    def specs(cls) -> dict[str, Option]:
        return {
            f.name: Option(
                f.default, f.metadata.get("help", ""), f.metadata.get("choices"), f.metadata.get("kind")
            )
            for f in fields(cls)
        }

    @classmethod
    def build(
        cls, given: Mapping[str, Any], method: str, others: Mapping[str, type["MethodOptions"]] | None = None
    ) -> "MethodOptions":
        """The model from options by name (None: not given); one line for a name the method does
        not take (naming the methods of ``others``, name -> options model, that take it) or a
        value of the wrong kind."""
        specs = cls.specs()
        given = {k: v for k, v in given.items() if v is not None}
        unknown = sorted(set(given) - set(specs))
        if unknown:
            known = ", ".join(sorted(specs)) or "none"
            others = others or {}
            owned = "".join(
                f"; {flag(name)} is an option of --method {' or '.join(owners)}"
                for name in unknown
                if (owners := [m for m in sorted(others) if name in others[m].specs()])
            )
            raise ConfigError(
                f"method {method!r} takes no option(s) {', '.join(unknown)} (its options: {known}){owned}"
            )
        return cls(**given)

    def second_llm_given(self) -> tuple[str, str | None, str] | None:
        """(model, server, the model option's flag) of the second LLM these options name, or None:
        the scoring LLM does that job too."""
        if self.second_llm is None or not getattr(self, self.second_llm[0]):
            return None
        model, url = self.second_llm
        return getattr(self, model), getattr(self, url), flag(model)

    def record(self) -> dict[str, Any]:
        """Every option, given or not, as the manifest's ``config.options`` records it (the second
        LLM's server without credentials or query)."""
        from hdeval.core.urls import public_url

        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.second_llm is not None and out.get(self.second_llm[1]):
            out[self.second_llm[1]] = public_url(out[self.second_llm[1]])
        return out

    def given(self) -> dict[str, Any]:
        """The options the caller gave (to :meth:`build`, or the constructor), at their default
        or not, in field order."""
        mine = getattr(self, "_given", frozenset())
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in mine}

    def replace(self, **changes: Any) -> "MethodOptions":
        """This model with some options changed, by name, checked as the constructor checks; the
        options given stay given and the changed ones join them. (``dataclasses.replace`` passes
        every field to the constructor, so it would count every option as given.)"""
        specs = self.specs()
        unknown = sorted(set(changes) - set(specs))
        if unknown:
            raise ConfigError(
                f"{type(self).__name__} takes no option(s) {', '.join(unknown)} "
                f"(its options: {', '.join(sorted(specs)) or 'none'})"
            )
        new = dataclass_replace(self, **changes)
        object.__setattr__(new, "_given", frozenset(self.given()) | frozenset(changes))
        return new


# an option's default's kind -> the values it takes (never a bool for a number) and their name
_KINDS = (
    (bool, bool, "true or false"),
    (int, int, "a whole number"),
    (float, (int, float), "a number"),
    (str, str, "text"),
    (type(None), str, "text"),
)


def _check_value(name: str, value: Any, spec: Option) -> None:
    default, where = spec.default if spec.kind is None else spec.kind(), flag(name)
    if spec.choices:
        if value not in spec.choices:
            raise ConfigError(f"{where} must be one of {', '.join(spec.choices)}, got {value!r}")
        return
    for kind, ok, words in _KINDS:
        if isinstance(default, kind):
            if not isinstance(value, ok) or (kind is not bool and isinstance(value, bool)):
                raise ConfigError(f"{where} must be {words}, got {value!r}")
            return


# Before artifact format 3 the manifest's config recorded HD-Eval's tree options flat for every
# method (other methods got HD-Eval's defaults), and a method's other options that differed from
# its defaults under "method_options".
_FLAT_BEFORE_3 = ("layers", "children", "top_k", "aggregator", "decompose_llm", "decompose_base_url", "tree")


def recorded_options(config: Any) -> dict[str, Any]:
    """The method's options a manifest's ``config`` records: its ``options`` (format 3), or what
    format 2 recorded of them (flat keys, then ``method_options``). {} when there is no record."""
    if not isinstance(config, Mapping):
        return {}
    if isinstance(config.get("options"), Mapping):
        return dict(config["options"])
    old = {k: config[k] for k in _FLAT_BEFORE_3 if k in config}
    changed = config.get("method_options")
    return {**old, **changed} if isinstance(changed, Mapping) else old


def check_recorded_options(options: type[MethodOptions], config: Any, where: str, method: str) -> None:
    """An artifact's record of the method's options holds values the method takes, or a one-line
    ArtifactError: the record is re-saved (``method_args``) and reported, so a hostile one is
    refused where the artifact is opened. Names the method does not take are left alone: format 2
    recorded HD-Eval's for every method."""
    from hdeval.core.errors import ArtifactError

    specs = options.specs()
    try:
        options.build({k: v for k, v in recorded_options(config).items() if k in specs}, method)
    except (ConfigError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: config.options: {exc}") from None


def check_aggregator(kind: str) -> None:
    """``--aggregator``: a learned aggregator's kind, or auto (the methods that learn one share it)."""
    from hdeval.learn.aggregate import CANDIDATES

    if kind not in CANDIDATES + ("auto",):
        raise ConfigError(f"unknown aggregator {kind!r}: choose from {', '.join(CANDIDATES)} or auto")


AGGREGATOR_HELP = (
    "mean, direct, aspect_mean, shrink, nnls, ridge, lr, dt, nn, rf (simplest first), or auto: "
    "the simplest within one standard error of the best grouped cross-validated Spearman on the "
    "training split (pairwise tasks: lr, dt, rf, nn or auto)."
)


def options_model(method: str, options: Mapping[str, Option]) -> type[MethodOptions]:
    """A plug-in's mapping name -> Option as an options model."""
    return make_dataclass(
        f"{method.title().replace('-', '')}Options",
        [(name, Any, option(o.default, o.help, o.choices, o.kind)) for name, o in options.items()],
        bases=(MethodOptions,),
        frozen=True,
    )
