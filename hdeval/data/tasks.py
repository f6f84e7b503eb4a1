"""Task files: which sample fields the prompts show and which aspects humans rated."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hdeval.core.errors import ConfigError
from hdeval.core.paths import resource_dir
from hdeval.core.types import Aspect, Task, TaskField

SAMPLE_FIELDS = ("source", "context", "output", "reference")
_TOP_KEYS = {
    "name",
    "description",
    "output_label",
    "data_file",
    "fields",
    "aspects",
    "shape",
    "where",
    "skip_empty",
    "own_regressor",
    "presets",
    "columns",
}
#: what a task's ``[columns]`` table may map (as ``hdeval data import``'s ``--*-col`` options)
COLUMN_KEYS = (*SAMPLE_FIELDS, "id", "doc_id", "system")
SHAPES = ("pointwise", "pairwise")
MAX_NAME = 100
# an aspect's scale ends, in absolute value: human rating scales are 1-5, 1-10 or 0-100; far past
# that, a score's arithmetic (spreads, intervals, squares) loses its precision or overflows
MAX_SCORE = 1e6
# A task name becomes part of file and directory names (artifacts/<name>-<kind>, <name>.jsonl):
# never a path separator, never "." or ".." or a hidden name.
_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}")


def builtin_tasks() -> dict[str, Path]:
    return {p.stem: p for p in sorted(resource_dir("tasks").glob("*.toml"))}


def load_task(name_or_path: str | Path) -> Task:
    """A built-in task by name (``summeval``) or a user's task file by path."""
    text = str(name_or_path)
    builtins = builtin_tasks()
    if text in builtins:
        return parse_task_file(builtins[text])
    path = Path(text)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"task file not found: {path}")
        task = parse_task_file(path)
        # A user's task finds its data_file (default <name>.jsonl) beside the task file
        # first, from any working directory; see hdeval.data.samples.data_candidates.
        return dataclasses.replace(task, source_dir=str(path.parent.resolve()))
    raise ConfigError(
        f"unknown task {text!r}: built-in tasks are {', '.join(builtins)}; "
        "or pass the path of a task .toml file"
    )


def parse_task_file(path: Path) -> Task:
    try:
        # utf-8-sig: an editor may put a byte-order mark in front
        raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read task file ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from exc
    return task_from_dict(raw, where=str(path))


def task_from_dict(raw: dict[str, Any], where: str) -> Task:
    """A task from a task file's (or an artifact manifest's) table; every value is type-checked,
    so a wrong one is a :class:`ConfigError` naming ``where`` and the field, never a crash later."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the task must be a table, got {_kind(raw)}")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")

    def text(d: dict, key: str, ctx: str, required: bool = True) -> str:
        """The text at ``key``; "" when it is optional and missing or blank."""
        value = d.get(key)
        if not required and (value is None or isinstance(value, str) and not value.strip()):
            return ""
        if not isinstance(value, str):
            what = "needs" if value is None else f"has {_kind(value)} as"
            raise ConfigError(f"{where}: {ctx} {what} {key!r}; it must be non-empty text")
        if not value.strip():
            raise ConfigError(f"{where}: {ctx} needs a non-empty {key!r}")
        lines_ok = key in ("definition", "description")  # prose: line ends and tabs are fine there
        bad = next((c for c in value if _control(c) and not (lines_ok and c in "\t\n\r")), None)
        if bad is not None:
            raise ConfigError(
                f"{where}: {ctx} {key!r} holds the control character {bad!r}; it must be plain text"
            )
        return value

    def tables(key: str, allowed: set[str]) -> list[dict]:
        value = raw.get(key)
        if not isinstance(value, list) or not value:
            got = "it is missing" if value is None else f"got {_kind(value)}"
            raise ConfigError(
                f"{where}: {key!r} must be a list of tables ([[{key}]] sections), at least one; {got}"
            )
        for i, t in enumerate(value, 1):
            if not isinstance(t, dict):
                raise ConfigError(f"{where}: {key} #{i} must be a table ([[{key}]]), got {_kind(t)} {t!r}")
            extra = set(t) - allowed
            if extra:
                raise ConfigError(
                    f"{where}: {key} #{i} has unknown key(s) {', '.join(sorted(map(str, extra)))}"
                )
        return value

    name = text(raw, "name", "the task")
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: task name {name!r} must be at most {MAX_NAME} letters, digits, '_', "
            "'.' or '-', starting with a letter, digit or '_' (it names files and directories)"
        )
    data_file = text(raw, "data_file", "the task", required=False) or f"{name}.jsonl"
    *folders, base = data_file.split("/")
    if not _NAME.fullmatch(base) or not all(_NAME.fullmatch(f) or f == ".." for f in folders):
        raise ConfigError(
            f"{where}: data_file {data_file!r} must be a file name, or a relative path with '/' "
            "from the task file's folder (looked up there, then by its name in HDEVAL_DATA_DIR "
            "and the user data dir)"
        )
    fields = []
    for i, f in enumerate(tables("fields", {"key", "label"}), 1):
        key = text(f, "key", f"fields #{i}")
        if key not in SAMPLE_FIELDS:
            raise ConfigError(
                f"{where}: fields #{i} key {key!r} is not a sample field ({', '.join(SAMPLE_FIELDS)})"
            )
        if key in {x.key for x in fields}:
            raise ConfigError(f"{where}: fields #{i}: field {key!r} is listed twice")
        fields.append(TaskField(key, text(f, "label", f"fields #{i}")))
    if "output" not in {f.key for f in fields}:
        raise ConfigError(f"{where}: fields must include the 'output' field (the text under evaluation)")
    aspects = []
    seen: set[str] = set()
    for i, a in enumerate(tables("aspects", {"key", "name", "definition", "range"}), 1):
        key = text(a, "key", f"aspects #{i}")
        if key in seen:
            raise ConfigError(f"{where}: aspect {key!r} is defined twice")
        if "/" in key or not key.strip():
            raise ConfigError(f"{where}: aspect key {key!r} must be a non-empty name without '/'")
        seen.add(key)
        rng = a.get("range")
        finite = isinstance(rng, list) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in rng
        )
        if not finite or len(rng) != 2 or rng[0] >= rng[1] or max(abs(rng[0]), abs(rng[1])) > MAX_SCORE:
            raise ConfigError(
                f"{where}: aspect {key!r} range must be [low, high], two numbers with low < high, "
                f"each between -{MAX_SCORE:g} and {MAX_SCORE:g}; got {rng!r}"
            )
        shown = text(a, "name", f"aspect {key!r}", required=False) or key.capitalize()
        aspects.append(
            Aspect(
                key=key,
                name=shown,
                definition=text(a, "definition", f"aspect {key!r}"),
                low=float(rng[0]),
                high=float(rng[1]),
            )
        )
    shape = raw.get("shape", "pointwise")
    if shape not in SHAPES:
        raise ConfigError(f"{where}: shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    skip_empty = raw.get("skip_empty", False)
    if not isinstance(skip_empty, bool):
        raise ConfigError(f"{where}: skip_empty must be true or false, got {skip_empty!r}")
    row_filter = parse_where(raw.get("where"), where)
    if shape == "pointwise" and (row_filter or skip_empty):
        raise ConfigError(f"{where}: 'where' and 'skip_empty' are supported for pairwise tasks only")
    keys = [a.key for a in aspects]
    own = _aspect_list(raw.get("own_regressor", []), keys, f"{where}: own_regressor", empty_ok=True)
    presets = parse_presets(raw.get("presets"), keys, where)
    columns = parse_columns(raw.get("columns"), keys, where)
    if columns and shape != "pointwise":
        raise ConfigError(f"{where}: 'columns' is supported for pointwise tasks only")
    return Task(
        name=name,
        description=text(raw, "description", "the task"),
        output_label=text(raw, "output_label", "the task", required=False) or "Output",
        fields=tuple(fields),
        aspects=tuple(aspects),
        data_file=data_file,
        shape=shape,
        where=row_filter,
        skip_empty=skip_empty,
        own_regressor=own,
        presets=presets,
        columns=columns,
    )


def parse_columns(raw: Any, aspects: list[str], where: str) -> tuple[tuple[str, str], ...]:
    """The ``[columns]`` table: ``source = "question"``, ..., ``scores = {clarity = "clear"}``:
    which column of the data file feeds which field (the field's own name when not given)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: 'columns' must be a table ([columns]), got {_kind(raw)}")
    out: list[tuple[str, str]] = []

    def column(value: Any, ctx: str) -> str:
        if not isinstance(value, str) or not value.strip() or "\x00" in value:
            raise ConfigError(f"{where}: columns: {ctx} must name a column (non-empty text), got {value!r}")
        return value

    for key, value in raw.items():
        if key == "scores":
            if not isinstance(value, dict):
                raise ConfigError(
                    f'{where}: columns.scores must be a table of ASPECT = "COLUMN", got {_kind(value)}'
                )
            for aspect, col in value.items():
                if aspect not in aspects:
                    raise ConfigError(
                        f"{where}: columns.scores: the task has no aspect {aspect!r} "
                        f"(aspects: {', '.join(aspects)})"
                    )
                out.append((f"scores.{aspect}", column(col, f"scores.{aspect}")))
        elif key in COLUMN_KEYS:
            out.append((key, column(value, key)))
        else:
            raise ConfigError(
                f"{where}: columns: unknown key {key!r} (keys: {', '.join(COLUMN_KEYS)}, scores)"
            )
    return tuple(out)


def _control(c: str) -> bool:
    """A control character (C0, DEL, C1) or a line or paragraph separator: never part of a name."""
    return unicodedata.category(c) in ("Cc", "Zl", "Zp")


def _aspect_list(value: Any, known: list[str], ctx: str, empty_ok: bool = False) -> tuple[str, ...]:
    """A list of distinct aspect keys of the task, or a ConfigError naming ``ctx``."""
    if (
        not isinstance(value, list)
        or not all(isinstance(v, str) for v in value)
        or (not value and not empty_ok)
    ):
        raise ConfigError(
            f"{ctx} must be a {'' if empty_ok else 'non-empty '}list of aspect keys, got {value!r}"
        )
    unknown = [v for v in value if v not in known]
    if unknown:
        raise ConfigError(
            f"{ctx} names unknown aspect(s) {', '.join(unknown)}: the task's aspects are {', '.join(known)}"
        )
    if len(set(value)) != len(value):
        raise ConfigError(f"{ctx} lists an aspect twice: {value!r}")
    return tuple(value)


def parse_presets(
    raw: Any, known: list[str], where: str
) -> tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]:
    """``[presets.NAME]`` tables: ``aspects`` (the aspects trained on) and ``own_regressor`` (those
    of them fitted alone, e.g. the paper's Topical-Chat groundedness)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: presets must be [presets.NAME] tables, got {_kind(raw)}")
    out = []
    for name, table in raw.items():
        ctx = f"{where}: presets.{name}"
        if not isinstance(table, dict):
            raise ConfigError(f"{ctx} must be a table, got {_kind(table)}")
        extra = set(table) - {"aspects", "own_regressor"}
        if extra:
            raise ConfigError(
                f"{ctx} has unknown key(s) {', '.join(sorted(map(str, extra)))} "
                "(a preset has aspects and own_regressor)"
            )
        aspects = _aspect_list(table.get("aspects"), known, f"{ctx}.aspects")
        own = _aspect_list(
            table.get("own_regressor", []), list(aspects), f"{ctx}.own_regressor", empty_ok=True
        )
        out.append((str(name), aspects, own))
    return tuple(out)


def apply_preset(task: Task, name: str) -> Task:
    """``--preset NAME``: the aspects (and own regressors) a task file's ``[presets.NAME]`` names."""
    known = {p[0]: p for p in task.presets}
    if name not in known:
        choices = f"known presets: {', '.join(known)}" if known else "it defines none"
        raise ConfigError(f"unknown preset {name!r} for task {task.name}: {choices}")
    _, aspects, own = known[name]
    return dataclasses.replace(select_aspects(task, aspects), own_regressor=own)


def parse_where(raw: Any, where: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """A ``where`` table, e.g. ``{ subset = "eli5" }`` or ``{ subset = ["a", "b"] }``: a row is
    kept when, for every key, its value (``meta.<key>``, else the top-level field) is one of
    the listed values."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f'{where}: where must be a non-empty table such as {{ subset = "eli5" }}')
    out = []
    for key, value in raw.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise ConfigError(
                f"{where}: where.{key} must be a string, number or boolean, or a non-empty list of them"
            )
        out.append((str(key), tuple(values)))
    return tuple(out)


def _kind(value: Any) -> str:
    """How a TOML value's type reads in a message."""
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "text",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def select_aspects(task: Task, aspects: Sequence[str] | None) -> Task:
    """``--aspects a,b``: train on a subset of the task's aspects."""
    if not aspects:
        return task
    unknown = [a for a in aspects if a not in task.aspect_keys]
    if unknown:
        raise ConfigError(
            f"unknown aspect(s) {', '.join(unknown)} for task {task.name}: "
            f"choose from {', '.join(task.aspect_keys)}"
        )
    keep = tuple(a for a in task.aspects if a.key in aspects)
    own = tuple(a for a in task.own_regressor if a in aspects)
    return dataclasses.replace(task, aspects=keep, own_regressor=own)
