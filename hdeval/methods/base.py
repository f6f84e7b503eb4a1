"""The method seam: a :class:`Method` fits on the training split and returns a :class:`Fitted`
evaluator, which scores new samples with an LLM and says which files it writes into an artifact
and how it reads them back (``hdeval.artifact.directory`` owns the directory, manifest, checksums and safe
loading; :mod:`hdeval.methods.registry` finds the methods and loads artifacts)."""

from __future__ import annotations

import copy
import importlib
import re
import warnings
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field, is_dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ClassVar,
    Iterator,
    Mapping,
    Protocol,
    Sequence,
    runtime_checkable,
)

from hdeval.core.errors import ArtifactError, ConfigError, DataError, MethodError
from hdeval.methods import options as _options
from hdeval.methods.options import MethodOptions, options_model

METRICS = "metrics.json"
SCORES = "scores.csv"
SHAPES = ("pointwise", "pairwise")  # a task's (hdeval.data.task_file's, too slow to load for --help)
# plug-ins import the seam's option names from here, as they did before the model moved out
Option, option = _options.Option, _options.option

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import numpy as np
    import pandas as pd
    from pydantic import BaseModel

    from hdeval.artifact.directory import ArtifactReader, ArtifactWriter
    from hdeval.core.progress import Progress
    from hdeval.core.types import PairSample, Sample, ScoreMatrix, Task
    from hdeval.llm.backends.base import Backend
    from hdeval.llm.cache.client import CachedBackend
    from hdeval.llm.config import LLMConfig
    from hdeval.methods.metrics_file import Metrics


@dataclass
class ScoreResult:
    """What scoring new samples returns, whatever the method."""

    sample_ids: list[str]
    aspects: list[str]
    predictions: "np.ndarray"  # samples x aspects, in each aspect's range
    criteria: "ScoreMatrix"  # the LLM-filled columns behind the predictions (NaN = failed / unused)
    usage: dict[str, int] = field(default_factory=dict)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.predictions, index=self.sample_ids, columns=self.aspects)

    def __repr__(self) -> str:
        failed = len(self.criteria.failures)
        return (
            f"<{type(self).__name__}: {len(self.sample_ids)} sample(s) x {len(self.aspects)} aspect(s) "
            f"({', '.join(self.aspects)}); {len(self.criteria.criterion_keys)} LLM-filled column(s), "
            f"{failed} unreadable cell(s); .to_frame() for the table>"
        )


class Fitted(ABC):
    """A trained evaluator of some method, and the state and defaults every one shares: the task,
    the prompt template, the LLM (saved without credentials, query or key), held-out metrics, the
    run record for the manifest (``run``), the training run's score table and an atomic
    :func:`~hdeval.artifact.directory.save_artifact`.

    A method's subclass must implement :meth:`score`, :meth:`write` (its files into the artifact;
    returns its state, the manifest's method section) and :meth:`from_artifact` (rebuild from that
    state, ``art.state``), and may declare ``State``, the pydantic model its state is validated
    with on load. Everything else has a default; optional capabilities (a report, explanations,
    held-out figures for ``benchmark``) are the protocols below, which shared code checks with
    ``isinstance``."""

    method = ""  # the registry name, recorded in the manifest
    row_names = ("criteria", "criterion")  # what apply's rows call the LLM-filled columns, and one
    # the pydantic model of the state ``write`` returns, checked on load (None: the method checks it)
    State: ClassVar["type[BaseModel] | None"] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a plug-in written before metrics_model() would otherwise lose its metrics checks unseen
        if "metrics_shape" in cls.__dict__:
            warnings.warn(
                f"{cls.__module__}.{cls.__qualname__} defines metrics_shape(), which hdeval no longer "
                "reads: its metrics.json is checked by metrics_model() (docs/plugins.md)",
                stacklevel=2,
            )

    def __init__(
        self,
        task: "Task",
        template: Any,
        llm: "LLMConfig",
        llm_identity: str,
        metrics: dict[str, Any],
        extra: dict[str, Any] | None = None,
        score_table: Any = None,
    ):
        self.task = task
        self.template = template
        self.llm = llm
        self.llm_identity = llm_identity
        self.metrics = metrics
        self.extra = dict(extra or {})  # the method's own state; the shared code never writes it
        self.run: dict[str, Any] = {}  # the run record (seed, split, config): see run_record
        self.score_table = score_table
        self.warnings: list[str] = []
        self.path: Any = None
        # a loaded artifact's scores.csv (path, recorded sha256): read only when needed, so a save
        # copies it rather than dropping it
        self.scores_file: tuple[Path, str] | None = None
        # loaded from an artifact: its recorded LLM server is the artifact's word, not the user's
        self.from_artifact_file = False

    @abstractmethod
    def score(
        self,
        samples: Sequence["Sample"],
        backend: "Backend | None" = None,
        cache_dir: Any = None,
        concurrency: int | None = None,
        progress: "Progress | None" = None,
    ) -> ScoreResult:
        """Score new samples with ``backend`` (a cached one), or the LLM it was trained with."""

    @abstractmethod
    def write(self, out: "ArtifactWriter") -> dict[str, Any]:
        """Write the method's files into ``out``; return its state (plain JSON data), which the
        manifest keeps apart from the header and the run record."""

    @classmethod
    @abstractmethod
    def from_artifact(cls, art: "ArtifactReader") -> "Fitted":
        """Rebuild from a verified artifact: its files and its state (``art.state``)."""

    def method_args(self) -> dict[str, Any]:
        """The method's own arguments, recorded in the manifest (how to rebuild it)."""
        return {}

    @classmethod
    def read_state(cls, art: "ArtifactReader") -> "BaseModel":
        """``art.state`` validated by ``State`` (unknown fields refused); a one-line ArtifactError
        naming the manifest and the first bad field. A format 1-3 manifest kept the state beside
        the header and the run record, where older hdeval wrote fields since dropped: those are
        left out there, not refused."""
        from pydantic import ValidationError

        if cls.State is None:
            raise TypeError(f"{cls.__name__} declares no State model")
        state: Any = art.state
        try:
            try:
                return cls.State.model_validate(state)
            except ValidationError as exc:
                extra = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
                legacy = not art.layered and "format_version" in art.manifest  # formats 1-3
                if not legacy or not extra or len(extra) != len(exc.errors()):
                    raise
                return cls.State.model_validate(_without(state, extra))
        except ValidationError as exc:
            raise ArtifactError(f"{art.path / 'manifest.json'}: {_state_problem(exc)}") from None

    # ---- what the shared code asks of every fitted evaluator (overridden where a method differs)
    def artifact_suffix(self) -> str:
        """What names the default artifact directory ``artifacts/<task>-<suffix>``."""
        return self.method

    def calls_per_sample(self) -> int:
        """LLM calls scoring one new sample takes (``apply`` prices with it)."""
        return len(self.columns_needed())

    def cost_line(self) -> str:
        """What ``apply`` says after the sample count about the calls each sample needs."""
        return f"; method {self.method}: {len(self.columns_needed())} LLM-filled column(s) per sample"

    def summary_line(self) -> str:
        """The held-out figure after training, in one line."""
        from hdeval.core.metrics import why_null

        final = self.metrics.get("final")  # optional: a plug-in may record no held-out figures
        avg = final.get("average") if isinstance(final, Mapping) else None
        if not isinstance(final, Mapping) or not isinstance(avg, Mapping):
            return "held-out average: not recorded"
        return (
            f"held-out average: pearson {avg.get('pearson')}, spearman {avg.get('spearman')}, "
            f"kendall {avg.get('kendall')}" + why_null(final)
        )

    def summary_lines(self, path: Any) -> list[tuple[str, bool]]:
        """The lines ``train`` prints after saving to ``path``: (text, to stderr)."""
        lines = [(self.summary_line(), False), (f"artifact written to {path}", False)]
        if isinstance(self, Reports):
            lines.append((f"next: hdeval report {path}", False))
        return lines

    def training_ids(self) -> frozenset[str]:
        """The ids of the samples this evaluator was trained on (the run record's ``split``);
        empty when the artifact records none. ``apply`` flags and reports them apart."""
        rec = self.run
        split = rec.get("split") if isinstance(rec, dict) else None
        train = split.get("train") if isinstance(split, dict) else None
        return frozenset(x for x in train if isinstance(x, str)) if isinstance(train, list) else frozenset()

    def metrics_model(self) -> "type[Metrics]":
        """The pydantic model of this evaluator's ``metrics.json`` (:mod:`hdeval.methods.metrics_file`):
        the fields the shared code and its report read, checked on load (an artifact is untrusted);
        fields nothing reads are not declared. The default: the fields every method writes."""
        from hdeval.methods.metrics_file import Metrics

        return Metrics

    def interval_calibration(self) -> Any:
        """Pointwise: the prediction-interval calibration in ``metrics["intervals"]``, checked
        (:class:`hdeval.learn.intervals.Calibration`), or None when the artifact has none."""
        from hdeval.learn.intervals import read_calibration

        if getattr(self.task, "shape", "pointwise") != "pointwise":
            return None
        where = f"{self.path or 'the artifact'}/metrics.json"
        return read_calibration(self.metrics, list(self.task.aspect_keys), where)

    def export_refusal(self) -> str | None:
        """Why ``apply --export-requests`` cannot write this evaluator's requests (None: it can)."""
        return None

    def reply_requests(
        self, items: Sequence[Any], columns: Sequence[str]
    ) -> tuple[list[tuple[tuple[str, str], Any]], str | None]:
        """For the report's per-sample view, the request whose cached reply is shown for each
        (row id, column) of ``items`` (samples or pairs read back from the data), rebuilt as
        training asked it; or no requests and a note saying why they cannot be rebuilt. Here,
        not in the report, so the shared report pages know no method."""
        return [], "this evaluator does not say which prompts it asked: raw replies are not shown"

    def fitted_aggregator(self) -> str | None:
        """The kind of the learned aggregator or classifier (None: nothing learned)."""
        return None

    def open_backend(self, backend: Any, cache_dir: Any) -> tuple[Any, bool]:
        """``backend`` as given, or the evaluator's own LLM opened now (then: True, close it)."""
        if backend is not None:
            return backend, False
        from hdeval.llm.client import open_llm

        if self.from_artifact_file and self.llm.base_url:
            # as apply asks before it sends anything where an artifact says (a file from anyone)
            raise ConfigError(
                f"the artifact names the LLM server {self.llm.base_url}: hdeval sends your samples "
                "there only if you say so; name it: hdeval.load(path).score(rows, base_url=URL), "
                "a backend= for this score, or --base-url on the command line"
            )
        return open_llm(self.llm.replace(cache_dir=str(cache_dir) if cache_dir else None)), True

    @contextmanager
    def llm_session(self, backend: Any, cache_dir: Any) -> Iterator[Any]:
        """:meth:`open_backend` for the block, closed after it when opened here."""
        backend, own = self.open_backend(backend, cache_dir)
        try:
            yield backend
        finally:
            if own:
                backend.close()

    def save(self, path: Any, force: bool = False) -> Any:
        """Write the artifact to ``path`` atomically; an existing artifact there is replaced only
        with ``force``, and a directory that is not an artifact never."""
        from hdeval.artifact.directory import save_artifact
        from hdeval.core.urls import public_identity

        section = {
            **self.llm.to_manifest(),
            "identity": public_identity(self.llm_identity, self.llm.base_url),
        }
        try:  # what the method gives is checked as load would check it, before anything is in place
            self._check_saved()
            self.path = save_artifact(self, path, section, force=force, check_state=self._saved_state)
        except MethodError as exc:
            raise MethodError(f"method {self.method!r}: {exc}") from None
        return self.path

    def _check_saved(self) -> None:
        """The metrics, run record and arguments as JSON data, the metrics as load reads them."""
        from pydantic import ValidationError

        from hdeval.artifact.directory import json_data
        from hdeval.methods.metrics_file import metrics_problem

        metrics = json_data(self.metrics, "metrics")
        try:
            self.metrics_model().model_validate(metrics)
        except ValidationError as exc:
            raise MethodError(f"its {METRICS} would be refused on load: {metrics_problem(exc)}") from None
        json_data(self.public_run(), "run")
        json_data(self.method_args(), "method_args")

    def _saved_state(self, state: Any) -> Any:
        """The state ``write`` returned, as JSON data that ``State`` (if declared) takes."""
        from pydantic import ValidationError

        from hdeval.artifact.directory import json_data

        data = json_data(state, "state")
        if self.State is not None:
            try:
                self.State.model_validate(data)
            except ValidationError as exc:
                raise MethodError(f"its state would be refused on load: {_state_problem(exc)}") from None
        return data

    def public_run(self) -> dict[str, Any]:
        """The run record as the manifest keeps it: the server address without credentials."""
        from hdeval.core.urls import public_url

        run = dict(self.run)
        if isinstance(run.get("config"), dict) and run["config"].get("base_url"):
            run["config"] = {**run["config"], "base_url": public_url(run["config"]["base_url"])}
        return run

    def columns_needed(self) -> list[str]:
        """The LLM-filled columns scoring a new sample needs (``apply`` prices with this)."""
        return list(self.task.aspect_keys)

    def output_rows(self, samples: Sequence["Sample"], result: ScoreResult) -> list[dict[str, Any]]:
        """The JSON lines ``apply`` writes (:func:`score_rows`)."""
        return score_rows(samples, result, names=self.row_names)

    def write_common(self, out: "ArtifactWriter", prompts: Mapping[str, Any]) -> dict[str, Any]:
        """The prompts (name -> template), metrics and score table; the manifest's prompt digests."""
        for name, template in prompts.items():
            out.text(f"prompts/{name}.toml", template.source)
        out.json(METRICS, self.metrics)
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        elif self.scores_file is not None:
            self._copy_scores(out)
        return {"prompts": {name: t.digest for name, t in prompts.items()}}

    def _copy_scores(self, out: "ArtifactWriter") -> None:
        """The loaded artifact's scores.csv into ``out``, as it was checked at load: a file changed
        since would carry a fresh checksum it never earned."""
        import shutil

        from hdeval.core.fetch import sha256_file

        src, digest = self.scores_file  # type: ignore[misc]
        try:
            same = src.is_file() and not src.is_symlink() and sha256_file(src) == digest
        except OSError:
            same = False
        if not same:
            raise ArtifactError(
                f"{src} changed or went missing since the artifact was loaded; load it again to save it"
            )
        shutil.copyfile(src, out.path(SCORES))


# ---- optional capabilities: shared code asks `isinstance(ev, Reports)`, never a method's name
@runtime_checkable
class Reports(Protocol):
    """``hdeval report`` can draw this evaluator."""

    def write_report(self, out: Any, progress: Any = None, **options: Any) -> tuple[Any, str, list[str]]:
        """Write the report's page: (html path, numbers file name, lines to print)."""


@runtime_checkable
class Banners(Protocol):
    """``hdeval view`` can list this evaluator with its report's verdict banner and headline
    figures, from the artifact alone: no LLM call, no plot, nothing written."""

    def banner(self) -> Any:
        """The :class:`hdeval.report.banner.Banner` its report draws on top."""

    def headline(self) -> dict[str, float | None]:
        """The held-out figures ``view`` shows and compares side by side: label -> value (None:
        not recorded)."""


@runtime_checkable
class Explains(Protocol):
    """``hdeval explain`` and ``apply --explain`` can say why this evaluator gave its scores."""

    def explain(self, result: ScoreResult, top: int = 3) -> list[dict[str, Any]]:
        """Per sample of ``result`` (in its order), per aspect: ``prediction``,
        ``clipped_prediction``, ``base_value``, the ``top`` columns that moved it most (each
        ``criterion``, ``name``, ``shap``, ``score``) and ``other_shap``, the rest's sum."""

    def explain_heading(self) -> str:
        """What the explanation of one sample says first about the evaluator (its model)."""

    def explained_columns(self) -> list[str]:
        """Every column an explanation weighs (the top ones and the rest)."""


@runtime_checkable
class HeldOutScores(Protocol):
    """``benchmark`` reads this pointwise evaluator's held-out predictions from its score table."""

    def held_out_predictions(self, table: "pd.DataFrame", test: "pd.DataFrame") -> Any:
        """Predicted scores (test rows x aspects) from the rows of ``scores.csv``, no LLM call."""


@runtime_checkable
class HeldOutLabels(Protocol):
    """``benchmark`` reads this pairwise evaluator's held-out verdicts from its score table."""

    def held_out_labels(self, test: "pd.DataFrame") -> dict[str, tuple[list, list]]:
        """Variant -> (label a/b/tie or None, label forced to a or b) per test pair."""


@runtime_checkable
class BenchmarkRecord(Protocol):
    """What a benchmark run records of this evaluator besides the shared figures."""

    def benchmark_record(self) -> dict[str, Any]:
        """E.g. the criteria per layer; merged into the run's record in results.json."""


def pointwise_headline(metrics: Mapping[str, Any], aspects: Sequence[str]) -> dict[str, float | None]:
    """A pointwise evaluator's :meth:`Banners.headline`: the held-out correlations of
    ``metrics["final"]``, their average and each aspect's Spearman."""

    def figure(row: Any, key: str) -> float | None:
        x = row.get(key) if isinstance(row, Mapping) else None
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    got = metrics.get("final")
    final: Mapping[str, Any] = got if isinstance(got, Mapping) else {}
    out = {f"held-out {k} (average)": figure(final.get("average"), k) for k in ("pearson", "spearman")}
    out |= {f"held-out spearman: {a}": figure(final.get(a), "spearman") for a in aspects}
    return out


def pointwise_banner(ev: Fitted) -> Any:
    """The banner of a pointwise evaluator that draws no report of its own: the LLM, the split
    (``metrics["split"]``), the intervals and what to do next, as the reports' banners say them."""
    from hdeval.report import banner as verdicts

    def count(x: Any) -> int | None:
        return x if isinstance(x, int) and not isinstance(x, bool) else None

    m = ev.metrics
    got = m.get("split")
    split: Mapping[str, Any] = got if isinstance(got, Mapping) else {}
    n_train, n_test = count(split.get("train")), count(split.get("test"))
    b = verdicts.Banner()
    verdicts.llm_line(b, ev.llm_identity)
    verdicts.split_line(b, n_train, n_test, None)
    verdicts.outlook_lines(
        b,
        intervals=m.get("intervals"),
        ranges={a.key: (a.low, a.high) for a in ev.task.aspects},
        identity=ev.llm_identity,
        evaluator=pointwise_headline(m, [])["held-out spearman (average)"],
        direct=None,
        n_train=n_train,
        n_features=None,
        n_test=n_test,
        path=ev.path or "ARTIFACT",
    )
    return b


def check_top(top: Any) -> None:
    """The one rule for how many criteria an explanation names per aspect (``explain --top``,
    ``apply --explain --top``, :meth:`Explains.explain`): a whole number, at least 1."""
    from hdeval.core.errors import ConfigError

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"--top must be a whole number of criteria, at least 1; got {top!r}")


def explain_refusal(ev: Fitted, artifact: Any, what: str) -> str:
    """The one line for ``what`` (``--explain``, ``hdeval explain``) asked of an evaluator that is
    not :class:`Explains`."""
    shape = getattr(ev.task, "shape", "pointwise")
    return (
        f"{what} cannot explain {artifact}: its evaluator (method {ev.method!r}, {shape} data) gives no "
        "explanations; hdeval apply shows its scores"
        + (", hdeval report its numbers" if isinstance(ev, Reports) else "")
    )


def report_refusal(ev: Fitted, artifact: Any) -> str:
    """The one line for ``hdeval report`` asked of an evaluator that is not :class:`Reports`."""
    return (
        f"hdeval report cannot draw {artifact}: its evaluator (method {ev.method!r}) writes no report; "
        "its numbers are in metrics.json"
    )


class SinglePromptFitted(Fitted):
    """One prompt per sample and aspect, nothing learned: the LLM's figure for an aspect, mapped
    onto its range, is the prediction (``direct``, ``direct-yesno``)."""

    prompt = ""  # the template's name; its file is prompts/<name>.toml
    stage = ""  # what the progress says it does to each sample x aspect
    scale: tuple[float, float] = (0, 1)  # the LLM's figures' range, mapped linearly onto each aspect's

    def method_args(self) -> dict[str, Any]:
        return {}

    def banner(self) -> Any:
        """:class:`Banners`: nothing is fitted, so no layer, aggregator or baseline line."""
        return pointwise_banner(self)

    def headline(self) -> dict[str, float | None]:
        return pointwise_headline(self.metrics, list(self.task.aspect_keys))

    def to_range(self, values: Any) -> Any:
        import numpy as np

        low, high = self.scale
        lo = np.array([a.low for a in self.task.aspects])
        hi = np.array([a.high for a in self.task.aspects])
        return lo + (np.asarray(values, float) - low) / (high - low) * (hi - lo)

    def ask(self, backend: Any, samples: list, concurrency: int | None, progress: Any) -> "ScoreMatrix":
        raise NotImplementedError

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        return self.to_range(test[list(self.task.aspect_keys)].to_numpy(float))

    def score(
        self,
        samples: Sequence["Sample"],
        backend: Any = None,
        cache_dir: Any = None,
        concurrency: int | None = None,
        progress: "Progress | None" = None,
    ) -> ScoreResult:
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        n = len(self.task.aspects)
        with self.llm_session(backend, cache_dir) as backend:
            label = f"{self.stage} {len(samples)} samples x {n} aspects"
            with progress_stage(progress, label, len(samples) * n):
                m = self.ask(backend, samples, concurrency, progress)
            return ScoreResult(
                m.sample_ids, list(self.task.aspect_keys), self.to_range(m.values), m, usage_of(backend)
            )

    def write(self, out: "ArtifactWriter") -> dict[str, Any]:
        return {**self.write_common(out, {self.prompt: self.template}), **self.extra}

    @classmethod
    def from_artifact(cls, art: "ArtifactReader") -> Any:
        from hdeval.judge.prompts import parse_template

        if cls.State is not None:  # a subclass's state (its prompts' digests, and what it adds)
            cls.read_state(art)
        file = f"prompts/{cls.prompt}.toml"
        return loaded(
            art,
            [file],
            lambda task, llm, identity: cls(
                task, parse_template(cls.prompt, art.text(file), str(art.path / file)), llm, identity, {}
            ),
        )


def fit_unlearned(ctx: "FitContext", ev: SinglePromptFitted, what: str) -> tuple:
    """Score every sample with ``ev`` (nothing to learn) and fill its held-out metrics, score table
    and run record; a ScoringError when more of ``what`` than allowed could not be read. Returns
    the result, the human scores and the training and test rows (rows as in the result)."""
    from hdeval.core.metrics import metric_table

    config, split = ctx.config, ctx.prep.split
    res = ev.score(ctx.prep.samples, backend=ctx.llm, concurrency=config.concurrency, progress=ctx.progress)
    check_failure_rate(ctx, res.criteria.failure_rate, what, res.criteria.failures)
    aspects = list(ev.task.aspect_keys)
    tr, te, Y = split_rows(ctx, res.sample_ids, aspects)
    ev.metrics = {
        "split": {"train": len(split.train_ids), "test": len(split.test_ids)},
        "final": metric_table(Y[te], res.predictions[te], aspects),
        "failure_rate": res.criteria.failure_rate,
        "usage": usage_of(ctx.llm),
    }
    ev.score_table = score_table(res.sample_ids, res.criteria, split, Y, aspects)
    ev.run = run_record(ctx)
    return res, Y, tr, te


def fit_message(ctx: "FitContext", what: str, detail: str = "") -> None:
    """The line a fit starts with: the task, the data and its split, ``detail``, the LLM."""
    from hdeval.llm.config import shown_identity

    split = ctx.prep.split
    ctx.progress.message(
        f"task {ctx.prep.task.name}: {len(ctx.prep.samples)} {what} from {ctx.prep.data_path} "
        f"({len(split.train_ids)} train, {len(split.test_ids)} test), {detail}"
        f"LLM {shown_identity(ctx.llm.identity)}"
    )


def check_failure_rate(ctx: "FitContext", rate: float, what: str, failures: Sequence[Any]) -> None:
    """A ScoringError when more of ``what`` than ``--max-failure-rate`` allows could not be read."""
    from hdeval.core.errors import ScoringError

    if rate > ctx.config.max_failure_rate:
        ex = failures[0]
        raise ScoringError(
            f"{rate:.0%} of {what} could not be read (threshold {ctx.config.max_failure_rate:.0%}), "
            f"e.g. sample {ex.sample_id} on {ex.criterion_key}: {ex.reason}; the replies are cached"
        )


def split_rows(ctx: "FitContext", ids: Sequence[str], aspects: Sequence[str]) -> tuple[Any, Any, Any]:
    """The training and test rows of ``ids`` and their human scores (rows x aspects)."""
    import numpy as np

    by_id = {s.id: s for s in ctx.prep.samples}
    pos = {s: i for i, s in enumerate(ids)}
    split = ctx.prep.split
    return (
        np.array([pos[s] for s in split.train_ids]),
        np.array([pos[s] for s in split.test_ids]),
        np.array([[by_id[s].scores[a] for a in aspects] for s in ids]),
    )


def loaded(
    art: "ArtifactReader",
    files: Sequence[str],
    build: Callable[["Task", Any, str], Any],
    errors: tuple = (KeyError, TypeError, ValueError),
) -> Any:
    """The evaluator ``build(task, llm, identity)`` makes from the task and LLM ``art`` records,
    once its manifest lists ``files`` and the metrics; with the artifact's metrics, run record,
    warnings and path. A malformed field (one of ``errors``) is a one-line ArtifactError."""
    from hdeval.data.tasks import task_from_dict
    from hdeval.llm.config import LLMConfig

    m = art.manifest
    try:
        for name in [*files, METRICS]:
            if name not in m["files"]:
                raise ArtifactError(f"{art.path / 'manifest.json'}: no checksum recorded for {name}")
        task = task_from_dict(m["task"], where=str(art.path / "manifest.json"))
        llm = m.get("llm") or {}
        if not isinstance(llm, dict) or not all(
            isinstance(llm.get(k), (str, type(None))) for k in ("model", "base_url", "identity")
        ):
            raise ArtifactError(
                f"{art.path}: malformed artifact ('llm' must hold text for model, base_url and "
                f"identity in {art.path / 'manifest.json'})"
            )
        ev = build(
            task,
            LLMConfig(model=llm.get("model") or "", base_url=llm.get("base_url")),
            str(llm.get("identity") or ""),
        )
        ev.metrics = check_metrics(art.json(METRICS), ev.metrics_model(), art.path / METRICS)
        ev.run = art.run
    except errors as exc:
        raise ArtifactError(f"{art.path}: malformed artifact ({exc})") from exc
    ev.warnings = list(art.warnings)
    ev.path = art.path
    remember_scores(ev, art.path, m.get("files"))
    return ev


def remember_scores(ev: Any, path: "Path", files: Any) -> None:
    """Mark ``ev`` as loaded from the artifact at ``path`` and note where its checked
    ``scores.csv`` is (``files``: the manifest's checksums), so saving the evaluator again copies
    it rather than dropping it."""
    ev.from_artifact_file = True
    digest = files.get(SCORES) if isinstance(files, dict) else None
    if ev.score_table is None and isinstance(digest, str):
        ev.scores_file = (path / SCORES, digest)


def _state_problem(exc: Any) -> str:
    """A state's first problem (a pydantic ValidationError) in one line naming the field."""
    err = exc.errors()[0]
    field = ".".join(str(x) for x in err["loc"])[:80] or "(state)"
    return f"state field {field!r}: {err['msg'].removeprefix('Value error, ')}"


def _without(data: Any, locs: Sequence[tuple[Any, ...]]) -> Any:
    """A copy of ``data`` (JSON) without the keys at ``locs`` (pydantic's error locations)."""
    out = copy.deepcopy(data)
    for loc in locs:
        parent = out
        for key in loc[:-1]:
            parent = parent[key]
        parent.pop(loc[-1], None)
    return out


def check_metrics(metrics: Any, model: "type[Metrics]", where: Any) -> dict[str, Any]:
    """``metrics`` (read from ``where``) when ``model`` takes it; else a one-line ArtifactError
    naming the file and the field. The dict itself is kept: the report and apply read it."""
    from hdeval.methods.metrics_file import read_metrics

    read_metrics(metrics, str(where), model)
    return metrics


@contextmanager
def progress_stage(progress: "Progress | None", label: str, total: int) -> Iterator[None]:
    """The block as one progress stage (nothing without a progress)."""
    if progress is not None:
        progress.stage(label, total)
    yield
    if progress is not None:
        progress.end_stage()


class Split(Protocol):
    """The training and test ids of a run (``hdeval.data.samples.Split``)."""

    @property
    def train_ids(self) -> Sequence[str]: ...

    @property
    def test_ids(self) -> Sequence[str]: ...

    def to_dict(self) -> dict[str, list[str]]: ...


class RunSettings(Protocol):
    """What a method reads of the run's settings (``hdeval.run.train.TrainConfig``, a floor above the
    methods, which name it by this protocol)."""

    @property
    def task(self) -> str: ...

    @property
    def data(self) -> str | None: ...

    @property
    def seed(self) -> int: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def max_failure_rate(self) -> float: ...

    @property
    def max_calls(self) -> int | None: ...

    @property
    def cache_dir(self) -> str | None: ...

    @property
    def batch(self) -> bool: ...

    @property
    def options(self) -> Any: ...  # the chosen method's MethodOptions subclass

    def llm_settings(self) -> dict[str, Any]: ...  # the request settings (hdeval.llm.config.LLMSettings)

    def public(self) -> dict[str, Any]: ...


class Prepared(Protocol):
    """The data a fit gets, read and split (``hdeval.run.train.Prepared``)."""

    @property
    def task(self) -> "Task": ...

    @property
    def samples(self) -> "Sequence[Sample] | Sequence[PairSample]": ...  # train + test, file order

    @property
    def split(self) -> Split: ...

    @property
    def data_path(self) -> Any: ...

    @property
    def given(self) -> Any: ...  # what Method.prepare kept (HD-Eval: the checked starting tree)


@dataclass
class FitContext:
    """Everything a method's ``fit`` gets: the run's options, the data already split, the LLM."""

    config: RunSettings
    prep: Prepared
    llm: "CachedBackend"  # the run's
    llm_config: "LLMConfig"  # the resolved one, recorded in the artifact
    progress: "Progress"
    decompose_llm: "CachedBackend | None" = None  # HD-Eval's decomposing LLM (None or llm: the same)
    jury: Any = None  # a jury's judges and their clients (hdeval.methods.jury.Jury); llm is its first

    @property
    def options(self) -> Any:
        """The chosen method's options model (``config.options``: its MethodOptions subclass)."""
        return self.config.options


@dataclass(frozen=True)
class Variant:
    """A benchmark entry that is a method with some options fixed, e.g. ``dna-direct``."""

    name: str
    options: Mapping[str, Any]
    baseline: bool = False


class CommandKit(Protocol):
    """What the CLI hands a method's ``commands``: its error boundary for a callback (library
    errors -> one line and an exit code) and its check of an output file (never an input, a
    FIFO or a device)."""

    def guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def check_output(self, path: Any, inputs: Sequence[Any]) -> None: ...


@dataclass(frozen=True)
class Method:
    """A registered method: its name, the sample shapes it accepts, how to fit it, how to read
    it back, and its options model."""

    name: str
    summary: str
    shapes: tuple[str, ...]  # "pointwise" and/or "pairwise"
    fit: Callable[[FitContext], Fitted]
    load: Callable[["ArtifactReader"], Fitted]  # rebuild a fitted evaluator from an artifact
    editable: tuple[str, ...] = ()  # artifact files a person may edit (checksum mismatch = warning)
    # the options model (a MethodOptions subclass); a plug-in may give a mapping name -> Option
    options: Any = MethodOptions
    # the dry run: (run options, prepared data, injected backend or None) -> one LayerPlan per
    # layer or stage, without calling the LLM; None: the method has no plan
    plan: Callable[[Any, Any, Any], list] | None = None
    # before any data is read or call made: (run options, task) -> what the method keeps in
    # Prepared.given (e.g. a checked starting tree), or None
    prepare: Callable[[Any, "Task"], Any] | None = None
    # the suffixes a run may give its default artifact directory artifacts/<task>-<suffix>
    # (checked before any call); None: the method's name
    artifact_suffixes: Callable[[Any], tuple[str, ...]] | None = None
    # the checks fit makes before its first call, callable without an LLM (benchmark makes them
    # for every run before the sweep's first call): FitContext -> None, raising HdevalError
    check_fit: Callable[[FitContext], None] | None = None
    # ---- what `hdeval benchmark` may run (its fitted evaluator gives HeldOutScores or
    # HeldOutLabels): whether it may, whether it is a baseline (run first: its calls are the
    # others' too), and its benchmark variants (the method with some options fixed)
    benchmark: bool = True
    baseline: bool = False
    variants: tuple["Variant", ...] = ()
    # command groups the method adds to the CLI: a callable returning click commands, called with
    # a CommandKit (the CLI's error boundary and output check), e.g. ``hdeval paireval ...``
    commands: Callable[["CommandKit"], Sequence[Any]] | None = None
    # whether several judge LLMs may score its criteria (train --jury, --llm given more than once)
    jury: bool = False

    def __post_init__(self) -> None:
        # the name is a --method value, a directory artifacts/<task>-<name> and, in benchmark's
        # --methods a,b and --method-option METHOD.NAME=VALUE, a word
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,63}", self.name):
            raise TypeError(
                f"method name {self.name!r}: give a letter, then letters, digits, '-' or '_' (at most 64)"
            )
        # a bare "pointwise" is no tuple of shapes: it would be taken as its letters
        shapes = self.shapes
        if isinstance(shapes, str) or not isinstance(shapes, (tuple, list)) or not shapes:
            raise TypeError(
                f"method {self.name!r}: shapes must be a tuple, e.g. ('pointwise',), got {shapes!r}"
            )
        if any(s not in SHAPES for s in shapes):
            raise TypeError(f"method {self.name!r}: shapes are {' or '.join(SHAPES)}, got {shapes!r}")
        object.__setattr__(self, "shapes", tuple(shapes))
        if isinstance(self.options, Mapping):
            wrong = next((k for k, v in self.options.items() if not isinstance(v, Option)), None)
            if wrong is not None:  # e.g. {"shrink": 0.1}: a value, not how the option is offered
                raise TypeError(
                    f"method {self.name!r}: option {wrong!r} must be an Option(default, help), "
                    f"not {type(self.options[wrong]).__name__}"
                )
            object.__setattr__(self, "options", options_model(self.name, self.options))
        # a plug-in written when options models were dataclasses
        if isinstance(self.options, type) and is_dataclass(self.options):
            raise TypeError(
                f"method {self.name!r}: its options model {self.options.__name__} is a dataclass; "
                "declare it as a plain subclass of MethodOptions (a pydantic model), without @dataclass"
            )
        # another model (a plain pydantic one, an instance) has no specs() or build(): every
        # command listing or training any method would stop on it
        if not (isinstance(self.options, type) and issubclass(self.options, MethodOptions)):
            got = (
                self.options.__name__
                if isinstance(self.options, type)
                else f"an instance of {type(self.options).__name__}"
            )
            raise TypeError(
                f"method {self.name!r}: its options model must be a subclass of "
                f"hdeval.methods.options.MethodOptions, not {got}"
            )

    def build_options(self, given: Mapping[str, Any] | None = None) -> MethodOptions:
        """This method's options model from options by name; ConfigError names a bad one."""
        # the registry's table names the other methods that take an option this one does not
        return self.options.build(given or {}, self.name, {m: METHODS[m].options for m in METHODS})


def later(target: str) -> Callable[..., Any]:
    """``module:function`` or ``module:Class.method``, imported when first called: a method's
    package registers it without loading its code, so ``hdeval --help`` stays light."""
    module, _, name = target.partition(":")

    def call(*args: Any) -> Any:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        return found(*args)

    return call


# name -> method, filled by hdeval.methods.registry (which imports the methods; this module
# never does, so a method can import its base without a circle)
METHODS: dict[str, Method] = {}


def check_shape(method: Method, task: "Task") -> None:
    shape = getattr(task, "shape", "pointwise")
    if shape not in method.shapes:
        raise ConfigError(
            f"method {method.name!r} does not support {shape} tasks yet (task {task.name!r}); "
            f"it takes {' or '.join(method.shapes)} data"
        )


def score_rows(
    samples: Sequence["Sample"],
    result: ScoreResult,
    columns: Sequence[str] | None = None,
    names: tuple[str, str] = ("criteria", "criterion"),
) -> list[dict[str, Any]]:
    """The JSON lines ``apply`` writes for pointwise samples: id, predicted aspect ``scores``,
    the LLM-filled ``columns`` (all, or those named), ``human`` scores when the input had them,
    and the recorded ``failures``. ``names``: what the columns and one column are called."""
    import math

    many, one = names
    keep = None if columns is None else set(columns)
    fail: dict[str, list[dict[str, str]]] = {}
    for f in result.criteria.failures:
        fail.setdefault(f.sample_id, []).append({one: f.criterion_key, "reason": f.reason})
    pos = {sid: i for i, sid in enumerate(result.sample_ids)}
    m = result.criteria
    row_of = {sid: i for i, sid in enumerate(m.sample_ids)}
    rows = []
    for s in samples:
        i = pos[s.id]
        row: dict[str, Any] = {
            "id": s.id,
            "doc_id": s.doc_id,
            "system": s.system,
            "scores": {a: round(float(result.predictions[i, j]), 6) for j, a in enumerate(result.aspects)},
            many: {
                k: (None if math.isnan(v) else round(float(v), 6))
                for k, v in zip(m.criterion_keys, m.values[row_of[s.id]])
                if keep is None or k in keep
            },
        }
        if s.scores:
            row["human"] = dict(s.scores)
        if s.id in fail:
            row["failures"] = fail[s.id]
        rows.append(row)
    return rows


def score_table(
    ids: Sequence[str], columns: "ScoreMatrix", split: Any, Y: "np.ndarray", aspects: Sequence[str]
):
    """The ``scores.csv`` every pointwise method writes: sample id, split, the LLM-filled columns
    (in the order the estimator takes them), then ``human:<aspect>``."""
    import pandas as pd

    table = pd.DataFrame(columns.values, columns=columns.criterion_keys)
    split_of = {s: "train" for s in split.train_ids} | {s: "test" for s in split.test_ids}
    table.insert(0, "split", [split_of[s] for s in ids])
    table.insert(0, "sample_id", list(ids))
    for j, a in enumerate(aspects):
        table[f"human:{a}"] = Y[:, j]
    return table


def run_record(ctx: "FitContext") -> dict[str, Any]:
    """What a run records in the manifest besides the method's own state: seed, split ids and
    the options (never the cache dir, a path on the trainer's machine)."""
    return {
        "seed": ctx.config.seed,
        "split": ctx.prep.split.to_dict(),
        "config": {k: v for k, v in ctx.config.public().items() if k != "cache_dir"},
    }


def usage_of(llm: Any, *more: Any) -> dict[str, int]:
    """Calls, cache hits and tokens of cached backends, each counted once ({} for another backend)."""
    backends = [llm] + [b for b in more if b is not llm]
    stats = [b.stats for b in backends if getattr(b, "stats", None) is not None]
    if not stats:
        return {}
    return {
        "calls": sum(s.calls for s in stats),
        "cache_hits": sum(s.hits for s in stats),
        "prompt_tokens": sum(s.prompt_tokens for s in stats),
        "completion_tokens": sum(s.completion_tokens for s in stats),
    }
