"""The task file's TOML tables as pydantic models: the shape of every table and value, unknown
keys refused. What needs the task as a whole (aspects named by presets and columns, the name as a
file name) is checked by hdeval.data.tasks after this."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

SAMPLE_FIELDS = ("source", "context", "output", "reference")
SHAPES = ("pointwise", "pairwise")


def _control(c: str) -> bool:
    """A control character (C0, DEL, C1) or a line or paragraph separator: never part of a name."""
    return unicodedata.category(c) in ("Cc", "Zl", "Zp")


def _plain(lines_ok: bool):
    def check(value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("text_blank", "needs non-empty text")
        bad = next((c for c in value if _control(c) and not (lines_ok and c in "\t\n\r")), None)
        if bad is not None:
            raise PydanticCustomError("text_control", "holds a control character", {"char": bad})
        return value

    return check


def _blank_is_unset(value: object) -> object:
    return None if isinstance(value, str) and not value.strip() else value


def _column(value: str) -> str:
    if not value.strip() or "\x00" in value:
        raise ValueError("must name a column")
    return value


# Text: a name or label, one line; Prose: a definition or description, where line ends and tabs are fine
Text = Annotated[str, Field(strict=True), AfterValidator(_plain(lines_ok=False))]
Prose = Annotated[str, Field(strict=True), AfterValidator(_plain(lines_ok=True))]
# optional text: missing or blank means "not set"
OptText = Annotated[Optional[Text], BeforeValidator(_blank_is_unset)]
Column = Annotated[str, Field(strict=True), AfterValidator(_column)]
Scalar = Union[
    Annotated[str, Field(strict=True)],
    Annotated[bool, Field(strict=True)],
    Annotated[int, Field(strict=True)],
    Annotated[float, Field(strict=True)],
]
Keys = Annotated[list[Annotated[str, Field(strict=True)]], Field(strict=True)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class FieldTable(_Table):
    """A ``[[fields]]`` table: a sample field the prompts show, and its label."""

    key: Text
    label: Text


class AspectTable(_Table):
    """An ``[[aspects]]`` table: a human-rated quality and its score range."""

    key: Text
    name: OptText = None
    definition: Prose
    # finiteness, order and bounds are checked with the aspect, for one message on the range
    range: list[float]


class PresetTable(_Table):
    """A ``[presets.NAME]`` table."""

    aspects: Keys
    own_regressor: Keys = []


class ColumnsTable(_Table):
    """The ``[columns]`` table: which column of the data file feeds which field."""

    source: Optional[Column] = None
    context: Optional[Column] = None
    output: Optional[Column] = None
    reference: Optional[Column] = None
    id: Optional[Column] = None
    doc_id: Optional[Column] = None
    system: Optional[Column] = None
    scores: Optional[dict[str, Column]] = None


class TaskFile(_Table):
    """A task file (or an artifact manifest's ``task`` table)."""

    name: Text
    description: Prose
    output_label: OptText = None
    data_file: OptText = None
    fields: list[FieldTable] = Field(min_length=1)
    aspects: list[AspectTable] = Field(min_length=1)
    shape: Literal["pointwise", "pairwise"] = "pointwise"
    where: Optional[dict[str, Union[Scalar, Annotated[list[Scalar], Field(min_length=1)]]]] = Field(
        default=None, min_length=1
    )
    skip_empty: bool = False
    own_regressor: Keys = []
    presets: Optional[dict[str, PresetTable]] = Field(default=None, min_length=1)
    columns: Optional[ColumnsTable] = None


TOP_KEYS = tuple(TaskFile.model_fields)
#: what a task's ``[columns]`` table may map (as ``hdeval data import``'s ``--*-col`` options)
COLUMN_KEYS = tuple(k for k in ColumnsTable.model_fields if k != "scores")
