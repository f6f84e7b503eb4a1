"""Golden runs: refactors must not change what training produces.

Each case trains with the fake backend on a slice of a real dataset and compares digests of
``tree.json``, ``scores.csv`` and ``metrics.json`` (usage/call counts removed) with the
digests recorded in ``tests/golden/digests.json``. The digests hold no data, only hashes.

A change that is *meant* to alter training output updates the digests in the same commit
(``HDEVAL_GOLDEN_UPDATE=1 pytest tests/test_golden.py``) and says why in its message.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from conftest import artifact_view, slice_jsonl, train_artifact
from hdeval.cli import main as _main  # noqa: F401  (the CLI entry point must import)

GOLDEN = Path(__file__).parent / "golden" / "digests.json"

# task, slice rows, layers, aggregator
CASES = [
    ("summeval", 48, 3, "lr"),
    ("topical_chat", 36, 3, "rf"),
    ("sfres", 60, 3, "dt"),
    ("sfhot", 60, 2, "lr"),
]


def _digests(path: Path) -> dict[str, str]:
    return {k: hashlib.sha256(v.encode()).hexdigest() for k, v in artifact_view(path).items()}


def _train(task: str, n: int, layers: int, agg: str, data_dir: Path, tmp_path: Path,
           llm: tuple[str, ...] = ("--llm", "fake"), env: dict | None = None) -> Path:
    data = slice_jsonl(data_dir / f"{task}.jsonl", tmp_path / f"{task}.jsonl", n)
    return train_artifact(task, data, tmp_path, "--layers", layers, "--children", 3, "--top-k", 2,
                          "--aggregator", agg, llm=llm, env=env)


@pytest.mark.parametrize("task, n, layers, agg", CASES)
def test_training_output_is_unchanged(task, n, layers, agg, data_dir, tmp_path):
    got = _digests(_train(task, n, layers, agg, data_dir, tmp_path))
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    name = f"{task}-{n}-{layers}-{agg}"
    if os.environ.get("HDEVAL_GOLDEN_UPDATE"):
        recorded[name] = got
        GOLDEN.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        return
    assert name in recorded, f"no golden digests for {name}: run with HDEVAL_GOLDEN_UPDATE=1"
    assert got == recorded[name]


def test_the_test_server_answers_exactly_like_the_fake_llm(data_dir, tmp_path):
    """The OpenAI-compatible path (HTTP, the real client, the server's responders chosen by the
    kind and data of the requests built in the test, from its book) trains the very same evaluator as
    the in-process fake."""
    from llm_server import FaultServer

    task, n, layers, agg = CASES[-1]
    recorded = json.loads(GOLDEN.read_text())[f"{task}-{n}-{layers}-{agg}"]
    with FaultServer(lifetime=300) as server:
        out = _train(task, n, layers, agg, data_dir, tmp_path,
                     ("--llm", "test-model", "--base-url", server.url), {"OPENAI_API_KEY": "sk-test"})
    assert _digests(out) == recorded
