"""Criteria decomposition (paper 2.1, App. G.1): one criterion -> validated sub-criteria."""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from hdeval.backends.base import Backend, CompletionRequest
from hdeval.errors import DecompositionError, RequestRejected
from hdeval.judge import UnusableReply, ask_json, extract_json
from hdeval.progress import Progress
from hdeval.prompts import Template, decomposition_messages
from hdeval.types import LONE_SURROGATE_PROBLEM, CriteriaTree, Criterion, Task, has_lone_surrogate

DECOMPOSE_MAX_TOKENS = 1024
ATTEMPTS = 3
_KEY_MAX = 24
# Schema bounds: a weak model looping inside a string ("a 1-5 scale, and a 1-5 scale, ...")
# is cut at these lengths by a server that constrains decoding, long before the token limit.
_NAME_MAX = 80
_DEFINITION_MAX = 300
# how many cached replies that failed validation one attempt walks past before asking anew


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return s[:_KEY_MAX].rstrip("_")


def reply_schema(max_children: int) -> str:
    """The JSON schema of a decomposition reply: a local model's grammar enforces it, and
    OpenAI-compatible servers get it as ``response_format`` ``json_schema``. String lengths and
    the item count are bounded so a constrained model cannot loop up to the token limit."""
    item = {
        "type": "object",
        "properties": {
            "key": {"type": "string", "maxLength": _KEY_MAX},
            "name": {"type": "string", "maxLength": _NAME_MAX},
            "definition": {"type": "string", "maxLength": _DEFINITION_MAX},
        },
        "required": ["key", "name", "definition"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {"subcriteria": {"type": "array", "items": item, "minItems": 1,
                                       "maxItems": max_children}},
        "required": ["subcriteria"],
        "additionalProperties": False,
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
    return validate_subcriteria(extract_json(text), parent, tree, max_children, taken)


def validate_subcriteria(
    data: Any, parent: Criterion, tree: CriteriaTree, max_children: int, taken: set[str]
) -> list[Criterion]:
    """:func:`parse_subcriteria` on an already parsed JSON reply."""
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
        if has_lone_surrogate(name + definition):
            raise ValueError(f"sub-criterion #{i} {LONE_SURROGATE_PROBLEM}")
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
    """Ask for sub-criteria through :func:`hdeval.judge.ask_json`: a malformed reply is answered
    with what was wrong and asked again (a new, deterministic request, so it is cached too); a
    rerun re-asks replies that were cached invalid; then a clear error."""
    request = decomposition_request(template, task, tree, criterion, max_children)
    used = set(taken or set())
    try:
        return ask_json(
            backend, request,
            lambda data: validate_subcriteria(data, criterion, tree, max_children, set(used)),
            lambda problem: (f"That reply was not usable: {problem}. Reply again with only the JSON "
                             f"object, at most {max_children} sub-criteria, each with a unique key."),
            attempts,
        )
    except RequestRejected as exc:
        raise DecompositionError(
            f"could not decompose criterion {criterion.key!r}: {' '.join(str(exc).split())[:300]}"
        ) from None
    except UnusableReply as exc:
        raise DecompositionError(
            f"could not decompose criterion {criterion.key!r}: {exc.attempts} replies were unusable "
            f"(last: {exc.problem}); the replies are kept in the cache for inspection and a rerun asks "
            "again: use a model that follows JSON instructions (--llm), or fewer --layers"
        ) from None


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
    from hdeval.request_files import export_first_requests

    # while exporting (train --export-requests): each node's first request depends only on its
    # ancestors, so all are known now and are written as one stage
    export_first_requests(backend, [decomposition_request(template, task, tree, n, max_children) for n in nodes])
    taken: set[str] = set(tree.keys)
    is_cached = getattr(backend, "is_cached", None)  # only a CachedBackend can tell
    for node in nodes:
        first = decomposition_request(template, task, tree, node, max_children)
        cached = bool(is_cached and is_cached(first))
        stats = getattr(backend, "stats", None)
        calls = getattr(stats, "calls", None)
        children = decompose(backend, template, task, tree, node, max_children, taken)
        if isinstance(calls, int):
            cached = stats.calls == calls  # a cached reply that failed validation was asked again
        taken.update(c.key for c in children)
        tree = tree.with_children(node.key, children)
        if progress is not None:
            progress.advance(1, cached=cached)
    return tree
