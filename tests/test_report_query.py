"""The report's per-sample view and a base URL with a query (Azure's ``?api-version=``): the
artifact keeps the URL without it, so the cache keys of the training run are found only when the
user gives the URL again (``hdeval report --base-url``), and the query is never written."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli

from hdeval.core.errors import ConfigError
from hdeval.core.urls import public_identity
from hdeval.llm.config import keyed_identity
from hdeval.llm.backends.base import CompletionRequest
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend

PUBLIC = "http://127.0.0.1:9/openai/deployments/d"
FULL = PUBLIC + "?api-version=2024-06-01&api-key=QUERY-SECRET-1234"


def test_the_identity_cache_keys_were_made_with_comes_back_from_the_url_with_its_query() -> None:
    for url in (FULL, "http://user:pw@127.0.0.1:9/v1/?a=b#frag", "http://127.0.0.1:9/v1"):
        from hdeval.llm.backends.openai_compat import OpenAICompatBackend

        for dialect in ("openai", "vllm", "llama.cpp"):  # the dialect's suffix follows the query
            full = OpenAICompatBackend("m", base_url=url, api_key="k", dialect=dialect).identity
            assert keyed_identity(public_identity(full, url), url) == full
    assert keyed_identity("openai:m@http://127.0.0.1:9/v1", "http://other:9/v1?q=1") == "openai:m@http://127.0.0.1:9/v1"


def test_the_per_sample_view_finds_a_query_servers_replies_given_its_url_again(data_dir, tmp_path: Path) -> None:
    from hdeval.data.samples import read_samples
    from hdeval.judge.scoring import scoring_request
    from hdeval.methods.hdeval.report import disagreements
    from hdeval.methods.registry import load_artifact

    data = tmp_path / "sfres40.jsonl"
    data.write_text("".join((data_dir / "sfres.jsonl").read_text(encoding="utf-8").splitlines(True)[:40]),
                    encoding="utf-8")
    art = tmp_path / "art"
    r = run_cli("train", "--task", "sfres", "--data", data, "--llm", "fake", "--layers", "1",
                "--cache-dir", tmp_path / "c0", "--out", art, "-q")
    assert r.exit_code == 0, r.output
    ev = load_artifact(art)
    # what an artifact trained against FULL holds: the URL and identity without the query
    ev.llm_identity = f"openai:m@{PUBLIC}"
    ev.llm = ev.llm.replace(model="m", base_url=PUBLIC)

    class AtFull(FakeBackend):  # the replies that run cached, under its full identity
        identity = f"openai:m@{FULL}"

    cache = tmp_path / "c"
    reqs: list[CompletionRequest] = [scoring_request(ev.templates["score"], ev.task, ev.tree, ev.tree[k], s)
                                     for s in read_samples(data, ev.task, require_scores=False)
                                     for k in ev.feature_keys]
    client = CachedBackend(AtFull(), cache)
    client.complete_many(reqs)
    client.close()

    samples, note = disagreements(ev, data, cache)
    assert note is not None and "none of these prompts' replies" in note  # the artifact alone cannot
    ev.llm = ev.llm.replace(base_url=FULL)  # what `hdeval report --base-url FULL` does
    samples, note = disagreements(ev, data, cache)
    assert note is None and samples
    assert all(c.get("reply") for s in samples for c in s["criteria"]), samples[0]["criteria"][:1]


def test_report_refuses_a_base_url_of_another_server(data_dir, tmp_path: Path) -> None:
    data = tmp_path / "sfres40.jsonl"
    data.write_text("".join((data_dir / "sfres.jsonl").read_text(encoding="utf-8").splitlines(True)[:40]),
                    encoding="utf-8")
    art = tmp_path / "art"
    assert run_cli("train", "--task", "sfres", "--data", data, "--llm", "fake", "--layers", "1",
                   "--cache-dir", tmp_path / "c0", "--out", art, "-q").exit_code == 0
    r = run_cli("report", art, "--base-url", FULL, "--cache-dir", tmp_path / "c0", "-q")
    assert r.exit_code == ConfigError.exit_code
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "another server" in errors[0] and "QUERY-SECRET" not in r.output + r.stderr
