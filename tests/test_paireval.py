"""PairEval (``--method paireval``), DIRECTEVAL (``--method direct-yesno``) and the PairEval
fine-tuning export: end to end with the fake LLM, the position swap, and every bad input path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import one_line_error, toy_rows, write_jsonl

from hdeval.cli import cli
from hdeval.core.errors import ConfigError, DataError
from hdeval.data.samples import read_samples
from hdeval.data.tasks import load_task
from hdeval.judge.fill import label_probability
from hdeval.llm.backends.base import Completion, TokenLogprob
from hdeval.llm.backends.fake import RESPONDERS, FakeBackend
from hdeval.methods.paireval.export import export_training
from hdeval.methods.paireval.fitted import PairEvalEvaluator
from hdeval.methods.paireval.yesno import YesNoEvaluator
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def lines(src: Path, dest: Path, start: int, stop: int) -> Path:
    with src.open(encoding="utf-8") as fh:
        rows = fh.readlines()[start:stop]
    dest.write_text("".join(rows), encoding="utf-8")
    return dest


def lp(*pairs):
    return (tuple(TokenLogprob(t, math.log(p)) for t, p in pairs),)


def fixed(p_first: float):
    """A responder that prefers whatever is shown first with probability ``p_first``."""
    def answer(request, fake):
        return Completion("A", lp(("A", p_first), ("B", 1 - p_first)), 10, 1)
    return answer


TOY_DIALOGUE = """
name = "toy_dialogue"
description = "Dialogue: a system wrote the next response."
output_label = "Response"

[[fields]]
key = "source"
label = "Dialogue history"

[[fields]]
key = "output"
label = "Response"

[[aspects]]
key = "overall"
name = "Overall quality"
definition = "How good the response is."
range = [1, 5]

[[aspects]]
key = "engagingness"
name = "Engagingness"
definition = "How engaging the response is."
range = [1, 3]
"""


@pytest.fixture
def dialogue(tmp_path) -> tuple[Path, Path]:
    """A toy dialogue task: 36 samples over 12 conversations (6 train, 6 test)."""
    task = tmp_path / "toy_dialogue.toml"
    task.write_text(TOY_DIALOGUE, encoding="utf-8")
    rows = toy_rows(aspects=("overall", "engagingness"))
    for r in rows:
        r["scores"]["engagingness"] = 1 + r["scores"]["engagingness"] % 3
    return task, write_jsonl(tmp_path / "toy.jsonl", rows)


# ---------------------------------------------------------------- end to end
@pytest.mark.parametrize("task, n, new", [("topical_chat", 48, (48, 60)), ("convai2_usr", 40, (40, 50))])
def test_train_load_apply_on_real_slices(task, n, new, data_dir, tmp_path, fake_calls):
    data = lines(data_dir / f"{task}.jsonl", tmp_path / "train.jsonl", 0, n)
    cache = str(tmp_path / "cache")
    ev = train(task=task, data=str(data), method="paireval", llm="fake", cache_dir=cache,
               aggregator="lr", comparisons=2)
    m = ev.metrics
    for section in ("final", "direct"):
        assert set(m[section]) == set(load_task(task).aspect_keys) | {"average"}
    assert m["direct"]["overall"]["spearman"] is not None
    assert 0.0 <= m["position_consistency"] <= 1.0 and 0.0 <= m["position_bias"] <= 1.0
    assert m["failure_rate"] == 0.0
    assert m["pair_judgments"] == n * 6 * 2 * 2  # samples x aspects x comparisons x orders
    # identical pairs (a training sample that is itself a comparison example) are one call
    assert m["usage"]["calls"] + m["usage"]["cache_hits"] == m["pair_judgments"]
    assert m["usage"]["calls"] < m["pair_judgments"]
    train_ids = set(ev.run["split"]["train"])
    assert [e.id for e in ev.pool] == m["comparisons"]["ids"] and set(m["comparisons"]["ids"]) <= train_ids
    assert len({e.doc_id for e in ev.pool}) == 3  # N + 1 distinct conversations

    path = ev.save(tmp_path / "art")
    recorded = json.loads((path / "comparisons.json").read_text())
    assert [r["id"] for r in recorded] == m["comparisons"]["ids"]
    loaded = load_artifact(path)
    assert isinstance(loaded, PairEvalEvaluator) and loaded.pool == ev.pool and loaded.n == 2

    fresh = read_samples(lines(data_dir / f"{task}.jsonl", tmp_path / "new.jsonl", *new), loaded.task,
                         require_scores=False)
    before = len(fake_calls)
    first = loaded.score(fresh, cache_dir=cache)
    assert len(fake_calls) - before == len(fresh) * 6 * 2 * 2  # new samples: new calls
    before = len(fake_calls)
    again = load_artifact(path).score(fresh, cache_dir=cache)
    assert len(fake_calls) == before  # a rerun compares against the recorded examples: 0 calls
    assert np.array_equal(first.predictions, again.predictions)
    lo = np.array([a.low for a in loaded.task.aspects])
    hi = np.array([a.high for a in loaded.task.aspects])
    assert np.all((first.predictions >= lo) & (first.predictions <= hi))
    # the training samples scored through the artifact ask exactly the training prompts again
    trained = read_samples(data, loaded.task)
    before = len(fake_calls)
    loaded.score(trained, cache_dir=cache)
    assert len(fake_calls) == before

    rows = loaded.output_rows(fresh, first)
    assert [r["id"] for r in rows] == [s.id for s in fresh]
    assert set(rows[0]["columns"]) == set(loaded.task.aspect_keys)
    assert all(0.0 <= v <= 1.0 for v in rows[0]["columns"].values())
    assert rows[0]["human"] == dict(fresh[0].scores)


def test_cli_train_paireval_writes_the_comparisons(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    out = tmp_path / "art"
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparisons", "4", "--no-swap", "--aggregator", "lr", "--cache-dir", str(tmp_path / "c"),
              "-o", str(out), "-q")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "paireval" and manifest["method_args"] == {"comparisons": 4, "swap": False}
    assert len(json.loads((out / "comparisons.json").read_text())) == 5
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pair_judgments"] == 36 * 2 * 4  # no second order
    assert metrics["position_consistency"] is None


# ---------------------------------------------------------------- the position swap
def test_swapped_average_is_order_free_and_consistency_is_low(dialogue, tmp_path):
    task, data = dialogue
    fake = FakeBackend(responders={**RESPONDERS, "pair": fixed(0.8)})
    ev = train(task=str(task), data=str(data), method="paireval", backend=fake,
               cache_dir=str(tmp_path / "c"), aggregator="lr")
    cols = ev.score_table[["overall", "engagingness"]].to_numpy()
    assert np.allclose(cols, 0.5, rtol=0, atol=1e-12)  # 0.8 first, 0.2 second: exactly 0.5
    assert ev.metrics["position_consistency"] == 0.0
    assert ev.metrics["position_bias"] == pytest.approx(0.6)


def test_without_swap_the_first_position_bias_stays(dialogue, tmp_path):
    task, data = dialogue
    fake = FakeBackend(responders={**RESPONDERS, "pair": fixed(0.8)})
    ev = train(task=str(task), data=str(data), method="paireval", backend=fake,
               cache_dir=str(tmp_path / "c"), aggregator="lr", swap=False)
    assert np.allclose(ev.score_table[["overall", "engagingness"]].to_numpy(), 0.8)
    assert ev.metrics["position_consistency"] is None and ev.metrics["position_bias"] is None


def test_a_failed_order_drops_that_comparison_and_is_counted(dialogue, tmp_path):
    task, data = dialogue
    seen = {"n": 0}

    def flaky(request, fake):
        seen["n"] += 1
        text = request.messages[-1].content
        if "Answer 0" in text.split("Conversation B:")[0]:  # targets "Answer 0 ..." shown first
            return Completion("I cannot decide.", None, 10, 3)
        return Completion("B", lp(("A", 0.3), ("B", 0.7)), 10, 1)

    fake = FakeBackend(responders={**RESPONDERS, "pair": flaky}, honour_constraints=False)
    ev = train(task=str(task), data=str(data), method="paireval", backend=fake,
               cache_dir=str(tmp_path / "c"), aggregator="lr", max_failure_rate=1.0)
    assert 0 < ev.metrics["failure_rate"] < 1
    table = ev.score_table.set_index("sample_id")
    # an "Answer 0" target shown first never reads, so none of its comparisons count: NaN
    assert table.loc["toy-00-0", ["overall", "engagingness"]].isna().all()
    assert table.loc["toy-00-1", "overall"] == pytest.approx(0.5)


# ---------------------------------------------------------------- label words
@pytest.mark.parametrize("top, text, target, other, want", [
    (lp(("A", 0.6), ("B", 0.2)), "A", "B", "A", 0.25),            # the second label's probability
    (lp((" Yes", 0.5), ("No", 0.25), (" no", 0.25)), "Yes", "Yes", "No", 2 / 3),  # spaces; case counts
    (lp(("Yes", 0.02), ("No", 0.01)), "Yes", "Yes", "No", 2 / 3),  # far from summing to 1
    (None, "No.", "Yes", "No", 0.0),
])
def test_label_probability_cases(top, text, target, other, want):
    p, reason = label_probability(Completion(text, top), target, other)
    assert reason is None and p == pytest.approx(want)


def test_label_probability_both_labels_missing_everywhere_is_a_failure():
    p, reason = label_probability(Completion("Hmm", lp(("Hmm", 0.9), ("I", 0.1))), "A", "B")
    assert math.isnan(p) and "neither" in reason


# ---------------------------------------------------------------- bad input
def test_zero_comparisons_is_one_error_line_before_any_call(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparisons", "0", "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    one_line_error(res, "--comparisons", "at least 1", "0")
    assert not fake_calls and not (tmp_path / "art").exists()


def test_more_comparisons_than_available_is_one_error_line(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparisons", "6", "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    # 6 training conversations: a target may be compared with the 5 others
    one_line_error(res, "--comparisons 6", "5 available", "training split")
    assert not fake_calls and not (tmp_path / "art").exists()


def test_comparison_file_of_the_wrong_shape_is_one_error_line(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [
        {"id": "p1", "source": "hi", "output_a": "hello", "output_b": "go away", "label": "a"}])
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparison-data", str(pairs), "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    one_line_error(res, "comparison file", str(pairs), "line 1", "'output'")
    assert not fake_calls and not (tmp_path / "art").exists()
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparison-data", str(tmp_path / "missing.jsonl"), "--cache-dir", str(tmp_path / "c"))
    one_line_error(res, "comparison file", "missing.jsonl", "does not exist")


def test_comparison_data_file_supplies_the_examples(dialogue, tmp_path):
    task, data = dialogue
    outside = write_jsonl(tmp_path / "outside.jsonl", [
        {"id": f"out-{i}", "doc_id": f"o-{i}", "source": f"hello number {i}", "output": f"hi there {i}"}
        for i in range(4)])
    ev = train(task=str(task), data=str(data), method="paireval", llm="fake", aggregator="lr",
               cache_dir=str(tmp_path / "c"), comparisons=4, comparison_data=str(outside))
    assert sorted(e.id for e in ev.pool) == [f"out-{i}" for i in range(4)]
    with pytest.raises(ConfigError, match="more than the 4 available"):
        train(task=str(task), data=str(data), method="paireval", llm="fake", cache_dir=str(tmp_path / "c"),
              comparisons=5, comparison_data=str(outside))


# ---------------------------------------------------------------- DIRECTEVAL
def test_direct_yesno_reads_p_yes_onto_the_aspect_range(dialogue, tmp_path, fake_calls):
    task, data = dialogue

    def yes75(request, fake):
        return Completion("Yes", lp((" Yes", 0.6), ("No", 0.2)), 10, 1)

    fake = FakeBackend(responders={**RESPONDERS, "yesno": yes75})
    ev = train(task=str(task), data=str(data), method="direct-yesno", backend=fake, cache_dir=str(tmp_path / "c"))
    assert np.allclose(ev.score_table[["overall", "engagingness"]].to_numpy(), 0.75)
    path = ev.save(tmp_path / "art")
    loaded = load_artifact(path)
    assert isinstance(loaded, YesNoEvaluator)
    samples = read_samples(data, loaded.task)[:4]
    res = loaded.score(samples, backend=fake)
    assert np.allclose(res.predictions, [[1 + 0.75 * 4, 1 + 0.75 * 2]] * 4)  # ranges 1-5 and 1-3


def test_direct_yesno_cli_with_the_fake_llm(dialogue, tmp_path):
    task, data = dialogue
    res = run("train", "--task", str(task), "--data", str(data), "--method", "direct-yesno", "--llm", "fake",
              "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"), "-q")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "art" / "manifest.json").read_text())["method"] == "direct-yesno"
    assert "held-out average" in res.stdout


# ---------------------------------------------------------------- fine-tuning export
def test_export_training_pairs(dialogue, tmp_path):
    task, data = dialogue
    out = tmp_path / "pairs.jsonl"
    res = run("paireval", "export-training", "--data", str(data), "--task", str(task), "-o", str(out))
    assert res.exit_code == 0, res.output
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    by_id = {s.id: s for s in read_samples(data, load_task(str(task)))}
    assert len(rows) == len(by_id)
    labels = set()
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["system", "user", "assistant"] and r["messages"][2]["content"] == r["label"]
        labels.add(r["label"])
        pos = by_id[r["positive"]]
        user = r["messages"][1]["content"]
        a, b = user.split("Conversation B:")
        assert pos.fields["output"] in (a if r["label"] == "A" else b)  # the real follow-up wins
        neg_h, neg_r = by_id[r["negative"]["history"]], by_id[r["negative"]["response"]]
        assert len({pos.doc_id, neg_h.doc_id, neg_r.doc_id}) == 3  # negatives from other conversations
    assert labels == {"A", "B"}  # positions randomised
    out2 = tmp_path / "pairs2.jsonl"
    run("paireval", "export-training", "--data", str(data), "--task", str(task), "-o", str(out2))
    assert out2.read_text() == out.read_text()  # seeded


def test_export_training_needs_three_conversations(dialogue, tmp_path):
    task, _ = dialogue
    small = write_jsonl(tmp_path / "s.jsonl", [r for r in toy_rows() if r["doc_id"] in ("doc-00", "doc-01")])
    res = run("paireval", "export-training", "--data", str(small), "--task", str(task), "-o", str(tmp_path / "o"))
    one_line_error(res, "at least 3 conversations")
    assert not (tmp_path / "o").exists()
    with pytest.raises(DataError):
        export_training(read_samples(small, load_task(str(task)), require_scores=False), load_task(str(task)))


def test_requests_are_sample_major(dialogue):
    from hdeval.judge.prompts import load_template
    from hdeval.methods.comparisons import Example, draw_comparisons, pair_scores

    task_path, data = dialogue
    task = load_task(str(task_path))
    samples = read_samples(data, task)
    pool = draw_comparisons(samples[:12], 2, 0, task, "the pool", own_docs=True)
    targets = [s for s in samples[12:18]]
    fake = FakeBackend()
    pair_scores(fake, load_template("pair"), task, targets, pool, 2, True, concurrency=1)
    per = len(task.aspects) * 2 * 2
    assert len(fake.requests) == len(targets) * per
    for i, s in enumerate(targets):
        shown = Example.of(task, s).response
        block = fake.requests[i * per:(i + 1) * per]
        assert all(f"<sample>\n{shown}\n</sample>" in r.messages[-1].content for r in block)


# ---------------------------------------------------------------- inside HD-Eval (--scorer pairwise)
def test_hdeval_with_pairwise_scorer_train_apply_rerun(dialogue, tmp_path):
    from hdeval.methods.comparisons import PairwiseScorer

    task, data = dialogue
    cache, out = str(tmp_path / "c"), tmp_path / "art"
    res = run("train", "--task", str(task), "--data", str(data), "--method", "hdeval", "--scorer", "pairwise",
              "--comparisons", "2", "--layers", "2", "--children", "2", "--aggregator", "lr", "--llm", "fake",
              "--cache-dir", cache, "-o", str(out), "-q")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["state"]["scorer"] == {"kind": "pairwise", "comparisons": 2, "swap": True}
    assert (out / "prompts" / "pair.toml").is_file() and len(json.loads((out / "comparisons.json").read_text())) == 3
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["position_consistency"] <= 1
    table = (out / "scores.csv").read_text().splitlines()[0].split(",")
    assert "overall" in table and any("/" in k for k in table)  # layer-1 and layer-2 criteria
    ev = load_artifact(out)
    assert isinstance(ev.scorer, PairwiseScorer) and ev.scorer.n == 2
    new = write_jsonl(tmp_path / "new.jsonl", [
        {"id": f"n{i}", "doc_id": f"new-{i}", "source": f"hi, how was day {i}?", "output": f"great, thanks {i}"}
        for i in range(3)])
    first = run("apply", str(out), str(new), "-o", str(tmp_path / "s1.jsonl"), "--cache-dir", cache, "-q")
    assert first.exit_code == 0, first.output
    assert "LLM calls made: 0," not in first.stderr
    again = run("apply", str(out), str(new), "-o", str(tmp_path / "s2.jsonl"), "--cache-dir", cache, "-q")
    assert "LLM calls made: 0," in again.stderr  # the recorded comparison examples: all cached
    assert (tmp_path / "s1.jsonl").read_text() == (tmp_path / "s2.jsonl").read_text()
    rows = [json.loads(l) for l in (tmp_path / "s1.jsonl").read_text().splitlines()]
    assert all(v is None or 0 <= v <= 1 for r in rows for v in r["criteria"].values())


def test_hdeval_pairwise_scorer_is_order_free(dialogue, tmp_path):
    task, data = dialogue
    fake = FakeBackend(responders={**RESPONDERS, "pair": fixed(0.9)})
    ev = train(task=str(task), data=str(data), method="hdeval", scorer="pairwise", layers=1, aggregator="lr",
               backend=fake, cache_dir=str(tmp_path / "c"))
    assert np.allclose(ev.score_table[["overall", "engagingness"]].to_numpy(), 0.5, rtol=0, atol=1e-12)
    assert ev.metrics["position_consistency"] == 0.0 and ev.metrics["position_bias"] == pytest.approx(0.8)


def test_hdeval_pairwise_scorer_bad_input(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    base = ("train", "--task", str(task), "--data", str(data), "--method", "hdeval", "--scorer", "pairwise",
            "--llm", "fake", "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    one_line_error(run(*base, "--comparisons", "0"), "--comparisons", "at least 1")
    one_line_error(run(*base, "--comparisons", "9"), "--comparisons 9", "5 available")
    one_line_error(run(*base, "--dry-run"), "--dry-run", "pairwise")
    assert not fake_calls and not (tmp_path / "art").exists()


@pytest.mark.parametrize("method, extra, calls", [
    # at most 36 samples x 2 aspects x 3 comparisons x 2 orders: a pair of two comparison
    # examples (each also a training target) comes up from both sides and is one call
    ("paireval", (), None),
    ("paireval", ("--no-swap", "--comparisons", "2"), 36 * 2 * 2),
    ("direct-yesno", (), 36 * 2),
])
def test_dry_run_counts_exactly_what_training_calls(method, extra, calls, dialogue, tmp_path, fake_calls):
    task, data = dialogue
    base = ("train", "--task", str(task), "--data", str(data), "--method", method, "--llm", "fake",
            *(("--aggregator", "lr") if method == "paireval" else ()), "--cache-dir", str(tmp_path / "c"), *extra)
    dry = run(*base, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert not fake_calls
    planned = int(dry.stdout.split("total: <= ")[1].split()[0])
    assert planned == calls if calls is not None else 0 < planned < 36 * 2 * 3 * 2
    res = run(*base, "-o", str(tmp_path / "art"), "-q")
    assert res.exit_code == 0, res.output
    assert len(fake_calls) == planned
    again = run(*base, "--dry-run")
    assert f"({planned} already cached)" in again.stdout


@pytest.mark.parametrize("bad", [
    {"not": "a list"},
    [{"id": "x", "doc_id": "d", "history": "h"}],          # a field missing
    [{"id": "x", "doc_id": "d", "history": "h", "response": 5}],
])
def test_a_malformed_comparisons_file_is_refused_on_load(bad, dialogue, tmp_path):
    from hdeval.artifact.directory import sha256_file
    from hdeval.core.errors import ArtifactError

    task, data = dialogue
    ev = train(task=str(task), data=str(data), method="paireval", llm="fake", aggregator="lr",
               cache_dir=str(tmp_path / "c"), comparisons=1)
    path = ev.save(tmp_path / "art")
    target = path / "comparisons.json"
    target.write_text(json.dumps(bad))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["comparisons.json"] = sha256_file(target)  # a consistent, hostile artifact
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="comparisons.json"):
        load_artifact(path)


# ---------------------------------------------------------------- the paper's settings
def _with_references(data: Path, tmp_path: Path) -> Path:
    rows = [json.loads(l) for l in data.read_text().splitlines()]
    for r in rows:
        r["reference"] = f"A human answer for {r['doc_id']}: plants turn light into sugar."
    return write_jsonl(tmp_path / "with_refs.jsonl", rows)


def test_references_serve_as_comparison_examples_and_the_artifact_says_so(dialogue, tmp_path):
    task, data = dialogue
    data = _with_references(data, tmp_path)
    out = tmp_path / "art"
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparison-source", "references", "--comparisons", "2", "--aggregator", "lr",
              "--cache-dir", str(tmp_path / "c"), "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "comparisons: 2 comparison examples from the training documents' references" in res.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["comparisons"]["source"] == "references" and "overlap_test" not in metrics["comparisons"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["state"]["comparison_source"] == "references"
    pool = json.loads((out / "comparisons.json").read_text())
    train_docs = {i.rsplit("-", 1)[0].replace("toy", "doc") for i in manifest["run"]["split"]["train"]}
    assert len(pool) == 3 and all(e["id"] == f"{e['doc_id']}:reference" for e in pool)
    assert all(e["doc_id"] in train_docs and e["response"].startswith("A human answer") for e in pool)
    assert load_artifact(out).pool[0].response == pool[0]["response"]


def test_comparison_source_bad_combinations_are_one_error_line(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    base = ("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
            "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    one_line_error(run(*base, "--comparison-source", "references"), "--comparison-source references",
                   "'reference'", "training split")
    one_line_error(run(*base, "--comparison-source", "file"), "--comparison-source file", "--comparison-data")
    one_line_error(run(*base, "--comparison-source", "train", "--comparison-data", str(data)),
                   "--comparison-data", "only with --comparison-source file")
    one_line_error(run(*base, "--all-vs-all", "--comparisons", "2"), "--all-vs-all", "--comparisons")
    assert not fake_calls and not (tmp_path / "art").exists()


def test_a_comparison_corpus_overlapping_the_test_rows_is_named_with_counts(dialogue, tmp_path):
    task, data = dialogue
    rows = [json.loads(l) for l in data.read_text().splitlines()]
    probe = train(task=str(task), data=str(data), method="paireval", llm="fake", aggregator="lr",
                  cache_dir=str(tmp_path / "c"), comparisons=1)
    test_ids = probe.run["split"]["test"]
    by_id = {r["id"]: r for r in rows}
    corpus = [{"id": f"out-{i}", "doc_id": f"o-{i}", "source": f"hello {i}", "output": f"fresh reply {i}"}
              for i in range(3)]
    corpus.append(dict(by_id[test_ids[0]]))                                   # the same id
    corpus.append({**by_id[test_ids[1]], "id": "renamed", "doc_id": "o-x"})  # the same response text
    path = write_jsonl(tmp_path / "corpus.jsonl", corpus)
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparison-data", str(path), "--comparisons", "5", "--aggregator", "lr",
              "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    assert res.exit_code == 0, res.output
    assert "warning: 2 of the 5 comparison rows (2 of the 5 examples drawn) match test rows" in res.output
    metrics = json.loads((tmp_path / "art" / "metrics.json").read_text())
    assert metrics["comparisons"]["overlap_test"] == {"rows": 2, "of": 5, "examples": 2, "drawn": 5}
    assert metrics["comparisons"]["source"] == "file"
    clean = write_jsonl(tmp_path / "clean.jsonl", corpus[:3])
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--comparison-data", str(clean), "--comparisons", "3", "--aggregator", "lr",
              "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art2"))
    assert res.exit_code == 0 and "match test rows" not in res.output
    assert "comparisons: 3 comparison examples from the corpus" in res.stdout


def test_all_vs_all_compares_within_each_document_train_dry_run_and_apply(dialogue, tmp_path, fake_calls):
    task, data = dialogue
    base = ("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
            "--all-vs-all", "--aggregator", "lr", "--cache-dir", str(tmp_path / "c"))
    dry = run(*base, "--dry-run")
    assert dry.exit_code == 0, dry.output
    planned = int(dry.stdout.split("total: <= ")[1].split()[0])
    # 36 targets x 2 aspects x 2 other responses x 2 orders; A-vs-B shown first is B-vs-A shown second
    assert planned == 36 * 2 * 2 * 2 // 2 and not fake_calls
    out = tmp_path / "art"
    res = run(*base, "-o", str(out))
    assert res.exit_code == 0, res.output
    assert len(fake_calls) == planned
    assert "every other response of the same document (all-vs-all)" in res.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method_args"] == {"all_vs_all": True, "swap": True}
    assert not (out / "comparisons.json").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pair_judgments"] == 36 * 2 * 2 * 2
    assert metrics["comparisons"] == {"all_vs_all": True, "swap": True, "source": "all-vs-all"}
    ev = load_artifact(out)
    assert ev.all_vs_all and ev.pool == []
    new = read_samples(write_jsonl(tmp_path / "new.jsonl", [
        {"id": "n1", "doc_id": "d1", "source": "hi", "output": "hello there"},
        {"id": "n2", "doc_id": "d1", "source": "hi", "output": "go away"},
        {"id": "n3", "doc_id": "d2", "source": "bye", "output": "see you"}]), ev.task, require_scores=False)
    judged = ev.judge(new, cache_dir=str(tmp_path / "c"))
    assert judged.requests == 2 * 2 * 1 * 2
    cols = judged.columns()
    assert np.isfinite(cols.values[:2]).all() and np.isnan(cols.values[2]).all()
    assert np.allclose(cols.values[0] + cols.values[1], 1.0)  # the two of d1 against each other
    assert any("no other response of document 'd2'" in f.reason for f in cols.failures)


def test_all_vs_all_is_position_free_and_refuses_lone_documents(dialogue, tmp_path):
    task, data = dialogue
    fake = FakeBackend(responders={**RESPONDERS, "pair": fixed(0.8)})
    ev = train(task=str(task), data=str(data), method="paireval", backend=fake, all_vs_all=True,
               cache_dir=str(tmp_path / "c"), aggregator="lr")
    assert np.allclose(ev.score_table[["overall", "engagingness"]].to_numpy(), 0.5, rtol=0, atol=1e-12)
    lone = write_jsonl(tmp_path / "lone.jsonl",
                       [json.loads(l) for l in data.read_text().splitlines()] + [
                           {"id": "solo", "doc_id": "solo-doc", "source": "hi", "output": "hey",
                            "scores": {"overall": 3, "engagingness": 2}}])
    with pytest.raises(ConfigError, match="1 of 13 documents have a single response.*'solo-doc'"):
        train(task=str(task), data=str(lone), method="paireval", llm="fake", all_vs_all=True,
              cache_dir=str(tmp_path / "c"))


def test_apply_with_an_all_vs_all_artifact_scores_the_input_in_one_piece(dialogue, tmp_path, monkeypatch):
    task, data = dialogue
    out = tmp_path / "art"
    ev = train(task=str(task), data=str(data), method="paireval", llm="fake", all_vs_all=True, aggregator="lr",
               cache_dir=str(tmp_path / "c"))
    ev.save(out)
    new = write_jsonl(tmp_path / "new.jsonl", [
        {"id": f"n{i}", "doc_id": f"d{i // 2}", "source": f"hi {i // 2}", "output": f"reply {i}"} for i in range(4)])
    res = run("apply", str(out), str(new), "-o", str(tmp_path / "s.jsonl"), "--cache-dir", str(tmp_path / "c"), "-q")
    assert res.exit_code == 0, res.output
    rows = [json.loads(l) for l in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert all(v is not None for r in rows for v in r["columns"].values())
    monkeypatch.setenv("HDEVAL_APPLY_CHUNK", "3")  # d1 would be split across two chunks
    res = run("apply", str(out), str(new), "-o", str(tmp_path / "s2.jsonl"), "--cache-dir", str(tmp_path / "c"))
    one_line_error(res, "all-vs-all", "in one piece", "at most 3 samples")
    monkeypatch.delenv("HDEVAL_APPLY_CHUNK")
    res = run("apply", str(out), str(new), "-o", str(tmp_path / "s3.jsonl"), "--shard", "1/2",
              "--cache-dir", str(tmp_path / "c"))
    one_line_error(res, "all-vs-all", "no --shard")
    assert not (tmp_path / "s2.jsonl").exists() and not (tmp_path / "s3.jsonl").exists()
    # more lines than a chunk (blank ones) but samples that fit: the id index is made before the
    # output's new folder, which used to be "cannot write the duplicate-id index in ...: No such file"
    (tmp_path / "blank.jsonl").write_text(new.read_text() + "\n\n")
    monkeypatch.setenv("HDEVAL_APPLY_CHUNK", "5")
    res = run("apply", str(out), str(tmp_path / "blank.jsonl"), "-o", str(tmp_path / "new" / "s4.jsonl"),
              "--cache-dir", str(tmp_path / "c"), "-q")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "new" / "s4.jsonl").read_text() == (tmp_path / "s.jsonl").read_text()


def test_all_vs_all_refuses_comparisons_given_at_its_default(dialogue, tmp_path, fake_calls):
    # 3 is --comparisons' default: given, it still asks for something all-vs-all does not do
    task, data = dialogue
    res = run("train", "--task", str(task), "--data", str(data), "--method", "paireval", "--llm", "fake",
              "--all-vs-all", "--comparisons", "3", "--cache-dir", str(tmp_path / "c"), "-o", str(tmp_path / "art"))
    one_line_error(res, "--all-vs-all", "--comparisons do not apply")
    assert not fake_calls and not (tmp_path / "art").exists()
