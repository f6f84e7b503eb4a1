"""Task files: which sample fields the prompts show and which aspects humans rated."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hdeval.errors import ConfigError
from hdeval.paths import resource_dir
from hdeval.types import Aspect, Task, TaskField

SAMPLE_FIELDS = ("source", "context", "output", "reference")
_TOP_KEYS = {"name", "description", "output_label", "data_file", "fields", "aspects"}


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
        # first, from any working directory; see hdeval.data.data_candidates.
        return replace(task, data_file=str(path.parent.resolve() / task.data_file))
    raise ConfigError(
        f"unknown task {text!r}: built-in tasks are {', '.join(builtins)}; "
        "or pass the path of a task .toml file"
    )


def parse_task_file(path: Path) -> Task:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read task file ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from exc
    return task_from_dict(raw, where=str(path))


def task_from_dict(raw: dict[str, Any], where: str) -> Task:
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")

    def need(d: dict, key: str, ctx: str) -> Any:
        if key not in d or d[key] in ("", None, []):
            raise ConfigError(f"{where}: {ctx} needs a non-empty {key!r}")
        return d[key]

    name = str(need(raw, "name", "the task"))
    fields = []
    for i, f in enumerate(need(raw, "fields", "the task"), 1):
        key = str(need(f, "key", f"fields #{i}"))
        if key not in SAMPLE_FIELDS:
            raise ConfigError(
                f"{where}: fields #{i} key {key!r} is not a sample field ({', '.join(SAMPLE_FIELDS)})"
            )
        fields.append(TaskField(key, str(need(f, "label", f"fields #{i}"))))
    if "output" not in {f.key for f in fields}:
        raise ConfigError(f"{where}: fields must include the 'output' field (the text under evaluation)")
    aspects = []
    seen: set[str] = set()
    for i, a in enumerate(need(raw, "aspects", "the task"), 1):
        key = str(need(a, "key", f"aspects #{i}"))
        if key in seen:
            raise ConfigError(f"{where}: aspect {key!r} is defined twice")
        if "/" in key or not key.strip():
            raise ConfigError(f"{where}: aspect key {key!r} must be a non-empty name without '/'")
        seen.add(key)
        rng = need(a, "range", f"aspect {key!r}")
        if (
            not isinstance(rng, list)
            or len(rng) != 2
            or not all(isinstance(x, (int, float)) for x in rng)
            or rng[0] >= rng[1]
        ):
            raise ConfigError(f"{where}: aspect {key!r} range must be [low, high] with low < high")
        aspects.append(
            Aspect(
                key=key,
                name=str(a.get("name") or key.capitalize()),
                definition=str(need(a, "definition", f"aspect {key!r}")),
                low=float(rng[0]),
                high=float(rng[1]),
            )
        )
    return Task(
        name=name,
        description=str(need(raw, "description", "the task")),
        output_label=str(raw.get("output_label") or "Output"),
        fields=tuple(fields),
        aspects=tuple(aspects),
        data_file=str(raw.get("data_file") or f"{name}.jsonl"),
    )


def select_aspects(task: Task, aspects: list[str] | None) -> Task:
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
    return Task(task.name, task.description, task.output_label, task.fields, keep, task.data_file)
