"""DnA's options, declared once (the CLI, the Python API and benchmark build them from here), and
the checked settings a run uses and an artifact records (``Settings``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from hdeval.core.errors import ArtifactError, ConfigError
from hdeval.methods.options import MethodOptions, option

MODES = ("dna", "direct", "cot", "prompt-agg")
SOURCES = ("predefined", "dynamic")
MAX_K = 10


@dataclass(frozen=True)
class Settings:
    mode: str = "dna"
    aspect_source: str = "predefined"
    k: int = 4
    tie_margin: float | None = None  # None: learned on the training split (learn_tie_margin)
    swap: bool = False
    # aspect scores weighted by their tokens' top logprobs (False: the reply text, as artifacts
    # written before this option record nothing and were scored that way)
    logprobs: bool = False
    # where tie_margin came from: "given" (by the user; artifacts written before margins were
    # learned record nothing and were given theirs) or "training split"
    tie_margin_from: str = "given"

    @property
    def uses_aspects(self) -> bool:
        return self.mode in ("dna", "prompt-agg")

    @property
    def dynamic(self) -> bool:
        return self.uses_aspects and self.aspect_source == "dynamic"

    @property
    def prompt_roles(self) -> list[str]:
        if not self.uses_aspects:  # the direct and chain-of-thought baselines
            return [self.mode]
        roles = (["aspects"] if self.dynamic else []) + ["weights", "score"]
        return roles + (["prompt_agg"] if self.mode == "prompt-agg" else [])

    @property
    def orders(self) -> int:
        return 2 if self.swap else 1

    def scoring_stage(self, aspects_per_pair: int) -> str:
        """The pairwise scoring stage's name, as the dry run lists it and progress shows it."""
        if not self.uses_aspects:
            return f"{self.mode} x {self.orders} order(s)"
        return f"aspect scores ({aspects_per_pair} per pair x {self.orders} order(s))"

    @property
    def aggregation_stage(self) -> str:
        return f"prompt aggregation x {self.orders} order(s)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "aspect_source": self.aspect_source,
            "k": self.k,
            "tie_margin": self.tie_margin,
            "tie_margin_from": self.tie_margin_from,
            "swap": self.swap,
            "logprobs": self.logprobs,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Settings":
        if not isinstance(d, dict):
            raise ArtifactError(f"{where}: method_args is not an object")
        try:
            given = {
                "dna_mode": d["mode"],
                "aspect_source": d["aspect_source"],
                "k": d["k"],
                "tie_margin": d["tie_margin"],
                "swap": d["swap"],
                "logprob_scores": d.get("logprobs", False),
            }
        except KeyError as exc:
            raise ArtifactError(f"{where}: method_args lacks {exc}") from None
        margin_from = d.get("tie_margin_from", "given")
        # a fitted judge has decided its margin
        if given["tie_margin"] is None or margin_from not in ("given", "training split"):
            raise ArtifactError(
                f"{where}: method_args holds no usable tie margin "
                f"({given['tie_margin']!r} from {str(margin_from)[:40]!r})"
            )
        try:  # the checks the options get
            return dataclasses.replace(DnaOptions(**given).settings(), tie_margin_from=margin_from)
        except ConfigError as exc:
            raise ArtifactError(f"{where}: {exc}") from None


class DnaOptions(MethodOptions):
    cli_flags = True  # a built-in method's: its options are flags too (hdeval.cli.options)
    dna_mode: str = option("dna", "dna, or a same-LLM baseline: direct, cot, prompt-agg", MODES)
    aspect_source: str = option("predefined", "the task's aspects, or k per instance from the LLM", SOURCES)
    k: int = option(4, "aspects the LLM proposes per instance with --aspect-source dynamic")
    tie_margin: float | None = option(
        None,
        "totals this close are a tie (default: learned on the training split, where humans tie pairs "
        "more often than they side with the judge)",
    )
    swap: bool = option(
        False,
        "ask every pairwise prompt in both orders and average (not given: one order, after a probe of "
        "30 training pairs in both orders; a position bias it finds adds the other order for every "
        "pair; --no-swap: one order, with a warning when it finds one)",
    )
    logprob_scores: bool = option(
        True,
        "weight each 1-10 aspect score by its token's top logprobs where the "
        "server returns them (else the reply text)",
    )

    def check(self) -> None:
        if not 1 <= self.k <= MAX_K:
            raise ConfigError(f"--k must be a whole number from 1 to {MAX_K}, got {self.k!r}")
        if self.tie_margin is not None and not (math.isfinite(self.tie_margin) and self.tie_margin >= 0):
            raise ConfigError(f"--tie-margin must be 0 or more, got {self.tie_margin!r}")

    @property
    def one_order_chosen(self) -> bool:
        """--no-swap given: one order even when the position probe finds a bias (it warns)."""
        return "swap" in self.given() and not self.swap

    def settings(self) -> Settings:
        return Settings(
            mode=self.dna_mode,
            aspect_source=self.aspect_source,
            k=self.k,
            tie_margin=self.tie_margin,
            swap=self.swap,
            logprobs=self.logprob_scores,
        )
