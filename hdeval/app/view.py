"""``hdeval view``: the labelling app's server browsing results. It lists the artifacts under a
folder with their verdict banners and headline figures, opens each one's report and compares two
side by side. Offline (no LLM call) and read-only: a report is drawn into a folder of the
server's own, never into the artifact.

An artifact is untrusted: it is verified as ``apply`` verifies it, its text is escaped, a page
names artifacts only by their place in the listing (never a path from the request), and a report
page is served with a policy that allows no script at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hdeval.app.server import HERE, Guard, templates
from hdeval.core.errors import ConfigError, HdevalError

#: How deep under the folder artifacts are looked for, and how many are listed at most.
MAX_DEPTH, MAX_ARTIFACTS = 6, 500
#: A report page is self-contained (embedded images, inline style) and runs no script.
REPORT_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)


@dataclass
class Entry:
    """One artifact as the listing shows it."""

    name: str  # its path under the folder, the key pages name it by
    path: Path
    stamp: tuple[int, int]  # the manifest's mtime and size: a retrained artifact is read again
    method: str = ""
    task: str = ""
    llm: str = ""
    created: str = ""
    error: str | None = None  # why it cannot be read (then nothing below is set)
    summary: str = ""  # the evaluator's own one-line held-out figure
    banner: Any = None  # hdeval.report.banner.Banner, when the method draws one
    banner_note: str | None = None  # why there is none
    figures: dict[str, float | None] = field(default_factory=dict)
    reports: bool = False
    evaluator: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None


def find_artifacts(root: Path) -> tuple[list[Path], int]:
    """The first :data:`MAX_ARTIFACTS` artifact directories under ``root`` (itself included),
    sorted, and how many there are in all; links are not followed and an artifact's own folders
    are not searched."""
    from hdeval.artifact.directory import is_artifact

    found: list[Path] = []
    total = 0
    for here, dirs, _ in os.walk(root, followlinks=False):
        at = Path(here)
        if is_artifact(at):
            total += 1
            if len(found) < MAX_ARTIFACTS:
                found.append(at)
            dirs[:] = []
        elif len(at.relative_to(root).parts) >= MAX_DEPTH:
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found), total


def _stamp(path: Path) -> tuple[int, int]:
    from hdeval.artifact.directory import MANIFEST

    st = os.lstat(path / MANIFEST)
    return st.st_mtime_ns, st.st_size


def read_entry(root: Path, path: Path) -> Entry:
    """Load and verify one artifact; whatever is wrong with it is the entry's ``error`` line."""
    from hdeval.methods.base import Banners, Reports
    from hdeval.methods.registry import load_artifact

    name = path.relative_to(root).as_posix()
    entry = Entry(name, path, _stamp(path))
    try:
        ev = load_artifact(path)
    except HdevalError as exc:
        entry.error = str(exc)
        return entry
    except Exception as exc:  # an artifact is untrusted: one that breaks a reader is listed, not fatal
        entry.error = f"cannot read it: {type(exc).__name__}: {exc}"
        return entry
    from hdeval.artifact.directory import MANIFEST, ArtifactReader

    manifest = ArtifactReader(path, {}, []).json(MANIFEST)  # verified by the load above
    entry.evaluator = ev
    entry.method, entry.task, entry.llm = ev.method, ev.task.name, str(ev.llm_identity)
    entry.created = str(manifest.get("created") or "")[:40] if isinstance(manifest, dict) else ""
    entry.reports = isinstance(ev, Reports)
    try:
        entry.summary = ev.summary_line()
    except Exception as exc:  # metrics are checked on load, but a summary must not hide the rest
        entry.summary = f"(no summary: {exc})"
    if isinstance(ev, Banners):
        try:
            entry.banner = ev.banner()
            entry.figures = {
                str(k)[:120]: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                for k, v in ev.headline().items()
            }
        except HdevalError as exc:
            entry.banner_note = f"no banner: {exc}"
        except Exception as exc:  # untrusted figures the method's checks let through
            entry.banner_note = f"no banner: {type(exc).__name__}: {exc}"
    else:
        entry.banner_note = f"method {ev.method!r} draws no verdict banner; its summary is above"
    return entry


class Catalogue:
    """The artifacts under a folder, read again when one is added, removed or retrained."""

    def __init__(self, root: str | Path) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ConfigError(f"{root}: not a folder (hdeval view lists the artifacts under a folder)")
        self.root = root.resolve()
        self.shown = str(root)  # the folder as it was given, for the page's header
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self.total = 0  # artifacts under the folder at the last listing, those not listed included

    def entries(self) -> list[Entry]:
        """The listed artifacts: at most :data:`MAX_ARTIFACTS` (``total`` says how many there are)."""
        with self._lock:
            now: dict[str, Entry] = {}
            paths, self.total = find_artifacts(self.root)
            for path in paths:
                name = path.relative_to(self.root).as_posix()
                old = self._entries.get(name)
                try:
                    stamp = _stamp(path)
                except OSError:
                    continue  # removed while we looked
                now[name] = old if old is not None and old.stamp == stamp else read_entry(self.root, path)
            self._entries = now
            return list(now.values())

    def get(self, name: str | None) -> Entry | None:
        """The listed artifact called ``name`` (a key of the listing, never a path to open)."""
        if not name:
            return None
        return {e.name: e for e in self.entries()}.get(name)


class ReportPages:
    """Report pages drawn on demand into a temporary folder of the server's, one per artifact
    version, kept while the server runs."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hdeval-view-"))
        self._pages: dict[tuple[str, tuple[int, int]], Path] = {}
        self._lock = threading.Lock()  # one report at a time: each takes the cores for seconds

    def page(self, entry: Entry) -> Path:
        key = (entry.name, entry.stamp)
        with self._lock:
            if key not in self._pages:
                out = self.dir / f"{len(self._pages):04d}"
                html, _, _ = entry.evaluator.write_report(out)
                self._pages[key] = Path(html)
            return self._pages[key]

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def compared(a: Entry, b: Entry) -> list[tuple[str, float | None, float | None, float | None]]:
    """The headline figures of two artifacts, row by row: (label, a, b, b - a)."""
    rows = []
    for label in list(dict.fromkeys([*a.figures, *b.figures])):
        x, y = a.figures.get(label), b.figures.get(label)
        rows.append((label, x, y, None if x is None or y is None else y - x))
    return rows


def build_view_app(
    catalogue: Catalogue, reports: ReportPages, *, host: str, port: int, token: str | None
) -> Any:
    """The ASGI app: the listing, a report, two artifacts side by side; behind the labelling
    app's :class:`~hdeval.app.server.Guard` (token, Host check, security headers)."""
    env = templates()

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(root=catalogue.shown, **values), status)

    def index(request: Request) -> Response:
        entries = catalogue.entries()
        return page("view_list.html.j2", entries=entries, total=catalogue.total, limit=MAX_ARTIFACTS)

    def report(request: Request) -> Response:
        entry = catalogue.get(request.query_params.get("a"))
        if entry is None or not entry.ok:
            return page("view_missing.html.j2", status=404, what="no such artifact in this folder")
        if not entry.reports:
            return page(
                "view_missing.html.j2",
                what=f"{entry.name}: method {entry.method!r} writes no report; its numbers are in metrics.json",
            )
        try:
            html = reports.page(entry).read_text(encoding="utf-8")
        except HdevalError as exc:
            return page("view_missing.html.j2", what=f"{entry.name}: no report: {exc}")
        except Exception as exc:  # an untrusted artifact that breaks the report costs only its page
            return page("view_missing.html.j2", what=f"{entry.name}: no report: {type(exc).__name__}: {exc}")
        return HTMLResponse(html, headers={"Content-Security-Policy": REPORT_CSP})

    def compare(request: Request) -> Response:
        entries = catalogue.entries()
        by_name = {e.name: e for e in entries}
        a = by_name.get(request.query_params.get("a") or "")
        b = by_name.get(request.query_params.get("b") or "")
        pair = (a, b) if a is not None and b is not None and a.ok and b.ok else None
        return page(
            "view_compare.html.j2",
            entries=[e for e in entries if e.ok],
            a=a,
            b=b,
            rows=compared(*pair) if pair else [],
            same_task=pair is None or pair[0].task == pair[1].task,
        )

    routes = [
        Route("/", index),
        Route("/report", report),
        Route("/compare", compare),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Guard(Starlette(routes=routes), host=host, port=port, token=token)


@dataclass
class ViewApp:
    """A prepared ``hdeval view``: the catalogue, the report folder and the bound socket."""

    catalogue: Catalogue
    reports: ReportPages
    sock: Any
    host: str
    port: int
    token: str | None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        from hdeval.app.server import url_of

        return url_of(self.host, self.port, self.token)

    def asgi(self) -> Any:
        return build_view_app(self.catalogue, self.reports, host=self.host, port=self.port, token=self.token)

    def serve(self) -> None:
        import uvicorn

        config = uvicorn.Config(self.asgi(), log_level="warning", access_log=False, lifespan="off")
        uvicorn.Server(config).run(sockets=[self.sock])

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()


def prepare_view(root: str | Path, *, host: str, port: int) -> ViewApp:
    """Check the folder and bind the address (a one-line HdevalError when either is wrong)."""
    from hdeval.app.launch import bind
    from hdeval.app.server import needs_token, new_token

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    catalogue = Catalogue(root)
    sock = bind(host, port)
    reports = ReportPages()
    return ViewApp(
        catalogue,
        reports,
        sock,
        host,
        sock.getsockname()[1],
        new_token() if needs_token(host) else None,
        [sock.close, reports.close],
    )
