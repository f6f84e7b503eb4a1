"""Writing a benchmark: results.json, results.md and report.html (each atomically), the run
artifacts of --keep-artifacts, and the checks that nothing a user owns is overwritten."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any, Mapping, Sequence

from hdeval.benchmark.tables import benchmark_tables, render_markdown
from hdeval.core.errors import ConfigError
from hdeval.report import bench as page

FORMAT = "hdeval-benchmark"
FORMAT_VERSION = 1
RESULTS, TABLE, HTML = "results.json", "results.md", "report.html"
OUTPUTS = (RESULTS, TABLE, HTML)
RUNS = "runs"  # --keep-artifacts: each run's artifact in runs/<setting>-seed<k>/
MAX_RESULTS_BYTES = 64 << 20  # a results.json this big is not one this module wrote


def render_html(results: Mapping[str, Any]) -> str:
    """report.html: the page the reports' package draws around the tables results.md shows."""
    return page.render_html(results, *benchmark_tables(results))


def _results(path: Path) -> dict[str, Any] | None:
    """The results.json in ``path`` when this command wrote it (its format says so)."""
    f = path / RESULTS
    try:
        if f.is_symlink() or not f.is_file() or f.stat().st_size > MAX_RESULTS_BYTES:
            return None
        data = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


_ARTIFACT_ENTRY = re.compile(rf"{RUNS}/[A-Za-z0-9][A-Za-z0-9._+-]*")


def _previous_artifacts(path: Path) -> set[str]:
    """The ``runs/<name>`` a previous benchmark's results.json lists as written by it."""
    listed = (_results(path) or {}).get("artifacts")
    return (
        {a for a in listed if isinstance(a, str) and _ARTIFACT_ENTRY.fullmatch(a)}
        if isinstance(listed, list)
        else set()
    )


def check_output_dir(out: str | Path, force: bool = False, artifacts: Sequence[str] = ()) -> None:
    """Raise unless the benchmark may write ``out``: a new or empty directory, or (with
    ``force``) a previous benchmark's output, whose three files are replaced and nothing else
    touched. Any other non-empty directory is refused, ``force`` or not. ``artifacts``
    (--keep-artifacts): the ``runs/<name>`` directories to write; one that exists is replaced
    only when the previous benchmark's results.json lists it as its own and it is an artifact."""
    from hdeval.artifact.directory import check_destination, check_writable, is_artifact

    path = Path(out)
    if path.is_symlink():
        raise ConfigError(
            f"refusing to write the benchmark to {path}: it is a symbolic link; give the real path"
        )
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"cannot write the benchmark to {path}: it exists and is not a directory")
        if _results(path) is not None:
            if not force:
                raise ConfigError(
                    f"{path} already holds a benchmark ({RESULTS}): pass --force to replace "
                    "its results, or choose another output directory"
                )
        elif any(path.iterdir()):
            raise ConfigError(
                f"refusing to write the benchmark to {path}: it is a non-empty directory that is "
                f"not a benchmark output (no {RESULTS} of format {FORMAT}); --force does not "
                "change that: choose a new directory"
            )
        for name in OUTPUTS:
            if (path / name).is_symlink() or (path / name).is_dir():
                raise ConfigError(f"refusing to replace {path / name}: it is not a file this command wrote")
        runs = path / RUNS
        if artifacts and (runs.is_symlink() or (runs.exists() and not runs.is_dir())):
            raise ConfigError(
                f"refusing to write run artifacts into {runs}: it is not a directory this command wrote"
            )
        if artifacts and runs.is_dir():
            ours = _previous_artifacts(path)
            for name in artifacts:
                target = runs / name
                if target.exists() or target.is_symlink():
                    if f"{RUNS}/{name}" not in ours or target.is_symlink() or not is_artifact(target):
                        raise ConfigError(
                            f"refusing to replace {target}: the previous benchmark in {path} did "
                            "not write it; move it away or choose another output directory"
                        )
                    check_destination(target, force=True)
    check_writable(path if path.is_dir() else Path(os.path.abspath(path)).parent)


def write_benchmark(
    results: Mapping[str, Any],
    out: str | Path,
    force: bool = False,
    artifacts: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write results.json, results.md and report.html into ``out``, each atomically, after the
    ``artifacts`` (from :func:`run_benchmark`) are saved to ``runs/<name>``: results.json,
    written last, lists only complete artifacts."""
    names = list(artifacts or {})
    check_output_dir(out, force, names)
    path = Path(out)
    # the artifacts this directory holds from the benchmark: the new ones and any an earlier
    # sweep wrote and this one did not replace (so a later --force may replace them too)
    from hdeval.artifact.directory import is_artifact

    kept = sorted(
        {a for a in _previous_artifacts(path) if is_artifact(path / a)} | {f"{RUNS}/{n}" for n in names}
    )
    if kept:
        results = {**results, "artifacts": kept}
    texts = {
        RESULTS: json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
        TABLE: render_markdown(results),
        HTML: render_html(results),
    }
    written = []
    umask = os.umask(0)
    os.umask(umask)
    # what this write creates, taken back if it fails, so a rerun is not refused a directory
    # that holds artifacts its results.json does not list (replaced ones cannot be put back)
    fresh = not path.exists() or not any(path.iterdir())  # (check_output_dir: a directory if it exists)
    created: list[tuple[Any, Path]] = [] if path.exists() else [(Path.rmdir, path)]
    if not (path / RUNS).exists():
        created.append((Path.rmdir, path / RUNS))
    new = {n for n in names if not (path / RUNS / n).exists()}
    try:
        path.mkdir(parents=True, exist_ok=True)
        for name in names:
            written.append(artifacts[name].save(path / RUNS / name, force=True))  # type: ignore[index]
            if name in new:
                created.append((shutil.rmtree, path / RUNS / name))
        for name in (TABLE, HTML, RESULTS):  # results.json last: it marks the directory as ours
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path)
            try:
                os.fchmod(fd, 0o666 & ~umask)  # as an ordinary new file, not mkstemp's 0600
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(texts[name])
                os.replace(tmp, path / name)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written.append(path / name)
            if fresh:
                created.append((Path.unlink, path / name))
    except BaseException as exc:
        for undo, p in reversed(created):  # newest first; a directory only when empty (nobody else's)
            with suppress(OSError):
                undo(p)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write the benchmark to {path}: {exc.strerror or exc}") from None
        raise
    return written
