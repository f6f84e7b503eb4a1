"""Helpers for a project's own test suite: ``assert_aligned`` fails a test, as ``hdeval check``
fails a CI job, when an evaluator agrees with human ratings less than a threshold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hdeval.run.check import CheckResult, check_alignment

__all__ = ["CheckResult", "assert_aligned"]


def assert_aligned(
    artifact: str | Path | Any,
    data: str | Path,
    *,
    min_spearman: float | None = None,
    min_agreement: float | None = None,
    **options: Any,
) -> CheckResult:
    """Raise ``AssertionError`` with ``hdeval check``'s one line when ``artifact`` scores ``data``
    (human-rated rows it was not trained on) below the threshold; the result otherwise.
    ``options``: the LLM's, as for :func:`hdeval.run.apply.apply_file` (``llm``, ``cache_dir``,
    ...). Nothing is printed; replies are cached, so a rerun on the same data makes no call::

        from hdeval.testing import assert_aligned

        def test_evaluator_still_agrees_with_raters():
            assert_aligned("artifacts/my-eval", "tests/gold.jsonl", min_spearman=0.5)
    """
    options.setdefault("notify", lambda line: None)
    res = check_alignment(artifact, data, min_spearman=min_spearman, min_agreement=min_agreement, **options)
    if not res.passed:
        raise AssertionError(res.line)
    return res
