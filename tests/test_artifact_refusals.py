"""Artifacts a method cannot use are refused in one line before any call: explain's refusal,
null or mistyped settings, and an oversized batch result named in MB."""

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
    assert r.stderr.strip() == (f"error: hdeval explain cannot explain {art}: its evaluator (method {method!r}, "
                                "pointwise data) gives no explanations; hdeval apply shows its scores")
    assert not (tmp_path / "fresh").exists()  # nothing asked of the LLM


def test_a_batch_result_file_over_its_cap_is_named_in_mb_as_before(monkeypatch, tmp_path):
    # s3backends (49a7bf2) gave the files client its own cap but worded both caps in KB: a result
    # file past 2 GB read "a reply larger than 2097152 KB" where caf1259 said "2048 MB"
    import asyncio

    from llm_server import FaultServer, Reply

    from hdeval.core.errors import BackendError
    from hdeval.llm.backends import batch as batch_mod

    monkeypatch.setattr(batch_mod, "MAX_RESULT_BYTES", 3 * 2**20)  # read when the client is made
    with FaultServer() as server:
        server.plan(Reply.raw(b'{"custom_id": "x"}\n' * (4 * 2**20 // 19), content_type="application/jsonl"))
        api = batch_mod.BatchAPI(server.url, "sk-big", max_retries=0, backoff_base=0.01, backoff_cap=0.01)
        with pytest.raises(BackendError) as err:
            asyncio.run(api.download("file-0", tmp_path / "out.jsonl"))
        api.close()
    msg = str(err.value)
    assert "last: a reply larger than 3 MB;" in msg and "\n" not in msg and "sk-big" not in msg


@pytest.fixture(scope="module")
def dna_artifact(tmp_path_factory):
    work = tmp_path_factory.mktemp("dna")
    r = run_cli("train", "--task", EX / "pairs_task.toml", "--method", "dna", "--llm", "fake",
                "--cache-dir", work / "c", "-o", work / "art", "-q")
    assert r.exit_code == 0, r.output
    return work / "art"


@pytest.mark.parametrize("key,message", [
    ("mode", "--dna-mode must be one of dna, direct, cot, prompt-agg, got None"),
    ("aspect_source", "--aspect-source must be one of predefined, dynamic, got None"),
    ("k", "--k must be a whole number, got None"),
    ("swap", "--swap must be true or false, got None"),
    ("logprobs", "--logprob-scores must be true or false, got None"),
])
def test_a_dna_artifact_whose_setting_is_null_is_refused_in_one_line(dna_artifact, tmp_path, key, message):
    # s3methods (44d1939) left the artifact's settings to DnaOptions' own checks, which skip a
    # None (an option not given): a null mode reached the prompt files as a KeyError traceback, a null k
    # a TypeError, and a null aspect source, swap or logprobs scored as if valid
    import json
    import shutil

    art = tmp_path / "art"
    shutil.copytree(dna_artifact, art)
    manifest = json.loads((art / "manifest.json").read_text(encoding="utf-8"))
    manifest["method_args"][key] = None
    (art / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    r = run_cli("apply", art, EX / "new_pairs.jsonl", "-o", tmp_path / "out.jsonl", "--cache-dir", tmp_path / "c")
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == f"error: {art}/manifest.json: {message}"
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("task,section", [("qa_task.toml", "aggregator"), ("pairs_task.toml", "classifier")])
def test_an_hdeval_artifact_whose_model_kind_is_a_list_is_refused_in_one_line(tmp_path, task, section):
    # the kind was looked up in a dict unchecked: ["lr"] ended in "TypeError: unhashable type"
    # (at caf1259 too); PairEval's loader already said "malformed artifact"
    import json

    art = tmp_path / "art"
    r = run_cli("train", "--task", EX / task, "--layers", "1", "--aggregator", "lr", "--llm", "fake",
                "--cache-dir", tmp_path / "c", "-o", art, "-q")
    assert r.exit_code == 0, r.output
    manifest = json.loads((art / "manifest.json").read_text(encoding="utf-8"))
    manifest["state"][section]["kind"] = ["lr"]
    (art / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    new = EX / ("new_qa.jsonl" if task == "qa_task.toml" else "new_pairs.jsonl")
    r = run_cli("apply", art, new, "-o", tmp_path / "out.jsonl", "--cache-dir", tmp_path / "c")
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == f"error: {art}/manifest.json: unknown {section} kind ['lr']"
    assert not (tmp_path / "out.jsonl").exists()
