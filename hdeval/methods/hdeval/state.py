"""HD-Eval's state in the manifest, as pydantic models (pointwise, pairwise, a jury): checked when
an artifact is loaded. The fitted model's section and the features keep their own checks against
the task and the model file (``check_section``, ``check_order``), with their own messages, so
those fields are only required here, not typed."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from hdeval.methods.state_file import MAX_ITEMS, Name, Names, Number, PromptsState, Seed, StrictState

Items = Annotated[list[Any], Field(max_length=MAX_ITEMS)]


class LayerRecord(StrictState):
    """One layer's training report (``LayerReport.to_dict``); the report and the summary read it."""

    layer: int
    added: Names = []
    aggregator: str | None = None
    cv_train: dict[str, Any] = {}
    test: dict[str, Any] = {}
    failure_rate: Number | None = None
    selection_scores: dict[str, Any] = {}
    importance: dict[str, Any] = {}
    expand_next: Names = []
    tuning: dict[str, Any] = {}
    params: dict[str, Any] = {}
    positive_importance: int | None = None
    notes: list[str] = []
    one_se: dict[str, Any] = {}


class Rejection(StrictState):
    """A degenerate decomposition reply (the criterion, why it was refused), or a criterion left
    unexpanded after all its attempts."""

    criterion: str
    rejected: str | None = None
    unexpanded: bool | None = None
    attempts: int | None = None


class RefitFrom(StrictState):
    """What ``hdeval refit`` started from: the LLM it replaced and the held-out change."""

    identity: str
    held_out: dict[str, Any]


class DecomposeLLM(StrictState):
    """The LLM that decomposed the criteria: model, server and identity, no key."""

    model: str
    base_url: str | None
    identity: str
    same_as_scoring: bool


class TreeInput(StrictState):
    """The ``--tree`` file training started from: its name, criteria and the locked ones."""

    file: str
    criteria: Names
    locked: Names


class AggregatorSection(StrictState):
    """Pointwise: the aggregator's kind, aspects, ranges and groups, checked against the task."""

    kind: Any
    aspects: Any
    ranges: Any
    groups: Any
    random_state: Seed = 0


class ClassifierSection(StrictState):
    """Pairwise: the classifier's kind and classes, checked against the model file."""

    kind: Any
    classes: Any


class ScorerSection(StrictState):
    """Pointwise with ``--scorer pairwise``: the comparison scorer's settings."""

    kind: Literal["pairwise"]
    comparisons: int
    swap: bool


class HDEvalState(PromptsState):
    """What every HD-Eval evaluator records."""

    features: Items  # distinct criterion keys, in the model's column order (checked on load)
    needed_criteria: Items | None = None  # the features the model uses (checked on load)
    layers: Annotated[list[LayerRecord], Field(max_length=1_000)] = []
    data_file: str | None = None
    decomposition_rejections: Annotated[list[Rejection], Field(max_length=MAX_ITEMS)] = []


class PointwiseState(HDEvalState):
    aggregator: AggregatorSection
    scorer: ScorerSection | None = None
    decompose_llm: DecomposeLLM | None = None
    tree_input: TreeInput | None = None
    refit_from: RefitFrom | None = None  # a refitted artifact's


class PairwiseState(HDEvalState):
    shape: Literal["pairwise"] = "pairwise"
    classifier: ClassifierSection


class JuryRecord(StrictState):
    """The judges (each checked by the jury file's model on load) and those the model kept."""

    judges: Annotated[list[dict[str, Any]], Field(max_length=1_000)]
    kept: Annotated[list[Name], Field(max_length=1_000)]


class JuryState(PointwiseState):
    jury: JuryRecord
