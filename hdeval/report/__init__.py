"""What every report shares: jinja2 templates with autoescaping (``templates/``), one stylesheet,
the matplotlib helpers (:mod:`.plots`), the verdict banner (:mod:`.banner`) and the per-sample
view's read-only reply lookup (:mod:`.samples`). The method modules build numbers; this package
turns them into one self-contained page."""

from __future__ import annotations

import base64
import functools
import os
import re
from pathlib import Path
from typing import Any

from hdeval.core.errors import ConfigError

TEMPLATES = Path(__file__).parent / "templates"
# What `hdeval report` writes, and how it knows a file there as its own: report.json opens with
# this "format", report.html's head names this generator (base.html.j2, set by the report pages).
REPORT_FILES = ("report.html", "report.json")
REPORT_FORMAT = "hdeval-report"
_MARKS = {
    "report.html": re.compile(rb'<meta name="generator" content="hdeval report">'),
    "report.json": re.compile(rb'\A\{\s*"format":\s*"' + REPORT_FORMAT.encode() + rb'"'),
}


@functools.lru_cache(maxsize=1)
def _env() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        # Every value from an artifact, a sample or an LLM reply is untrusted: escape them all.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_num
    env.filters["datauri"] = lambda png: "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return env


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number for a table cell; "n/a" for missing (None, NaN, not a number)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x:  # x != x: NaN
        return "n/a"
    return f"{x:.{digits}f}"


def render(template: str, **context: Any) -> str:
    """One report page from ``templates/<template>`` (it extends ``base.html.j2``)."""
    return _env().get_template(template).render(**context)


def file_url(path: str | Path) -> str:
    """The report's location as a ``file://`` URL a terminal makes clickable."""
    return Path(path).resolve().as_uri()


def written_by_report(path: str | Path) -> bool:
    """Whether ``path`` (a report.html or report.json) is a file ``hdeval report`` wrote: its
    marker is in its first 4 KiB. A report.html without its own (written before it had one, or
    by a method plug-in's page) counts when the report.json beside it is hdeval's."""
    path = Path(path)
    mark = _MARKS.get(path.name)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if mark is not None and mark.search(head) is not None:
        return True
    return path.name == "report.html" and written_by_report(path.with_name("report.json"))


def check_report_output(out: str | Path, force: bool = False) -> None:
    """Raise a one-line ConfigError unless ``hdeval report`` may write its two files into
    ``out``: each is new, one it wrote before (:func:`written_by_report`), or ``force`` replaces
    it; and files can be written there (checked first: a report takes minutes to compute).
    Nothing is created."""
    from hdeval.artifact.directory import check_writable

    out = Path(out)
    if os.path.lexists(out) and not out.is_dir():
        raise ConfigError(f"cannot write the report to {out}: it exists and is not a directory")
    try:
        check_writable(out)
    except ConfigError as exc:
        raise ConfigError(f"cannot write the report to {out}: {str(exc).split(': ', 1)[-1]}") from None
    for name in REPORT_FILES:
        f = out / name
        if not force and os.path.lexists(f) and not written_by_report(f):
            raise ConfigError(
                f"refusing to replace {f}: hdeval report did not write it; pass --force to "
                "replace it, or choose another -o"
            )
        if os.path.isfile(f) and not os.access(f, os.W_OK):
            raise ConfigError(f"cannot write the report to {out}: {f} is read-only")
