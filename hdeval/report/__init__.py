"""What every report shares: jinja2 templates with autoescaping (``templates/``), one stylesheet,
the matplotlib helpers (:mod:`.plots`), the verdict banner (:mod:`.banner`) and the per-sample
view's read-only reply lookup (:mod:`.samples`). The method modules build numbers; this package
turns them into one self-contained page."""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "templates"


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
