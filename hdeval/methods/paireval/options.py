"""PairEval's options, declared once (the CLI, the Python API and benchmark build them from here)."""

from __future__ import annotations

from hdeval.methods.options import AGGREGATOR_HELP, MethodOptions, check_aggregator, option

SOURCES = ("train", "file", "references")  # where PairEval's comparison examples come from


class PairEvalOptions(MethodOptions):
    cli_flags = True  # a built-in method's: its options are flags too (hdeval.cli.options)
    comparisons: int = option(3, "Comparison examples each response is compared with.")
    comparison_data: str = option(
        "", "JSONL (the task's schema) to draw comparison examples from, instead of the training split."
    )
    swap: bool = option(True, "Also ask each pair in the swapped order and average.")
    aggregator: str = option("auto", AGGREGATOR_HELP)
    # None: train, or file when --comparison-data is given (a contradiction is an error at fit)
    comparison_source: str | None = option(
        None,
        "Where the comparison examples come from: responses of the training split, the "
        "--comparison-data corpus, or the training documents' human-written references (the data's "
        "'reference' field). Default: train, or file with --comparison-data.",
        SOURCES,
    )
    all_vs_all: bool = option(
        False,
        "Compare each response with every other response of its own document "
        "(the paper's exhaustive comparison) instead of comparison examples.",
    )

    def check(self) -> None:
        from hdeval.methods.comparisons import check_comparisons

        check_comparisons(self.comparisons)
        check_aggregator(self.aggregator)
