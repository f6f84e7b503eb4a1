"""Prompt templates from ``prompts/``: loading, digests and literal rendering."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hdeval.core.errors import PromptError
from hdeval.core.paths import resource_dir
from hdeval.core.types import CriteriaTree, Criterion, Sample, Task
from hdeval.llm.backends.base import Message

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
PROMPT_NAMES = ("score", "decompose")


@dataclass(frozen=True)
class Template:
    name: str
    system: str
    user: str
    digest: str  # sha256 of the template file's bytes
    source: str  # the file text, so an artifact can carry the exact prompt it was trained with

    def render(self, values: Mapping[str, str]) -> tuple[Message, ...]:
        return (
            Message("system", render_text(self.system, values, self.name)),
            Message("user", render_text(self.user, values, self.name)),
        )


def render_text(template: str, values: Mapping[str, str], name: str = "template") -> str:
    """Replace ``{{key}}`` in one pass. Inserted text is never scanned again, so braces,
    backticks or ``{{...}}`` inside a sample stay exactly as written."""

    def sub(m: re.Match) -> str:
        key = m.group(1)
        if key not in values:
            raise PromptError(f"prompt {name!r} uses unknown placeholder {{{{{key}}}}}")
        return str(values[key])

    return _PLACEHOLDER.sub(sub, template)


def parse_template(name: str, text: str, where: str) -> Template:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PromptError(f"{where}: invalid TOML ({exc})") from exc
    for part in ("system", "user"):
        if not isinstance(raw.get(part), str) or not raw[part].strip():
            raise PromptError(f"{where}: needs a non-empty {part!r} string")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Template(name, raw["system"], raw["user"], digest, text)


def load_template(name: str, directory: Path | None = None) -> Template:
    path = (directory or resource_dir("prompts")) / f"{name}.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PromptError(f"prompt file not found: {path}") from exc
    return parse_template(name, text, str(path))


def load_templates(directory: Path | None = None) -> dict[str, Template]:
    return {n: load_template(n, directory) for n in PROMPT_NAMES}


# Whitespace inside the brackets counts: a model reads "</sample >" or "< /sample>" as a tag.
_TAG = re.compile(r"<\s*(/?)\s*sample\s*>", re.I)


def neutralise(text: str) -> str:
    # A sample may not close the sample section early: "</sample>" inside it is defused.
    return _TAG.sub(lambda m: f"<{m.group(1)}sample\u200b>", text)


def sample_block(task: Task, sample: Sample) -> str:
    parts = [f"{f.label}:\n{neutralise(sample.text(f.key))}" for f in task.fields]
    return "\n\n".join(parts)


def hierarchy_text(tree: CriteriaTree, criterion: Criterion) -> str:
    """Parent criterion with its definition, then the criterion itself (paper App. G.2)."""
    parent = tree.parent(criterion.key)
    if parent is None:
        return f"Criterion: {criterion.name}: {criterion.definition}"
    return (
        f"Parent criterion: {parent.name}: {parent.definition}\n"
        f"Criterion (a sub-criterion of {parent.name}): {criterion.name}: {criterion.definition}"
    )


def scoring_messages(
    template: Template, task: Task, tree: CriteriaTree, criterion: Criterion, sample: Sample
) -> tuple[Message, ...]:
    return template.render(
        {
            "task_description": task.description,
            "output_label_lower": task.output_label.lower(),
            "sample": sample_block(task, sample),
            "hierarchy": hierarchy_text(tree, criterion),
            "criterion_name": criterion.name,
        }
    )


def decomposition_messages(
    template: Template, task: Task, tree: CriteriaTree, criterion: Criterion, max_children: int
) -> tuple[Message, ...]:
    anc = tree.ancestors(criterion.key)
    hierarchy = "".join(f"Ancestor criterion: {a.name}: {a.definition}\n" for a in anc)
    return template.render(
        {
            "task_description": task.description,
            "output_label_lower": task.output_label.lower(),
            "hierarchy": hierarchy,
            "criterion_name": criterion.name,
            "criterion_key": criterion.key,
            "criterion_definition": criterion.definition,
            "max_children": str(max_children),
        }
    )
