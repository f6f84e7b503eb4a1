"""The trained evaluator artifact: save, verify + load, and score new samples."""

from __future__ import annotations

import csv
import ctypes
import errno
import hashlib
import io
import json
import math
import os
import platform
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pandas as pd

from hdeval import __version__
from hdeval.aggregate import Aggregator
from hdeval.backends.base import Backend
from hdeval.backends.factory import LLMSpec, make_backend
from hdeval.cache import CachedBackend
from hdeval.errors import ArtifactError, ConfigError, DataError
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
# Bounds on what ``load`` reads from an artifact (it is data from whoever sent it).
MAX_ENTRIES = 10_000  # files + directories inside an artifact
MAX_FILES = 1_000  # entries in the manifest's ``files``
MAX_TEXT_BYTES = 64 << 20  # manifest, tree, metrics, prompts
MAX_BIG_BYTES = 2 << 30  # aggregator.skops, scores.csv
MAX_HEADER_BYTES = 4 << 20  # the header line of scores.csv
# Names next to an artifact directory NAME used while it is replaced (see ``Evaluator.save``).
ASIDE = ".hdeval-old"  # .NAME.hdeval-old: the previous artifact, between two renames
NEW = ".hdeval-new-"  # .NAME.hdeval-new-PID: the artifact being written
ESTIMATORS = {
    "lr": "LinearRegression",
    "dt": "DecisionTreeRegressor",
    "rf": "RandomForestRegressor",
    "nn": "MLPRegressor",
}


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
        llm = {**self.llm.to_manifest(), "identity": public_identity(self.llm_identity, self.llm.base_url)}
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

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write the artifact to ``path`` atomically.

        ``path`` may be new, an empty directory, or (with ``force``) an existing hdeval
        artifact; any other directory is refused, ``force`` or not. The new artifact is
        written next to ``path`` and swapped in, so whenever the process stops, ``path``
        holds either the old or the new artifact (see :func:`recover_artifact`).
        """
        import skops.io as sio

        path = Path(path)
        check_destination(path, force=force)
        path.parent.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(path)
        tmp = path.with_name(f".{path.name}{NEW}{os.getpid()}")
        if tmp.exists() or tmp.is_symlink():
            _remove_tree(tmp)
        tmp.mkdir()
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
                p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
            }
            _write_json(tmp / MANIFEST, manifest)
            if path.is_dir() and not is_artifact(path):  # an empty directory (checked above)
                path.rmdir()
            if not path.exists():
                os.replace(tmp, path)
            elif _exchange(tmp, path):
                _remove_tree(tmp)  # now the previous artifact
            else:
                aside = _aside(path)
                if aside.exists():
                    _remove_tree(aside)
                os.replace(path, aside)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    os.replace(aside, path)  # put the previous artifact back
                    raise
                _remove_tree(aside)
        finally:
            if tmp.exists():
                _remove_tree(tmp)
        self.path = path
        return path

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path) -> "Evaluator":
        """Verify checksums and versions, then load with safe deserialisation only."""
        import skops.io as sio

        path = Path(path)
        recover_artifact(path)
        if not path.is_dir():
            raise ArtifactError(f"{path} is not an artifact directory")
        _refuse_links(path)
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
        if not isinstance(files, dict) or len(files) > MAX_FILES:
            raise ArtifactError(f"{mpath}: 'files' must map at most {MAX_FILES} file names to checksums")
        warnings: list[str] = []
        for name in (MODEL, TREE, METRICS, "prompts/score.toml"):
            if name not in files:
                raise ArtifactError(f"{mpath}: no checksum recorded for {name}")
        for name, digest in files.items():
            f = _member(path, name, mpath)
            if not isinstance(digest, str):
                raise ArtifactError(f"{mpath}: the checksum of {name} is not a string")
            try:
                st = os.lstat(f)
            except OSError:
                raise ArtifactError(f"{path}: {name} is missing") from None
            if not stat.S_ISREG(st.st_mode):
                raise ArtifactError(f"{path}: {name} is not a regular file")
            limit = MAX_BIG_BYTES if name in (MODEL, SCORES) else MAX_TEXT_BYTES
            if st.st_size > limit:
                raise ArtifactError(f"{path}: {name} is {st.st_size} bytes, more than the {limit} an artifact may hold")
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
            templates = {}
            for name in sorted(files):
                member = PurePosixPath(name)
                if len(member.parts) == 2 and member.parts[0] == "prompts" and member.suffix == ".toml":
                    p = path / name
                    templates[member.stem] = parse_template(member.stem, p.read_text(encoding="utf-8"), str(p))
            features = list(manifest["features"])
            agg_meta = manifest["aggregator"]
            if not isinstance(agg_meta, dict):
                raise TypeError("'aggregator' is not an object")
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path}: malformed artifact ({exc})") from exc
        if not all(isinstance(f, str) for f in features) or len(set(features)) != len(features):
            raise ArtifactError(f"{mpath}: 'features' must be distinct criterion keys")
        if sorted(tree.keys) != sorted(features):
            raise ArtifactError(
                f"{path}: {TREE} no longer has the criteria the aggregator was trained on; "
                "edit only names and definitions, or retrain"
            )
        agg_aspects, ranges, groups, kind = _check_aggregator_meta(agg_meta, task, mpath)
        _check_order(path, files, features, agg_aspects, tree, mpath)
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
        _check_models(models, kind, groups, len(features), path / MODEL)
        random_state = agg_meta.get("random_state", 0)
        agg = Aggregator(kind, agg_aspects, ranges, groups,
                         random_state if isinstance(random_state, int) else 0)
        agg.models_ = models
        agg.n_features_in_ = len(features)
        needed = manifest.get("needed_criteria")
        if needed is not None:
            if not isinstance(needed, list) or not set(map(str, needed)) <= set(features):
                raise ArtifactError(f"{mpath}: 'needed_criteria' names criteria that are not among 'features'")
            try:
                computed = [k for k, used in zip(features, agg.used_features()) if used]
            except Exception as exc:  # a model without the attributes it should have
                raise ArtifactError(f"{path / MODEL}: unusable aggregator ({exc})") from exc
            if computed != needed:
                raise ArtifactError(f"{mpath}: 'needed_criteria' does not match the criteria the aggregator uses")
        llm = manifest.get("llm") or {}
        if not isinstance(llm, dict) or not all(
            isinstance(llm.get(k), (str, type(None))) for k in ("model", "base_url", "identity")
        ):
            raise ArtifactError(f"{mpath}: 'llm' must hold text for model, base_url and identity")
        ev = cls(
            task, tree, agg, features, templates,
            LLMSpec(llm.get("model") or "", llm.get("base_url")), llm.get("identity") or "",
            _read_json(path / METRICS),
            {k: v for k, v in manifest.items() if k in ("seed", "split", "config", "layers")},
        )
        ev.warnings = warnings
        ev.path = path
        ev.manifest_data = manifest
        return ev


def _public_url(url: str | None) -> str | None:
    """``url`` without ``user:password@``, query and fragment: artifacts get shared, and
    credentials or keys (``?api-key=...``) must not travel with them."""
    if not url:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment=""))


def public_identity(identity: str, url: str | None) -> str:
    """A backend identity without the query or fragment of ``url`` (which it may quote)."""
    if not url or not identity:
        return identity
    parts = urlsplit(url)
    for secret in (parts.query and "?" + parts.query, parts.fragment and "#" + parts.fragment):
        if secret:
            identity = identity.replace(secret, "")
    return identity.replace(parts.netloc, parts.netloc.rpartition("@")[2]) if "@" in parts.netloc else identity


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise ArtifactError(f"{path}: larger than the {MAX_TEXT_BYTES} bytes an artifact file may hold")
        return json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable ({exc})") from exc


# ---------------------------------------------------------------------- destination
def is_artifact(path: Path) -> bool:
    """Whether ``path`` is a real directory whose manifest says it is an hdeval artifact."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        st = os.lstat(path / MANIFEST)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TEXT_BYTES:
            return False
        manifest = json.loads((path / MANIFEST).read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def check_destination(path: str | Path, force: bool = False) -> None:
    """Raise unless :meth:`Evaluator.save` may write ``path``; creates and deletes nothing of
    the user's. Call it before paying for a run: it also checks that the location is writable."""
    path = Path(path)
    full = Path(os.path.abspath(path))
    cwd = Path(os.getcwd())
    if full == full.parent or full == cwd or full in cwd.parents:
        raise ConfigError(f"refusing to write the artifact to {path}: it is the current directory or "
                          "holds it; give a directory of its own, e.g. -o artifacts/NAME")
    recover_artifact(path)
    if path.is_symlink():
        raise ConfigError(f"refusing to write the artifact to {path}: it is a symbolic link; give the real path")
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"cannot write the artifact to {path}: it exists and is not a directory")
        if is_artifact(path):
            if not force:
                raise ConfigError(f"{path} already holds an hdeval artifact: pass --force to replace it, "
                                  "or choose another output directory")
        elif any(path.iterdir()):
            raise ConfigError(f"refusing to write the artifact to {path}: it is a non-empty directory that "
                              f"is not an hdeval artifact (no {MANIFEST} saying so); --force does not change "
                              "that: choose a new directory")
    check_writable(full.parent)


def check_writable(directory: str | Path) -> None:
    """Raise a one-line ConfigError unless files can be created in ``directory`` (or in the
    nearest existing folder above it, where the missing ones would be created)."""
    d = Path(os.path.abspath(directory))
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir():
        raise ConfigError(f"cannot write to {directory}: {d} is not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=".hdeval-probe-", dir=d)
        os.rmdir(probe)
    except OSError as exc:
        raise ConfigError(f"cannot write to {d}: {exc.strerror or exc}") from None


def _aside(path: Path) -> Path:
    return path.with_name(f".{path.name}{ASIDE}")


def recover_artifact(path: str | Path) -> None:
    """Put back an artifact a replacing ``save`` had renamed aside when it was killed."""
    path = Path(os.path.abspath(path))
    if path == path.parent:
        return
    aside = _aside(path)
    if os.path.lexists(path) or not is_artifact(aside):
        return
    try:
        os.rename(aside, path)
    except OSError as exc:
        raise ArtifactError(f"{path} was being replaced when a run stopped and the previous artifact "
                            f"is in {aside}; cannot rename it back ({exc.strerror or exc}): do so by hand") from None


def _clean_leftovers(path: Path) -> None:
    """Remove what a killed ``save`` of ``path`` left next to it (only hdeval's own names)."""
    aside = _aside(path)
    if path.is_dir() and aside.is_dir() and not aside.is_symlink() and (is_artifact(aside) or not any(aside.iterdir())):
        _remove_tree(aside)
    prefix = f".{path.name}{NEW}"
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for e in entries:
        pid = e.name[len(prefix):]
        if e.name.startswith(prefix) and pid.isdigit() and pid.isascii() and int(pid) != os.getpid() \
                and e.is_dir(follow_symlinks=False) and not _alive(int(pid)):
            _remove_tree(Path(e.path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def _remove_tree(path: Path) -> None:
    """Delete a directory hdeval wrote, its manifest last (so a half-deleted one is still
    recognisable as an artifact, or empty)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    for child in path.iterdir():
        if child.name == MANIFEST:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    (path / MANIFEST).unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False where the
    system or file system cannot, so the caller falls back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


# ---------------------------------------------------------------------- load checks
def _refuse_links(path: Path) -> None:
    """Refuse any symbolic link (or more entries than an artifact has) inside ``path``."""
    n = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            n += 1
            full = Path(root) / name
            if n > MAX_ENTRIES:
                raise ArtifactError(f"{path}: more than {MAX_ENTRIES} files; not an artifact hdeval wrote")
            if full.is_symlink():
                raise ArtifactError(f"{path}: {full.relative_to(path).as_posix()} is a symbolic link; "
                                    "an artifact holds only regular files")


def _member(path: Path, name: Any, mpath: Path) -> Path:
    """``path / name`` for a manifest ``files`` entry, refusing names that leave ``path``."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        raise ArtifactError(f"{mpath}: bad file name {name!r} in 'files'")
    rel = PurePosixPath(name)
    if rel.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise ArtifactError(f"{mpath}: file {name!r} in 'files' is outside the artifact directory")
    return path / rel


def _check_aggregator_meta(meta: dict, task: Task, mpath: Path) -> tuple[list[str], list[tuple[float, float]], list[list[str]], str]:
    """The manifest's aggregator section, checked against the task it names."""
    kind = meta.get("kind")
    if kind not in ESTIMATORS:
        raise ArtifactError(f"{mpath}: unknown aggregator kind {kind!r}")
    aspects, ranges, groups = meta.get("aspects"), meta.get("ranges"), meta.get("groups")
    if not isinstance(aspects, list) or list(aspects) != list(task.aspect_keys):
        raise ArtifactError(f"{mpath}: aggregator aspects {aspects!r} are not the task's aspects "
                            f"{list(task.aspect_keys)!r} in order")
    if not isinstance(ranges, list) or len(ranges) != len(aspects):
        raise ArtifactError(f"{mpath}: aggregator 'ranges' must give one [low, high] per aspect")
    out_ranges = []
    for a, r in zip(aspects, ranges):
        ok = (isinstance(r, list) and len(r) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in r))
        if not ok or tuple(float(x) for x in r) != tuple(float(x) for x in task.aspect(a).range):
            raise ArtifactError(f"{mpath}: aggregator range {r!r} of aspect {a!r} differs from the task's "
                                f"{list(task.aspect(a).range)!r}")
        out_ranges.append((float(r[0]), float(r[1])))
    if not isinstance(groups, list) or not all(
            isinstance(g, list) and g and all(isinstance(a, str) for a in g) for g in groups):
        raise ArtifactError(f"{mpath}: aggregator 'groups' must be lists of aspect names")
    flat = [a for g in groups for a in g]
    if sorted(flat) != sorted(aspects):
        raise ArtifactError(f"{mpath}: aggregator 'groups' {groups!r} must hold each aspect exactly once")
    for g in groups:
        if len({task.aspect(a).range for a in g}) != 1:
            raise ArtifactError(f"{mpath}: aggregator group {g!r} mixes aspects with different score ranges")
    return list(aspects), out_ranges, [list(g) for g in groups], kind


def _check_order(path: Path, files: dict, features: list[str], aspects: list[str], tree: CriteriaTree,
                 mpath: Path) -> None:
    """The aggregator's columns are positional: ``features`` must be in the trained order.

    The checksummed ``scores.csv`` header records it (criterion columns, then ``human:``
    aspect columns); without that table, the order the training builds (layer by layer,
    in tree order) is the reference.
    """
    if SCORES in files:
        try:
            with (path / SCORES).open(encoding="utf-8", newline="") as fh:
                line = fh.readline(MAX_HEADER_BYTES)
            header = next(csv.reader(io.StringIO(line)))
        except (OSError, UnicodeDecodeError, StopIteration, csv.Error) as exc:
            raise ArtifactError(f"{path / SCORES}: unreadable header ({exc})") from None
        if header[:2] == ["sample_id", "split"]:  # the layout train writes: positions decide
            cols = header[2:2 + len(features)]
            humans = [c.removeprefix("human:") for c in header[2 + len(features):] if c.startswith("human:")]
        else:
            cols = [c for c in header if not c.startswith("human:")]
            humans = [c.removeprefix("human:") for c in header if c.startswith("human:")]
        if cols != features:
            raise ArtifactError(f"{mpath}: 'features' are not in the order the aggregator was trained on "
                                f"(the columns of {SCORES}); the manifest was edited")
        if humans != aspects:
            raise ArtifactError(f"{mpath}: the aspects are not in the order the aggregator was trained on "
                                f"(the human: columns of {SCORES}); the manifest was edited")
        return
    layered = [c.key for n in sorted({c.layer for c in tree}) for c in tree.layer(n)]
    if features not in (tree.keys, layered):
        raise ArtifactError(f"{mpath}: 'features' are not in the order of the criteria in {TREE}")


def _check_models(models: Any, kind: str, groups: list[list[str]], n_features: int, where: Path) -> None:
    """One fitted pipeline per aspect group, of the recorded kind, with the right widths."""
    from sklearn.pipeline import Pipeline

    if not isinstance(models, list) or len(models) != len(groups):
        raise ArtifactError(f"{where}: holds {type(models).__name__} instead of one model per aspect group "
                            f"({len(groups)})")
    for g, m in zip(groups, models):
        if not isinstance(m, Pipeline) or "model" not in m.named_steps:
            raise ArtifactError(f"{where}: the model for {', '.join(g)} is not an hdeval pipeline")
        est = m.named_steps["model"]
        if type(est).__name__ != ESTIMATORS[kind]:
            raise ArtifactError(f"{where}: the model for {', '.join(g)} is a {type(est).__name__}, "
                                f"but the manifest says aggregator {kind!r}")
        width = getattr(m, "n_features_in_", None)
        if width != n_features:
            raise ArtifactError(f"{where}: the model for {', '.join(g)} takes {width} criterion scores, "
                                f"but the manifest lists {n_features} features")
        try:
            out = np.asarray(m.predict(np.zeros((1, n_features)))).reshape(1, -1)
        except Exception as exc:  # any failure of an unusable model
            raise ArtifactError(f"{where}: the model for {', '.join(g)} cannot predict ({exc})") from None
        if out.shape[1] != len(g):
            raise ArtifactError(f"{where}: the model for {', '.join(g)} predicts {out.shape[1]} value(s) "
                                f"for {len(g)} aspect(s)")
