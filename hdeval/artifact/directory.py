"""The artifact directory, whatever the method: layout, manifest, checksums, safe loading, atomic save.
An artifact is data from whoever sent it: every file is checked against the manifest's sha256,
nothing is unpickled, no path leaves the directory, symlinks are refused, and sizes are bounded."""

from __future__ import annotations

import ctypes
import errno
import json
import numbers
import os
import platform
import shutil
import stat
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from hdeval import __version__
from hdeval.artifact.manifest_file import MAX_FILES, Manifest, _safe_name, error_line
from hdeval.core.errors import ArtifactError, ConfigError, MethodError
from hdeval.core.fetch import sha256_file

FORMAT = "hdeval-artifact"
# 2: the manifest names its method; 3: its run config records the method's own options under
# "options" (format 2 recorded HD-Eval's flat for every method); 4: the method's state under
# "state" and the run record under "run", apart from the header (before, all three shared the top
# level, so a method's key could replace the header's). Formats 1 to 3 are still read.
FORMAT_VERSION = 4
MANIFEST = "manifest.json"
# the manifest's header (what every artifact records) and, in formats 1-3, the run record's keys at
# the top level beside the method's state
HEADER_KEYS = (
    "format",
    "format_version",
    "hdeval_version",
    "created",
    "method",
    "method_args",
    "task",
    "llm",
    "versions",
    "files",
)
RUN_KEYS = ("seed", "split", "config")
# Bounds on what is read from an artifact (it is data from whoever sent it).
MAX_ENTRIES = 10_000  # files + directories inside an artifact
MAX_JSON_BYTES = 64 << 20  # manifest, tree, metrics, prompts: any text file
MAX_FILE_BYTES = 2 << 30  # a model or score table
# Names next to an artifact directory NAME used while it is replaced (see ``save_artifact``).
ASIDE = ".hdeval-old"  # .NAME.hdeval-old: the previous artifact, between two renames
NEW = ".hdeval-new-"  # .NAME.hdeval-new-PID: the artifact being written
# What hdeval itself writes inside an artifact besides its files: `hdeval report`'s default output.
REPORT, REPORT_FILES = "report", ("report.html", "report.json")
SHOWN = 3  # entries a refusal names


def _json_int(value: Any) -> int:
    # numpy's integers (a count from pandas), which the metrics model takes as the ints they are;
    # numpy's bool is not Integral and stays refused, as json refuses any other type
    if isinstance(value, numbers.Integral):
        return int(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def write_json(path: Path, data: Any) -> None:
    path.write_text(
        json.dumps(data, indent=2, ensure_ascii=False, default=_json_int) + "\n", encoding="utf-8"
    )


def json_data(data: Any, where: str) -> Any:
    """``data`` as it reads back from the JSON an artifact keeps; a value JSON cannot hold (a
    numpy float32, a set) is a one-line MethodError naming its path under ``where``."""
    try:
        return json.loads(json.dumps(data, default=_json_int))
    except (TypeError, ValueError):
        raise _not_json_error(data, where) from None


def _not_json_error(data: Any, where: str, file: str = "") -> MethodError:
    found = _not_json(data, where)
    what = f"{found}, which JSON cannot hold" if found else "it refers to itself, which JSON cannot hold"
    return MethodError(f"{file}: {what}" if file else what)


def _not_json(value: Any, path: str) -> str | None:
    """The first value in ``value`` JSON cannot hold, by its path and type; None: there is none."""
    if value is None or isinstance(value, (str, int, float, numbers.Integral)):  # as _json_int
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, int, float))):
                return f"{path or 'the top level'} has a key of type {_type_name(key)}"
            found = _not_json(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        return next((f for i, x in enumerate(value) if (f := _not_json(x, f"{path}[{i}]"))), None)
    return f"{path or 'the top level'} is a {_type_name(value)}"


def _type_name(value: Any) -> str:
    kind = type(value)  # numpy.bool, not bool: a message must not say JSON cannot hold a bool
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


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
        try:
            write_json(self.path(name), data)
        except (TypeError, ValueError):  # a value JSON cannot hold: one line naming where it is
            raise _not_json_error(data, "", file=name) from None

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

    @property
    def layered(self) -> bool:
        """Whether the manifest keeps the state apart (format 4 on); formats 1-3 share one level."""
        return _layered(self.manifest)

    @property
    def run(self) -> dict[str, Any]:
        """The run record: seed, split ids and the run's options (``config``), those it records."""
        m = self.manifest
        if _layered(m):
            return self._section("run")
        return {k: m[k] for k in RUN_KEYS if k in m}

    @property
    def state(self) -> dict[str, Any]:
        """The method's state: what its ``write`` returned, apart from the header and run record."""
        if _layered(self.manifest):
            return self._section("state")
        return {k: v for k, v in self.manifest.items() if k not in HEADER_KEYS and k not in RUN_KEYS}

    def _section(self, name: str) -> dict[str, Any]:
        value = self.manifest.get(name)
        if not isinstance(value, dict):
            raise ArtifactError(f"{self.path / MANIFEST}: {name!r} must be a JSON object")
        return value

    def file(self, name: str) -> Path:
        """The regular file ``name`` inside the artifact (never a link, never outside)."""
        p = self.path / _safe_name(name)
        try:
            st = os.lstat(p)
        except OSError:
            raise ArtifactError(f"{self.path}: {name} is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(f"{self.path}: {name} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ArtifactError(f"{self.path}: {name} is {st.st_size} bytes, more than an artifact may hold")
        return p

    def text(self, name: str) -> str:
        p = self.file(name)
        if p.stat().st_size > MAX_JSON_BYTES:
            raise ArtifactError(
                f"{self.path}: {name} is {p.stat().st_size} bytes, more than the "
                f"{MAX_JSON_BYTES} an artifact text file may hold"
            )
        try:
            return p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{p}: unreadable ({exc})") from exc

    def json(self, name: str) -> Any:
        try:
            # utf-8-sig: an editor may put a byte-order mark in front of a file it saves (tree.json);
            # the checksum still covers the bytes as they are
            return json.loads(self.text(name).removeprefix("\ufeff"))
        except (ValueError, RecursionError) as exc:  # ValueError: also an integer longer than int() reads
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


def _layered(manifest: dict[str, Any]) -> bool:
    """Whether ``manifest`` keeps the state and run record apart (format 4 on)."""
    version = manifest.get("format_version")
    return isinstance(version, int) and not isinstance(version, bool) and version >= 4


def _refuse_links(path: Path) -> None:
    """Refuse any symbolic link (or more entries than an artifact has) inside ``path``."""
    entries = (Path(root) / name for root, dirs, files in os.walk(path) for name in dirs + files)
    for n, full in enumerate(entries, 1):
        if n > MAX_ENTRIES:
            raise ArtifactError(f"{path}: more than {MAX_ENTRIES} files; not an artifact hdeval wrote")
        if full.is_symlink():
            raise ArtifactError(
                f"{path}: {full.relative_to(path).as_posix()} is a symbolic link; "
                "an artifact holds only regular files"
            )


def is_artifact(path: Path) -> bool:
    """Whether ``path`` is a real directory whose manifest says it is an hdeval artifact."""
    try:
        manifest = (
            ArtifactReader(path, {}, []).json(MANIFEST) if stat.S_ISDIR(os.lstat(path).st_mode) else None
        )
    except (OSError, ArtifactError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def save_artifact(
    fitted: Any,
    path: str | Path,
    llm: dict[str, Any],
    force: bool = False,
    check_state: Callable[[Any], Any] | None = None,
) -> Path:
    """Write ``fitted`` to ``path`` atomically. ``path`` may be new, an empty directory, or (with
    ``force``) an existing hdeval artifact holding nothing but what hdeval wrote there
    (:func:`foreign_entries`); any other directory is refused, ``force`` or not. The
    new artifact is written next to ``path`` and swapped in, so whenever the process stops,
    ``path`` holds either the old or the new artifact (see :func:`recover_artifact`). ``llm``: the
    manifest's LLM section (model, base_url without credentials, identity). ``check_state``: the
    state ``fitted.write`` returned -> the state to record, raising before anything is in place."""
    import numpy as np
    import pandas as pd
    import sklearn
    import skops

    path = Path(path)
    check_destination(path, force=force)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(path)
    tmp = path.with_name(f".{path.name}{NEW}{os.getpid()}")
    _remove_tree(tmp)  # (any of these removes nothing when there is nothing)
    tmp.mkdir()
    try:
        state = fitted.write(ArtifactWriter(tmp))
        if check_state is not None:
            state = check_state(state)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "hdeval_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "method": fitted.method,
            "method_args": fitted.method_args(),
            "task": fitted.task.to_dict(),
            "llm": llm,
            "versions": {
                "hdeval": __version__,
                "python": platform.python_version(),
                "scikit-learn": sklearn.__version__,
                "numpy": np.__version__,
                "pandas": pd.__version__,
                "skops": skops.__version__,
            },
            "state": state,
            "run": fitted.public_run(),
        }
        manifest["files"] = {
            p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        write_json(tmp / MANIFEST, manifest)
        if path.is_dir() and not is_artifact(path):  # an empty directory (checked above)
            path.rmdir()
        if not path.exists():
            os.replace(tmp, path)
        elif _exchange(tmp, path):
            _remove_tree(tmp)  # now the previous artifact
        else:
            aside = _aside(path)
            _remove_tree(aside)
            os.replace(path, aside)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(aside, path)  # put the previous artifact back
                raise
            _remove_tree(aside)
    finally:
        _remove_tree(tmp)
    return path


def check_destination(path: str | Path, force: bool = False) -> None:
    """Raise unless :meth:`Evaluator.save` may write ``path``; creates and deletes nothing of
    the user's. Call it before paying for a run: it also checks that the location is writable."""
    path = Path(path)
    full = Path(os.path.abspath(path))
    cwd = Path(os.getcwd())
    if full == full.parent or full == cwd or full in cwd.parents:
        raise ConfigError(
            f"refusing to write the artifact to {path}: it is the current directory or "
            "holds it; give a directory of its own, e.g. -o artifacts/NAME"
        )
    recover_artifact(path)
    if path.is_symlink():
        raise ConfigError(
            f"refusing to write the artifact to {path}: it is a symbolic link; give the real path"
        )
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"cannot write the artifact to {path}: it exists and is not a directory")
        if is_artifact(path):
            if not force:
                raise ConfigError(
                    f"{path} already holds an hdeval artifact: pass --force (in Python, "
                    "save(..., force=True)) to replace it, or choose another output directory"
                )
            foreign = foreign_entries(path)
            if foreign:
                more = f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else ""
                raise ConfigError(
                    f"refusing to replace the artifact in {path}: it also holds "
                    f"{', '.join(foreign[:SHOWN])}{more}, which hdeval did not write there and "
                    "replacing would delete; move them out, or choose another output directory"
                )
        elif any(path.iterdir()):
            raise ConfigError(
                f"refusing to write the artifact to {path}: it is a non-empty directory that "
                f"is not an hdeval artifact (no {MANIFEST} saying so); --force does not change "
                "that: choose a new directory"
            )
    check_writable(full.parent)


#: Entries tools drop into a folder they merely show: not the user's work, so --force may
#: replace an artifact holding them (they go with it).
TOOL_LITTER = frozenset({".DS_Store", ".ipynb_checkpoints", "Thumbs.db", "desktop.ini", "__pycache__"})


def foreign_entries(path: Path) -> list[str]:
    """What the artifact directory ``path`` holds besides what hdeval wrote there (the files its
    manifest lists, the manifest, ``report/``'s two files and :data:`TOOL_LITTER`), as paths inside it: replacing
    the artifact would delete them. A symbolic link is never hdeval's; a directory that holds
    none of hdeval's files is named once, not walked. At most ``MAX_ENTRIES`` are looked at."""
    try:
        listed = ArtifactReader(path, {}, []).json(MANIFEST).get("files")
    except (ArtifactError, AttributeError):
        listed = None
    known = {
        *(listed if isinstance(listed, dict) else ()),
        MANIFEST,
        *(f"{REPORT}/{n}" for n in REPORT_FILES),
    }
    folders = {"/".join(name.split("/")[:i]) for name in known for i in range(1, name.count("/") + 1)}
    found: list[str] = []
    seen = 0
    for root, dirs, files in os.walk(path):
        base = Path(root).relative_to(path).as_posix()
        for name in sorted(dirs) + sorted(files):
            seen += 1
            if seen > MAX_ENTRIES:
                return found + ["..."]
            rel = name if base == "." else f"{base}/{name}"
            full = Path(root) / name
            if name in TOOL_LITTER and not full.is_symlink():
                continue  # what a file browser or Jupyter leaves in any folder it shows
            if name in dirs and not full.is_symlink() and rel in folders:
                continue
            if name in files and not full.is_symlink() and rel in known:
                continue
            found.append(rel + ("/" if name in dirs else ""))
        dirs[:] = [d for d in dirs if (d if base == "." else f"{base}/{d}") in folders]
    return found


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
        raise ArtifactError(
            f"{path} was being replaced when a run stopped and the previous artifact "
            f"is in {aside}; cannot rename it back ({exc.strerror or exc}): do so by hand"
        ) from None


def _clean_leftovers(path: Path) -> None:
    """Remove what a killed ``save`` of ``path`` left next to it (only hdeval's own names)."""
    aside = _aside(path)
    if (
        path.is_dir()
        and aside.is_dir()
        and not aside.is_symlink()
        and (is_artifact(aside) or not any(aside.iterdir()))
    ):
        _remove_tree(aside)
    prefix = f".{path.name}{NEW}"
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for e in entries:
        pid = e.name[len(prefix) :]
        if (
            e.name.startswith(prefix)
            and pid.isdigit()
            and pid.isascii()
            and int(pid) != os.getpid()
            and e.is_dir(follow_symlinks=False)
            and not _alive(int(pid))
        ):
            _remove_tree(Path(e.path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, OSError):  # another user's process, or no such pid number
        pass
    return True


def _remove_tree(path: Path) -> None:
    """Delete a directory hdeval wrote, its manifest last (half-deleted, it is still recognised)."""
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
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
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


def open_artifact(path: str | Path, editable: tuple[str, ...] = ()) -> ArtifactReader:
    """Verify the manifest, format version and every file's checksum. A file in ``editable`` (a
    method's human-editable file, e.g. HD-Eval's tree.json) may differ from its checksum: that is a
    warning, and the method checks its structure itself."""
    path = Path(path)
    recover_artifact(path)
    if not path.is_dir():
        raise ArtifactError(f"{path} is not an artifact directory")
    _refuse_links(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{path} is not an hdeval artifact: {MANIFEST} is missing")
    reader = ArtifactReader(path, {}, [])
    manifest = reader.json(MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{mpath} is not an hdeval artifact manifest")
    version = manifest.get("format_version")
    if "format_version" not in manifest:
        raise ArtifactError(f"{mpath}: 'format_version' is missing")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        # "4" or 4.0 is an edited manifest, not one from a newer hdeval
        raise ArtifactError(f"{mpath}: 'format_version' must be a whole number, got {version!r}")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{path} was written by hdeval {manifest.get('hdeval_version', '?')} (artifact "
            f"format {version}); this hdeval {__version__} reads format {FORMAT_VERSION} or "
            "older: upgrade hdeval"
        )
    if _layered(manifest):  # format 4 on: the header, the run record and the state, nothing else
        files = _read_manifest(manifest, mpath).files
    else:  # formats 1 to 3, read as they always were
        files = _legacy_files(manifest, mpath)
    reader.manifest = manifest
    for name, digest in files.items():
        f = reader.file(name)  # a regular file, not a link, within the size bound
        if sha256_file(f) != digest:
            if name in editable:
                reader.warnings.append(
                    f"{name} was edited after training: its wording differs, so scores "
                    "may differ from the recorded metrics"
                )
                continue
            raise ArtifactError(
                f"{path}: {name} does not match its checksum in {MANIFEST} (modified or truncated)"
            )
    return reader


def _legacy_files(manifest: dict[str, Any], mpath: Path) -> dict[str, str]:
    """The checked ``files`` of a format 1-3 manifest (one level: header, run record and state)."""
    config = manifest.get("config", {})  # the run's options; methods read theirs from it
    if not isinstance(config, dict) or not isinstance(config.get("options", {}), dict):
        raise ArtifactError(
            f"{mpath}: {'config' if not isinstance(config, dict) else 'config.options'!r} is not an object"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        raise ArtifactError(f"{mpath}: 'files' must map at most {MAX_FILES} file names to checksums")
    for name, digest in files.items():
        if not isinstance(digest, str):
            raise ArtifactError(f"{mpath}: the checksum of {name} is not a string")
        try:
            _safe_name(name)
        except ArtifactError as exc:
            raise ArtifactError(f"{mpath}: {exc} (in 'files')") from None
    return files


def _read_manifest(manifest: dict[str, Any], mpath: Path) -> Manifest:
    """A format-4 manifest as :class:`~hdeval.artifact.manifest_file.Manifest`, or one
    ArtifactError line naming ``mpath`` and the first bad field."""
    try:
        return Manifest.model_validate(manifest)
    except ValidationError as exc:
        raise ArtifactError(f"{mpath}: {error_line(exc, manifest.get('format_version'))}") from None
