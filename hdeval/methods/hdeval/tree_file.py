"""A criteria tree given to ``hdeval train --tree`` (an artifact's ``tree.json`` format, plus
``locked``; docs/methods.md gives it): read as untrusted input, checked against the task. The
path may also be an artifact directory: its tree.json is taken."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdeval.core.errors import ConfigError, HdevalError
from hdeval.core.types import LONE_SURROGATE_PROBLEM, CriteriaTree, Criterion, Task, has_lone_surrogate

MAX_TREE_BYTES = 1 << 20
MAX_CRITERIA = 500
MAX_DEPTH = 6
MAX_NAME = 200
MAX_DEFINITION = 2000
FIELDS = ("key", "name", "definition", "parent", "layer", "locked")
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]{1,48}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class GivenTree:
    """The tree a run starts from, which of its criteria are locked, and where it came from."""

    tree: CriteriaTree
    locked: frozenset[str]
    source: str

    @property
    def depth(self) -> int:
        return max(c.layer for c in self.tree)

    def manifest(self) -> dict[str, Any]:
        """What the artifact records: the file, the criteria taken from it, the locked ones."""
        return {
            "file": self.source,
            "criteria": self.tree.keys,
            "locked": [k for k in self.tree.keys if k in self.locked],
        }


def read_tree(path: str | Path, task: Task) -> GivenTree:
    """Read and check a tree file (or an artifact directory's tree.json) for ``task``."""
    p = Path(path)
    if p.is_dir():
        return _from_artifact(p, task)
    where = str(p)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_TREE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the tree file ({exc.strerror or exc})") from None
    if len(raw) > MAX_TREE_BYTES:
        raise ConfigError(f"{where}: the tree file is larger than {MAX_TREE_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: the tree file is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{where}: not a criteria tree (JSON nested too deeply)") from None
    return parse_tree(data, task, where)


def _from_artifact(path: Path, task: Task) -> GivenTree:
    from hdeval.artifact.directory import open_artifact

    try:
        reader = open_artifact(path, editable=("tree.json",))
        if reader.method != "hdeval":
            raise ConfigError(
                f"{path}: a {reader.method!r} artifact has no criteria tree; --tree takes an "
                "HD-Eval artifact or a tree.json file"
            )
        data = reader.json("tree.json")
    except ConfigError:
        raise
    except HdevalError as exc:
        raise ConfigError(f"--tree {path}: {exc}") from None
    return parse_tree(data, task, str(path / "tree.json"))


def _text(value: Any, at: str, limit: int, control: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{at}: must be non-empty text")
    if len(value) > limit:
        raise ValueError(f"{at}: longer than {limit} characters")
    if control.search(value):
        raise ValueError(f"{at}: holds a control character")
    if has_lone_surrogate(value):
        raise ValueError(f"{at}: {LONE_SURROGATE_PROBLEM}")
    return value.strip()


def parse_tree(data: Any, task: Task, where: str) -> GivenTree:
    """Check parsed JSON; any problem is a one-line ConfigError naming ``where`` and the field."""
    try:
        return _parse(data, task, where)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _parse(data: Any, task: Task, where: str) -> GivenTree:
    if not isinstance(data, dict) or "criteria" not in data:
        raise ValueError('not a criteria tree: expected an object {"criteria": [...]}')
    extra = sorted(set(data) - {"criteria"})
    if extra:
        raise ValueError(f'unknown field {extra[0]!r} (a tree file holds only "criteria")')
    items = data["criteria"]
    if not isinstance(items, list) or not items:
        raise ValueError("criteria: must be a non-empty list")
    if len(items) > MAX_CRITERIA:
        raise ValueError(f"criteria: {len(items)} criteria, more than the {MAX_CRITERIA} a tree may hold")
    aspects = list(task.aspect_keys)
    out: list[Criterion] = []
    index: dict[str, Criterion] = {}
    locked: set[str] = set()
    for i, item in enumerate(items):
        at = f"criteria[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{at}: must be an object")
        unknown = [k for k in item if k not in FIELDS]
        if unknown:
            raise ValueError(f"{at}.{unknown[0]}: unknown field (known: {', '.join(FIELDS)})")
        for f in ("key", "name", "definition"):
            if f not in item:
                raise ValueError(f"{at}.{f}: missing")
        key = _text(item["key"], f"{at}.key", 200, _CONTROL)
        if key != item["key"]:
            raise ValueError(f"{at}.key: has leading or trailing spaces")
        name = _text(item["name"], f"{at}.name", MAX_NAME, _CONTROL)
        definition = _text(item["definition"], f"{at}.definition", MAX_DEFINITION, _CONTROL_BUT_LINES)
        if key in index:
            raise ValueError(f"{at}.key: {key!r} appears twice")
        parent_key = item.get("parent")
        if parent_key is None:
            layer = 1
            if key not in aspects:
                raise ValueError(
                    f"{at}.key: {key!r} has no parent but is not an aspect trained "
                    f"({', '.join(aspects)}): layer 1 holds exactly the aspects trained "
                    "(the task's, or those of --aspects)"
                )
        else:
            if not isinstance(parent_key, str) or parent_key not in index:
                raise ValueError(
                    f"{at}.parent: {parent_key!r} is not the key of a criterion listed before it"
                )
            layer = index[parent_key].layer + 1
            rest = key[len(parent_key) + 1 :] if key.startswith(parent_key + "/") else ""
            if not _SEGMENT.fullmatch(rest):
                raise ValueError(
                    f"{at}.key: {key!r} must be '{parent_key}/NAME' (NAME: up to 48 letters, "
                    "digits, '_', '-' or '.')"
                )
        if layer > MAX_DEPTH:
            raise ValueError(f"{at}: layer {layer} is deeper than the {MAX_DEPTH} layers a tree may have")
        given_layer = item.get("layer")
        if given_layer is not None and (
            not isinstance(given_layer, int) or isinstance(given_layer, bool) or given_layer != layer
        ):
            raise ValueError(f"{at}.layer: {given_layer!r}, but its parent puts it on layer {layer}")
        lock = item.get("locked", False)
        if not isinstance(lock, bool):
            raise ValueError(f"{at}.locked: must be true or false, not {lock!r}")
        c = Criterion(key, name, definition, parent_key, layer)
        index[key] = c
        out.append(c)
        if lock:
            locked.add(key)
    missing = [a for a in aspects if a not in index]
    if missing:
        raise ValueError(
            f"criteria: no criterion for aspect(s) {', '.join(missing)} of task {task.name}; "
            f"add them, or train on the aspects the tree has with --aspects"
        )
    return GivenTree(CriteriaTree(out), frozenset(locked), where)
