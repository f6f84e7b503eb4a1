"""Decompose-and-Aggregate's options, declared once (the CLI, the Python API and benchmark build
them from here)."""

from __future__ import annotations

from dataclasses import dataclass

from hdeval.methods.base import MethodOptions, option
from hdeval.methods.dna.settings import MODES, SOURCES, Settings


@dataclass(frozen=True)
class DnaOptions(MethodOptions):
    dna_mode: str = option("dna", "dna, or a same-LLM baseline: direct, cot, prompt-agg", MODES)
    aspect_source: str = option("predefined", "the task's aspects, or k per instance from the LLM", SOURCES)
    k: int = option(4, "aspects the LLM proposes per instance with --aspect-source dynamic")
    tie_margin: float | None = option(
        None, "totals this close are a tie (default: learned on the training split, where humans tie pairs "
              "more often than they side with the judge)", kind=float)
    swap: bool = option(False, "ask every pairwise prompt in both orders and average")
    logprob_scores: bool = option(True, "weight each 1-10 aspect score by its token's top logprobs where the "
                                        "server returns them (else the reply text)")

    def validate(self) -> None:
        self.settings()

    def settings(self):
        """The run's checked DnA settings (the implementation's own record of them)."""
        return Settings(mode=self.dna_mode, aspect_source=self.aspect_source, k=self.k,
                        tie_margin=self.tie_margin, swap=self.swap, logprobs=self.logprob_scores).check()
