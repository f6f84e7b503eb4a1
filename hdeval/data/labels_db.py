"""Reading ``labels.db``, the labels file ``hdeval label`` writes (:mod:`hdeval.app.labels` writes
it): its task record, its rows, and the labelled samples they make, in the sample format ``train``
reads. Here, below the data readers, so ``train --data labels.db`` (and every reader of samples)
takes the labels file itself as ``hdeval data export-labels`` would write it out.

A pairwise task's label is one choice per pair, kept under the aspect ``label`` as a number: +1 A
is better, 0 a tie, -1 B is better.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdeval.core.errors import DataError

FORMAT = 1
# a pair's choice, as stored (the sign convention of hdeval.learn.selection)
PAIR_ASPECT = "label"
PAIR_VALUES = {"a": 1.0, "tie": 0.0, "b": -1.0}
PAIR_CHOICES = {v: k for k, v in PAIR_VALUES.items()}
COLUMNS = (
    "seq",
    "sample_id",
    "content_hash",
    "aspect",
    "action",
    "value",
    "rater",
    "time",
    "session",
    "note",
    "strategy",
    "reason",
)
SQLITE_MAGIC = b"SQLite format 3\x00"


def is_labels_file(path: str | Path) -> bool:
    """Whether ``path`` is a SQLite file (what a labels file is; a data file never is)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class Rating:
    """The latest label of one (sample, aspect, rater)."""

    sample_id: str
    content_hash: str
    aspect: str
    value: float
    rater: str
    seq: int


def current_ratings(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Rating]:
    latest: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for r in rows:
        if r["action"] in ("label", "undo"):
            latest[(r["sample_id"], r["aspect"], r["rater"])] = r
    return {
        k: Rating(r["sample_id"], r["content_hash"], r["aspect"], r["value"], r["rater"], r["seq"])
        for k, r in latest.items()
        if r["action"] == "label"
    }


def json_or_none(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def read_meta(path: str | Path) -> dict[str, Any]:
    """The task record of a labels file, read without opening it for writing."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such labels file")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise DataError(f"{path} is not an hdeval labels file ({exc})") from None
    task = json_or_none(meta.get("task"))
    if meta.get("format") != str(FORMAT) or not isinstance(task, dict):
        raise DataError(f"{path} is not an hdeval labels file of format {FORMAT}")
    return task


def read_rows(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every row and the stored contents, read only."""
    con = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        rows = [
            dict(zip(COLUMNS, r))
            for r in con.execute(f"SELECT {', '.join(COLUMNS)} FROM labels ORDER BY seq")
        ]
        contents = {h: json.loads(c) for h, c in con.execute("SELECT content_hash, content FROM samples")}
    finally:
        con.close()
    return rows, contents


def majority_choice(values: Iterable[float]) -> float:
    """The raters' choice on one pair (+1 A, 0 tie, -1 B): the most frequent; when two choices are
    equally frequent (one person says A, another B), a tie (0)."""
    counts = Counter(values)
    top = max(counts.values())
    best = [v for v, n in counts.items() if n == top]
    return best[0] if len(best) == 1 else 0.0


def labelled_samples(
    rows: Iterable[Mapping[str, Any]], contents: Mapping[str, Mapping[str, Any]], pairwise: bool = False
) -> list[dict[str, Any]]:
    """One sample row per labelled content, in the sample format ``train`` reads: the content the
    raters saw and ``scores``, each aspect's mean over the raters' standing labels (the tie rule
    for scores), with ``raters`` the number of people behind them, and ``selection``: the strategy
    that first showed it to a rater, when the app picked it (``hdeval estimate`` refuses labels
    an active strategy picked, which are no random sample). ``pairwise``: the pair format,
    ``label`` the majority of the raters' choices (:func:`majority_choice`)."""
    rows = list(rows)
    picked: dict[str, str] = {}
    for r in sorted((r for r in rows if r["action"] == "label"), key=lambda r: r["seq"]):
        if isinstance(r.get("strategy"), str) and r["strategy"] != "second rating":
            picked.setdefault(r["content_hash"], r["strategy"])
    by_content: dict[str, dict[str, list[float]]] = {}
    raters: dict[str, set[str]] = {}
    first: dict[str, int] = {}
    for g in current_ratings(rows).values():
        by_content.setdefault(g.content_hash, {}).setdefault(g.aspect, []).append(g.value)
        raters.setdefault(g.content_hash, set()).add(g.rater)
        first[g.content_hash] = min(first.get(g.content_hash, g.seq), g.seq)
    out = []
    for h in sorted(by_content, key=first.__getitem__):
        row = dict(contents[h])
        if pairwise:
            row["label"] = PAIR_CHOICES[majority_choice(by_content[h].get(PAIR_ASPECT, []))]
        else:
            row["scores"] = {a: statistics.fmean(v) for a, v in sorted(by_content[h].items())}
        row["raters"] = len(raters[h])
        if h in picked:
            row["selection"] = picked[h]
        out.append(row)
    return out


def labelled_rows(path: str | Path, name: str, shape: str) -> list[dict[str, Any]]:
    """The labelled samples of the labels file ``path`` for the task called ``name`` of
    ``shape``, exactly as ``hdeval data export-labels`` writes them; a one-line DataError for a
    file that is no labels file or holds another task's labels."""
    task = read_meta(path)
    if task.get("name") != name or task.get("shape", "pointwise") != shape:
        raise DataError(
            f"{path} holds labels for task {task.get('name')!r} ({task.get('shape', 'pointwise')}), "
            f"not {name!r} ({shape})"
        )
    rows, contents = read_rows(path)
    return labelled_samples(rows, contents, pairwise=shape == "pairwise")
