"""Task files: which sample fields the prompts show and which aspects humans rated."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Any, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hdeval.core.errors import ConfigError, shown_name, validation_line
from hdeval.core.paths import resource_dir
from hdeval.core.types import Aspect, Task, TaskField

MAX_NAME = 100
MAX_CRITERION_NAME = 200  # a criterion's key or name (as tree files and tree.json bound them)
# a criterion's definition: every writer of a tree (task, tree file, decomposition) keeps to it,
# so tree.json, which bounds it on reload, never refuses a tree hdeval wrote. Far above a real
# rubric (the longest shipped is 182 characters; a decomposition's reply is capped at 1,024
# tokens), so no task or artifact written before the bound is refused, yet no megabyte prompt
MAX_CRITERION_DEFINITION = 20_000
# The control characters a tree (tree file, decomposition reply, tree.json) refuses. A task file
# is stricter (C1 controls and U+2028/9 too, task_file.py): trees keep to C0 and DEL so that no
# tree.json written before is refused. A criterion's key or name is one line: no control character
NAME_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# a definition's: none but tab and line ends (CR LF too: a task's or a decomposition reply's),
# the same in a tree file as in tree.json, so --tree takes any artifact's tree.json
DEFINITION_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# an aspect's scale ends, in absolute value: human rating scales are 1-5, 1-10 or 0-100; far past
# that, a score's arithmetic (spreads, intervals, squares) loses its precision or overflows
MAX_SCORE = 1e6
# A task name becomes part of file and directory names (artifacts/<name>-<kind>, <name>.jsonl):
# never a path separator, never "." or ".." or a hidden name.
#: Column names of an artifact's score table that an aspect key must not take.
RESERVED_KEYS = ("sample_id", "pair_id", "split", "human")
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
    """A task from a task file's (or an artifact manifest's) table, validated by the
    :class:`~hdeval.data.task_file.TaskFile` model; a wrong value is a :class:`ConfigError`
    naming ``where`` and the field, never a crash later."""
    # pydantic is imported when a task is read: importing this module stays cheap
    from pydantic import ValidationError

    from hdeval.data.task_file import SAMPLE_FIELDS, TaskFile

    try:
        model = TaskFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problem(exc, raw)}") from None
    name = model.name
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: task name {name!r} must be at most {MAX_NAME} letters, digits, '_', "
            "'.' or '-', starting with a letter, digit or '_' (it names files and directories)"
        )
    data_file = model.data_file or f"{name}.jsonl"
    *folders, base = data_file.split("/")
    if not _NAME.fullmatch(base) or not all(_NAME.fullmatch(f) or f == ".." for f in folders):
        raise ConfigError(
            f"{where}: data_file {data_file!r} must be a file name, or a relative path with '/' "
            "from the task file's folder (looked up there, then by its name in HDEVAL_DATA_DIR "
            "and the user data dir)"
        )
    fields: list[TaskField] = []
    for i, f in enumerate(model.fields, 1):
        if f.key not in SAMPLE_FIELDS:
            raise ConfigError(
                f"{where}: fields #{i} key {f.key!r} is not a sample field ({', '.join(SAMPLE_FIELDS)})"
            )
        if f.key in {x.key for x in fields}:
            raise ConfigError(f"{where}: fields #{i}: field {f.key!r} is listed twice")
        fields.append(TaskField(f.key, f.label))
    if "output" not in {f.key for f in fields}:
        raise ConfigError(f"{where}: fields must include the 'output' field (the text under evaluation)")
    aspects: list[Aspect] = []
    for a, given in zip(model.aspects, raw["aspects"]):
        if a.key in {x.key for x in aspects}:
            raise ConfigError(f"{where}: aspect {a.key!r} is defined twice")
        if "/" in a.key:
            raise ConfigError(f"{where}: aspect key {a.key!r} must be a non-empty name without '/'")
        if a.key != a.key.strip():  # a tree's keys have none (tree.json refuses them on reload)
            raise ConfigError(f"{where}: aspect key {a.key!r} has leading or trailing spaces")
        if ":" in a.key or a.key in RESERVED_KEYS:
            # scores.csv's columns: sample_id, split, pair_id, human:<aspect>, <criterion>:a, judge:criterion
            raise ConfigError(
                f"{where}: aspect key {a.key!r} is taken: an aspect key holds no ':' and is none of "
                f'{", ".join(RESERVED_KEYS)}; rename it (key = "...")'
            )
        for field, text in (("key", a.key), ("name", a.name)):
            # an aspect is a tree's first-layer criterion: its text must pass the tree's bounds on reload
            if text is not None and len(text) > MAX_CRITERION_NAME:
                raise ConfigError(
                    f"{where}: aspect {a.key[:40]!r}: {field} is longer than {MAX_CRITERION_NAME} characters"
                )
        if len(a.definition) > MAX_CRITERION_DEFINITION:
            raise ConfigError(
                f"{where}: aspect {a.key[:40]!r}: definition is longer than {MAX_CRITERION_DEFINITION} characters"
            )
        rng = a.range
        if not _range_ok(rng):
            raise ConfigError(f"{where}: {_range_problem(a.key, given['range'])}")
        aspects.append(
            Aspect(
                key=a.key, name=a.name or a.key.capitalize(), definition=a.definition, low=rng[0], high=rng[1]
            )
        )
    row_filter = tuple(
        (key, tuple(value if isinstance(value, list) else [value]))
        for key, value in (model.where or {}).items()
    )
    for key, values in row_filter:
        for value in values:
            # NaN equals nothing (itself included), and no JSON value is inf: such a filter can never match
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(
                    f"{where}: where.{shown_name(key)} = {value!r} can never match a row: use a finite number"
                )
    if model.shape == "pointwise" and (row_filter or model.skip_empty):
        raise ConfigError(f"{where}: 'where' and 'skip_empty' are supported for pairwise tasks only")
    keys = [a.key for a in aspects]
    own = _aspect_list(model.own_regressor, keys, f"{where}: own_regressor", empty_ok=True)
    presets = []
    for preset, table in (model.presets or {}).items():
        ctx = f"{where}: presets.{preset}"
        chosen = _aspect_list(table.aspects, keys, f"{ctx}.aspects")
        solo = _aspect_list(table.own_regressor, list(chosen), f"{ctx}.own_regressor", empty_ok=True)
        presets.append((preset, chosen, solo))
    columns = _columns(model.columns, raw.get("columns") or {}, keys, where)
    if columns and model.shape != "pointwise":
        raise ConfigError(f"{where}: 'columns' is supported for pointwise tasks only")
    return Task(
        name=name,
        description=model.description,
        output_label=model.output_label or "Output",
        fields=tuple(fields),
        aspects=tuple(aspects),
        data_file=data_file,
        shape=model.shape,
        where=row_filter,
        skip_empty=model.skip_empty,
        own_regressor=own,
        presets=tuple(presets),
        columns=columns,
    )


def _range_ok(rng: Any) -> bool:
    numbers = isinstance(rng, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in rng
    )
    return numbers and len(rng) == 2 and rng[0] < rng[1] and max(abs(rng[0]), abs(rng[1])) <= MAX_SCORE


def _range_problem(key: Any, rng: Any) -> str:
    return (
        f"aspect {key!r} range must be [low, high], two numbers with low < high, "
        f"each between -{MAX_SCORE:g} and {MAX_SCORE:g}; got {rng!r}"
    )


def _columns(model: Any, raw: dict, aspects: list[str], where: str) -> tuple[tuple[str, str], ...]:
    """The ``[columns]`` pairs, in the file's order: (field, column), a score as ``scores.ASPECT``."""
    if model is None:
        return ()
    out: list[tuple[str, str]] = []
    for key in raw:
        if getattr(model, key) is None:
            # an explicit null (an artifact manifest is JSON): the model reads it as "not given"
            what = 'a table of ASPECT = "COLUMN"' if key == "scores" else "a column (non-empty text)"
            raise ConfigError(f"{where}: columns: {key} must name {what}, got None")
        if key != "scores":
            out.append((key, getattr(model, key)))
            continue
        for aspect, col in model.scores.items():
            if aspect not in aspects:
                raise ConfigError(
                    f"{where}: columns.scores: the task has no aspect {aspect!r} (aspects: {', '.join(aspects)})"
                )
            out.append((f"scores.{aspect}", col))
    return tuple(out)


def parse_columns(raw: Any, aspects: list[str], where: str) -> tuple[tuple[str, str], ...]:
    """The ``[columns]`` table: ``source = "question"``, ..., ``scores = {clarity = "clear"}``:
    which column of the data file feeds which field (the field's own name when not given)."""
    from pydantic import ValidationError

    from hdeval.data.task_file import ColumnsTable

    if raw is None:
        return ()
    try:
        model = ColumnsTable.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problem(exc, {'columns': raw}, ('columns',))}") from None
    return _columns(model, raw, aspects, where)


def _problem(exc: Any, raw: Any, prefix: tuple = ()) -> str:
    """The first problem of a :class:`TaskFile` ``ValidationError`` in the words of a task file's
    messages, without the file: unknown keys first (with a close known key, if any), then the first
    wrong value, named by its table (``fields #2``, ``aspect 'clarity'``, ``presets.NAME``) and key."""
    from hdeval.data import task_file as tf

    errors = [{**e, "loc": prefix + tuple(e["loc"])} for e in exc.errors()]
    extras = [e for e in errors if e["type"] == "extra_forbidden"]
    if extras:
        parent = extras[0]["loc"][:-1]
        unknown = sorted(str(e["loc"][-1]) for e in extras if e["loc"][:-1] == parent)
        return _unknown(parent, unknown)
    e = errors[0]
    loc, kind, value = e["loc"], e["type"], e.get("input")
    top = loc[0] if loc else None
    if not loc:
        return f"the task must be a table, got {_kind(raw)}"
    if top in ("fields", "aspects"):
        if len(loc) == 1:
            got = "it is missing" if kind == "missing" else f"got {_kind(value)}"
            return f"{top!r} must be a list of tables ([[{top}]] sections), at least one; {got}"
        i = int(loc[1])
        if len(loc) == 2:
            return f"{top} #{i + 1} must be a table ([[{top}]]), got {_kind(value)} {value!r}"
        table = raw[top][i]
        if loc[2] == "range":
            return _range_problem(table.get("key"), table.get("range"))
        ctx = f"aspect {table.get('key')!r}" if top == "aspects" and loc[2] != "key" else f"{top} #{i + 1}"
        return _text_problem(ctx, str(loc[2]), e)
    if top in ("name", "description", "output_label", "data_file"):
        return _text_problem("the task", top, e)
    if top == "shape":
        return f"shape must be one of {', '.join(tf.SHAPES)}, got {value!r}"
    if top == "skip_empty":
        return f"skip_empty must be true or false, got {value!r}"
    if top == "where":
        if len(loc) == 1:
            return 'where must be a non-empty table such as { subset = "eli5" }'
        return f"where.{shown_name(loc[1])} must be a string, number or boolean, or a non-empty list of them"
    if top == "own_regressor":
        return f"own_regressor must be a list of aspect keys, got {raw.get('own_regressor')!r}"
    if top == "presets":
        presets = raw.get("presets")
        if len(loc) == 1:
            return f"presets must be [presets.NAME] tables, got {_kind(presets)}"
        if len(loc) == 2:
            return f"presets.{shown_name(loc[1])} must be a table, got {_kind(value)}"
        keys = "list of aspect keys" if loc[2] == "own_regressor" else "non-empty list of aspect keys"
        return f"presets.{shown_name(loc[1])}.{loc[2]} must be a {keys}, got {presets[loc[1]].get(loc[2])!r}"
    if top == "columns":
        if len(loc) == 1:
            return f"'columns' must be a table ([columns]), got {_kind(value)}"
        if loc[1] == "scores" and len(loc) == 2:
            return f'columns.scores must be a table of ASPECT = "COLUMN", got {_kind(value)}'
        name = f"scores.{loc[2]}" if loc[1] == "scores" else loc[1]
        return f"columns: {name} must name a column (non-empty text), got {value!r}"
    return validation_line(exc)


def _text_problem(ctx: str, key: str, error: dict) -> str:
    kind = error["type"]
    if kind == "missing":
        return f"{ctx} needs {key!r}; it must be non-empty text"
    if kind == "text_blank":
        return f"{ctx} needs a non-empty {key!r}"
    if kind == "text_control":
        return f"{ctx} {key!r} holds the control character {error['ctx']['char']!r}; it must be plain text"
    return f"{ctx} has {_kind(error.get('input'))} as {key!r}; it must be non-empty text"


def _unknown(parent: tuple, keys: list[str]) -> str:
    """Unknown keys of the table at ``parent``, with the known key closest to the first, if any."""
    import difflib

    from hdeval.data import task_file as tf

    table = parent[0] if parent else ""
    keys = [shown_name(k) for k in keys]  # a key of the file cannot add a line to the message
    known = {
        "": tf.TOP_KEYS,
        "fields": tuple(tf.FieldTable.model_fields),
        "aspects": tuple(tf.AspectTable.model_fields),
        "presets": tuple(tf.PresetTable.model_fields),
        "columns": (*tf.COLUMN_KEYS, "scores"),
    }[table]
    close = difflib.get_close_matches(keys[0], known, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(keys)
    if table == "":
        return f"unknown key(s) {listed}{hint}"
    if table == "columns":
        return f"columns: unknown key {keys[0]!r} (keys: {', '.join(known)}){hint}"
    if table == "presets":
        return f"presets.{shown_name(parent[1])} has unknown key(s) {listed} (a preset has aspects and own_regressor){hint}"
    return f"{table} #{parent[1] + 1} has unknown key(s) {listed}{hint}"


def _aspect_list(value: list[str], known: list[str], ctx: str, empty_ok: bool = False) -> tuple[str, ...]:
    """A list of distinct aspect keys of the task, or a ConfigError naming ``ctx``."""
    if not value and not empty_ok:
        raise ConfigError(f"{ctx} must be a non-empty list of aspect keys, got {value!r}")
    unknown = [v for v in value if v not in known]
    if unknown:
        raise ConfigError(
            f"{ctx} names unknown aspect(s) {', '.join(unknown)}: the task's aspects are {', '.join(known)}"
        )
    if len(set(value)) != len(value):
        raise ConfigError(f"{ctx} lists an aspect twice: {value!r}")
    return tuple(value)


def apply_preset(task: Task, name: str) -> Task:
    """``--preset NAME``: the aspects (and own regressors) a task file's ``[presets.NAME]`` names."""
    known = {p[0]: p for p in task.presets}
    if name not in known:
        choices = f"known presets: {', '.join(known)}" if known else "it defines none"
        raise ConfigError(f"unknown preset {name!r} for task {task.name}: {choices}")
    _, aspects, own = known[name]
    return dataclasses.replace(select_aspects(task, aspects), own_regressor=own)


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
