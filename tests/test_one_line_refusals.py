"""Bad values are one line, never a leak or a traceback: a URL query secret in what is printed,
DnA weights that overflow, requests that cannot be exported, an LLM model that is not text."""

from __future__ import annotations

import pytest
from conftest import REPO, one_error, run_cli, trained_toy_artifact


def test_a_query_secret_in_the_base_url_is_never_printed_by_the_dry_run(tmp_path):
    # the backend identity keeps the query (it is cache-key material); what is shown must not
    r = run_cli("train", "--task", REPO / "examples" / "qa_task.toml", "--data", REPO / "examples" / "qa.jsonl",
                "--llm", "mymodel", "--base-url", "http://127.0.0.1:9/v1?api_key=SECRETQ", "--layers", "1",
                "--cache-dir", tmp_path / "c", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "127.0.0.1:9/v1" in r.output and "SECRETQ" not in r.output


def test_shown_identity_drops_credentials_queries_and_fragments_of_every_url():
    from hdeval.core.urls import shown_identity

    raw = "openai:m@http://u:pw@h:9/v1?api_key=S1, decomposition LLM openai:x@https://g/v1?k=S2#S3"
    assert shown_identity(raw) == "openai:m@http://h:9/v1, decomposition LLM openai:x@https://g/v1"


def test_a_shown_identity_keeps_its_dialect_when_the_url_has_a_query():
    # the dialect sends scale constraints another way: a run on vllm and one on llama.cpp at the
    # same Azure-style URL must not print (or record their speed) as the same LLM
    from hdeval.llm.backends.openai_compat import OpenAICompatBackend
    from hdeval.llm.config import shown_identity

    for dialect in ("vllm", "llama.cpp"):
        be = OpenAICompatBackend("m", base_url="http://u:pw@127.0.0.1:9/v1?api-key=SECRETQ#F", api_key="k",
                                 dialect=dialect)
        assert shown_identity(be.identity) == f"openai:m@http://127.0.0.1:9/v1+{dialect}"
    # a query that merely ends like one is cut with the query when the identity names no dialect
    assert shown_identity("openai:m@http://h/v1?key=S+x") == "openai:m@http://h/v1"


def test_dna_weights_too_large_to_add_up_are_refused_not_zeroed():
    from hdeval.methods.dna.replies import validate_weights

    with pytest.raises(ValueError, match="too large"):
        validate_weights(["a", "b"])({"weights": {"a": 1e308, "b": 1e308}})


def test_export_requests_refuses_dna_whose_weights_are_asked_per_pair(faireval40, tmp_path):
    # DnA asks each pair's weights as JSON with re-asks: an offline engine cannot answer that, and
    # the export used to stop on its own --max-calls 0 with nothing written
    art = tmp_path / "dna"
    r = run_cli("train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--llm", "fake",
                "--cache-dir", tmp_path / "c", "-o", art, "-q")
    assert r.exit_code == 0, r.output
    out = tmp_path / "requests.jsonl"
    r = run_cli("apply", art, faireval40, "--llm", "m", "--base-url", "http://127.0.0.1:9/v1",
                "--cache-dir", tmp_path / "c2", "--export-requests", out)
    assert r.exit_code != 0 and "--export-requests cannot serve DnA" in r.output
    assert not out.exists()


@pytest.mark.parametrize("method", ["direct", "direct-yesno"])
def test_an_artifact_whose_llm_model_is_not_text_is_one_line_not_a_traceback(tmp_path, method):
    import json

    art = tmp_path / "art"
    res = run_cli("train", "--task", REPO / "examples" / "qa_task.toml", "--data", REPO / "examples" / "qa.jsonl",
                  "--method", method, "--llm", "fake", "--cache-dir", tmp_path / "cache", "-o", art)
    assert res.exit_code == 0, res.output
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["llm"] = dict(manifest["llm"], model=5)
    (art / "manifest.json").write_text(json.dumps(manifest))
    res = run_cli("apply", art, REPO / "examples" / "new_qa.jsonl", "-o", tmp_path / "out.jsonl",
                  "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 2 and not isinstance(res.exception, AttributeError), res.output
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: {art}: malformed artifact ('llm' must hold text")
    assert not (tmp_path / "out.jsonl").exists()


def _as_hdeval(*args):
    from click.testing import CliRunner

    from hdeval.cli import cli

    return CliRunner().invoke(cli, list(args), prog_name="hdeval")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("train", "--no-such-option"), "error: No such option '--no-such-option'. Did you mean '--method-option'? (see 'hdeval train -h')"),
        (("train", "--llm"), "error: Option '--llm' requires an argument. (see 'hdeval train -h')"),
        (("apply",), "error: Missing argument 'ARTIFACT'. (see 'hdeval apply -h')"),
        (("estimate", "a", "--data", "b", "--alpha", "abc"),
         "error: Invalid value for '--alpha': 'abc' is not a valid float. (see 'hdeval estimate -h')"),
        (("nosuch",), "error: No such command 'nosuch'. (see 'hdeval -h')"),
        (("data", "nosuch"), "error: No such command 'nosuch'. (see 'hdeval data -h')"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help_to_read(args, line):
    # click's own is three lines (usage, a hint, the error), unlike every other refusal
    r = _as_hdeval(*args)
    assert r.exit_code == 2
    assert r.output.strip() == line


def test_no_arguments_still_shows_the_help_page():
    r = _as_hdeval()
    assert "Usage: hdeval" in r.output and "Commands:" in r.output


BAD_URLS = ["http://[bad/v1", "http://u:SECRETPW@[bad/v1", "http://[x/v1?api-key=SECRETQ"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_base_url_urllib_cannot_read_is_one_line_without_its_credentials(tmp_path, url):
    """'http://[bad/v1' ended in urllib's ValueError traceback (Invalid IPv6 URL), in the option's
    check, in apply's identity, in the backend, and in the redactor reporting the error."""
    task = ["--task", REPO / "examples" / "qa_task.toml", "--layers", "1", "--cache-dir", tmp_path / "c"]
    for llm in (["--llm", "m1"], ["--llm", "fake"]):
        r = run_cli("train", *task, *llm, "--base-url", url, "--dry-run")
        assert r.exit_code == 2 and "SECRET" not in r.output
        one_error(r, "--base-url is not a valid URL (Invalid IPv6 URL)")


def test_apply_with_a_base_url_urllib_cannot_read_is_one_line_with_or_without_llm(tmp_path, monkeypatch):
    art, data = trained_toy_artifact(tmp_path, layers=1), tmp_path / "toy.jsonl"
    for url in BAD_URLS:
        for llm in ([], ["--llm", "m1"]):
            r = run_cli("apply", art, data, *llm, "--base-url", url, "-o", tmp_path / "o.jsonl")
            assert r.exit_code == 2 and "SECRET" not in r.output
            one_error(r, "--base-url is not a valid URL (Invalid IPv6 URL)")
    monkeypatch.setenv("HDEVAL_BASE_URL", BAD_URLS[1])
    r = run_cli("apply", art, data, "-o", tmp_path / "o.jsonl")
    assert "SECRET" not in r.output
    one_error(r, "HDEVAL_BASE_URL is not a valid URL (Invalid IPv6 URL)")


def test_a_jury_judge_base_url_urllib_cannot_read_names_the_file_and_judge(tmp_path):
    jury = tmp_path / "jury.toml"
    jury.write_text('[[judge]]\nname = "a"\nllm = "m"\nbase_url = "http://u:SECRETPW@[x/v1"\n'
                    '[[judge]]\nname = "b"\nllm = "fake"\n')
    r = run_cli("train", "--task", REPO / "examples" / "qa_task.toml", "--layers", "1", "--jury", jury,
                "--cache-dir", tmp_path / "c", "--dry-run")
    assert r.exit_code == 2 and "SECRET" not in r.output
    one_error(r, f"{jury}: judge 'a': base_url is not a valid URL (Invalid IPv6 URL)")


def test_the_library_refuses_a_base_url_urllib_cannot_read_in_one_line(monkeypatch):
    from hdeval.core.errors import ConfigError
    from hdeval.llm.backends.openai_compat import OpenAICompatBackend
    from hdeval.llm.config import LLMConfig

    for url in BAD_URLS:
        with pytest.raises(ConfigError, match=r"^--base-url is not a valid URL \(Invalid IPv6 URL\)$"):
            LLMConfig(model="m", base_url=url).check()
        with pytest.raises(ConfigError, match=r"^--base-url is not a valid URL \(Invalid IPv6 URL\)$"):
            OpenAICompatBackend("m", base_url=url, api_key="k")
    with pytest.raises(ConfigError, match="--base-url is empty"):
        LLMConfig(model="m", base_url=" ").check()
    monkeypatch.setenv("HTTPS_PROXY", "http://u:SECRETPW@[bad:1")
    with pytest.raises(ConfigError, match=r"proxy .* is not a valid URL \(Invalid IPv6 URL\)") as refused:
        OpenAICompatBackend("m", base_url="https://127.0.0.1:9/v1", api_key="k")
    assert "SECRET" not in str(refused.value)


def test_urls_urllib_cannot_read_are_shown_and_redacted_without_raising():
    """The redactor ran on every error line with the command's --base-url: on 'http://[bad/v1' it
    raised while an error was being reported (two chained tracebacks)."""
    from hdeval.core.redaction import Redactor, url_secrets
    from hdeval.core.urls import keyed_identity, public_identity, public_url, unreadable

    url = "http://u:SECRETPW@[bad/v1?api-key=SECRETQ#FRAG"
    assert unreadable(url) == "Invalid IPv6 URL" and unreadable("http://u:p@h:9/v1?k=v") is None
    assert public_url(url) == "http://[bad/v1"
    assert "SECRET" not in public_identity(f"openai:m@{url}", url)
    assert keyed_identity("openai:m@http://[bad/v1", url)  # no raise
    assert {"SECRETPW", "SECRETQ"} <= url_secrets(url)
    text = Redactor(None, url)(f"error: {url} refused; key SECRETPW, query SECRETQ")
    assert "SECRET" not in text
    assert "SECRET" not in Redactor.from_env(url)(url)
