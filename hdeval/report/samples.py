"""The per-sample view: the held-out samples the evaluator got most wrong, with their criterion
scores and, when the training data and the LLM reply cache are at hand, the LLM's raw reply to
each criterion prompt. The cache is opened read-only: a report never writes to it."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Samples shown in the per-sample view.
TOP_SAMPLES = 10
#: Characters of a reply or a sample field shown; the rest is cut (a report stays readable).
MAX_REPLY_CHARS = 600
MAX_FIELD_CHARS = 1200


def clip(text: Any, limit: int) -> str:
    t = text if isinstance(text, str) else ("" if text is None else str(text))
    return t if len(t) <= limit else t[: limit - 1] + "…"


@dataclass
class Replies:
    """Raw replies found for (sample id, criterion) and why some are not shown."""

    texts: dict[tuple[str, str], str] = field(default_factory=dict)
    note: str | None = None


def read_only_lookup(cache_dir: str | Path, keys: Sequence[str]) -> tuple[dict[str, str], str | None]:
    """Raw reply text per cache key, read without opening the cache (the value files through its
    own bounded reader). A missing or unreadable cache is a note, not an error: the rest of the
    report does not need it."""
    from hdeval.core.errors import CacheError
    from hdeval.llm.cache.codec import (
        MAX_ENTRY_CHARS,
        UnreadableEntry,
        parse_completion,
        read_value,
        table_value,
    )
    from hdeval.llm.cache.guard import DBNAME, TABLE_DBNAME, read_only
    from hdeval.llm.cache.store import TABLE_LOOKUP, stored_key

    directory = Path(cache_dir)
    # the reply table first (where replies are written), then diskcache's rows (older caches)
    dbs = [directory / name for name in (TABLE_DBNAME, DBNAME) if (directory / name).is_file()]
    if not dbs:
        return (
            {},
            f"the LLM reply cache {directory} is not available, so raw replies are not shown "
            "(give the cache the run used with --cache-dir)",
        )
    out: dict[str, str] = {}
    for db in dbs:
        try:
            with read_only(db, "raw replies are not shown", leave_no_files=True) as (con, _, readable):
                for key in [k for k in dict.fromkeys(keys) if k not in out] if readable else ():
                    try:
                        if db.name == TABLE_DBNAME:
                            row = con.execute(TABLE_LOOKUP, (MAX_ENTRY_CHARS, stored_key(key))).fetchone()
                            text = None if row is None else table_value(*row)
                        else:  # the compact key, or the hex text older caches hold
                            sql = "SELECT mode, filename, value FROM Cache WHERE key IN (?, ?) AND raw = 1"
                            row = con.execute(sql, (stored_key(key), key)).fetchone()
                            text = None if row is None else read_value(directory, *row)
                        if text is not None:
                            out[key] = parse_completion(text).text or ""
                    except (UnreadableEntry, ValueError, TypeError):
                        continue
        except CacheError as exc:
            return out, str(exc)
        except sqlite3.Error as exc:
            return out, f"the LLM reply cache {db} could not be read ({exc}): some raw replies are not shown"
    return out, None


def data_path(ev: Any, given: str | Path | None) -> Path | None:
    """The data file the replies are rebuilt from: the one given, else the training data the
    manifest names (``--data`` as the run was given it, else ``data_file``, the file the run
    found from the task), if it is still there."""
    if given:
        return Path(given)
    config = _recorded(ev, "config")
    for data in (config.get("data") if isinstance(config, Mapping) else None, _recorded(ev, "data_file")):
        if isinstance(data, str) and data and os.path.isfile(data):
            return Path(data)
    return None


def _recorded(ev: Any, key: str) -> Any:
    """A top-level entry of the manifest (the evaluator's run record or copy, else manifest.json)."""
    for attr in ("run", "manifest_data", "manifest_extra"):
        value = (getattr(ev, attr, None) or {}).get(key)
        if value is not None:
            return value
    path = Path(ev.path) / "manifest.json" if getattr(ev, "path", None) else None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8-sig")) if path else None
    except (OSError, ValueError):
        manifest = None
    return manifest.get(key) if isinstance(manifest, dict) else None


def check_data(path: str | Path, task: Any) -> None:
    """A data file given for the per-sample view (``report --data``), read through once as
    :func:`score_replies` reads it: one that cannot be read (missing, not the task's rows, not
    UTF-8) is the reader's one-line DataError, before the report computes anything (a file the
    report found by itself is only a note on the page)."""
    from hdeval.data.samples import iter_task_chunks

    for _chunk in iter_task_chunks(path, task, require_labels=False, labels_file=True):
        pass


def score_replies(
    ev: Any,
    wanted: Sequence[str],
    columns: Sequence[str],
    data: Path | None,
    cache_dir: str | Path | None,
    noun: str = "samples",
) -> tuple[Replies, dict[str, Any]]:
    """The raw replies behind the ``columns`` of the ``wanted`` ids (see :func:`replies`), and
    the samples or pairs read (for their text), a chunk at a time (validated as training reads
    them) and stopping once all are found: a report does not hold a large file."""
    from hdeval.data.samples import iter_task_chunks

    if data is None:
        return Replies(
            note=f"the training data file is not available, so the {noun}' text and the raw "
            "replies are not shown (give it with --data)"
        ), {}
    want, items = set(wanted), {}
    try:
        for chunk in iter_task_chunks(data, ev.task, require_labels=False, labels_file=True):
            items.update((s.id, s) for s in chunk if s.id in want)
            if len(items) == len(want):
                break
    except Exception as exc:  # noqa: BLE001 - an unreadable file only costs this view its text
        return Replies(
            note=f"{data} could not be read ({str(exc)[:200]}): the {noun}' text and raw replies "
            "are not shown"
        ), {}
    return replies(ev, [items[i] for i in wanted if i in items], columns, cache_dir), items


def replies(ev: Any, items: Sequence[Any], columns: Sequence[str], cache_dir: str | Path | None) -> Replies:
    """The LLM's cached replies to the prompts the evaluator says it asked about ``items``
    (``ev.reply_requests``: the method rebuilds its own requests, so this page knows none),
    keyed as it says, e.g. (sample id, criterion) or (``<pair>#a``, criterion)."""
    from hdeval.core.paths import default_cache_dir
    from hdeval.llm.cache.client import request_key
    from hdeval.llm.config import keyed_identity

    requests, note = ev.reply_requests(items, columns)
    if note is not None:
        return Replies(note=note)
    # the training run's cache keys: the artifact's identity, plus the query of a base URL the
    # caller set on ``ev.llm`` (``hdeval report --base-url``), in memory only
    identity = keyed_identity(ev.llm_identity, getattr(getattr(ev, "llm", None), "base_url", None))
    keyed = {request_key(identity, req): where for where, req in requests}
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    found, note = read_only_lookup(cache, list(keyed))
    texts = {keyed[k]: clip(t, MAX_REPLY_CHARS) for k, t in found.items()}
    if note is None and keyed and not texts:
        note = (
            f"none of these prompts' replies is in the LLM reply cache {cache} (another cache, "
            "or another prompt version): raw replies are not shown"
        )
    return Replies(texts, note)
