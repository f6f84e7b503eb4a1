"""Criteria decomposition (paper 2.1, App. G.1): one criterion -> validated sub-criteria."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

from hdeval.backends.base import Backend, Completion, CompletionRequest, Message
from hdeval.errors import DecompositionError, RequestRejected
from hdeval.progress import Progress
from hdeval.prompts import Template, decomposition_messages
from hdeval.types import CriteriaTree, Criterion, Task

DECOMPOSE_MAX_TOKENS = 1024
ATTEMPTS = 3
_KEY_MAX = 24
# Schema bounds: a weak model looping inside a string ("a 1-5 scale, and a 1-5 scale, ...")
# is cut at these lengths by a server that constrains decoding, long before the token limit.
_NAME_MAX = 80
_DEFINITION_MAX = 300
# how many cached replies that failed validation one attempt walks past before asking anew
_MAX_REASKS = 50


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
    again (a new, deterministic request, so it is cached too); then a clear error.

    A reply that failed validation stays cached (for inspection) but is not the last word:
    when every attempt of the chain failed and some replies came from the cache (a rerun),
    the chain runs once more asking anew wherever it meets a cached invalid reply (the same
    request under the next ``attempt`` number: the LLM sees the same prompt). So a rerun after
    a fix (another model, a server that now constrains its output) can succeed, and a chain
    that recovered through feedback replays from the cache at no cost."""
    problem = ""
    for reask in (False, True):
        request = decomposition_request(template, task, tree, criterion, max_children)
        from_cache = False
        for _ in range(attempts):
            try:
                completion = _ask(backend, request, criterion, tree, max_children, taken or set(), reask)
            except RequestRejected as exc:
                raise DecompositionError(
                    f"could not decompose criterion {criterion.key!r}: {' '.join(str(exc).split())[:300]}"
                ) from None
            from_cache = from_cache or completion.cached
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
        if not from_cache:
            break
    raise DecompositionError(
        f"could not decompose criterion {criterion.key!r}: {attempts} replies were unusable "
        f"(last: {problem}); the replies are kept in the cache for inspection and a rerun asks "
        "again: use a model that follows JSON instructions (--llm), or fewer --layers"
    )


def _ask(
    backend: Backend, request: CompletionRequest, criterion: Criterion, tree: CriteriaTree,
    max_children: int, taken: set[str], reask: bool,
) -> Completion:
    """The reply to ``request``; with ``reask``, the first one under an ``attempt`` number
    that is either fresh from the LLM or cached and valid (cached invalid ones are walked past)."""
    completion = backend.complete(request)
    for n in range(1, _MAX_REASKS + 1):
        if not reask or not completion.cached:
            return completion
        try:
            parse_subcriteria(completion.text, criterion, tree, max_children, set(taken))
            return completion
        except ValueError:
            completion = backend.complete(dataclasses.replace(request, attempt=n))
    return completion


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
