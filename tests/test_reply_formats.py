"""Replies in the formats judges really write are read as they mean, with a simulated DnA judge
whose scores we control: the format of a reply must not change the agreement it yields."""

from __future__ import annotations

import pytest
from simjudge import pair_backend, pairwise_rows, write_pairs

from hdeval.core.errors import ScoringError
from hdeval.run.train import train


def _agreement(tmp_path, fmt: str, name: str) -> dict:
    data = write_pairs(tmp_path / "pairs.jsonl", pairwise_rows(100, seed=3))
    ev = train(task="faireval", data=str(data), method="dna", llm="fake", cache_dir=str(tmp_path / name),
               backend=pair_backend(fmt, noise=1.5))
    return ev.metrics


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [
    "R1: {a}; R2: {b}",                       # the DnA paper's own format
    "Assistant 1: {a}\nAssistant 2: {b}",
    "Response 1: {a}; Response 2: {b}",
    "{a}/10 {b}/10",
    "{a} out of 10 and {b} out of 10",
])
def test_labelled_reply_formats_give_the_agreement_of_plain_scores(tmp_path, fmt):
    plain = _agreement(tmp_path, "{a} {b}", "plain")
    other = _agreement(tmp_path, fmt, "other")
    assert other["failure_rate"] == 0.0
    for split in ("test", "train"):
        want, got = plain[split]["llm_weights"], other[split]["llm_weights"]
        assert want["n"] == got["n"]
        assert abs(got["wo_ties"] - want["wo_ties"]) <= 0.05, (fmt, got, want)
    # the judge is informative: the plain reading is far above a coin flip
    assert plain["test"]["llm_weights"]["wo_ties"] > 0.7


@pytest.mark.slow
def test_ambiguous_replies_are_recorded_failures_not_numbers(tmp_path):
    # three numbers, nothing saying which two are the scores: every pair fails, none is guessed
    with pytest.raises(ScoringError, match="numbers, not two scores"):
        _agreement(tmp_path, "{a} {b} 10", "amb")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dna", "direct", "prompt-agg"])
def test_dna_asks_for_its_scores_by_schema_and_reads_the_json_reply(tmp_path, mode):
    from hdeval.methods.dna.replies import PAIR_SCHEMA

    data = write_pairs(tmp_path / "pairs.jsonl", pairwise_rows(40, seed=5))
    # a server that enforces the schema: the JSON reply, never the prompt's "7 4" line
    backend = pair_backend("this text is not read", noise=1.0, json_replies=True)
    ev = train(task="faireval", data=str(data), method="dna", llm="fake", cache_dir=str(tmp_path / "c"),
               backend=backend, method_options={"dna_mode": mode})
    scored = [r for r in backend.requests if r.kind in ("dna_score", "dna_direct", "dna_prompt_agg")]
    assert scored and all(r.json_schema == PAIR_SCHEMA for r in scored)
    assert ev.metrics["failure_rate"] == 0.0
