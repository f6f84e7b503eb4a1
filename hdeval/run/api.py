"""The notebook API: :func:`load` any method's artifact into a :class:`TrainedEvaluator`, whose
``score`` takes a DataFrame, a list of dicts or a JSONL path and returns a DataFrame. Bad input
is an :class:`~hdeval.core.errors.HdevalError` naming what is wrong, never an AttributeError."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from hdeval.core.errors import ArtifactError, DataError
from hdeval.methods.metrics_file import Metrics, read_metrics

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from hdeval.core.progress import Progress
    from hdeval.methods.base import Fitted


class TrainedEvaluator:
    """A trained evaluator of any method, loaded from its artifact (:func:`load`)."""

    def __init__(self, fitted: "Fitted"):
        from hdeval.core.errors import ConfigError
        from hdeval.methods.base import Fitted

        if isinstance(fitted, TrainedEvaluator):
            fitted = fitted.fitted
        if not isinstance(fitted, Fitted):
            raise ConfigError(
                f"TrainedEvaluator wraps a trained evaluator (what hdeval.train returns), got "
                f"{type(fitted).__name__}; for an artifact's path use hdeval.load(path)"
            )
        self.fitted = fitted  # the method's own evaluator (hdeval.methods.base.Fitted)

    @property
    def method(self) -> str:
        return self.fitted.method

    @property
    def task(self) -> Any:
        return self.fitted.task

    @property
    def path(self) -> Path | None:
        return None if self.fitted.path is None else Path(self.fitted.path)

    @property
    def warnings(self) -> list[str]:
        return list(self.fitted.warnings)

    @property
    def metrics(self) -> Metrics:
        """``metrics.json`` as the typed :class:`Metrics` model."""
        return read_metrics(self.fitted.metrics, f"{self.path or 'the evaluator'}/metrics.json")

    def __repr__(self) -> str:
        task = self.fitted.task
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return (
            f"<TrainedEvaluator method={self.method!r} task={task.name!r} ({task.shape}, "
            f"{len(task.aspects)} aspect(s)) llm={self.fitted.llm_identity!r}{where}>"
        )

    def score(
        self,
        data: "pd.DataFrame | Sequence[Mapping[str, Any]] | str | Path",
        *,
        llm: str | None = None,
        base_url: str | None = None,
        cache_dir: str | Path | None = None,
        concurrency: int | None = None,
        progress: "Progress | None" = None,
    ) -> "pd.DataFrame":
        """Score ``data`` (a DataFrame or a list of dicts with the task's fields, one row a sample or
        pair; or a JSONL file) and return one row per sample, indexed by id: the predicted
        ``scores.<aspect>`` (pairs: the verdict), the LLM-filled columns and the human scores the
        input had. ``llm``/``base_url``: another LLM or server than the one it was trained with
        (``base_url`` alone: the trained model there; a loaded artifact's own server is used only
        when named here); the reply cache is ``cache_dir`` or the default one. Bad input is one DataError naming the row."""
        import pandas as pd

        from hdeval.core.errors import ConfigError
        from hdeval.data.samples import read_task_samples

        for name, value in (("llm", llm), ("base_url", base_url)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"score: {name} must be text, got {value!r}")
        if concurrency is not None and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
        ):
            raise ConfigError(f"score: concurrency must be a whole number of at least 1, got {concurrency!r}")
        samples = (
            read_task_samples(data, self.task, require_labels=False)
            if isinstance(data, (str, Path))
            else _records_samples(data, self.task)
        )
        backend = None
        if llm is not None or base_url is not None:
            from hdeval.llm.client import open_llm
            from hdeval.llm.config import LLMConfig

            # base_url alone: the trained model on that server (as apply's --base-url)
            config = LLMConfig(
                model=self.fitted.llm.model if llm is None else llm,
                base_url=base_url,
                cache_dir=None if cache_dir is None else str(cache_dir),
            )
            config.check()
            backend = open_llm(config)
        try:
            result = self.fitted.score(
                samples, backend=backend, cache_dir=cache_dir, concurrency=concurrency, progress=progress
            )
            rows = self.fitted.output_rows(samples, result)
        finally:
            if backend is not None:
                backend.close()
        return pd.json_normalize(rows, sep=".").set_index("id")


def load(path: str | Path) -> TrainedEvaluator:
    """Open, verify and load the artifact at ``path``, whatever method wrote it."""
    from hdeval.methods.registry import load_artifact

    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactError(f"hdeval.load takes an artifact directory's path, got {type(path).__name__}")
    return TrainedEvaluator(load_artifact(path))


def _records_samples(data: Any, task: Any) -> list:
    """The samples (or pairs) of a DataFrame or a list of dicts, validated as the JSONL reader
    validates a file; a problem is one DataError naming the row (1-based)."""
    from hdeval.data.samples import read_task_samples

    records = _records(data)
    with tempfile.TemporaryDirectory(prefix="hdeval-rows-") as tmp:
        file = Path(tmp) / "rows.jsonl"
        file.write_text(
            "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records),
            encoding="utf-8",
        )
        try:
            return read_task_samples(file, task, require_labels=False)
        except DataError as exc:  # the reader names the temporary file and its lines: say rows
            text = (
                str(exc).replace(f"{file}: ", "the rows given: ", 1).replace("bad line(s)", "bad row(s)", 1)
            )
            text = re.sub(r"\blines (\d+)", r"rows \1", text)
            raise DataError(re.sub(r"\bline (\d+)", r"row \1", text)) from None


def _records(data: Any) -> list[dict[str, Any]]:
    """Plain JSON rows from a DataFrame or a list of dicts (NaN and NA as null)."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - a dependency
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        flat = [c for c in data.columns if isinstance(c, str) and c.startswith(("scores.", "human."))]
        if flat and "scores" not in data.columns:
            import warnings

            warnings.warn(
                f"score does not read the columns {', '.join(map(str, flat[:3]))}"
                f"{' ...' if len(flat) > 3 else ''} as human scores: give them as a 'scores' column "
                "of dicts {aspect: score}, as the JSONL sample format has them",
                stacklevel=3,
            )
        data = data.reset_index(drop=not (data.index.name == "id" and "id" not in data.columns))
        data = data.astype(object).where(pd.notna(data), None).to_dict("records")
    if isinstance(data, Mapping) or not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
        raise DataError(
            f"score takes a DataFrame, a list of dicts or a JSONL path, got {type(data).__name__}"
        )
    bad = next((i for i, r in enumerate(data, 1) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise DataError(f"the rows given: row {bad} is {type(data[bad - 1]).__name__}, not a dict of fields")
    if not data:
        raise DataError("the rows given: no samples to score")
    return [_plain(dict(r), f"row {i}") for i, r in enumerate(data, 1)]


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON data: numpy numbers as numbers, NaN as null; anything else a DataError."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isinf(value):
            raise DataError(f"the rows given: {where} holds an infinite number")
        return None if math.isnan(value) else value
    if getattr(value, "ndim", 0) and callable(getattr(value, "tolist", None)):  # a numpy array
        return _plain(value.tolist(), where)
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item):
        return _plain(item(), where)
    raise DataError(f"the rows given: {where} holds a {type(value).__name__}, which is not JSON data")
