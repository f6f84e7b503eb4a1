"""``hdeval check``: a CI gate. Score a file of human-rated samples with an artifact (as ``apply``
does, cached) and compare the held-out agreement with a threshold: Spearman for scores, agreement
for pairs; :mod:`hdeval.testing` raises it in a test suite."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdeval.core.errors import ConfigError


@dataclass(frozen=True)
class CheckResult:
    """What a gate found: the figure (``spearman``: the average over aspects; ``agreement``: with
    ties), its threshold, the rows it is over and the one line saying so."""

    passed: bool
    metric: str
    value: float | None
    threshold: float
    rows: int
    line: str


def check_alignment(
    artifact: str | Path | Any,
    data: str | Path,
    *,
    min_spearman: float | None = None,
    min_agreement: float | None = None,
    **apply_options: Any,
) -> CheckResult:
    """Score ``data`` (human scores or labels, in any format ``apply`` reads) with ``artifact`` and
    compare the agreement on the rows the artifact was not trained on with the threshold.
    ``apply_options``: those of :func:`hdeval.run.apply.apply_file` (``llm``, ``cache_dir``,
    ``progress``, ``notify``, ...). A file without human scores, or whose every row is a training
    row, is a :class:`ConfigError` before anything is scored: no gate can be honest on it."""
    from hdeval.data.samples import check_readable
    from hdeval.run.apply import apply_file, load_checked

    if (min_spearman is None) == (min_agreement is None):
        raise ConfigError("give one threshold: --min-spearman (scores) or --min-agreement (pairs)")
    threshold = min_spearman if min_spearman is not None else min_agreement
    if not (isinstance(threshold, (int, float)) and -1 <= threshold <= 1):
        raise ConfigError(f"the threshold must be a number between -1 and 1, got {threshold!r}")
    check_readable(data)
    ev, _ = load_checked(artifact, False, 0.5, apply_options.get("notify"))
    pairs = ev.task.shape == "pairwise"
    metric = "agreement" if pairs else "spearman"
    if pairs != (min_agreement is not None):
        raise ConfigError(
            f"{ev.task.name} is a {'pairwise' if pairs else 'pointwise'} task: gate it with "
            f"{'--min-agreement' if pairs else '--min-spearman'}"
        )
    _check_gold(ev, data, pairs)  # before any LLM call: a file no gate can be honest on
    with tempfile.TemporaryDirectory(prefix=".hdeval-check-") as scratch:
        res = apply_file(ev, str(data), str(Path(scratch) / "scored.jsonl"), **apply_options)
    held_out = res.scored - int(res.trust.get("in_training") or 0)
    if pairs:
        table = res.agreement or {}
        chosen = next(iter(table.values()), None)  # the verdict the output's label holds (DnA: not 'learned')
        value = None if not chosen else chosen.get("w_ties")
    else:
        value = ((res.correlations or {}).get("average") or {}).get("spearman")
    # (_check_gold refused these before any call; kept for an evaluator whose rows differ)
    if held_out <= 0 and res.scored:
        raise _all_training(data)
    if value is None and not (res.agreement or res.correlations):
        what = "labels (a/b/tie)" if pairs else f"scores for every aspect ({', '.join(ev.task.aspect_keys)})"
        raise ConfigError(f"{data} holds no human {what}: a gate compares the evaluator with them")
    shown = (
        "undefined (under 3 rows, or scores that do not vary)"
        if value is None or not math.isfinite(value)
        else f"{value:.3f}"
    )
    passed = value is not None and math.isfinite(value) and value >= threshold
    name = "agreement (ties counted)" if pairs else "Spearman (average over aspects)"
    line = (
        f"check {'passed' if passed else 'FAILED'}: held-out {name} {shown} "
        f"{'>=' if passed else 'is below'} {threshold:g} on {held_out} rows of {data}"
    )
    return CheckResult(
        passed=passed,
        metric=metric,
        value=value if value is None else float(value),
        threshold=float(threshold),
        rows=held_out,
        line=line,
    )


def _check_gold(ev: Any, data: str | Path, pairs: bool) -> None:
    """Read ``data`` as apply will (every line validated, ids checked) and refuse, before anything
    is scored, a file the gate's figure cannot come from: rows that are all in the artifact's
    training split, a pointwise row without a human score for every aspect (apply's correlations
    need them all), or pairs none of whose held-out rows has a label."""
    from hdeval.data.samples import DiskIds, iter_task_chunks

    training = ev.training_ids()
    aspects = list(ev.task.aspect_keys)
    rows = held_out = labelled = 0
    with DiskIds() as seen:  # in the temporary folder: the gold file's may be read-only
        for chunk in iter_task_chunks(data, ev.task, require_labels=False, seen=seen):
            for s in chunk:
                rows += 1
                mine = s.id not in training
                held_out += mine
                if pairs:
                    labelled += mine and getattr(s, "label", None) is not None
                    continue
                missing = [a for a in aspects if a not in getattr(s, "scores", {})]
                if missing:
                    raise ConfigError(
                        f"{data} holds no human scores for every aspect ({', '.join(aspects)}): "
                        f"sample {s.id} has none for {', '.join(missing)}; a gate compares the "
                        "evaluator with them"
                    )
    if rows and not held_out:
        raise _all_training(data)
    if pairs and held_out and not labelled:
        raise ConfigError(
            f"{data} holds no human labels (a/b/tie) on rows the artifact was not trained on: a "
            "gate compares the evaluator with them"
        )


def _all_training(data: str | Path) -> ConfigError:
    return ConfigError(
        f"every row of {data} is in the artifact's training split: a gate needs rows the "
        "evaluator was not fitted on"
    )
