"""Replies of a real OpenAI-compatible server read right: llama.cpp's server reports probabilities
from before its answer constraint (and for a ```json fence it strips from the text), so a score is
read from the token that was generated, or from the text when the two do not line up; a label's
probability needs both labels among the alternatives; a JSON reply cut short is asked again with
more room; a constant prediction says why its correlation is null."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from hdeval.core.metrics import metric_table
from hdeval.judge.fill import Cell, fill_matrix, label_probability
from hdeval.judge.scoring import parse_score
from hdeval.llm.backends.base import Completion, CompletionRequest, Message, TokenLogprob, chat_completion
from hdeval.llm.backends.fake import FakeBackend
from hdeval.methods.dna.replies import PAIR_SCHEMA, more_room, read_pair_weighted, score_pair, structured_pair

FIXTURES = Path(__file__).parent / "golden" / "llamacpp_replies.json"


def _position(token, logprob, *alts):
    """One llama.cpp logprobs position: the generated token and its top alternatives."""
    return {"id": 0, "token": token, "bytes": list(token.encode()), "logprob": logprob,
            "top_logprobs": [{"id": 0, "token": t, "bytes": list(t.encode()), "logprob": lp} for t, lp in alts]}


def _reply(content, positions):
    return {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content},
                         "logprobs": {"content": positions}}], "model": "m.gguf"}


def test_the_generated_token_comes_first_even_when_the_server_ranks_others_above_it():
    # pre-constraint probabilities: "{" generated, '{"' and "```" likelier before the schema applied
    c = chat_completion(_reply("7", [_position("7", -2.0, ("I", -0.5), ("7", -2.0), ("5", -2.5)),
                                     _position("", -9.0, (" is", -1.0))]), True)
    assert [pos[0].token for pos in c.top_logprobs] == ["7", ""]
    assert [t.token for t in c.top_logprobs[0]] == ["7", "I", "5"]  # no duplicate
    assert c.top_logprobs[1][0].logprob == -9.0  # not among its alternatives: its own logprob


def test_llama_cpp_dna_replies_weighted_scores_agree_with_their_text():
    """Recorded llama.cpp server replies (SmolLM2-135M, PAIR_SCHEMA, top_logprobs 10), plus the
    two shapes it produces that lie: a ```json fence counted in logprobs but stripped from the
    text, and a generated score that is not the likeliest score token reported."""
    replies = json.loads(FIXTURES.read_text())["dna_score"]
    doubts = []
    for reply in replies:
        c = chat_completion(reply, True)
        text, why = score_pair(c, (1.0, 10.0))
        (weighted, _), doubt = read_pair_weighted(c)
        if text is None:
            assert weighted is None
            continue
        doubts.append(doubt)
        assert all(abs(w - t) <= 1.0 for w, t in zip(weighted, text)), (c.text, weighted, doubt)
    assert len(doubts) >= 20
    assert any(d is None for d in doubts)  # the replies that line up are weighted
    assert any(d and "spell" in d for d in doubts) and any(d and "likeliest" in d for d in doubts)


def test_a_1_5_score_is_read_from_the_generated_digit_not_a_likelier_one():
    # generated "1" under the grammar, yet "4" reported likelier: probabilities before the grammar
    c = Completion("1", ((TokenLogprob("1", -2.1), TokenLogprob("4", -0.4), TokenLogprob("I", -1.0)),))
    assert parse_score(c) == (1.0, None)
    good = Completion("4", ((TokenLogprob("4", -0.4), TokenLogprob("5", -1.2), TokenLogprob("I", -1.0)),))
    value, why = parse_score(good)
    assert why is None and 4.0 < value < 5.0  # weighted
    # a first token that is not the score: its digits are not the score's distribution
    c = Completion("Score: 3", ((TokenLogprob("Score", -0.1), TokenLogprob("5", -2.0)),
                                (TokenLogprob(":", -0.1),), (TokenLogprob(" 3", -0.3), TokenLogprob(" 2", -1.0))))
    assert parse_score(c) == (3.0, None)


def test_a_label_missing_from_the_alternatives_is_not_given_probability_zero():
    only_a = (TokenLogprob("<", -0.3), TokenLogprob("A", -2.6))
    value, why = label_probability(Completion("<sample", (only_a,)), "A", "B")
    assert math.isnan(value) and "names neither" in why
    assert label_probability(Completion("A", ((TokenLogprob("A", -0.1),),)), "A", "B") == (1.0, None)
    both = (TokenLogprob("A", math.log(0.3)), TokenLogprob("B", math.log(0.1)))
    value, why = label_probability(Completion("A", (both,)), "A", "B")
    assert why is None and math.isclose(value, 0.75)


def test_a_constant_prediction_says_why_its_correlation_is_null():
    y = np.array([[1.0], [2.0], [3.0], [4.0]])
    table = metric_table(y, np.full((4, 1), 0.5), ["overall"])
    assert table["overall"]["pearson"] is None and table["overall"]["why"] == "every prediction is 0.5"
    assert "why" not in metric_table(y, y, ["overall"])["overall"]


def test_a_json_reply_cut_short_is_asked_again_once_with_more_room():
    budgets = []

    def pair(request, fake):
        budgets.append(request.max_tokens)
        text = '{\n  "score_a": 7,\n  "score_b": 4\n}'
        return Completion(text[:request.max_tokens], None, 10, min(len(text), request.max_tokens))

    request = structured_pair(CompletionRequest((Message("user", "score"),), kind="pair", max_tokens=8))
    assert request.json_schema == PAIR_SCHEMA and request.max_tokens >= 36  # '{"score_a": 10, ...}' pretty-printed
    short = CompletionRequest((Message("user", "score"),), kind="pair", max_tokens=20, json_schema=PAIR_SCHEMA)
    fake = FakeBackend(responders={"pair": pair}, honour_constraints=False)  # cut short, as a server does
    m = fill_matrix(fake, [Cell("s1", "a", (short,))], lambda cs: (score_pair(cs[0], (1, 10))[0][1], None),
                    retry=more_room)
    assert budgets == [20, 40] and m.values[0, 0] == 4.0
    # a complete reply is not asked again
    assert more_room(short, Completion('{"score_a": 7, "score_b": 4}', None, 10, 20)) is None
