"""``hdeval benchmark``: the paper's analyses as one sweep over methods, aggregators, seeds and
training fractions. One job per module: :mod:`.spec` (what to sweep), :mod:`.sweep` (the runs),
:mod:`.heldout` (each run's test predictions), :mod:`.statistics` (bootstrap and the other
figures), :mod:`.settings` (figures per setting), :mod:`.tables` and :mod:`.output` (what is
written). Library code: nothing here prints.
"""

from __future__ import annotations

from hdeval.benchmark.heldout import (
    PAIR_STATISTICS, HeldOut, PairHeldOut, held_out, held_out_pairs, pair_arrays,
)
from hdeval.benchmark.output import (
    FORMAT, FORMAT_VERSION, HTML, OUTPUTS, RESULTS, RUNS, TABLE, check_output_dir, is_benchmark_output,
    render_html, write_benchmark,
)
from hdeval.benchmark.settings import (
    BASELINE, DEFINITIONS, PAIR_BASELINE, PAIR_VS, criteria_efficiency,
)
from hdeval.benchmark.spec import (
    ENTRIES, LEARNED, METHODS, BenchmarkSpec, artifact_name, check_method_options, check_shapes,
    parse_method_option, parse_method_options,
)
from hdeval.benchmark.statistics import (
    LEVEL, N_RESAMPLES, bootstrap_ci, mean_std, paired_bootstrap, ranking_exact_match, summary_level_correlation,
)
from hdeval.benchmark.sweep import run_benchmark
from hdeval.benchmark.tables import Table, benchmark_tables, render_markdown
from hdeval.metrics import agreement_w_ties, agreement_wo_ties, average_spearman as avg_spearman

# The page (tables, plots, banner) is drawn by the reports' package; results.json holds its numbers.
from hdeval.report.bench import pair_curves


__all__ = [
    "agreement_w_ties",
    "agreement_wo_ties",
    "artifact_name",
    "avg_spearman",
    "BASELINE",
    "benchmark_tables",
    "BenchmarkSpec",
    "bootstrap_ci",
    "check_method_options",
    "check_output_dir",
    "check_shapes",
    "criteria_efficiency",
    "DEFINITIONS",
    "ENTRIES",
    "FORMAT",
    "FORMAT_VERSION",
    "held_out",
    "held_out_pairs",
    "HeldOut",
    "HTML",
    "is_benchmark_output",
    "LEARNED",
    "LEVEL",
    "mean_std",
    "METHODS",
    "N_RESAMPLES",
    "OUTPUTS",
    "pair_arrays",
    "PAIR_BASELINE",
    "pair_curves",
    "PAIR_STATISTICS",
    "PAIR_VS",
    "paired_bootstrap",
    "PairHeldOut",
    "parse_method_option",
    "parse_method_options",
    "ranking_exact_match",
    "render_html",
    "render_markdown",
    "RESULTS",
    "run_benchmark",
    "RUNS",
    "summary_level_correlation",
    "TABLE",
    "Table",
    "write_benchmark",
]
