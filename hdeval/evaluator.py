"""The HD-Eval evaluator: criteria tree + fitted aggregator; scores new samples, reads/writes its files.

The artifact directory itself (manifest, checksums, safe loading, atomic save) belongs to
:mod:`hdeval.artifact`; this module only says which files HD-Eval writes and checks that what
it reads back is consistent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from hdeval.aggregate import Aggregator
from hdeval.artifact import (  # noqa: F401  (FORMAT_VERSION, MANIFEST, sha256_file: public names)
    FORMAT_VERSION, MANIFEST, ArtifactReader, ArtifactWriter, load_artifact, save_artifact, sha256_file,
)
from hdeval.backends.base import Backend
from hdeval.cache import CachedBackend
from hdeval.config import LLMConfig
from hdeval.errors import ArtifactError, DataError
from hdeval.methods.base import ScoreResult, usage_of
from hdeval.progress import Progress
from hdeval.prompts import Template, parse_template
from hdeval.scoring import score_criteria
from hdeval.tasks import task_from_dict
from hdeval.types import CriteriaTree, Sample, ScoreMatrix, Task

TREE = "tree.json"
MODEL = "aggregator.skops"
SCORES = "scores.csv"
METRICS = "metrics.json"
# Types the aggregator file may contain beyond what skops trusts by default; anything
# else in the file is refused before a byte of it is turned into objects.
TRUSTED_TYPES = (
    "numpy.dtype",
    "sklearn.tree._tree.Tree",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
)
# manifest keys an HD-Eval artifact keeps besides the generic ones
_EXTRA_KEYS = ("seed", "split", "config", "layers", "data_file")


class Evaluator:
    """Criteria tree + fitted aggregator + everything needed to score new samples the same way."""

    method = "hdeval"
    scorer: Any = None  # None: 1-5 digit scores; else e.g. PairEval's PairwiseScorer (--scorer pairwise)

    def __init__(
        self,
        task: Task,
        tree: CriteriaTree,
        aggregator: Aggregator,
        feature_keys: Sequence[str],
        templates: Mapping[str, Template],
        llm: LLMConfig,
        llm_identity: str,
        metrics: dict[str, Any],
        manifest_extra: dict[str, Any] | None = None,
        score_table: pd.DataFrame | None = None,
    ):
        self.task = task
        self.tree = tree
        self.aggregator = aggregator
        self.feature_keys = list(feature_keys)
        self.templates = dict(templates)
        self.llm = llm
        self.llm_identity = llm_identity
        self.metrics = metrics
        self.manifest_extra = dict(manifest_extra or {})
        self.score_table = score_table
        self.warnings: list[str] = []
        self.path: Path | None = None
        self.manifest_data: dict[str, Any] = {}

    # ------------------------------------------------------------------ scoring
    @property
    def needed_criteria(self) -> list[str]:
        """Criteria the aggregator actually uses: only these are scored by ``apply``."""
        mask = self.aggregator.used_features()
        return [k for k, used in zip(self.feature_keys, mask) if used]

    def score(
        self,
        samples: Iterable[Sample],
        backend: Backend | None = None,
        cache_dir: str | Path | None = None,
        concurrency: int = 8,
        progress: Progress | None = None,
    ) -> ScoreResult:
        """Score new samples on the tree's criteria with the trained prompts and LLM (cached)."""
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        own = backend is None
        if backend is None:
            from hdeval.llm import open_llm

            backend = open_llm(self.llm.replace(cache_dir=str(cache_dir) if cache_dir else None))
        try:
            needed = self.needed_criteria
            criteria = [self.tree[k] for k in needed]
            if progress is not None:
                progress.stage(f"scoring {len(samples)} samples x {len(criteria)} criteria", len(samples) * len(criteria))
            m = (self.scorer or score_criteria)(
                backend, self.templates["score"], self.task, self.tree, criteria, samples,
                concurrency, progress,
            )
            if progress is not None:
                progress.end_stage()
            X = np.full((len(samples), len(self.feature_keys)), np.nan)
            for j, k in enumerate(self.feature_keys):
                if k in m.criterion_keys:
                    X[:, j] = m.values[:, m.criterion_keys.index(k)]
            full = ScoreMatrix([s.id for s in samples], list(self.feature_keys), X, m.failures)
            pred = self.aggregator.predict(X)
            usage = usage_of(backend)
            return ScoreResult([s.id for s in samples], list(self.aggregator.aspects), pred, full, usage)
        finally:
            if own and isinstance(backend, CachedBackend):
                backend.close()

    # ------------------------------------------------------------------ the method seam
    def method_args(self) -> dict[str, Any]:
        config = self.manifest_extra.get("config") or {}
        keys = ("layers", "children", "top_k", "aggregator")
        return {k: config[k] for k in keys if k in config}

    def columns_needed(self) -> list[str]:
        return self.needed_criteria

    def llm_manifest(self) -> dict[str, Any]:
        return {**self.llm.to_manifest(), "identity": self.llm_identity}

    # ------------------------------------------------------------------ saving
    def manifest(self) -> dict[str, Any]:
        """HD-Eval's part of the manifest (the artifact module adds the generic header)."""
        from hdeval.urls import public_url

        extra = dict(self.manifest_extra)
        if isinstance(extra.get("config"), dict) and extra["config"].get("base_url"):
            extra["config"] = {**extra["config"], "base_url": public_url(extra["config"]["base_url"])}
        return {
            "aggregator": {
                "kind": self.aggregator.kind,
                "aspects": self.aggregator.aspects,
                "ranges": [list(r) for r in self.aggregator.ranges],
                "groups": self.aggregator.groups,
                "random_state": self.aggregator.random_state,
            },
            "features": self.feature_keys,
            "needed_criteria": self.needed_criteria,
            "prompts": {n: t.digest for n, t in self.templates.items()},
            **({"scorer": self.scorer.manifest()} if self.scorer is not None else {}),
            **extra,
        }

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        for name, t in self.templates.items():
            out.text(f"prompts/{name}.toml", t.source)
        out.json(TREE, self.tree.to_dict())
        out.skops(MODEL, self.aggregator.models_)
        out.json(METRICS, self.metrics)
        if self.score_table is not None:
            self.score_table.to_csv(out.path(SCORES), index=False)
        if self.scorer is not None:
            self.scorer.write(out)
        return self.manifest()

    def save(self, path: str | Path) -> Path:
        """Write the artifact to ``path`` atomically (see :func:`hdeval.artifact.save_artifact`)."""
        self.path = save_artifact(self, path, self.llm_manifest())
        return self.path

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path) -> "Evaluator":
        """Verify checksums and versions, then load with safe deserialisation only."""
        ev = load_artifact(path)
        if not isinstance(ev, cls):
            raise ArtifactError(f"{path} holds a {ev.method!r} evaluator, not an HD-Eval one")
        return ev

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "Evaluator":
        """Rebuild from a verified artifact; check that its parts fit together."""
        path, manifest = art.path, art.manifest
        files = manifest["files"]
        for name in (MODEL, TREE, METRICS, "prompts/score.toml"):
            if name not in files:
                raise ArtifactError(f"{path / 'manifest.json'}: no checksum recorded for {name}")
        try:
            task = task_from_dict(manifest["task"], where=str(path / "manifest.json"))
            tree = CriteriaTree.from_dict(art.json(TREE))
            templates = {}
            for name in sorted(files):
                if name.startswith("prompts/") and name.endswith(".toml"):
                    stem = Path(name).stem
                    templates[stem] = parse_template(stem, art.text(name), str(path / name))
            features = list(manifest["features"])
            agg_meta = manifest["aggregator"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: malformed artifact ({exc})") from exc
        if sorted(tree.keys) != sorted(features):
            raise ArtifactError(
                f"{path}: {TREE} no longer has the criteria the aggregator was trained on; "
                "edit only names and definitions, or retrain"
            )
        models = art.skops(MODEL, TRUSTED_TYPES)
        try:
            agg = Aggregator(
                agg_meta["kind"], agg_meta["aspects"], [tuple(r) for r in agg_meta["ranges"]],
                agg_meta["groups"], agg_meta.get("random_state", 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: malformed aggregator section ({exc})") from exc
        agg.models_ = models
        agg.n_features_in_ = len(features)
        llm = manifest.get("llm") or {}
        ev = cls(
            task, tree, agg, features, templates,
            LLMConfig(model=llm.get("model") or "", base_url=llm.get("base_url")),
            llm.get("identity", ""),
            art.json(METRICS),
            {k: v for k, v in manifest.items() if k in _EXTRA_KEYS},
        )
        if manifest.get("scorer") is not None:
            from hdeval.methods.paireval import PairwiseScorer

            ev.scorer = PairwiseScorer.from_artifact(art, manifest["scorer"], templates)
        ev.warnings = list(art.warnings)
        ev.path = path
        ev.manifest_data = manifest
        return ev
