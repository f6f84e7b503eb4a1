"""The HD-Eval evaluator: criteria tree + fitted aggregator; scores new samples, writes its files and
checks that what it reads back is consistent (the artifact directory is :mod:`hdeval.artifact.directory`'s)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from hdeval.artifact.directory import (
    MANIFEST,
    ArtifactReader,
    ArtifactWriter,
    open_artifact,
    recover_artifact,
)
from hdeval.core.errors import ArtifactError, DataError
from hdeval.core.progress import Progress
from hdeval.core.types import CriteriaTree, Sample, ScoreMatrix, Task
from hdeval.data.tasks import task_from_dict
from hdeval.judge.prompts import Template, parse_template
from hdeval.judge.scoring import score_criteria, scoring_request
from hdeval.learn.aggregate import Aggregator
from hdeval.llm.backends.base import Backend
from hdeval.llm.config import LLMConfig
from hdeval.methods.aggregator_file import ESTIMATORS, TRUSTED_TYPES, check_models
from hdeval.methods.base import (
    METRICS,
    SCORES,
    Fitted,
    ScoreResult,
    check_metrics,
    pointwise_headline,
    progress_stage,
    remember_scores,
    score_rows,
    usage_of,
)
from hdeval.methods.hdeval.options import HDEvalOptions
from hdeval.methods.hdeval.state import PointwiseState
from hdeval.methods.metrics_file import (
    ABSENT,
    LAYER_KEYS,
    REQUIRED,
    Correlations,
    FigureOrCorrelations,
    Metrics,
)
from hdeval.methods.options import check_recorded_options, recorded_options

TREE = "tree.json"
MODEL = "aggregator.skops"
MAX_HEADER_BYTES = 4 << 20  # the header line of scores.csv
# the state an HD-Eval artifact keeps besides the model's (features, aggregator, prompts), and the
# run record (seed, split, config), which a fit hands in with it
_EXTRA_KEYS = ("layers", "data_file", "decompose_llm", "tree_input", "decomposition_rejections", "refit_from")
_RUN_KEYS = ("seed", "split", "config")


class TreeEvaluator(Fitted):
    """What the pointwise and the pairwise HD-Eval evaluators share: the state, scoring the
    criteria the model uses, the files they write, and one load path; a subclass says what its
    fitted model is called, where it is stored and how its manifest section is checked."""

    method = "hdeval"
    shape = "pointwise"  # the task shape this evaluator's artifacts have
    fitted = "aggregator"  # the fitted model's name: its manifest section, in messages
    model_file = MODEL
    extra_keys = _EXTRA_KEYS  # manifest keys it keeps besides the generic ones
    manifest_data: dict[str, Any] = {}  # the manifest it was loaded from

    def __init__(
        self,
        task: Task,
        tree: CriteriaTree,
        model: Any,
        kind: str,
        feature_keys: Sequence[str],
        templates: Mapping[str, Template],
        llm: LLMConfig,
        llm_identity: str,
        metrics: dict[str, Any],
        manifest_extra: dict[str, Any] | None = None,
        score_table: pd.DataFrame | None = None,
    ):
        super().__init__(task, None, llm, llm_identity, metrics, None, score_table)
        self.tree = tree
        self.model = model
        self.kind = kind
        self.feature_keys = list(feature_keys)
        self.templates = dict(templates)
        extra = dict(manifest_extra or {})
        self.run = {k: extra.pop(k) for k in _RUN_KEYS if k in extra}
        self.manifest_extra = extra

    # ------------------------------------------------------------------ saving
    def write_files(
        self, out: ArtifactWriter, model: Any, head: dict[str, Any], tail: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write the files both evaluators write (prompts, tree, the fitted model, metrics, score
        table); their manifest part: ``head``, features and prompts, ``tail``, the run record."""
        prompts = self.write_common(out, self.templates)
        out.json(TREE, self.tree.to_dict())
        out.skops(self.model_file, model)
        return {
            **head,
            "features": self.feature_keys,
            "needed_criteria": self.needed_criteria,
            **prompts,
            **(tail or {}),
            **self.manifest_extra,
        }

    @property
    def needed_criteria(self) -> list[str]:
        """Criteria the fitted model actually uses: only these are scored by ``apply``."""
        return [k for k, used in zip(self.feature_keys, self.used_mask()) if used]

    def artifact_suffix(self) -> str:
        return self.kind

    def fitted_aggregator(self) -> str | None:
        return self.kind

    def cost_line(self) -> str:
        return (
            f", {len(self.columns_needed())} of {len(self.feature_keys)} criteria used by the "
            f"aggregator: {self.calls_per_sample()} LLM calls per sample"
        )

    def method_args(self) -> dict[str, Any]:
        options = recorded_options(self.run.get("config"))  # format 3 or 2
        return {k: options[k] for k in ("layers", "children", "top_k", "aggregator") if k in options}

    def columns_needed(self) -> list[str]:
        return self.needed_criteria

    def reply_requests(self, items: Sequence[Any], columns: Sequence[str]) -> tuple[list, str | None]:
        """The criterion prompts of ``items`` (the samples each criterion scored)."""
        template = self.templates.get("score")
        if template is None:
            return [], "the artifact holds no scoring prompt: raw replies are not shown"
        return [
            ((s.id, c), scoring_request(template, self.task, self.tree, self.tree[c], s))
            for s in self.scored_samples(items)
            for c in columns
            if c in self.tree
        ], None

    def score_needed(
        self,
        items: Sequence[Any],
        backend: Any,
        cache_dir: Any,
        concurrency: int | None,
        progress: Progress | None,
        what: str,
        units: int,
        score: Callable,
    ) -> tuple[Any, Any]:
        """(``score``'s scores of ``items`` on the criteria the model uses, usage), in one progress
        stage of ``units`` per criterion; the backend is opened here unless given."""
        criteria = [self.tree[k] for k in self.needed_criteria]
        with self.llm_session(backend, cache_dir) as backend:
            label = f"scoring {what} x {len(criteria)} criteria"
            with progress_stage(progress, label, units * len(criteria)):
                out = score(
                    backend,
                    self.templates["score"],
                    self.task,
                    self.tree,
                    criteria,
                    items,
                    concurrency,
                    progress,
                )
            return out, usage_of(backend)

    def on_features(self, m: ScoreMatrix) -> np.ndarray:
        """``m``'s scores in feature order, NaN for a feature it did not score."""
        X = np.full((len(m.values), len(self.feature_keys)), np.nan)
        for j, k in enumerate(self.feature_keys):
            if k in m.criterion_keys:
                X[:, j] = m.values[:, m.criterion_keys.index(k)]
        return X

    def scored_samples(self, items: Sequence[Any]) -> list[Sample]:
        """The samples the criterion prompts were asked about, for data items of this shape."""
        return list(items)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Verify checksums and versions, then load with safe deserialisation only; an artifact
        of another method or shape is a one-line error (``load_artifact`` loads any)."""
        path = Path(path)
        recover_artifact(path)
        head = ArtifactReader(path, {}, []).json(MANIFEST) if (path / MANIFEST).is_file() else {}
        head = head if isinstance(head, dict) else {}
        method, task = head.get("method", "hdeval"), head.get("task")
        shape = task.get("shape", "pointwise") if isinstance(task, dict) else "pointwise"
        if not isinstance(method, str):
            raise ArtifactError(f"{path / MANIFEST}: 'method' is not a name")
        if method != "hdeval" or shape != cls.shape:
            raise cls.not_mine(path, method, shape)
        art = open_artifact(path, editable=(TREE,))
        check_recorded_options(HDEvalOptions, art.run.get("config"), str(path / MANIFEST), method)
        return cls.from_artifact(art)

    @classmethod
    def feature_criteria(cls, features: Sequence[str]) -> list[str]:
        """The tree criteria the model's columns score (a jury's columns are judge:criterion)."""
        return list(features)

    @classmethod
    def not_mine(cls, path: Any, method: str, shape: str) -> ArtifactError:
        """The error for an artifact of another method or shape than this evaluator's."""
        what = "HD-Eval" if method == "hdeval" else f"{method!r}"
        return ArtifactError(
            f"{path} holds a {shape} {what} evaluator, and {cls.__name__} reads {cls.shape} "
            "HD-Eval ones only: load it with hdeval.load(path) or "
            "score with hdeval apply"
        )

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> Any:
        """Rebuild from a verified artifact and check that its parts fit together: task, tree,
        prompts, the feature order, the fitted model against its manifest section."""
        path, manifest = art.path, art.manifest
        mpath = path / MANIFEST
        raw_task = manifest.get("task")
        shape = raw_task.get("shape", "pointwise") if isinstance(raw_task, dict) else None
        if art.method != "hdeval" or (shape != cls.shape and shape in ("pointwise", "pairwise")):
            raise cls.not_mine(path, art.method, shape if isinstance(shape, str) else "pointwise")
        # the state as recorded (absent fields stay absent, so saving it again changes nothing)
        state = cls.read_state(art).model_dump(exclude_unset=True)
        files = manifest["files"]
        for name in (cls.model_file, TREE, METRICS, "prompts/score.toml"):
            if name not in files:
                raise ArtifactError(f"{mpath}: no checksum recorded for {name}")
        # the tree file's models: imported when an HD-Eval artifact is loaded, not with the CLI
        from hdeval.methods.hdeval.tree_file import stored_tree

        try:
            task = task_from_dict(manifest["task"], where=str(mpath))
            tree = stored_tree(art.json(TREE), str(path / TREE))
            templates = {}
            for name in sorted(files):
                member = Path(name)
                if len(member.parts) == 2 and member.parts[0] == "prompts" and member.suffix == ".toml":
                    templates[member.stem] = parse_template(member.stem, art.text(name), str(path / name))
            features = list(state["features"])
            meta = state[cls.fitted]
            if not isinstance(meta, dict):
                raise TypeError(f"{cls.fitted!r} is not an object")
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path}: malformed artifact ({exc})") from exc
        if not all(isinstance(f, str) for f in features) or len(set(features)) != len(features):
            raise ArtifactError(f"{mpath}: 'features' must be distinct criterion keys")
        if sorted(tree.keys) != sorted(cls.feature_criteria(features)):
            raise ArtifactError(
                f"{path}: {TREE} no longer has the criteria the {cls.fitted} was trained on; "
                "edit only names and definitions, or retrain"
            )
        checked = cls.check_section(meta, task, mpath)
        cls.check_order(path, files, features, task, tree, mpath)
        where = path / cls.model_file
        model = cls.checked_model(art.skops(cls.model_file, TRUSTED_TYPES), checked, len(features), where)
        llm = manifest.get("llm") or {}
        if not isinstance(llm, dict) or not all(
            isinstance(llm.get(k), (str, type(None))) for k in ("model", "base_url", "identity")
        ):
            raise ArtifactError(f"{mpath}: 'llm' must hold text for model, base_url and identity")
        spec = LLMConfig(model=llm.get("model") or "", base_url=llm.get("base_url"))
        ev = cls(
            task,
            tree,
            model,
            checked[0],
            features,
            templates,
            spec,
            llm.get("identity") or "",
            art.json(METRICS),
            {k: v for k, v in state.items() if k in cls.extra_keys} | art.run,
        )
        needed = state.get("needed_criteria")
        if needed is not None:  # when given, the features the model uses
            if not isinstance(needed, list) or not set(map(str, needed)) <= set(features):
                raise ArtifactError(
                    f"{mpath}: 'needed_criteria' names criteria that are not among 'features'"
                )
            try:
                computed = ev.needed_criteria
            except Exception as exc:  # a model without the attributes it should have
                raise ArtifactError(f"{where}: unusable {cls.fitted} ({exc})") from exc
            if computed != needed:
                raise ArtifactError(
                    f"{mpath}: 'needed_criteria' does not match the criteria the {cls.fitted} uses"
                )
        check_metrics(ev.metrics, ev.metrics_model(), path / METRICS)
        ev.warnings, ev.path, ev.manifest_data = list(art.warnings), art.path, manifest
        remember_scores(ev, path, files)
        return ev

    @classmethod
    def check_order(
        cls, path: Path, files: dict, features: list[str], task: Task, tree: CriteriaTree, mpath: Path
    ) -> None:
        """The model's columns are positional: ``features`` must be in the trained order, which the
        checksummed ``scores.csv`` header records (pairs: its ``<criterion>:a`` columns); without
        it, training's order (layer by layer)."""
        pairs = cls.shape == "pairwise"
        if SCORES not in files:
            layered = [c.key for n in sorted({c.layer for c in tree}) for c in tree.layer(n)]
            if not pairs and features not in (tree.keys, layered):
                raise ArtifactError(f"{mpath}: 'features' are not in the order of the criteria in {TREE}")
            return
        try:  # the column names: the first line of scores.csv, bounded
            with (path / SCORES).open(encoding="utf-8", newline="") as fh:
                header = next(csv.reader(io.StringIO(fh.readline(MAX_HEADER_BYTES))))
        except (OSError, UnicodeDecodeError, StopIteration, csv.Error) as exc:
            raise ArtifactError(f"{path / SCORES}: unreadable header ({exc})") from None
        if pairs or header[:2] == ["sample_id", "split"]:  # the layout train writes: positions decide
            cols = header[2 : 2 + len(features)]
            humans = [c.removeprefix("human:") for c in header[2 + len(features) :] if c.startswith("human:")]
        else:
            cols = [c for c in header if not c.startswith("human:")]
            humans = [c.removeprefix("human:") for c in header if c.startswith("human:")]
        if (cols if not pairs else [c[:-2] for c in cols if c.endswith(":a")]) != features:
            raise ArtifactError(
                f"{mpath}: 'features' are not in the order the {cls.fitted} was trained on "
                f"(the columns of {SCORES}); the manifest was edited"
            )
        if not pairs and humans != list(task.aspect_keys):
            raise ArtifactError(
                f"{mpath}: the aspects are not in the order the aggregator was trained on "
                f"(the human: columns of {SCORES}); the manifest was edited"
            )


class PointwiseMetrics(Metrics):
    """Pointwise HD-Eval's ``metrics.json``: held-out correlations per aspect (and "average") of
    the kept layer, of every layer, and of the baselines the report draws beside them."""

    final: Annotated[Correlations, REQUIRED]
    layers: Annotated[dict[str, Correlations], LAYER_KEYS, REQUIRED]  # layer number -> figures
    direct_layer1: Correlations = ABSENT
    mean_all_criteria: Correlations = ABSENT
    mean_subtree: Correlations = ABSENT
    baselines: dict[str, FigureOrCorrelations] = ABSENT


class Evaluator(TreeEvaluator):
    """Criteria tree + fitted aggregator + everything needed to score new samples the same way."""

    scorer: Any = None  # None: 1-5 digit scores; else e.g. PairEval's PairwiseScorer (--scorer pairwise)
    State: ClassVar[type[PointwiseState]] = PointwiseState

    def metrics_model(self) -> type[Metrics]:
        return PointwiseMetrics

    @property
    def aggregator(self) -> Aggregator:
        return self.model

    def used_mask(self) -> Any:
        return self.aggregator.used_features()

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        return self.aggregator.predict(test[list(self.feature_keys)].to_numpy(float))

    def benchmark_record(self) -> dict[str, Any]:
        m = self.metrics
        # the layer chosen on training data (metrics' "selection"); the figures above are its
        kept = (m.get("selection") or {}).get("kept_layer")
        # layer k -> the criteria its proxy aggregator uses: those the layer reports added on 1..k
        per_layer, total = {}, 0
        for report in sorted(self.manifest_extra.get("layers") or [], key=lambda r: int(r["layer"])):
            total += len(report.get("added") or [])
            per_layer[str(int(report["layer"]))] = total
        return {
            "criteria": len(self.feature_keys),
            "layers": m.get("layers") or {},
            "kept_layer": kept,
            "criteria_per_layer": per_layer,
            "baselines": {k: m[k] for k in ("direct_layer1", "mean_all_criteria", "mean_subtree") if k in m},
        }

    # ---- the Explains capability (hdeval explain, apply --explain)
    def explain(self, result: ScoreResult, top: int = 3) -> list[dict[str, Any]]:
        from hdeval.methods.hdeval.explain import explain_samples

        return explain_samples(self, result, top=top)

    def explain_heading(self) -> str:
        return f"aggregator {self.aggregator.kind}"

    def explained_columns(self) -> list[str]:
        return list(self.feature_keys)

    def reply_requests(self, items: Sequence[Any], columns: Sequence[str]) -> tuple[list, str | None]:
        if self.scorer is not None:
            return [], "this evaluator scores with --scorer pairwise; its raw replies are not shown"
        return super().reply_requests(items, columns)

    def summary_lines(self, path: Any) -> list[tuple[str, bool]]:
        from hdeval.methods.hdeval.summary import summary_lines

        return summary_lines(self, path)

    def report_sections(self) -> tuple[dict[str, Any], list[Any]]:
        """What this evaluator adds to the report: numbers for report.json (key -> value) and
        sections of the page (:class:`hdeval.report.sections.Section`): a refitted artifact's swap."""
        from hdeval.methods.hdeval.jury_report import refit_sections

        return refit_sections(self)

    def banner(self) -> Any:
        from hdeval.methods.hdeval.report import banner_data
        from hdeval.report.pointwise import verdict

        return verdict(self, banner_data(self))

    def headline(self) -> dict[str, float | None]:
        return pointwise_headline(self.metrics, list(self.aggregator.aspects or ()))

    def write_report(self, out: Any, progress: Any = None, **options: Any) -> tuple[Any, str, list[str]]:
        from hdeval.methods.hdeval.report import write_report

        html, numbers = write_report(self, out, progress=progress, **options)
        return html, numbers.name, []

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        samples: Iterable[Sample],
        backend: Backend | None = None,
        cache_dir: str | Path | None = None,
        concurrency: int | None = None,
        progress: Progress | None = None,
    ) -> ScoreResult:
        """Score new samples on the tree's criteria with the trained prompts and LLM (cached)."""
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        m, usage = self.score_needed(
            samples,
            backend,
            cache_dir,
            concurrency,
            progress,
            f"{len(samples)} samples",
            len(samples),
            self.scorer or score_criteria,
        )
        X = self.on_features(m)
        ids = [s.id for s in samples]
        full = ScoreMatrix(ids, list(self.feature_keys), X, m.failures)
        return ScoreResult(ids, list(self.aggregator.aspects), self.aggregator.predict(X), full, usage)

    # ------------------------------------------------------------------ the method seam
    def output_rows(self, samples: Sequence[Sample], result: ScoreResult) -> list[dict[str, Any]]:
        """The JSON lines ``apply`` writes: only the criteria the aggregator uses are shown."""
        return score_rows(samples, result, self.needed_criteria)

    # ------------------------------------------------------------------ saving
    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        """Write the files; HD-Eval's part of the manifest (the artifact module adds the header)."""
        agg = self.aggregator
        own = {
            "kind": agg.kind,
            "aspects": agg.aspects,
            "ranges": [list(r) for r in agg.ranges],
            "groups": agg.groups,
            "random_state": agg.random_state,
        }
        manifest = self.write_files(
            out,
            agg.models_,
            {"aggregator": own},
            None if self.scorer is None else {"scorer": self.scorer.manifest()},
        )
        if self.scorer is not None:
            self.scorer.write(out)
        return manifest

    # ------------------------------------------------------------------ loading
    @classmethod
    def check_section(cls, meta: dict, task: Task, mpath: Path) -> tuple:
        """The manifest's aggregator section, checked against the task it names: (kind, aspects,
        ranges, groups, random_state)."""
        kind = meta.get("kind")
        if not isinstance(kind, str) or kind not in ESTIMATORS:  # a list or object is no key
            raise ArtifactError(f"{mpath}: unknown aggregator kind {kind!r}")
        aspects, ranges, groups = meta.get("aspects"), meta.get("ranges"), meta.get("groups")
        if not isinstance(aspects, list) or list(aspects) != list(task.aspect_keys):
            raise ArtifactError(
                f"{mpath}: aggregator aspects {aspects!r} are not the task's aspects "
                f"{list(task.aspect_keys)!r} in order"
            )
        if not isinstance(ranges, list) or len(ranges) != len(aspects):
            raise ArtifactError(f"{mpath}: aggregator 'ranges' must give one [low, high] per aspect")
        out_ranges = []
        for a, r in zip(aspects, ranges):
            ok = (
                isinstance(r, list)
                and len(r) == 2
                and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in r
                )
            )
            if not ok or tuple(float(x) for x in r) != tuple(float(x) for x in task.aspect(a).range):
                raise ArtifactError(
                    f"{mpath}: aggregator range {r!r} of aspect {a!r} differs from the "
                    f"task's {list(task.aspect(a).range)!r}"
                )
            out_ranges.append((float(r[0]), float(r[1])))
        if not isinstance(groups, list) or not all(
            isinstance(g, list) and g and all(isinstance(a, str) for a in g) for g in groups
        ):
            raise ArtifactError(f"{mpath}: aggregator 'groups' must be lists of aspect names")
        if sorted(a for g in groups for a in g) != sorted(aspects):
            raise ArtifactError(f"{mpath}: aggregator 'groups' {groups!r} must hold each aspect exactly once")
        for g in groups:
            if len({task.aspect(a).range for a in g}) != 1:
                raise ArtifactError(
                    f"{mpath}: aggregator group {g!r} mixes aspects with different score ranges"
                )
        random_state = meta.get("random_state", 0)
        return kind, list(aspects), out_ranges, groups, random_state if isinstance(random_state, int) else 0

    @classmethod
    def checked_model(cls, models: Any, section: tuple, n_features: int, where: Path) -> Aggregator:
        kind, aspects, ranges, groups, random_state = section
        check_models(models, kind, groups, n_features, where)
        return Aggregator.from_fitted(kind, aspects, ranges, groups, random_state, models, n_features)

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "Evaluator":
        ev = super().from_artifact(art)
        scorer = art.state.get("scorer")  # checked by State in super().from_artifact
        if scorer is not None:
            from hdeval.methods.comparisons import PairwiseScorer

            ev.scorer = PairwiseScorer.from_artifact(art, scorer, ev.templates)
        return ev
