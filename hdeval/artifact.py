"""The artifact directory, whatever the method: layout, manifest, checksums, safe loading, atomic save.

A method writes its files through an :class:`ArtifactWriter` and reads them back through an
:class:`ArtifactReader`; this module owns everything else. An artifact is data from whoever sent
it: every file is checked against the manifest's sha256, nothing is unpickled (the skops loader
refuses types outside a short trusted list), no path leaves the directory, symlinks are refused,
and sizes are bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from hdeval import __version__
from hdeval.errors import ArtifactError, HdevalError

if TYPE_CHECKING:  # pragma: no cover
    from hdeval.methods.base import Fitted

FORMAT = "hdeval-artifact"
# 2: the manifest names its method; format 1 (HD-Eval only) is still read.
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
MAX_FILE_BYTES = 512 * 1024 * 1024  # no artifact file of ours comes near this
MAX_JSON_BYTES = 64 * 1024 * 1024


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_versions() -> dict[str, str]:
    import numpy as np
    import pandas as pd
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


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


class ArtifactWriter:
    """Where a method writes its files: a fresh temporary directory, renamed into place later."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        p = self.root / _safe_name(name)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def text(self, name: str, text: str) -> None:
        self.path(name).write_text(text, encoding="utf-8")

    def json(self, name: str, data: Any) -> None:
        write_json(self.path(name), data)

    def skops(self, name: str, obj: Any) -> None:
        import skops.io as sio

        sio.dump(obj, self.path(name))


class ArtifactReader:
    """A verified artifact: its manifest, and checked access to its files."""

    def __init__(self, path: Path, manifest: dict[str, Any], warnings: list[str]):
        self.path = path
        self.manifest = manifest
        self.warnings = warnings

    @property
    def method(self) -> str:
        return str(self.manifest.get("method") or "hdeval")

    def file(self, name: str) -> Path:
        p = self.path / _safe_name(name)
        if p.is_symlink() or not p.is_file():
            raise ArtifactError(f"{self.path}: {name} is missing or not a regular file")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ArtifactError(f"{self.path}: {name} is larger than any hdeval artifact file")
        return p

    def text(self, name: str, limit: int = MAX_JSON_BYTES) -> str:
        p = self.file(name)
        if p.stat().st_size > limit:
            raise ArtifactError(f"{p}: too large ({p.stat().st_size} bytes)")
        try:
            return p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{p}: unreadable ({exc})") from exc

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.text(name))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ArtifactError(f"{self.path / name}: unreadable (not valid JSON: {exc})") from exc

    def skops(self, name: str, trusted: tuple[str, ...]) -> Any:
        """Load a skops file, refusing any type outside skops' defaults and ``trusted``."""
        import skops.io as sio

        p = self.file(name)
        try:
            found = sio.get_untrusted_types(file=p)
        except Exception as exc:  # not a skops zip at all: a pickle, a truncated file ...
            raise ArtifactError(f"{p}: not a readable skops file ({exc})") from exc
        untrusted = [t for t in found if t not in trusted]
        if untrusted:
            raise ArtifactError(f"{p} contains types hdeval does not trust: {', '.join(untrusted)}")
        try:
            return sio.load(p, trusted=list(trusted))
        except Exception as exc:  # skops raises many kinds on a corrupt file
            raise ArtifactError(f"{p}: cannot load ({exc})") from exc


def _safe_name(name: str) -> str:
    """A relative POSIX path inside the artifact: no absolute path, no '..', no backslash."""
    p = PurePosixPath(name)
    if not name or "\\" in name or p.is_absolute() or any(part in ("..", "") for part in p.parts):
        raise ArtifactError(f"artifact file name {name!r} points outside the artifact directory")
    return str(p)


def is_artifact(path: Path) -> bool:
    """Whether ``path`` is a directory whose manifest says it is an hdeval artifact."""
    m = path / MANIFEST
    try:
        if not path.is_dir() or path.is_symlink() or m.is_symlink() or not m.is_file():
            return False
        if m.stat().st_size > MAX_JSON_BYTES:
            return False
        data = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def save_artifact(fitted: "Fitted", path: str | Path, llm: dict[str, Any]) -> Path:
    """Write ``fitted`` to ``path`` atomically: files go to a temporary sibling directory that is
    renamed into place, so a reader never sees half an artifact. ``llm``: the manifest's LLM
    section (model, base_url without credentials, identity)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        section = fitted.write(ArtifactWriter(tmp))
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "hdeval_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "method": fitted.method,
            "method_args": fitted.method_args(),
            "task": fitted.task.to_dict(),
            "llm": llm,
            "versions": package_versions(),
            **section,
        }
        manifest["files"] = {
            p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        write_json(tmp / MANIFEST, manifest)
        _swap_into_place(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _swap_into_place(tmp: Path, path: Path) -> None:
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def open_artifact(path: str | Path, editable: tuple[str, ...] = ()) -> ArtifactReader:
    """Verify the manifest, format version and every file's checksum.

    A file in ``editable`` (a method's human-editable file, e.g. HD-Eval's tree.json) may differ
    from its checksum: that is a warning, and the method checks its structure itself.
    """
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path} is not an artifact directory")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{path} is not an hdeval artifact: {MANIFEST} is missing")
    reader = ArtifactReader(path, {}, [])
    manifest = reader.json(MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{mpath} is not an hdeval artifact manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
        raise ArtifactError(
            f"{path} was written by hdeval {manifest.get('hdeval_version', '?')} (artifact format "
            f"{version}); this hdeval {__version__} reads format {FORMAT_VERSION} or older: upgrade hdeval"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ArtifactError(f"{mpath}: no valid 'files' checksum table")
    reader.manifest = manifest
    for name, digest in files.items():
        f = reader.file(name)  # refuses paths outside the directory and symlinks
        if sha256_file(f) != digest:
            if name in editable:
                reader.warnings.append(
                    f"{name} was edited after training: its wording differs, so scores may differ "
                    "from the recorded metrics"
                )
                continue
            raise ArtifactError(
                f"{path}: {name} does not match its checksum in {MANIFEST} (modified or truncated)"
            )
    return reader


def load_artifact(path: str | Path) -> "Fitted":
    """Open, verify and rebuild the fitted evaluator of whatever method wrote ``path``."""
    from hdeval.methods.base import get_method

    path = Path(path)
    probe = ArtifactReader(path, {}, [])
    head = probe.json(MANIFEST) if (path / MANIFEST).is_file() else {}
    name = head.get("method", "hdeval") if isinstance(head, dict) else "hdeval"
    if not isinstance(name, str):
        raise ArtifactError(f"{path / MANIFEST}: 'method' is not a name")
    try:
        method = get_method(name)
    except HdevalError as exc:
        raise ArtifactError(f"{path}: {exc} (written by a newer hdeval?)") from None
    reader = open_artifact(path, editable=method.editable)
    return method.load(reader)
