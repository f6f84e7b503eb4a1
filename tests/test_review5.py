"""Regressions found by the review of round three's size cuts (issue #19): behaviour the cuts'
goldens do not reach, checked against the code before them."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli

EX = REPO / "examples"


@pytest.mark.parametrize("method,extra", [("direct", ()), ("direct-yesno", ()),
                                          ("paireval", ("--comparisons", "1"))])
def test_explain_refuses_an_artifact_it_cannot_explain_in_one_line_before_any_call(tmp_path, method, extra):
    # `hdeval explain` on a method other than HD-Eval paid for the sample's calls, then stopped
    # with an AttributeError traceback (no feature_keys); apply --explain already refused
    art, cache = tmp_path / "art", tmp_path / "c"
    r = run_cli("train", "--task", EX / "qa_task.toml", "--method", method, *extra, "--llm", "fake",
                "--cache-dir", cache, "-o", art, "-q")
    assert r.exit_code == 0, r.output
    r = run_cli("explain", art, "--sample", "new-qa-0", "--data", EX / "new_qa.jsonl", "--cache-dir",
                tmp_path / "fresh")
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == (f"error: hdeval explain reads HD-Eval artifacts; {art} was made by "
                                f"method {method!r}: apply shows its scores")
    assert not (tmp_path / "fresh").exists()  # nothing asked of the LLM
