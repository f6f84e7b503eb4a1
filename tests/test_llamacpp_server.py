"""HD-Eval, direct, direct-yesno, PairEval and DnA through llama.cpp's own HTTP server (started by
xllamacpp on 127.0.0.1 on the embedded model's GGUF), against the embedded runtime on the same file.

hdeval recognises the server from its /v1/models (``owned_by: llamacpp``) and sends it the
embedded runtime's constraint, so a score read through the server is the embedded one. The 135M
model's figures are smoke tests of the plumbing, not of judging. Skipped without xllamacpp and
the bundled model.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import numpy as np
import pytest

pytest.importorskip("xllamacpp", reason="needs xllamacpp: pip install -e '.[local]'")
from conftest import embedded_model_or_skip  # noqa: E402

MODEL = embedded_model_or_skip()

from conftest import toy_rows, write_jsonl  # noqa: E402
from test_local_methods import PAIRS  # noqa: E402
from test_paireval import TOY_DIALOGUE  # noqa: E402

from hdeval.llm.backends.xllamacpp import CACHE_RAM_MIB, XLlamaCppBackend  # noqa: E402
from hdeval.run.train import train  # noqa: E402

pytestmark = pytest.mark.slow


# One thread each: llama.cpp's threads wait for each other at every step, so on a shared machine
# two of them stall whenever one is descheduled; both sides use the same, as their numbers must.
THREADS = 1


def start_server():
    """llama.cpp's HTTP server on the embedded model, on 127.0.0.1, set up as the embedded runtime
    sets up its own: (its URL, the server)."""
    import xllamacpp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    params = xllamacpp.CommonParams()
    params.model.path = str(MODEL)
    params.n_ctx = 4096
    params.n_parallel = 1
    params.n_batch = 512  # as the embedded runtime: the same batches, the same numbers
    params.cache_ram_mib = CACHE_RAM_MIB
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = THREADS
    params.warmup = False
    params.verbosity = -1
    params.hostnames = ["127.0.0.1"]
    params.port = port
    server = xllamacpp.Server(params)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/models", timeout=2).raise_for_status()
            return url, server
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def server_url():
    url, server = start_server()
    yield url
    del server


@pytest.fixture
def local():
    """The embedded runtime, started for each test as the server is: both begin with an empty
    prompt cache, and llama.cpp's numbers depend on which prompt prefixes it reuses."""
    b = XLlamaCppBackend.from_spec("local", n_threads=THREADS)
    yield b
    b.close()


@pytest.fixture(autouse=True)
def _auto_dialect(monkeypatch):
    monkeypatch.setenv("HDEVAL_LLM_DIALECT", "auto")  # as a user's run: asked of the server


@pytest.fixture
def toy(tmp_path):
    """8 short dialogue samples over 4 conversations, one aspect."""
    task = tmp_path / "toy_dialogue.toml"
    task.write_text(TOY_DIALOGUE.split("[[aspects]]\nkey = \"engagingness\"")[0], encoding="utf-8")
    return str(task), str(write_jsonl(tmp_path / "toy.jsonl", toy_rows(n_docs=4, per_doc=2, aspects=("overall",))))


def _both(method, task, data, url, local, tmp_path, **options):
    """(through the server, embedded) evaluators of one method on the same samples."""
    # one request at a time, as the embedded runtime runs them: the server's one slot then reuses
    # the same cached prompt prefixes, so llama.cpp computes the same numbers
    served = train(task=task, data=data, method=method, llm="SmolLM2-135M-Instruct.Q4_1.gguf", base_url=url,
                   cache_dir=str(tmp_path / "served"), concurrency=1, **options)
    embedded = train(task=task, data=data, method=method, backend=local, cache_dir=str(tmp_path / "embedded"),
                     **options)
    return served, embedded


def _agree(served, embedded, columns):
    """(correlation, unreadable share, distinct values, largest difference) of the served scores
    against the embedded ones, printed for the record."""
    a = served.score_table[columns].to_numpy(float).ravel()
    b = embedded.score_table[columns].to_numpy(float).ravel()
    unreadable = float(np.isnan(a).mean())
    ok = ~np.isnan(a) & ~np.isnan(b)
    corr = float(np.corrcoef(a[ok], b[ok])[0, 1]) if np.ptp(a[ok]) and np.ptp(b[ok]) else float("nan")
    gap = float(np.abs(a[ok] - b[ok]).max())
    distinct = len(set(np.round(a[ok], 6)))
    print(f"{columns}: {ok.sum()} cells, unreadable {unreadable:.1%}, correlation {corr:.4f}, distinct {distinct}, "
          f"spread {np.ptp(b[ok]):.3f}, largest difference {gap:.4f}")
    return corr, unreadable, distinct, gap


# The same requests in the same order, to a server and to the embedded runtime both just started,
# give the same numbers: only a difference in what the server is asked (or in what it reused of
# its cache) makes them differ, and it would show here.
SAME = 1e-6


def test_direct_through_the_server_scores_as_embedded(server_url, local, toy, tmp_path):
    served, embedded = _both("direct", *toy, server_url, local, tmp_path)
    assert served.llm_identity.endswith("+llama.cpp")  # recognised: the constraint was sent
    corr, unreadable, _, gap = _agree(served, embedded, ["overall"])
    assert unreadable < 0.05 and gap <= SAME and corr >= 0.95


def test_hdeval_two_layers_through_the_server_scores_as_embedded(server_url, local, toy, tmp_path):
    served, embedded = _both("hdeval", *toy, server_url, local, tmp_path, layers=2, children=2, aggregator="lr")
    # every criterion scored (the 135M model's decompositions are unusable, on both sides alike:
    # layer 1's then stand, with the reason)
    criteria = [c for c in served.score_table.columns if c not in ("sample_id", "split") and ":" not in c]
    shared = [c for c in criteria if c in set(embedded.score_table.columns)]
    assert shared == criteria and served.metrics.get("stopped") == embedded.metrics.get("stopped")
    corr, unreadable, _, gap = _agree(served, embedded, shared)
    assert unreadable < 0.05 and gap <= SAME and corr >= 0.95


@pytest.mark.parametrize("method, options", [("paireval", {"comparisons": 1, "aggregator": "lr"}),
                                             ("direct-yesno", {})])
def test_label_probabilities_through_the_server_are_distinct_and_embedded(method, options, server_url, local, toy,
                                                                          tmp_path):
    served, embedded = _both(method, *toy, server_url, local, tmp_path, **options)
    corr, unreadable, distinct, gap = _agree(served, embedded, ["overall"])
    # distinct probabilities (never a 0.5 from one label alone), each the embedded one
    assert served.metrics["failure_rate"] < 0.05 and distinct > 2 and gap <= SAME and corr >= 0.9


def test_dna_through_the_server(server_url, tmp_path):
    # four pairs, the fewest a split leaves two to train on: every kind of DnA call (weights, aspect
    # scores) is made, each JSON reply read from the server
    data = str(write_jsonl(tmp_path / "pairs.jsonl", [
        {"id": f"p{i}", "doc_id": f"d{i}", "source": q, "output_a": a, "output_b": b, "label": "ab"[i % 2]}
        for i, (q, a, b) in enumerate(PAIRS[:4])]))
    served = train(task="faireval", data=data, method="dna", llm="SmolLM2-135M-Instruct.Q4_1.gguf",
                   base_url=server_url, cache_dir=str(tmp_path / "c"))
    m = served.metrics
    assert m["failure_rate"] == 0.0 and m["score_failures"] == 0
    assert m["usage"]["cache_hits"] == 0


def test_direct_on_topical_chat_through_the_server_scores_as_embedded(server_url, local, tmp_path):
    from conftest import shared_data_dir

    data = shared_data_dir()
    if data is None or not (data / "topical_chat.jsonl").exists():
        pytest.skip("needs the topical_chat data set (HDEVAL_DATA_DIR)")
    # two responses to each of the two shortest conversations (the time is the prompts'): a split
    # by conversation leaves one to train on
    rows = [json.loads(line) for line in (data / "topical_chat.jsonl").open(encoding="utf-8")]
    size = {}
    for r in rows:
        size[r["doc_id"]] = max(size.get(r["doc_id"], 0), len(r["source"]) + len(r.get("context") or ""))
    docs = sorted(size, key=lambda d: (size[d], d))[:2]
    subset = [r for d in docs for r in [r for r in rows if r["doc_id"] == d][:2]]
    served, embedded = _both("direct", "topical_chat", str(write_jsonl(tmp_path / "tc.jsonl", subset)), server_url,
                             local, tmp_path)
    corr, unreadable, _, gap = _agree(served, embedded, list(served.score_table.columns.intersection(
        ["naturalness", "coherence", "engagingness", "groundedness", "understandability", "overall"])))
    assert unreadable < 0.05 and gap <= SAME and corr >= 0.95
