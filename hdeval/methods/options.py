"""A method's options as one typed, validated model: :class:`MethodOptions` (a method declares a
subclass whose fields, made with :func:`option`, are its options), how one option is offered
(:class:`Option`), and reading an artifact's record of them back."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from hdeval.core.errors import ConfigError, validation_line


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


def option(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A field of a method's options model: its one default, its help and its allowed values;
    the field's type is its annotation. The CLI offers it as ``--name`` or ``-O name=VALUE``."""
    return Field(default, description=help, json_schema_extra={"choices": list(choices)} if choices else None)


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


class MethodOptions(BaseModel):
    """A method's options as one typed, frozen pydantic model. A method declares a subclass whose
    fields (annotated, made with :func:`option`) are its options; :meth:`build` is the one way the
    CLI, the Python API and ``benchmark`` make it, so every caller gets the same defaults and the
    same checks. Values are taken as they are (strict: no "2" for 2, no 1 for true); an unknown
    name is refused. The options given (:meth:`given`, pydantic's ``model_fields_set``) are told
    apart from those left out: one given at its default is not one left out, and a method may
    refuse it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # the options naming a second LLM the method opens (its model, its server), e.g. HD-Eval's
    # decomposing LLM: the run opens it from them without knowing their names
    second_llm: ClassVar[tuple[str, str] | None] = None
    # whether the CLI offers these options as flags (--name): the built-in methods' only; a
    # plug-in's are -O NAME=VALUE, and its messages name them so
    cli_flags: ClassVar[bool] = False

    def __init__(self, **given: Any) -> None:
        try:
            super().__init__(**given)
        except ValidationError as exc:
            raise self._config_error(exc) from None

    @model_validator(mode="after")
    def _checked(self) -> "MethodOptions":
        for name, spec in self.specs().items():
            value = getattr(self, name)
            if spec.choices and value not in spec.choices and (value is not None or spec.default is not None):
                raise ConfigError(
                    f"{self.shown(name)} must be one of {', '.join(spec.choices)}, got {value!r}"
                )
        self.check()
        return self

    def check(self) -> None:
        """Checks beyond a field's type and choices: a one-line ConfigError naming the option (as
        :meth:`shown` names it)."""

    @classmethod
    def shown(cls, name: str) -> str:
        """Option ``name`` as a message names it: its flag, or ``-O name`` for a plug-in's."""
        return flag(name) if cls.cli_flags else f"-O {name}"

    @classmethod
    def specs(cls) -> dict[str, Option]:
        out = {}
        for name, f in cls.model_fields.items():
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            choices = extra.get("choices")
            out[name] = Option(
                f.default,
                f.description or "",
                tuple(map(str, choices)) if isinstance(choices, list) else None,
                _kind(f.annotation),
            )
        return out

    @classmethod
    def _config_error(cls, exc: ValidationError) -> ConfigError:
        """pydantic's report as today's one line: the unknown names, or the first wrong value."""
        errors = exc.errors()
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        if unknown:
            return ConfigError(
                f"{cls.__name__} takes no option(s) {', '.join(unknown)} "
                f"(its options: {', '.join(sorted(cls.model_fields)) or 'none'})"
            )
        name = str(errors[0]["loc"][0]) if errors[0]["loc"] else ""
        spec = cls.specs().get(name)
        if spec is not None and spec.choices:  # a choice's words, whatever the value's type
            choices = ", ".join(spec.choices)
            return ConfigError(f"{cls.shown(name)} must be one of {choices}, got {errors[0]['input']!r}")
        return ConfigError(validation_line(exc, flags=cls.shown))

    @classmethod
    def build(
        cls, given: Mapping[str, Any], method: str, others: Mapping[str, type["MethodOptions"]] | None = None
    ) -> "MethodOptions":
        """The model from options by name (None: not given); one line for a name the method does
        not take (naming the methods of ``others``, name -> options model, that take it) or a
        value of the wrong kind."""
        given = {k: v for k, v in given.items() if v is not None}
        unknown = sorted(set(given) - set(cls.model_fields))
        if unknown:
            known = ", ".join(sorted(cls.model_fields)) or "none"
            others = others or {}
            owned = "".join(
                f"; {others[owners[0]].shown(name)} is an option of --method {' or '.join(owners)}"
                for name in unknown
                if (owners := [m for m in sorted(others) if name in others[m].model_fields])
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
        return getattr(self, model), getattr(self, url), self.shown(model)

    def record(self) -> dict[str, Any]:
        """Every option, given or not, as the manifest's ``config.options`` records it (the second
        LLM's server without credentials or query)."""
        from hdeval.core.urls import public_url

        out = self.model_dump()
        if self.second_llm is not None and out.get(self.second_llm[1]):
            out[self.second_llm[1]] = public_url(out[self.second_llm[1]])
        return out

    def given(self) -> dict[str, Any]:
        """The options the caller gave (to :meth:`build`, or the constructor), at their default
        or not, in field order."""
        return {
            name: getattr(self, name) for name in type(self).model_fields if name in self.model_fields_set
        }

    def replace(self, **changes: Any) -> "MethodOptions":
        """This model with some options changed, by name, checked as the constructor checks; the
        options given stay given and the changed ones join them (pydantic's ``model_copy`` would
        not check them)."""
        return type(self)(**{**self.given(), **changes})


# the settings every run shares besides the LLM's (hdeval.run.train.TrainConfig's fields, a floor
# above: a test holds them equal) and the mapping that carries a method's options by name
RUN_FIELDS = (
    "task", "method", "options", "method_options", "data", "aspects", "preset", "llm", "base_url",
    "seed", "test_frac", "train_frac", "limit", "max_failure_rate", "judges", "jury", "prune_judges",
)  # fmt: skip


def declaration_problem(model: type[MethodOptions]) -> str | None:
    """What an options model declares that no run could use, in words naming the option (None:
    nothing): an option without a default, a default of another type than the option's or outside
    its own choices, or a name every run's settings have (TrainConfig would mix the two up)."""
    from pydantic import TypeAdapter

    from hdeval.llm.config import LLMSettings

    shared = {*RUN_FIELDS, *LLMSettings.model_fields}
    specs = model.specs()
    for name, f in model.model_fields.items():
        if name in shared:
            return f"option {name!r} has the name of a setting every run has: rename it (the two would be mixed up)"
        if f.is_required():
            return f"option {name!r} has no default: declare it as {name}: TYPE = option(DEFAULT, HELP)"
        default = f.get_default(call_default_factory=True)
        kind: Any = f.annotation  # its type (a bound such as ge=1 is the runs' to check)
        try:
            TypeAdapter(kind).validate_python(default, strict=True)
        except ValidationError:
            shown = getattr(f.annotation, "__name__", None) or repr(f.annotation).replace("typing.", "")
            return f"option {name!r}: its default {default!r} is not of its type, {shown}"
        choices = specs[name].choices
        if choices and default is not None and default not in choices:
            return (
                f"option {name!r}: its default {default!r} is not one of its choices ({', '.join(choices)})"
            )
    return None


def _kind(annotation: Any) -> type | None:
    """The type of an option's value: its annotation without None (``int | None`` -> int)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else None
    return annotation if isinstance(annotation, type) else None


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
    """A plug-in's mapping name -> Option as an options model (a None default takes text unless
    the Option names its kind)."""
    fields: dict[str, Any] = {}
    for name, o in options.items():
        kind = o.kind or (str if o.default is None else type(o.default))
        fields[name] = (kind | None if o.default is None else kind, option(o.default, o.help, o.choices))
    return create_model(f"{method.title().replace('-', '')}Options", __base__=MethodOptions, **fields)
