"""The fields of ``metrics.json`` every method writes, as a pydantic model: checked when an
artifact is loaded, so ``ev.metrics`` of a loaded evaluator cannot fail later."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from hdeval.core.errors import ArtifactError


class Metrics(BaseModel):
    """An artifact's ``metrics.json``: the fields every method writes, typed; a method's own
    (layers, intervals, selection, ...) are kept as they are (``model_extra``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    split: dict[str, int]  # samples (or pairs) in the training and test splits
    final: dict[str, Any] | None = None  # held-out figures: per aspect correlations, or pair agreement
    failure_rate: float | None = None  # share of LLM-filled cells that could not be read
    usage: dict[str, int] = {}  # calls, cache hits and tokens of the training run


def read_metrics(metrics: Any, where: str) -> Metrics:
    """``metrics`` (read from ``where``) as the model; else one ArtifactError line naming the field
    (repr: a key from the file cannot add a line)."""
    try:
        return Metrics.model_validate(metrics)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise ArtifactError(f"{where}: {field!r}: {err['msg']}") from None
