"""A section a method adds to its report page: a heading, how to read it, lines of text,
tables and plots, all as values the page escapes. The method builds them from its numbers; the
shared page draws them after its own sections without knowing what they are about."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class Table:
    head: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str | None = None
    text_cols: tuple[int, ...] = (0,)  # left-aligned, wrapping columns


@dataclass(frozen=True)
class Section:
    title: str
    how: str = ""
    lines: Sequence[str] = ()  # one paragraph each
    plots: Sequence[tuple[bytes, str]] = ()  # (PNG, alt text)
    tables: Sequence[Table] = field(default_factory=tuple)
    anchor: str = ""  # the heading's id, for links into the page
