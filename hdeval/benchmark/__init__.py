"""``hdeval benchmark``: the paper's analyses as one sweep over methods, aggregators, seeds and
training fractions. One job per module: :mod:`.spec` (what to sweep), :mod:`.sweep` (the runs),
:mod:`.heldout` (each run's test predictions), :mod:`.statistics` (bootstrap and the other
figures), :mod:`.settings` (figures per setting), :mod:`.tables` and :mod:`.output` (what is
written). Library code: nothing here prints.
"""

from __future__ import annotations

from hdeval.benchmark.heldout import PairHeldOut, pair_arrays
from hdeval.benchmark.output import FORMAT, check_output_dir, write_benchmark
from hdeval.benchmark.spec import BenchmarkSpec, check_shapes, parse_method_options
from hdeval.benchmark.statistics import (
    pooled_bootstrap_ci, pooled_paired_bootstrap, ranking_exact_match, summary_level_correlation,
)
from hdeval.benchmark.sweep import run_benchmark

__all__ = [
    "BenchmarkSpec", "check_output_dir", "check_shapes", "FORMAT", "pair_arrays", "PairHeldOut",
    "parse_method_options", "pooled_bootstrap_ci", "pooled_paired_bootstrap", "ranking_exact_match",
    "run_benchmark", "summary_level_correlation", "write_benchmark",
]
