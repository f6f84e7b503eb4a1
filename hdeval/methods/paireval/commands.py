"""``hdeval paireval ...``: PairEval's commands beyond train / apply, which the method adds to the
CLI through its ``commands`` (the work is in :mod:`hdeval.methods.paireval.export`)."""

from __future__ import annotations

from typing import Any, Sequence

import click

from hdeval.core.errors import ConfigError
from hdeval.methods.base import CommandKit


def commands(kit: CommandKit) -> Sequence[Any]:
    """The ``paireval`` command group, its callbacks inside the CLI's error boundary."""

    @click.group("paireval")
    def paireval() -> None:
        """PairEval helpers (train it with `hdeval train --method paireval`)."""

    @paireval.command("export-training")
    @click.option(
        "--data",
        required=True,
        type=click.Path(dir_okay=False),
        help="Dialogue corpus JSONL in the task's schema (history fields + 'output', the real follow-up).",
    )
    @click.option(
        "--task",
        default="dailydialog_grade",
        show_default=True,
        help="Built-in task or task .toml saying which fields are the history and how they are labelled.",
    )
    @click.option(
        "--out", "-o", required=True, type=click.Path(dir_okay=False), help="Training pairs JSONL to write."
    )
    @click.option(
        "--seed", default=0, show_default=True, type=int, help="Negatives and positions randomness."
    )
    @kit.guarded
    def export_training_cmd(data: str, task: str, out: str, seed: int) -> None:
        """Write chat-format fine-tuning pairs (PairEval Sec. 3.3): the real follow-up against a random
        response from another conversation, positions randomised, the label word as the target.

        \b
        Example:
          hdeval paireval export-training --data corpus.jsonl -o pairs.jsonl
        """
        from hdeval.data.samples import read_samples, write_jsonl
        from hdeval.data.tasks import load_task
        from hdeval.methods.comparisons import history_fields
        from hdeval.methods.paireval.export import export_training

        kit.check_output(out, [data, task if task.endswith(".toml") else None])  # a name is no file
        t = load_task(task)
        if t.shape != "pointwise":
            raise ConfigError(
                f"--task {task} judges pairs of responses; export-training builds pairs from a "
                "dialogue corpus with one real follow-up per conversation: pass a dialogue task "
                "such as --task dailydialog_grade (see `hdeval tasks`)"
            )
        history_fields(t)
        samples = read_samples(data, t, require_scores=False)
        rows = export_training(samples, t, seed)
        write_jsonl(out, rows)
        click.echo(f"wrote {len(rows)} training pairs to {out}")

    return [paireval]
