"""PairEval's fitted evaluator (win probabilities against the recorded comparison examples,
mapped by a learned aggregator) and what it shares with DIRECTEVAL's: the artifact's file names
and the rows ``apply`` writes."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hdeval.artifact.directory import ArtifactReader, ArtifactWriter
from hdeval.core.errors import ConfigError, DataError
from hdeval.core.progress import Progress
from hdeval.core.types import Sample, Task
from hdeval.judge.prompts import Template, parse_template
from hdeval.llm.config import LLMConfig
from hdeval.methods.base import Fitted, ScoreResult, loaded, pointwise_banner, pointwise_headline, usage_of
from hdeval.methods.comparisons import (
    COMPARISONS,
    Example,
    PairScores,
    fits_examples,
    pair_scores,
    parse_examples,
)
from hdeval.methods.paireval.sources import comparison_text, overlap_text
from hdeval.methods.state_file import AggregatorSpec, Name, PromptsState

PAIR_PROMPT = "prompts/pair.toml"
MODEL = "aggregator.skops"


class PairEvalState(PromptsState):
    """PairEval's state: the pair prompt's digest, the aggregator and where the examples came from."""

    aggregator: AggregatorSpec
    comparison_source: Name | None = None  # absent before it was recorded


class PairEvalEvaluator(Fitted):
    """Win probabilities against recorded comparison examples, one column per aspect, mapped to
    the human aspects by a fitted aggregator."""

    method = "paireval"
    row_names = ("columns", "column")
    State = PairEvalState

    def __init__(
        self,
        task: Task,
        template: Template,
        pool: list[Example],
        n: int,
        swap: bool,
        agg: Any,
        llm: LLMConfig,
        llm_identity: str,
        metrics: dict[str, Any],
        extra: dict[str, Any] | None = None,
        score_table=None,
        all_vs_all: bool = False,
    ):
        super().__init__(task, template, llm, llm_identity, metrics, extra, score_table)
        self.pool = list(pool)
        self.n = n
        self.swap = swap
        self.agg = agg
        self.all_vs_all = all_vs_all  # compared within each document, no recorded examples
        # apply streams chunks and shards: a document split across them would compare fewer rows
        self.whole_input = (
            (
                "this all-vs-all PairEval artifact compares each response with the other "
                "responses of its document in the input"
            )
            if all_vs_all
            else None
        )

    def held_out_predictions(self, table: Any, test: Any) -> Any:
        cols = [c for c in table.columns[2:] if not str(c).startswith("human:")]  # between split and human:
        return self.agg.predict(test[cols].to_numpy(float))

    def fitted_aggregator(self) -> str | None:
        return self.agg.kind

    def banner(self) -> Any:
        return pointwise_banner(self)

    def headline(self) -> dict[str, float | None]:
        return pointwise_headline(self.metrics, list(self.task.aspect_keys))

    def method_args(self) -> dict[str, Any]:
        if self.all_vs_all:
            return {"all_vs_all": True, "swap": self.swap}
        return {"comparisons": self.n, "swap": self.swap}

    def summary_lines(self, path: Any) -> list[tuple[str, bool]]:
        lines = super().summary_lines(path)
        c = self.metrics.get("comparisons") or {}
        lines.insert(1, (f"comparisons: {comparison_text(c)}", False))
        overlap = c.get("overlap_test")
        if isinstance(overlap, dict):
            lines.insert(2, (f"warning: {overlap_text(overlap)}", True))
        return lines

    def judge(
        self,
        samples: Sequence[Sample],
        backend=None,
        cache_dir=None,
        concurrency: int | None = None,
        progress: Progress | None = None,
    ) -> PairScores:
        """Every pair judgment behind the columns (what ``score`` averages)."""
        samples = list(samples)
        if not samples:
            raise DataError("no samples to score")
        with self.llm_session(backend, cache_dir) as backend:
            return pair_scores(
                backend,
                self.template,
                self.task,
                samples,
                None if self.all_vs_all else self.pool,
                self.n,
                self.swap,
                concurrency,
                progress,
            )

    def score(
        self,
        samples: Sequence[Sample],
        backend=None,
        cache_dir=None,
        concurrency: int | None = None,
        progress: Progress | None = None,
    ) -> ScoreResult:
        with self.llm_session(backend, cache_dir) as backend:
            cols = self.judge(samples, backend, concurrency=concurrency, progress=progress).columns()
            return ScoreResult(
                cols.sample_ids,
                list(self.task.aspect_keys),
                self.agg.predict(cols.values),
                cols,
                usage_of(backend),
            )

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        if not self.all_vs_all:
            out.json(COMPARISONS, [dataclasses.asdict(e) for e in self.pool])
        out.skops(MODEL, self.agg.models_)
        return {
            **self.write_common(out, {"pair": self.template}),
            "aggregator": {"kind": self.agg.kind, "random_state": self.agg.random_state},
            **self.extra,
        }

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "PairEvalEvaluator":
        from hdeval.learn.aggregate import Aggregator
        from hdeval.methods.aggregator_file import TRUSTED_TYPES, check_models

        state = cls.read_state(art)
        assert isinstance(state, PairEvalState)
        args = art.manifest.get("method_args") or {}
        all_vs_all = args.get("all_vs_all", False) is True  # compared within each document: no examples

        def build(task: Task, llm: LLMConfig, identity: str) -> PairEvalEvaluator:
            if all_vs_all:
                pool, n, swap = [], 0, args["swap"]
                if set(args) != {"all_vs_all", "swap"} or not isinstance(swap, bool):
                    raise ValueError("method_args of an all-vs-all artifact are 'all_vs_all' and 'swap' only")
            else:
                pool = parse_examples(art.json(COMPARISONS), str(art.path / COMPARISONS))
                n, swap = args["comparisons"], args["swap"]
                if not fits_examples(n, swap, pool):
                    raise ValueError("method_args 'comparisons' / 'swap' do not fit the recorded examples")
            spec = state.aggregator
            template = Aggregator.for_task(spec.kind, task, spec.random_state)
            models = art.skops(MODEL, TRUSTED_TYPES)
            check_models(models, template.kind, template.groups, len(task.aspects), art.path / MODEL)
            agg = Aggregator.from_fitted(
                template.kind,
                template.aspects,
                template.ranges,
                template.groups,
                template.random_state,
                models,
                len(task.aspects),
            )
            return cls(
                task,
                parse_template("pair", art.text(PAIR_PROMPT), str(art.path / PAIR_PROMPT)),
                pool,
                n,
                swap,
                agg,
                llm,
                identity,
                {},
                all_vs_all=all_vs_all,
            )

        need = (PAIR_PROMPT, MODEL) if all_vs_all else (PAIR_PROMPT, COMPARISONS, MODEL)
        ev = loaded(art, need, build, (KeyError, TypeError, ValueError, ConfigError))
        if state.comparison_source is not None:  # kept, so saving it again loses nothing
            ev.extra["comparison_source"] = state.comparison_source
        return ev
