"""The default embedded runtime (xllamacpp + the bundled SmolLM2-135M GGUF).

Skipped as a whole unless xllamacpp and the model package are installed (CI installs both:
see .ci/run). The model is loaded once per module; everything runs offline (the in-process
server's loopback listener is never contacted).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("xllamacpp", reason="needs xllamacpp: pip install -e '.[local]'")
from conftest import embedded_model_or_skip  # noqa: E402

embedded_model_or_skip()  # the model package installed, or fetched once as a first --llm local run does

from conftest import ARTICLE, SUMMARIES

from hdeval.core.errors import BackendError, ConfigError
from hdeval.core.types import CriteriaTree, Sample
from hdeval.data.tasks import load_task
from hdeval.judge.prompts import load_template
from hdeval.judge.scoring import parse_score, scoring_request
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.constraints import Labels, Scale
from hdeval.llm.backends.factory import local_runtime, make_backend, resolve_llm
from hdeval.llm.backends.llama_cpp import DECODING_TAG, default_model_path, local_identity, model_identity
from hdeval.llm.backends.xllamacpp import XLlamaCppBackend
from hdeval.llm.config import LLMConfig


@pytest.fixture(scope="module")
def backend() -> XLlamaCppBackend:
    b = XLlamaCppBackend.from_spec("local", n_threads=1)
    yield b
    b.close()


def _requests(n_criteria: int) -> list[CompletionRequest]:
    task = load_task("summeval")
    tree = CriteriaTree.from_aspects(task.aspects)
    samples = [
        Sample(id=f"s{i}", doc_id=f"d{i}", fields={"source": ARTICLE, "output": text})
        for i, text in enumerate(SUMMARIES)
    ]
    template = load_template("score")
    return [scoring_request(template, task, tree, c, s) for s in samples for c in list(tree)[:n_criteria]]


def test_local_uses_xllamacpp_by_default_and_shares_the_cache_identity(backend, monkeypatch) -> None:
    monkeypatch.delenv("HDEVAL_LOCAL_RUNTIME", raising=False)
    assert local_runtime() == "xllamacpp"
    assert resolve_llm(None, {}) == "local"
    assert backend.is_default_model and backend.max_concurrency == 1
    # the same GGUF has the same identity under either runtime: cached replies carry over;
    # it names the decoding too, so replies cached before answers were constrained are not served
    assert backend.identity == local_identity(default_model_path())
    assert backend.identity == model_identity(default_model_path()) + DECODING_TAG
    assert backend.identity.startswith("llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf#")


def test_unknown_runtime_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv("HDEVAL_LOCAL_RUNTIME", "llamafile")
    with pytest.raises(ConfigError, match="HDEVAL_LOCAL_RUNTIME='llamafile'.*xllamacpp"):
        make_backend(LLMConfig("local"))


def test_scores_a_real_scoring_prompt_with_every_digit(backend) -> None:
    c = backend.complete(_requests(1)[0])
    assert c.top_logprobs is not None and len(c.top_logprobs) == 1
    alts = {a.token: a.logprob for a in c.top_logprobs[0]}
    assert {"1", "2", "3", "4", "5"} <= set(alts)  # missing ones come from the constrained read
    assert len(alts) <= 10 + 5
    assert all(lp <= 0.0 for lp in alts.values())
    assert list(alts.values()) == sorted(alts.values(), reverse=True)
    score, reason = parse_score(c)
    assert reason is None and 1.0 <= score <= 5.0
    assert c.prompt_tokens > 100 and 0 < c.prompt_tokens_evaluated <= c.prompt_tokens + 2


def test_prefix_reuse_evaluates_fewer_tokens_with_the_same_scores(backend) -> None:
    requests = _requests(3)  # 2 samples x 3 criteria, sample-major
    backend.reuse = False
    try:
        off = [backend.complete(r) for r in requests]
    finally:
        backend.reuse = True
    on = [backend.complete(r) for r in requests]
    assert [c.prompt_tokens for c in on] == [c.prompt_tokens for c in off]
    assert all(c.prompt_tokens_evaluated >= c.prompt_tokens for c in off)
    for i in (1, 2, 4, 5):  # further criteria of a sample evaluate only the criterion part
        assert on[i].prompt_tokens_evaluated < on[i].prompt_tokens / 2
    assert sum(c.prompt_tokens_evaluated for c in on) < 0.6 * sum(c.prompt_tokens_evaluated for c in off)
    for a, b in zip(off, on):
        assert parse_score(a)[0] == pytest.approx(parse_score(b)[0], abs=0.05)


def test_a_prompt_that_does_not_ask_for_a_digit_still_gets_one_under_a_scale(backend) -> None:
    # The prompt asks for a story; the request's constraint says a 1-5 digit, so that is the reply.
    msgs = (Message("user", "Write a long story about a dragon."),)
    c = backend.complete(CompletionRequest(msgs, max_tokens=8, top_logprobs=10, answer=Scale(1, 5)))
    top = c.top_logprobs[0]
    assert sorted(a.token for a in top) == ["1", "2", "3", "4", "5"]
    assert sum(math.exp(a.logprob) for a in top) == pytest.approx(1.0, abs=1e-6)
    assert c.text == top[0].token
    score, reason = parse_score(c)
    assert reason is None and 1.0 <= score <= 5.0
    # without a constraint nothing is guessed from top_logprobs: the model writes its story
    free = backend.complete(CompletionRequest(msgs, max_tokens=8, top_logprobs=3))
    assert len(free.text) > 1 and free.completion_tokens > 1
    assert free.top_logprobs is not None and all(len(p) <= 3 for p in free.top_logprobs)


@pytest.mark.parametrize("words", [("A", "B"), ("Yes", "No")])
def test_label_words_come_back_as_one_word_with_both_probabilities(backend, words) -> None:
    msgs = (Message("user", "Tell me about the weather in a long paragraph."),)  # no label asked for
    c = backend.complete(CompletionRequest(msgs, max_tokens=2, top_logprobs=10, answer=Labels(words)))
    assert c.text in words
    top = c.top_logprobs[0]
    assert sorted(a.token for a in top) == sorted(words) and top[0].token == c.text
    assert sum(math.exp(a.logprob) for a in top) == pytest.approx(1.0, abs=1e-6)


def test_two_scores_on_a_ten_point_scale_are_generated_under_the_grammar(backend) -> None:
    msgs = (Message("user", "Write a haiku about rain."),)  # nothing asks for scores
    c = backend.complete(CompletionRequest(msgs, max_tokens=8, answer=Scale(1, 10, count=2)))
    a, b = c.text.split(" ")
    assert 1 <= int(a) <= 10 and 1 <= int(b) <= 10 and c.top_logprobs is None


def test_a_json_schema_constrains_the_reply(backend) -> None:
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 2,
                                 "items": {"type": "string", "maxLength": 20}}},
        "required": ["items"],
        "additionalProperties": False,
    }
    req = CompletionRequest(messages=(Message("user", "List two fruits as JSON."),), max_tokens=60,
                            json_schema=json.dumps(schema))
    c = backend.complete(req)
    data = json.loads(c.text)
    assert set(data) == {"items"} and 1 <= len(data["items"]) <= 2
    assert all(len(x) <= 20 for x in data["items"])
    assert c.top_logprobs is None and 0 < c.completion_tokens <= 60


def test_a_prompt_longer_than_the_context_names_the_setting(backend) -> None:
    req = CompletionRequest(messages=(Message("user", "word " * 6000),), top_logprobs=5)
    with pytest.raises(BackendError, match="does not fit the local model's context of 4096 tokens: set HDEVAL_LLAMACPP_N_CTX"):
        backend.complete(req)


def test_bad_model_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="/nonexistent.gguf"):
        make_backend(LLMConfig("llamacpp:/nonexistent.gguf"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="cannot load GGUF model .*broken.gguf"):
        XLlamaCppBackend(bad, n_threads=1)


def test_a_closed_backend_refuses_calls() -> None:
    b = XLlamaCppBackend.from_spec("local", n_threads=1, n_ctx=512)
    b.close()
    with pytest.raises(BackendError, match="closed"):
        b.complete(CompletionRequest(messages=(Message("user", "hi"),)))


def test_same_scores_as_llama_cpp_python_on_the_same_gguf(backend) -> None:
    pytest.importorskip("llama_cpp", reason="the comparison needs llama-cpp-python too: pip install -e '.[local-llamacpp]'")
    from hdeval.llm.backends.llama_cpp import LlamaCppBackend

    other = LlamaCppBackend.from_spec("local", n_threads=1)
    try:
        for req in _requests(2):
            a, b = backend.complete(req), other.complete(req)
            assert a.prompt_tokens == b.prompt_tokens  # the same chat template, the same tokens
            # different llama.cpp builds round differently: measured up to 0.1 apart on 1-5
            assert parse_score(a)[0] == pytest.approx(parse_score(b)[0], abs=0.25)
    finally:
        other.close()
