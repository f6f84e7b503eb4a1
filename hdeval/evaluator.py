"""The trained evaluator artifact: save, verify + load, and score new samples."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pandas as pd

from hdeval import __version__
from hdeval.aggregate import Aggregator
from hdeval.backends.base import Backend
from hdeval.backends.factory import LLMSpec, make_backend
from hdeval.cache import CachedBackend
from hdeval.errors import ArtifactError, DataError
from hdeval.metrics import metric_table
from hdeval.paths import default_cache_dir
from hdeval.progress import Progress
from hdeval.prompts import Template, parse_template
from hdeval.scoring import score_criteria
from hdeval.tasks import task_from_dict
from hdeval.types import CriteriaTree, Sample, ScoreMatrix, Task

FORMAT = "hdeval-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_versions() -> dict[str, str]:
    import sklearn
    import skops

    return {
        "hdeval": __version__,
        "python": platform.python_version(),
        "scikit-learn": sklearn.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "skops": skops.__version__,
    }


@dataclass
class ScoreResult:
    """What :meth:`Evaluator.score` returns."""

    sample_ids: list[str]
    aspects: list[str]
    predictions: np.ndarray  # samples x aspects, clipped to each aspect's range
    criteria: ScoreMatrix  # the criterion scores that were obtained (NaN = failed / not needed)
    usage: dict[str, int] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.predictions, index=self.sample_ids, columns=self.aspects)

    def correlations(self, samples: Sequence[Sample]) -> dict[str, Any] | None:
        """Held-out style correlations when every sample carries human scores."""
        if not samples or not all(all(a in s.scores for a in self.aspects) for s in samples):
            return None
        y = np.array([[s.scores[a] for a in self.aspects] for s in samples])
        return metric_table(y, self.predictions, self.aspects)


class Evaluator:
    """Criteria tree + fitted aggregator + everything needed to score new samples the same way."""

    def __init__(
        self,
        task: Task,
        tree: CriteriaTree,
        aggregator: Aggregator,
        feature_keys: Sequence[str],
        templates: Mapping[str, Template],
        llm: LLMSpec,
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
            backend = CachedBackend(
                make_backend(self.llm), cache_dir if cache_dir is not None else default_cache_dir()
            )
        try:
            needed = self.needed_criteria
            criteria = [self.tree[k] for k in needed]
            if progress is not None:
                progress.stage(f"scoring {len(samples)} samples x {len(criteria)} criteria", len(samples) * len(criteria))
            m = score_criteria(
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
            usage = {}
            if isinstance(backend, CachedBackend):
                st = backend.stats
                usage = {
                    "calls": st.calls, "cache_hits": st.hits,
                    "prompt_tokens": st.prompt_tokens, "completion_tokens": st.completion_tokens,
                }
            return ScoreResult([s.id for s in samples], list(self.aggregator.aspects), pred, full, usage)
        finally:
            if own and isinstance(backend, CachedBackend):
                backend.close()

    # ------------------------------------------------------------------ saving
    def manifest(self) -> dict[str, Any]:
        llm = {**self.llm.to_manifest(), "identity": self.llm_identity}
        llm["base_url"] = _public_url(llm.get("base_url"))
        extra = dict(self.manifest_extra)
        if isinstance(extra.get("config"), dict) and extra["config"].get("base_url"):
            extra["config"] = {**extra["config"], "base_url": _public_url(extra["config"]["base_url"])}
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "hdeval_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "task": self.task.to_dict(),
            "llm": llm,
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
            "versions": package_versions(),
            **extra,
        }

    def save(self, path: str | Path) -> Path:
        """Write the artifact to ``path`` atomically (a temp dir renamed into place)."""
        import skops.io as sio

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            (tmp / "prompts").mkdir()
            for name, t in self.templates.items():
                (tmp / "prompts" / f"{name}.toml").write_text(t.source, encoding="utf-8")
            _write_json(tmp / TREE, self.tree.to_dict())
            sio.dump(self.aggregator.models_, tmp / MODEL)
            _write_json(tmp / METRICS, self.metrics)
            if self.score_table is not None:
                self.score_table.to_csv(tmp / SCORES, index=False)
            manifest = self.manifest()
            manifest["files"] = {
                str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
            }
            _write_json(tmp / MANIFEST, manifest)
            if path.exists():
                old = path.with_name(f".{path.name}.old-{os.getpid()}")
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.path = path
        return path

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path) -> "Evaluator":
        """Verify checksums and versions, then load with safe deserialisation only."""
        import skops.io as sio

        path = Path(path)
        if not path.is_dir():
            raise ArtifactError(f"{path} is not an artifact directory")
        mpath = path / MANIFEST
        if not mpath.is_file():
            raise ArtifactError(f"{path} is not an hdeval artifact: {MANIFEST} is missing")
        manifest = _read_json(mpath)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArtifactError(f"{mpath} is not an hdeval artifact manifest")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ArtifactError(
                f"{path} was written by hdeval {manifest.get('hdeval_version', '?')} (artifact format "
                f"{version}); this hdeval {__version__} reads format {FORMAT_VERSION} or older: upgrade hdeval"
            )
        files = manifest.get("files") or {}
        warnings: list[str] = []
        for name in (MODEL, TREE, METRICS, "prompts/score.toml"):
            if name not in files:
                raise ArtifactError(f"{mpath}: no checksum recorded for {name}")
        for name, digest in files.items():
            f = path / name
            if not f.is_file():
                raise ArtifactError(f"{path}: {name} is missing")
            if sha256_file(f) != digest:
                if name == TREE:
                    # The tree is meant to be readable and editable; its structure must still
                    # match what the aggregator was fitted on (checked below).
                    warnings.append(
                        f"{TREE} was edited after training: criteria wording differs, so scores "
                        "may differ from the recorded metrics"
                    )
                    continue
                raise ArtifactError(
                    f"{path}: {name} does not match its checksum in {MANIFEST} (modified or truncated)"
                )
        try:
            task = task_from_dict(manifest["task"], where=str(mpath))
            tree = CriteriaTree.from_dict(_read_json(path / TREE))
            templates = {
                p.stem: parse_template(p.stem, p.read_text(encoding="utf-8"), str(p))
                for p in sorted((path / "prompts").glob("*.toml"))
            }
            features = list(manifest["features"])
            agg_meta = manifest["aggregator"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: malformed artifact ({exc})") from exc
        if sorted(tree.keys) != sorted(features):
            raise ArtifactError(
                f"{path}: {TREE} no longer has the criteria the aggregator was trained on; "
                "edit only names and definitions, or retrain"
            )
        try:
            found = sio.get_untrusted_types(file=path / MODEL)
        except Exception as exc:  # not a skops zip at all: a pickle, a truncated file ...
            raise ArtifactError(f"{path / MODEL}: not a readable skops file ({exc})") from exc
        untrusted = [t for t in found if t not in TRUSTED_TYPES]
        if untrusted:
            raise ArtifactError(
                f"{path / MODEL} contains types hdeval does not trust: {', '.join(untrusted)}"
            )
        try:
            models = sio.load(path / MODEL, trusted=list(TRUSTED_TYPES))
        except Exception as exc:  # skops raises many kinds on a corrupt file
            raise ArtifactError(f"{path / MODEL}: cannot load aggregator ({exc})") from exc
        try:
            agg = Aggregator.from_fitted(
                agg_meta["kind"], agg_meta["aspects"], agg_meta["ranges"], agg_meta["groups"],
                agg_meta.get("random_state", 0), models, len(features),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: malformed aggregator in {MANIFEST} ({exc})") from exc
        llm = manifest.get("llm") or {}
        ev = cls(
            task, tree, agg, features, templates,
            LLMSpec(llm.get("model", ""), llm.get("base_url")), llm.get("identity", ""),
            _read_json(path / METRICS),
            {k: v for k, v in manifest.items() if k in ("seed", "split", "config", "layers")},
        )
        ev.warnings = warnings
        ev.path = path
        ev.manifest_data = manifest
        return ev


def _public_url(url: str | None) -> str | None:
    """``url`` without ``user:password@``: artifacts get shared, the credentials must not."""
    if not url:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable ({exc})") from exc
