"""Criteria decomposition (paper 2.1, App. G.1): one criterion -> validated sub-criteria."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Sequence

from hdeval.core.errors import DecompositionError, RequestRejected
from hdeval.core.progress import Progress
from hdeval.core.types import LONE_SURROGATE_PROBLEM, CriteriaTree, Criterion, Task, has_lone_surrogate
from hdeval.data.tasks import DEFINITION_CONTROL, MAX_CRITERION_DEFINITION, MAX_CRITERION_NAME, NAME_CONTROL
from hdeval.judge.fill import UnusableReply, ask_json
from hdeval.judge.prompts import Template, decomposition_messages
from hdeval.llm.backends.base import Backend, CompletionRequest

DECOMPOSE_MAX_TOKENS = 1024
ATTEMPTS = 3
_KEY_MAX = 24
# Schema bounds: a weak model looping inside a string ("a 1-5 scale, and a 1-5 scale, ...")
# is cut at these lengths by a server that constrains decoding, long before the token limit.
_NAME_MAX = 80
_DEFINITION_MAX = 300
# A sub-criterion that talks about the rating scale instead of a quality ("a 1-5 scale",
# "on a scale of 1 to 10", "Likert"): rubric boilerplate a weak model copies from the prompt.
_SCALE = re.compile(
    r"\b\d+\s*(?:-|\u2013|to|/)\s*\d+\s*(?:-?\s*points?\s*)?(?:scale|rating|score)"
    r"|\bscale\s+(?:of|from)\s+\d|\blikert\b",
    re.I,
)
# The same three words three times over: a model looping inside one string.
_LOOP_WORDS, _LOOP_REPEATS = 3, 3


class DegenerateCriteria(ValueError):
    """A reply's sub-criteria parse but are not usable criteria (a copy of the parent, a
    near-duplicate sibling, rubric boilerplate): the LLM is asked again."""


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
        "properties": {
            "subcriteria": {"type": "array", "items": item, "minItems": 1, "maxItems": max_children}
        },
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
        data={"criterion": criterion.key, "criterion_name": criterion.name, "max_children": max_children},
    )


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def _boilerplate(text: str) -> str | None:
    """Why ``text`` is not a quality but rubric boilerplate, or None."""
    if _SCALE.search(text):
        return "describes the rating scale, not a quality"
    words = _norm(text).split()
    grams = Counter(tuple(words[i : i + _LOOP_WORDS]) for i in range(len(words) - _LOOP_WORDS + 1))
    gram, n = grams.most_common(1)[0] if grams else ((), 0)
    if n >= _LOOP_REPEATS:
        return f"repeats the phrase {' '.join(gram)!r} {n} times"
    return None


def quality_problem(
    name: str,
    definition: str,
    parent: Criterion,
    tree: CriteriaTree,
    siblings: Sequence[tuple[str, str, str]],
) -> str | None:
    """Why a sub-criterion is degenerate (it repeats its parent, shares a sibling's name or
    definition, or is rubric boilerplate), or None if it is usable.

    ``siblings``: (name, normalised name, normalised definition) of the ones accepted before it."""
    n_name, n_def = _norm(name), _norm(definition)
    lineage = ([parent] + tree.ancestors(parent.key)) if parent.key in tree else [parent]
    for up in lineage:
        last = up.key.rsplit("/", 1)[-1]
        # the name, not the key: "clarity" under "coherence/clarity" may be named "clarity of wording"
        if n_name in (_norm(up.name), _norm(last.replace("_", " "))):
            return f"repeats its parent {up.key!r} (same name)"
        if n_def == _norm(up.definition):
            return f"repeats its parent {up.key!r} (same definition)"
    for other, o_name, o_def in siblings:
        if n_name == o_name:
            return f"has the same name as sibling {other!r}"
        if n_def == o_def:
            return f"has the same definition as sibling {other!r}"
    why = _boilerplate(name) or _boilerplate(definition)
    return f"is rubric boilerplate: it {why}" if why else None


def validate_subcriteria(
    data: Any, parent: Criterion, tree: CriteriaTree, max_children: int, taken: set[str]
) -> list[Criterion]:
    """Validate a parsed reply; raise ValueError saying what is wrong (fed back to the LLM).

    Keys are made unique across the tree (a clashing key gets a number); a repeated
    sub-criterion (same name and definition) is kept once; more than ``max_children`` are
    cut to the first ``max_children``. ``taken`` holds keys already in use. Raises
    :class:`DegenerateCriteria` (a ``ValueError``) naming every sub-criterion that repeats
    its parent, duplicates a sibling or is rubric boilerplate: the reply is re-asked."""
    items = data.get("subcriteria") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError('"subcriteria" must be a non-empty list')
    out: list[Criterion] = []
    local: set[str] = set()
    seen_text: set[tuple[str, str]] = set()
    accepted: list[tuple[str, str, str]] = []
    rejected: list[str] = []
    for i, item in enumerate(items, 1):
        if len(out) == max_children:
            break
        if not isinstance(item, dict):
            raise ValueError(f"sub-criterion #{i} is not an object")
        name = str(item.get("name") or "").strip()
        definition = str(item.get("definition") or "").strip()
        given = str(item.get("key") or name)
        key = slug(given)
        missing = [field for field, value in (("name", name), ("definition", definition)) if not value]
        if missing:
            raise ValueError(f"sub-criterion #{i} needs a non-empty {' and '.join(missing)}")
        if not key:
            raise ValueError(
                f"sub-criterion #{i}: its key {given[:40]!r} holds no letter or digit to "
                "make a key of; give a key of letters, digits and underscores"
            )
        # refused as a malformed reply, not rewritten: tree.json (reloaded) bounds names so
        if len(name) > MAX_CRITERION_NAME:
            raise ValueError(f"sub-criterion #{i}: its name is longer than {MAX_CRITERION_NAME} characters")
        if NAME_CONTROL.search(name):
            raise ValueError(f"sub-criterion #{i}: its name holds a control character (a name is one line)")
        if len(definition) > MAX_CRITERION_DEFINITION:
            raise ValueError(
                f"sub-criterion #{i}: its definition is longer than {MAX_CRITERION_DEFINITION} characters"
            )
        if DEFINITION_CONTROL.search(definition):
            raise ValueError(f"sub-criterion #{i}: its definition holds a control character")
        if has_lone_surrogate(name + definition):
            raise ValueError(f"sub-criterion #{i} {LONE_SURROGATE_PROBLEM}")
        text = (name.lower(), definition.lower())
        if text in seen_text:
            continue  # the same criterion twice (small models repeat themselves): keep one
        seen_text.add(text)
        why = quality_problem(name, definition, parent, tree, accepted)
        if why:
            rejected.append(f"sub-criterion #{i} {name[:60]!r} {why}")
            continue
        accepted.append((name, _norm(name), _norm(definition)))
        # A key clash between different criteria is only a naming problem: number it.
        base, n = key, 2
        while key in local or f"{parent.key}/{key}" in taken or f"{parent.key}/{key}" in tree:
            key = f"{base[: _KEY_MAX - 3]}_{n}"
            n += 1
        local.add(key)
        out.append(Criterion(f"{parent.key}/{key}", name, definition, parent.key, parent.layer + 1))
    if rejected:
        raise DegenerateCriteria("; ".join(rejected))
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
    rejections: list[dict[str, Any]] | None = None,
) -> list[Criterion]:
    """Ask for sub-criteria through :func:`hdeval.judge.fill.ask_json`: a malformed reply is answered
    with what was wrong and asked again (a new, deterministic request, so it is cached too); a
    rerun re-asks replies that were cached malformed; then a clear error.

    Degenerate sub-criteria (:func:`quality_problem`) are re-asked the same way; each rejection
    is appended to ``rejections``. When the last reply is still degenerate, the criterion is left
    unexpanded: an empty list (a weak model's garbage is never scored, and the run keeps what it
    paid for). That outcome is final: a rerun replays the cached chain to the same empty list
    and asks nothing (a degenerate reply was judged, not lost)."""
    request = decomposition_request(template, task, tree, criterion, max_children)
    used = set(taken or set())
    last: list[BaseException] = []

    def validate(data: Any) -> list[Criterion]:
        try:
            return validate_subcriteria(data, criterion, tree, max_children, set(used))
        except ValueError as exc:
            last[:] = [exc]
            if isinstance(exc, DegenerateCriteria) and rejections is not None:
                entry = {"criterion": criterion.key, "rejected": str(exc)}
                if entry not in rejections:  # a rerun walks past the same cached reply again
                    rejections.append(entry)
            raise

    def feedback(problem: str) -> str:
        ask = (
            f"That reply was not usable: {problem}. Reply again with only the JSON object, at most "
            f"{max_children} sub-criteria, each with a unique key."
        )
        if last and isinstance(last[0], DegenerateCriteria) and problem == str(last[0]):
            ask += (
                f" Each sub-criterion must be a different, narrower quality of {criterion.name!r}: not "
                f"{criterion.name!r} itself, not a copy of another, and not a description of the rating scale."
            )
        return ask

    try:
        return ask_json(
            backend,
            request,
            validate,
            feedback,
            attempts,
            final=lambda exc: isinstance(exc, DegenerateCriteria),
        )
    except RequestRejected as exc:
        raise DecompositionError(
            f"could not decompose criterion {criterion.key!r}: {' '.join(str(exc).split())[:300]}"
        ) from None
    except UnusableReply as exc:
        # only when the last reply parsed but was degenerate (malformed JSON fails before validate)
        if last and isinstance(last[0], DegenerateCriteria) and exc.problem == str(last[0]):
            return []  # the caller warns and records it: the node stays a leaf
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
    rejections: list[dict[str, Any]] | None = None,
) -> CriteriaTree:
    """Decompose ``nodes`` in order and return the tree with their children added.

    ``rejections`` collects every degenerate reply (see :func:`decompose`); a node whose replies
    all stayed degenerate gets an entry with ``"unexpanded": True`` and a warning line."""
    from hdeval.llm.request_files import export_first_requests

    # while exporting (train --export-requests): each node's first request depends only on its
    # ancestors, so all are known now and are written as one stage
    export_first_requests(
        backend, [decomposition_request(template, task, tree, n, max_children) for n in nodes]
    )
    taken: set[str] = set(tree.keys)
    found: list[dict[str, Any]] = [] if rejections is None else rejections
    for node in nodes:
        calls = getattr(getattr(backend, "stats", None), "calls", None)  # only a CachedBackend counts
        mark = len(found)
        children = decompose(backend, template, task, tree, node, max_children, taken, rejections=found)
        # cached: no call made (a cached reply that failed validation was asked again)
        cached = isinstance(calls, int) and backend.stats.calls == calls
        if not children:
            why = found[-1]["rejected"] if len(found) > mark else "no usable sub-criteria"
            found.append({"criterion": node.key, "unexpanded": True, "attempts": ATTEMPTS})
            if progress is not None:
                progress.message(
                    f"warning: criterion {node.key!r} left unexpanded: {ATTEMPTS} decomposition replies were "
                    f"degenerate (last: {why[:300]}); see decomposition_rejections in the manifest"
                )
        taken.update(c.key for c in children)
        tree = tree.with_children(node.key, children)
        if progress is not None:
            progress.advance(1, cached=cached)
    return tree
