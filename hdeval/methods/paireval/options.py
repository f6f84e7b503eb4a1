"""PairEval's options, declared once (the CLI, the Python API and benchmark build them from here)."""

from __future__ import annotations

from dataclasses import dataclass

from hdeval.methods.base import AGGREGATOR_HELP, MethodOptions, check_aggregator, option


@dataclass(frozen=True)
class PairEvalOptions(MethodOptions):
    comparisons: int = option(3, "Comparison examples each response is compared with.")
    comparison_data: str = option("", "JSONL (the task's schema) to draw comparison examples from, instead "
                                      "of the training split.")
    swap: bool = option(True, "Also ask each pair in the swapped order and average.")
    aggregator: str = option("auto", AGGREGATOR_HELP)

    def validate(self) -> None:
        from hdeval.methods.comparisons import check_comparisons

        check_comparisons(self.comparisons)
        check_aggregator(self.aggregator)
