"""Criteria decomposition (paper 2.1, App. G.1): one criterion -> validated sub-criteria."""

from __future__ import annotations

import json
import re
from typing import Sequence

from hdeval.backends.base import Backend, CompletionRequest, Message
from hdeval.errors import DecompositionError
from hdeval.progress import Progress
from hdeval.prompts import Template, decomposition_messages
from hdeval.types import CriteriaTree, Criterion, Task

DECOMPOSE_MAX_TOKENS = 1024
ATTEMPTS = 3
_KEY_MAX = 24


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return s[:_KEY_MAX].rstrip("_")


def reply_schema(max_children: int) -> str:
    """The JSON schema of a decomposition reply (lets a local model's grammar enforce it)."""
    item = {
        "type": "object",
        "properties": {
            "key": {"type": "string", "maxLength": _KEY_MAX},
            "name": {"type": "string"},
            "definition": {"type": "string"},
        },
        "required": ["key", "name", "definition"],
    }
    schema = {
        "type": "object",
        "properties": {"subcriteria": {"type": "array", "items": item, "minItems": 1,
                                       "maxItems": max_children}},
        "required": ["subcriteria"],
    }
    return json.dumps(schema, sort_keys=True)


def decomposition_request(
    template: Template, task: Task, tree: CriteriaTree, criterion: Criterion, max_children: int
) -> CompletionRequest:
    return CompletionRequest(
        messages=decomposition_messages(template, task, tree, criterion, max_children),
        temperature=0.0,
        max_tokens=DECOMPOSE_MAX_TOKENS,
        json_mode=True,
        json_schema=reply_schema(max_children),
        kind="decompose",
    )


def parse_subcriteria(
    text: str, parent: Criterion, tree: CriteriaTree, max_children: int, taken: set[str]
) -> list[Criterion]:
    """Validate a reply; raise ValueError saying what is wrong (fed back to the LLM).

    Keys are made unique across the tree (a clashing key gets a number); a repeated
    sub-criterion (same name and definition) is kept once; more than ``max_children`` are
    cut to the first ``max_children``. ``taken`` holds keys already in use.
    """
    body = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fence:
        body = fence.group(1).strip()
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("the reply holds no JSON object")
    try:
        data = json.loads(body[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the reply is not valid JSON ({exc.msg})") from exc
    items = data.get("subcriteria") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError('"subcriteria" must be a non-empty list')
    out: list[Criterion] = []
    local: set[str] = set()
    seen_text: set[tuple[str, str]] = set()
    for i, item in enumerate(items, 1):
        if len(out) == max_children:
            break
        if not isinstance(item, dict):
            raise ValueError(f"sub-criterion #{i} is not an object")
        name = str(item.get("name") or "").strip()
        definition = str(item.get("definition") or "").strip()
        key = slug(str(item.get("key") or name))
        if not key or not name or not definition:
            raise ValueError(f"sub-criterion #{i} needs a non-empty key, name and definition")
        text = (name.lower(), definition.lower())
        if text in seen_text:
            continue  # the same criterion twice (small models repeat themselves): keep one
        seen_text.add(text)
        # A key clash between different criteria is only a naming problem: number it.
        base, n = key, 2
        while key in local or f"{parent.key}/{key}" in taken or f"{parent.key}/{key}" in tree:
            key = f"{base[: _KEY_MAX - 3]}_{n}"
            n += 1
        local.add(key)
        out.append(Criterion(f"{parent.key}/{key}", name, definition, parent.key, parent.layer + 1))
    return out


def decompose(
    backend: Backend,
    template: Template,
    task: Task,
    tree: CriteriaTree,
    criterion: Criterion,
    max_children: int,
    taken: set[str] | None = None,
    attempts: int = ATTEMPTS,
) -> list[Criterion]:
    """Ask for sub-criteria; a malformed reply is answered with what was wrong and asked
    again (a new, deterministic request, so it is cached too); then a clear error."""
    request = decomposition_request(template, task, tree, criterion, max_children)
    problem = ""
    for _ in range(attempts):
        completion = backend.complete(request)
        try:
            return parse_subcriteria(completion.text, criterion, tree, max_children, taken or set())
        except ValueError as exc:
            problem = str(exc)
            request = CompletionRequest(
                messages=request.messages
                + (
                    Message("assistant", completion.text),
                    Message(
                        "user",
                        f"That reply was not usable: {problem}. Reply again with only the JSON "
                        f"object, at most {max_children} sub-criteria, each with a unique key.",
                    ),
                ),
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                json_mode=request.json_mode,
                json_schema=request.json_schema,
                kind=request.kind,
            )
    raise DecompositionError(
        f"could not decompose criterion {criterion.key!r}: {attempts} replies were unusable "
        f"(last: {problem}); the replies are cached, so a rerun with the same LLM fails the same "
        "way: use a model that follows JSON instructions (--llm), or fewer --layers"
    )


def decompose_nodes(
    backend: Backend,
    template: Template,
    task: Task,
    tree: CriteriaTree,
    nodes: Sequence[Criterion],
    max_children: int,
    progress: Progress | None = None,
) -> CriteriaTree:
    """Decompose ``nodes`` in order and return the tree with their children added."""
    taken: set[str] = set(tree.keys)
    is_cached = getattr(backend, "is_cached", None)  # only a CachedBackend can tell
    for node in nodes:
        first = decomposition_request(template, task, tree, node, max_children)
        cached = bool(is_cached and is_cached(first))
        children = decompose(backend, template, task, tree, node, max_children, taken)
        taken.update(c.key for c in children)
        tree = tree.with_children(node.key, children)
        if progress is not None:
            progress.advance(1, cached=cached)
    return tree
