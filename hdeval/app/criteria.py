"""The criteria the labelling app scores the pool on, and the scoring itself, through the
library's one path (``decompose_nodes``, ``score_criteria`` on the cached client): the same
requests as ``train``, so training on the exported labels hits the same cache entries. A pair
is scored as ``train`` scores it (each response alone, the pointwise prompt) and its row is
score(A) - score(B) per criterion, the pairwise evaluator's features."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hdeval.core.errors import ConfigError, DecompositionError
from hdeval.core.progress import Progress
from hdeval.core.types import CriteriaTree, Criterion, PairSample, Sample, Task

# as `train --layers 2 --children 4`: the aspects and one decomposition of each
DEFAULT_CHILDREN = 4


class PoolCriteria:
    """A criteria tree and the criteria (columns) scored from it, in column order."""

    def __init__(
        self,
        task: Task,
        tree: CriteriaTree,
        criteria: Sequence[Criterion],
        templates: dict[str, Any],
        source: str,
        warning: str | None = None,
    ) -> None:
        self.task, self.tree, self.criteria, self.templates, self.source = (
            task,
            tree,
            list(criteria),
            templates,
            source,
        )
        self.warning = warning  # what the person should know about these criteria

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.criteria]

    def plan(
        self, llm: Any, samples: Sequence[Sample | PairSample], chunk: int = 500
    ) -> tuple[int, int, int]:
        """The dry run of scoring ``samples``: (calls, of which cached, prompt tokens, estimated),
        counted a chunk of requests at a time (a prompt is a few KB; a pool may be large)."""
        from hdeval.judge.scoring import SCORE_MAX_TOKENS, score_requests
        from hdeval.methods.run import exact_plan

        samples = _responses(samples)

        calls = cached = tokens = 0
        for start in range(0, len(samples), chunk):
            reqs = score_requests(
                self.templates["score"], self.task, self.tree, self.criteria, samples[start : start + chunk]
            )
            row = exact_plan(llm, reqs, SCORE_MAX_TOKENS)
            calls, cached, tokens = (
                calls + row.score_calls,
                cached + (row.cached or 0),
                tokens + row.prompt_tokens,
            )
        return calls, cached, tokens

    def score(
        self,
        llm: Any,
        samples: Sequence[Sample | PairSample],
        concurrency: int | None = None,
        progress: Progress | None = None,
    ) -> np.ndarray:
        from hdeval.judge.scoring import score_criteria

        m = score_criteria(
            llm,
            self.templates["score"],
            self.task,
            self.tree,
            self.criteria,
            _responses(samples),
            concurrency,
            progress,
        )
        if self.task.shape == "pairwise":  # A then B per pair (side_samples' order)
            return m.values[0::2] - m.values[1::2]
        return m.values


def _responses(samples: Sequence[Sample | PairSample]) -> list[Sample]:
    """The samples to score: a pair's two responses, each as a sample, as ``train`` scores them."""
    if samples and isinstance(samples[0], PairSample):
        from hdeval.methods.hdeval.pairwise import side_samples

        return side_samples(samples)  # type: ignore[arg-type]
    return list(samples)  # type: ignore[arg-type]


def check_artifact_task(artifact: str | Path, task: Task) -> Any:
    """The HD-Eval evaluator at ``artifact``, refused in one line if it judges another task."""
    from hdeval.methods.registry import load_artifact

    ev = load_artifact(artifact)
    tree = getattr(ev, "tree", None)
    if getattr(ev, "method", None) != "hdeval" or getattr(ev, "shape", None) != task.shape or tree is None:
        raise ConfigError(
            f"--artifact {artifact}: the labelling app reads {task.shape} HD-Eval artifacts "
            f"(their criteria tree); this one is {getattr(ev, 'method', '?')}"
        )
    if any(k not in tree for k in getattr(ev, "feature_keys", ())):  # a jury's columns are judge:criterion
        raise ConfigError(
            f"--artifact {artifact}: a jury's evaluator (its columns are one per judge and "
            "criterion): the labelling app scores the pool with one LLM; give a one-LLM HD-Eval "
            "artifact, or no --artifact"
        )
    if ev.task.name != task.name or ev.task.aspect_keys != task.aspect_keys:
        raise ConfigError(
            f"--artifact {artifact} judges task {ev.task.name!r} (aspects "
            f"{', '.join(ev.task.aspect_keys)}), not {task.name!r}"
        )
    return ev


def artifact_criteria(ev: Any, task: Task) -> PoolCriteria:
    criteria = [ev.tree[k] for k in ev.feature_keys]
    return PoolCriteria(task, ev.tree, criteria, dict(ev.templates), "the artifact's criteria")


def first_decomposition(
    llm: Any, task: Task, children: int = DEFAULT_CHILDREN, progress: Progress | None = None
) -> PoolCriteria:
    """The aspects and their first decomposition (layers 1 and 2), as ``train`` makes them. When
    the LLM's decompositions are unusable (a tiny model's), the aspects alone, with a warning:
    ``train`` keeps layer 1 the same way when layer 2's decomposition fails."""
    from hdeval.judge.prompts import load_templates
    from hdeval.methods.hdeval.decompose import decompose_nodes

    templates = load_templates()
    tree = CriteriaTree.from_aspects(task.aspects)
    try:
        deeper = decompose_nodes(llm, templates["decompose"], task, tree, tree.layer(1), children, progress)
    except DecompositionError as exc:
        return PoolCriteria(
            task,
            tree,
            list(tree),
            templates,
            "the task's aspects",
            f"warning: {exc}; the pool is scored on the task's aspects alone (layer 1), as `train "
            "--layers 2` would keep them",
        )
    criteria = [c for c in deeper if c.layer <= 2]
    return PoolCriteria(task, deeper, criteria, templates, "the aspects and their first decomposition")
