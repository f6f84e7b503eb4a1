"""``metrics.json`` as pydantic models: the fields every method writes (:class:`Metrics`) and the
typed building blocks a method's own model (its ``metrics_model``) is made of. An artifact is
untrusted: its metrics are checked when it is loaded, so ``ev.metrics`` (kept as the plain dict the
report and apply read) cannot fail later. Strict: a bool or text where a number belongs, NaN and the
infinities (Python's json writes and reads them) are refused. Fields nothing reads are not declared
and are kept as they are (``extra="allow"``)."""

from __future__ import annotations

import json
import math
import numbers
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hdeval.core.errors import ArtifactError

# the error type of this module's own messages, which read "'<field>' <message>"
OWN = "hdeval_metrics"
# pydantic's error types for a value that is not an object where one belongs
_OBJECT = {"model_type", "model_attributes_type", "dict_type"}
# a field not in the file; typed Any so that an optional object's default need not be None-typed
# (an explicit null is still refused where an object belongs, as readers take it for one)
ABSENT: Any = None


def _got(value: Any) -> str:
    got = json.dumps(value, default=str)  # NaN as NaN, as the file holds it
    return got[:40] + "..." * (len(got) > 40)


def _refuse(must: str, value: Any) -> PydanticCustomError:
    # the whole message as the template, no context: nothing in the value is substituted
    return PydanticCustomError(OWN, f"must be {must}, got {_got(value)}")


def _whole(v: Any) -> bool:
    # numpy's integers (a pandas count) are Integral, not int; numpy's bool is neither
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    if not (_whole(v) or isinstance(v, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past float's range
        return False


def _number(v: Any) -> Any:
    if _is_number(v):
        return int(v) if _whole(v) else v
    raise _refuse("a finite number", v)


def _figure(v: Any) -> Any:
    if v is None or _is_number(v):
        return int(v) if _whole(v) else v
    raise _refuse("a finite number or null", v)


def _text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    raise _refuse("text or null", v)


def _count(v: Any) -> Any:
    # its own words for every refusal: a figure's ("or null") would say null is taken
    if _whole(v) and v >= 0:
        return int(v)  # a plain int, as the same value read from the file
    raise _refuse("a whole number (0 or more)", v)


Number = Annotated[float, PlainValidator(_number)]
Figure = Annotated[float | None, PlainValidator(_figure)]  # null: could not be computed
Text = Annotated[str | None, PlainValidator(_text)]
Count = Annotated[int, PlainValidator(_count)]


def _layer_keys(v: Any) -> Any:
    if isinstance(v, dict):
        for key in v:  # str.isdigit takes "²", int() (the report's layer order) does not
            if not (isinstance(key, str) and key.isascii() and key.isdigit()):
                raise PydanticCustomError(OWN, f"must be keyed by layer number, got {str(key)[:40]!r}")
    return v


# a dict keyed by layer number ("1", "2", ...): Annotated[dict[str, X], LAYER_KEYS]
LAYER_KEYS = BeforeValidator(_layer_keys)


class Required:
    """Marks a field that must be there, not null and not empty: Annotated[X, REQUIRED]."""


REQUIRED = Required()


class Table(BaseModel):
    """A JSON object of a metrics file: strict, its undeclared fields kept unchecked."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _required_there(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if REQUIRED in field.metadata and (data.get(name) is None or data[name] == {}):
                    raise ValidationError.from_exception_data(
                        cls.__name__,
                        [
                            {
                                "type": PydanticCustomError(OWN, "is missing, null or empty"),
                                "loc": (name,),
                                "input": data,
                            }
                        ],
                    )
        return data


class CorrelationRow(Table):
    """An aspect's (or the average's) figures: pearson, spearman, kendall; ``why`` one is null."""

    why: Text = None
    __pydantic_extra__: dict[str, Figure]  # every other field a figure


Correlations = dict[str, CorrelationRow]  # aspect (and "average") -> its figures


class Agreement(Table):
    """Pairs: agreement with the human choices, with and without ties, and the confusion counts."""

    w_ties: Figure = None
    wo_ties: Figure = None
    confusion: dict[str, dict[str, Number]] = {}


class Metrics(Table):
    """An artifact's ``metrics.json``: the fields every method writes, typed. A method's own model
    subclasses it with the fields its code and report read."""

    split: dict[str, Count]  # samples (or pairs) in the training and test splits
    final: dict[str, Any] | None = None  # held-out figures: a method's model types them
    # share of LLM-filled cells that could not be read
    failure_rate: Annotated[float, Field(allow_inf_nan=False)] | None = None
    usage: dict[str, Count] = {}  # calls, cache hits and tokens of the training run


def _field(loc: tuple) -> str:
    """A field path as a message names it: repr (a key from the file cannot add a line), cut."""
    path = ".".join(str(x) for x in loc)
    return repr(path if len(path) <= 80 else path[:80] + "...")


def metrics_problem(exc: ValidationError) -> str:
    """The first problem of ``exc`` as one line: ``'<field>' must be ..., got ...`` (the message's
    own words), ``'<field>': <pydantic's message>`` otherwise."""
    err = exc.errors()[0]
    loc, kind = tuple(err["loc"]), err["type"]
    if kind in _OBJECT:
        msg, own = f"must be a JSON object, got {_got(err['input'])}", True
    else:
        msg, own = err["msg"], kind == OWN
    if not loc:
        return msg
    return f"{_field(loc)} {msg}" if own else f"{_field(loc)}: {msg}"


def read_metrics(metrics: Any, where: str, model: type[Metrics] = Metrics) -> Metrics:
    """``metrics`` (read from ``where``) as ``model``; else one ArtifactError line naming the file
    and the field."""
    try:
        return model.model_validate(metrics)
    except ValidationError as exc:
        raise ArtifactError(f"{where}: {metrics_problem(exc)}") from None


def _figure_or(table: Any) -> Any:
    """A check of a value that is a figure, or (when it is an object) a ``table``."""
    adapter = TypeAdapter(table)

    def check(value: Any, handler: Any) -> Any:
        return adapter.validate_python(value) if isinstance(value, dict) else _figure(value)

    return WrapValidator(check)


# e.g. a baseline held one figure per run before it held a table of correlations
FigureOrCorrelations = Annotated[Any, _figure_or(Correlations)]
FigureOrAgreement = Annotated[Any, _figure_or(Agreement)]
