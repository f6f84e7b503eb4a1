"""A criteria tree given to ``hdeval train --tree`` (an artifact's ``tree.json`` format, plus
``locked``; docs/methods.md gives it): read as untrusted input, checked against the task. The
path may also be an artifact directory: its tree.json is taken."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from hdeval.core.errors import ArtifactError, ConfigError, HdevalError, shown_name, validation_line
from hdeval.core.types import LONE_SURROGATE_PROBLEM, CriteriaTree, Criterion, Task, has_lone_surrogate
from hdeval.data.tasks import DEFINITION_CONTROL, MAX_CRITERION_DEFINITION, MAX_CRITERION_NAME, NAME_CONTROL

MAX_TREE_BYTES = 1 << 20
MAX_CRITERIA = 500
MAX_DEPTH = 6
MAX_NAME = MAX_CRITERION_NAME  # a criterion's key or name: one line, so no control character
MAX_DEFINITION = MAX_CRITERION_DEFINITION
FIELDS = ("key", "name", "definition", "parent", "layer", "locked")
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]{1,48}")


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
        data = json.loads(raw.decode("utf-8-sig"))  # an editor may put a byte-order mark in front
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


def _text(limit: int, control: re.Pattern[str], edges: Literal["strip", "refuse", "keep"] = "strip"):
    """A bounded text field. ``edges``: leading and trailing spaces are stripped ("strip"),
    refused ("refuse", a key), or kept as written ("keep", a stored definition: the prompts apply
    sends must be the ones training sent)."""

    def check(value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("tree_text", "must be non-empty text")
        if len(value) > limit:
            raise PydanticCustomError("tree_text", "longer than {limit} characters", {"limit": limit})
        if control.search(value):
            raise PydanticCustomError("tree_text", "holds a control character")
        if has_lone_surrogate(value):  # no prompt (nor its cache key) can be encoded with it
            raise PydanticCustomError("tree_text", LONE_SURROGATE_PROBLEM)
        if edges == "refuse" and value != value.strip():
            raise PydanticCustomError("tree_text", "has leading or trailing spaces")
        return value if edges == "keep" else value.strip()

    return AfterValidator(check)


_Str = Annotated[str, Field(strict=True)]


class TreeCriterion(BaseModel):
    """One criterion of a tree file: its text bounded (the file is untrusted), where it hangs, and
    whether decomposition may expand it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    key: Annotated[_Str, _text(MAX_NAME, NAME_CONTROL, edges="refuse")]
    name: Annotated[_Str, _text(MAX_NAME, NAME_CONTROL)]
    definition: Annotated[_Str, _text(MAX_DEFINITION, DEFINITION_CONTROL)]
    parent: Optional[_Str] = None
    # optional: a criterion's layer follows from its parent; a given one must agree
    layer: Optional[int] = None
    locked: bool = False


class TreeFile(BaseModel):
    """A tree file: ``{"criteria": [...]}``, parents before their children."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    criteria: list[TreeCriterion] = Field(min_length=1, max_length=MAX_CRITERIA)


def parse_tree(data: Any, task: Task, where: str) -> GivenTree:
    """Check parsed JSON; any problem is a one-line ConfigError naming ``where`` and the field."""
    try:
        return _parse(data, task, where)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _problem(exc: ValidationError) -> str:
    """The first problem of the criterion listed first, in the tree file's words: unknown fields
    before wrong values, as a reader fixes them."""

    def rank(e: Any) -> tuple[int, int, str]:
        loc = e["loc"]
        item = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else -1
        top = str(loc[0]) if len(loc) == 1 else ""  # unknown top-level fields: the first by name
        return (item, 0 if e["type"] == "extra_forbidden" else 1, top)

    e = min(exc.errors(), key=rank)  # min keeps the first of equal rank: the order of the fields
    loc, kind, value = e["loc"], e["type"], e.get("input")
    if len(loc) == 1 and loc[0] != "criteria":
        return f'unknown field {loc[0]!r} (a tree file holds only "criteria")'
    if len(loc) == 1:
        if kind == "too_long":
            return f"criteria: {len(value)} criteria, more than the {MAX_CRITERIA} a tree may hold"
        return "criteria: must be a non-empty list"
    at = f"criteria[{loc[1]}]"
    if len(loc) == 2:
        return f"{at}: must be an object"
    field = f"{at}.{shown_name(loc[2])}"
    if kind == "extra_forbidden":
        return f"{field}: unknown field (known: {', '.join(FIELDS)})"
    if kind == "missing":
        return f"{field}: missing"
    if kind == "tree_text":
        return f"{field}: {e['msg']}"
    if loc[2] in ("key", "name", "definition"):
        return f"{field}: must be non-empty text"
    if loc[2] == "parent":
        return f"{field}: {value!r} is not the key of a criterion listed before it"
    if loc[2] == "locked":
        return f"{field}: must be true or false, not {value!r}"
    return f"{field}: must be a whole number, not {value!r}"


def _parse(data: Any, task: Task, where: str) -> GivenTree:
    if not isinstance(data, dict) or "criteria" not in data:
        raise ValueError('not a criteria tree: expected an object {"criteria": [...]}')
    try:
        given = TreeFile.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_problem(exc)) from None
    aspects = list(task.aspect_keys)
    out: list[Criterion] = []
    index: dict[str, Criterion] = {}
    locked: set[str] = set()
    for i, item in enumerate(given.criteria):
        at = f"criteria[{i}]"
        key = item.key
        if key in index:
            raise ValueError(f"{at}.key: {key!r} appears twice")
        parent_key = item.parent
        if parent_key is None:
            layer = 1
            if key not in aspects:
                raise ValueError(
                    f"{at}.key: {key!r} has no parent but is not an aspect trained "
                    f"({', '.join(aspects)}): layer 1 holds exactly the aspects trained "
                    "(the task's, or those of --aspects)"
                )
        else:
            if parent_key not in index:
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
        if item.layer is not None and item.layer != layer:
            raise ValueError(f"{at}.layer: {item.layer!r}, but its parent puts it on layer {layer}")
        c = Criterion(key, item.name, item.definition, parent_key, layer)
        index[key] = c
        out.append(c)
        if item.locked:
            locked.add(key)
    missing = [a for a in aspects if a not in index]
    if missing:
        raise ValueError(
            f"criteria: no criterion for aspect(s) {', '.join(missing)} of task {task.name}; "
            f"add them, or train on the aspects the tree has with --aspects"
        )
    return GivenTree(CriteriaTree(out), frozenset(locked), where)


class StoredCriterion(BaseModel):
    """A criterion of an artifact's tree.json as ``Criterion.to_dict`` writes it. Its names and
    definitions may be edited by hand; they are bounded as every writer of a tree bounds them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # bounded as a tree file's are: explain, report and the summary print them on one line
    key: Annotated[_Str, _text(MAX_NAME, NAME_CONTROL, edges="refuse")]
    # kept as written, as the definition: a task's aspect name may end in a space, and a name
    # stripped on reload would send apply's prompts (and cache keys) unlike training's
    name: Annotated[_Str, _text(MAX_NAME, NAME_CONTROL, edges="keep")]
    definition: Annotated[_Str, _text(MAX_DEFINITION, DEFINITION_CONTROL, edges="keep")]
    parent: Optional[str] = None
    layer: Annotated[int, Field(ge=1)]


class StoredTree(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    criteria: list[StoredCriterion] = Field(min_length=1)


def stored_tree(data: Any, where: str) -> CriteriaTree:
    """An artifact's tree.json; a wrong one is one ArtifactError line naming the file and field."""
    try:
        tree = StoredTree.model_validate(data)
    except ValidationError as exc:
        raise ArtifactError(f"{where}: {validation_line(exc)}") from None
    try:
        return CriteriaTree(Criterion(c.key, c.name, c.definition, c.parent, c.layer) for c in tree.criteria)
    except ValueError as exc:
        raise ArtifactError(f"{where}: {exc}") from None
