"""Core value types. Frozen where they can be; no I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # numpy loads with the first ScoreMatrix: the CLI's --help and data commands skip it
    import numpy as np

# A JSON "\ud800" escape decodes to a lone surrogate, which cannot be encoded as UTF-8: no
# prompt, request or cache key can carry it, so text from outside is refused where it comes in.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
LONE_SURROGATE_PROBLEM = "holds a lone surrogate (a \\ud800-style escape): not usable text"


def has_lone_surrogate(text: str) -> bool:
    return bool(_LONE_SURROGATE.search(text))


@dataclass(frozen=True)
class Aspect:
    """A human-rated quality of the task (layer-1 criterion) and its score range."""

    key: str
    name: str
    definition: str
    low: float
    high: float

    @property
    def range(self) -> tuple[float, float]:
        return (self.low, self.high)


@dataclass(frozen=True)
class TaskField:
    """A sample field shown to the LLM, e.g. ``source`` labelled "Source article"."""

    key: str
    label: str


@dataclass(frozen=True)
class Task:
    """What is generated, which sample fields the prompts show, and which aspects humans rated."""

    name: str
    description: str
    output_label: str
    fields: tuple[TaskField, ...]
    aspects: tuple[Aspect, ...]
    data_file: str = ""
    #: the folder of the task's .toml file ("" for built-in tasks): its data_file is looked
    #: for there first. Where the file lay on the trainer's machine: never written to artifacts.
    source_dir: str = field(default="", compare=False)
    #: ``pointwise`` (one output with human scores) or ``pairwise`` (two outputs and a
    #: human preference label); see hdeval.data.samples.read_task_samples
    shape: str = "pointwise"
    #: row filter from the task file's ``where`` table: (key, accepted values) pairs
    where: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    #: pairwise only: skip rows whose shown text or a response is an empty string
    skip_empty: bool = False
    #: aspects fitted by a regressor of their own, never jointly with others of the same range
    own_regressor: tuple[str, ...] = ()
    #: the task file's ``[presets.NAME]`` tables: (name, aspects, own_regressor); see
    #: hdeval.data.tasks.apply_preset. What a run selected is recorded, the menu is not.
    presets: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = field(default=(), compare=False)
    #: the task file's ``[columns]`` table: which column of its data file feeds which sample field
    #: (``("source", "question")``; a score as ``("scores.clarity", "clear")``), as ``hdeval data
    #: import``'s ``--*-col`` options; see hdeval.data.samples.map_columns. Recorded in artifacts, so
    #: ``apply`` reads new files of the same layout.
    columns: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def aspect(self, key: str) -> Aspect:
        for a in self.aspects:
            if a.key == key:
                return a
        raise KeyError(key)

    @property
    def aspect_keys(self) -> tuple[str, ...]:
        return tuple(a.key for a in self.aspects)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "output_label": self.output_label,
            "data_file": self.data_file,
            "fields": [{"key": f.key, "label": f.label} for f in self.fields],
            "aspects": [
                {"key": a.key, "name": a.name, "definition": a.definition, "range": [a.low, a.high]}
                for a in self.aspects
            ],
        }
        # Only non-default keys, so manifests of pointwise tasks stay byte-identical.
        optional = {
            "shape": self.shape != "pointwise" and self.shape,
            "where": {k: list(v) if len(v) > 1 else v[0] for k, v in self.where},
            "skip_empty": self.skip_empty,
            "own_regressor": list(self.own_regressor),
            "columns": _columns_table(self.columns),
        }
        return {**d, **{k: v for k, v in optional.items() if v}}


def _columns_table(columns: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A task's column mapping as its task file writes it: ``{"source": "q", "scores": {"clarity": "c"}}``."""
    out: dict[str, Any] = {}
    for key, column in columns:
        if key.startswith("scores."):
            out.setdefault("scores", {})[key[len("scores.") :]] = column
        else:
            out[key] = column
    return out


@dataclass(frozen=True)
class Sample:
    """One generated text with its inputs and (optionally) human scores."""

    id: str
    doc_id: str
    fields: Mapping[str, str]
    scores: Mapping[str, float] = field(default_factory=dict)
    system: str | None = None
    line: int = 0

    def text(self, key: str) -> str:
        return self.fields.get(key) or ""


PAIR_LABELS = ("a", "b", "tie")


@dataclass(frozen=True)
class PairSample:
    """Two outputs for the same input and (optionally) the human preference between them. ``fields``
    holds the shown inputs (``source``, ``context``, ...), not the two outputs; ``label`` is ``a``,
    ``b`` or ``tie`` (None when unlabelled, e.g. pairs to be judged)."""

    id: str
    doc_id: str
    fields: Mapping[str, str]
    output_a: str
    output_b: str
    label: str | None = None
    system_a: str | None = None
    system_b: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    line: int = 0

    def text(self, key: str) -> str:
        return self.fields.get(key) or ""


@dataclass(frozen=True)
class Criterion:
    """A node of the criteria tree. ``key`` is a stable path such as ``coherence/logic``."""

    key: str
    name: str
    definition: str
    parent_key: str | None
    layer: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "definition": self.definition,
            "parent": self.parent_key,
            "layer": self.layer,
        }


class CriteriaTree:
    """Immutable ordered set of criteria; layer 1 are the task's aspects."""

    def __init__(self, criteria: Iterable[Criterion]):
        items = tuple(criteria)
        index: dict[str, Criterion] = {}
        for c in items:
            if c.key in index:
                raise ValueError(f"duplicate criterion key {c.key!r}")
            if c.parent_key is not None and c.parent_key not in index:
                raise ValueError(f"criterion {c.key!r} names unknown parent {c.parent_key!r}")
            if c.parent_key is None and c.layer != 1:
                raise ValueError(f"criterion {c.key!r} has no parent but is on layer {c.layer}")
            if c.parent_key is not None and index[c.parent_key].layer != c.layer - 1:
                raise ValueError(f"criterion {c.key!r} is not one layer below its parent")
            index[c.key] = c
        self._items = items
        self._index = index

    @classmethod
    def from_aspects(cls, aspects: Sequence[Aspect]) -> "CriteriaTree":
        return cls(Criterion(a.key, a.name, a.definition, None, 1) for a in aspects)

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __getitem__(self, key: str) -> Criterion:
        return self._index[key]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CriteriaTree) and self._items == other._items

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self._items]

    def layer(self, n: int) -> list[Criterion]:
        return [c for c in self._items if c.layer == n]

    def children(self, key: str) -> list[Criterion]:
        return [c for c in self._items if c.parent_key == key]

    def parent(self, key: str) -> Criterion | None:
        p = self._index[key].parent_key
        return self._index[p] if p else None

    def ancestors(self, key: str) -> list[Criterion]:
        """Ancestors from the root (a layer-1 aspect) down to the direct parent."""
        out: list[Criterion] = []
        p = self.parent(key)
        while p is not None:
            out.append(p)
            p = self.parent(p.key)
        return out[::-1]

    def with_children(self, key: str, children: Sequence[Criterion]) -> "CriteriaTree":
        if key not in self._index:
            raise KeyError(key)
        return CriteriaTree(list(self._items) + list(children))

    def to_dict(self) -> dict[str, Any]:
        return {"criteria": [c.to_dict() for c in self._items]}


@dataclass(frozen=True)
class Failure:
    """A criterion score that could not be obtained; the matrix holds NaN in its place."""

    sample_id: str
    criterion_key: str
    reason: str


@dataclass
class ScoreMatrix:
    """Samples x criteria scores (the ``X`` for scikit-learn); NaN where a score failed."""

    sample_ids: list[str]
    criterion_keys: list[str]
    values: np.ndarray
    failures: list[Failure] = field(default_factory=list)

    def __post_init__(self) -> None:
        import numpy as np

        self.values = np.asarray(self.values, dtype=float)
        if self.values.shape != (len(self.sample_ids), len(self.criterion_keys)):
            raise ValueError("score matrix shape does not match its labels")

    @classmethod
    def empty(cls, sample_ids: Sequence[str]) -> "ScoreMatrix":
        import numpy as np

        return cls(list(sample_ids), [], np.zeros((len(sample_ids), 0)))

    def columns(self, keys: Sequence[str]) -> np.ndarray:
        idx = [self.criterion_keys.index(k) for k in keys]
        return self.values[:, idx]

    def hstack(self, other: "ScoreMatrix") -> "ScoreMatrix":
        if other.sample_ids != self.sample_ids:
            raise ValueError("cannot join score matrices over different samples")
        import numpy as np

        return ScoreMatrix(
            self.sample_ids,
            self.criterion_keys + other.criterion_keys,
            np.hstack([self.values, other.values]),
            self.failures + other.failures,
        )

    @property
    def failure_rate(self) -> float:
        n = self.values.size
        return float((self.values != self.values).sum()) / n if n else 0.0  # NaN != NaN
