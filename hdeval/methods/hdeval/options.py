"""HD-Eval's options, declared once (the CLI, the Python API and benchmark build them from here)."""

from __future__ import annotations

from typing import ClassVar

from hdeval.core.errors import ConfigError
from hdeval.methods.options import AGGREGATOR_HELP, MethodOptions, check_aggregator, option


class HDEvalOptions(MethodOptions):
    cli_flags = True  # a built-in method's: its options are flags too (hdeval.cli.options)
    # the LLM that decomposes criteria, when another than the scoring one
    second_llm: ClassVar[tuple[str, str]] = ("decompose_llm", "decompose_base_url")

    layers: int = option(3, "Depth of the criteria tree (1 = the aspects only).")
    children: int = option(4, "Max sub-criteria per decomposed criterion.")
    top_k: int = option(4, "Criteria expanded per layer from layer 3 on (attribution pruning).")
    aggregator: str = option("auto", AGGREGATOR_HELP)
    tree: str | None = option(
        None,
        "Start from this criteria tree (a tree.json, e.g. an artifact's, edited or not; or an HD-Eval "
        "artifact directory): its layers are scored as given, --layers beyond them expand it; criteria "
        'with "locked": true are never expanded.',
    )
    decompose_llm: str | None = option(
        None, "The LLM that decomposes criteria (same forms as --llm). Default: the scoring LLM."
    )
    decompose_base_url: str | None = option(None, "OpenAI-compatible server of --decompose-llm.")
    scorer: str = option(
        "digit",
        "How criteria are scored: a 1-5 digit, or 'pairwise' (PairEval win "
        "probability against comparison examples, both orders).",
        choices=("digit", "pairwise"),
    )
    comparisons: int = option(
        3, "Comparison examples each response is compared with (HD-Eval: with --scorer pairwise)."
    )
    swap: bool = option(
        True, "Also ask each pair in the swapped order and average (HD-Eval: with --scorer pairwise)."
    )

    def check(self) -> None:
        for name in ("layers", "children", "top_k"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        check_aggregator(self.aggregator)
        if self.decompose_base_url and not self.decompose_llm:
            raise ConfigError("--decompose-base-url needs --decompose-llm MODEL (the model that server runs)")
        from hdeval.llm.config import llm_problem

        problem = llm_problem(self.decompose_llm, self.decompose_base_url, "--decompose-llm")
        if problem:  # as --llm: "" is no "the scoring LLM", "FAKE" no model to send to OpenAI
            raise ConfigError(problem)
        from hdeval.methods.comparisons import check_comparisons

        check_comparisons(self.comparisons)
