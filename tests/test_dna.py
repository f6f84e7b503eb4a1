"""Decompose and Aggregate (`--method dna`) on pairwise data: the aggregation arithmetic, the
validated aspect / weight replies, end-to-end runs on slices of LLMBar and FairEval with the fake
LLM, artifacts scoring new pairs, the baselines, swap, and bad input before any LLM call."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import REPO, run_cli, slice_jsonl, write_jsonl

from hdeval.core.errors import ArtifactError, ConfigError, ScoringError
from hdeval.core.metrics import pair_agreement as agreement
from hdeval.core.progress import Progress
from hdeval.data.samples import read_task_samples
from hdeval.data.tasks import load_task
from hdeval.llm.backends.base import Completion, TokenLogprob
from hdeval.llm.backends.fake import RESPONDERS, FakeBackend
import hdeval.methods.dna.fake  # noqa: F401  (registers the fake LLM's DnA responders)
from hdeval.methods.dna.decision import Learned, decide, weighted_totals
from hdeval.methods.dna.replies import _read_cot, validate_aspects, validate_weights
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train


def _train(tmp_path, data, task="faireval", backend=None, **options):
    return train(task=task, data=str(data), method="dna", llm="fake", cache_dir=str(tmp_path / "cache"),
                 backend=backend, method_options=options)


# --------------------------------------------------------------------------- the arithmetic


def test_weighted_sum_and_decision_with_hand_computed_totals():
    # A: .5*8 + .25*6 + .25*4 = 6.5 ; B: .5*6 + .25*7 + .25*6 = 6.25
    ta, tb = weighted_totals([8, 6, 4], [6, 7, 6], [0.5, 0.25, 0.25])
    assert (ta, tb) == (6.5, 6.25)
    assert decide(ta, tb) == "a"
    assert decide(tb, ta) == "b"
    assert decide(ta, tb, tie_margin=0.25) == "tie"  # |diff| <= margin is a tie
    assert decide(ta, tb, tie_margin=0.2) == "a"
    assert decide(5.0, 5.0) == "tie"  # equal totals, no margin


def test_agreement_with_and_without_ties_by_hand():
    human = ["a", "b", "tie", "a", "b", None]
    pred = ["a", "tie", "tie", "b", None, "a"]
    pred_ab = ["a", "b", "a", "b", None, "a"]
    got = agreement(human, pred, pred_ab)
    # w/ ties: 4 predicted labelled pairs, right on p1 and p3 -> 0.5
    # w/o ties: non-tie human pairs with a prediction: p1 (a=a), p2 (b=b), p4 (b!=a) -> 2/3
    assert got["w_ties"] == 0.5 and got["wo_ties"] == round(2 / 3, 6)
    assert got["n"] == 4 and got["n_wo_ties"] == 3 and got["failed"] == 1
    assert got["confusion"] == {"a": {"a": 1, "b": 1}, "b": {"failed": 1, "tie": 1}, "tie": {"tie": 1}}


def test_weights_are_validated_and_normalised():
    check = validate_weights(["x", "y", "z"])
    assert np.allclose(check({"weights": {"x": 50, "y": 30, "z": 20}}), [0.5, 0.3, 0.2])
    assert np.allclose(check({"weights": {"x": 1, "y": 1, "z": 2}}), [0.25, 0.25, 0.5])  # need not sum to 100
    for bad, fragment in [
        ({"weights": {"x": 50, "y": 50}}, "no weight for z"),
        ({"weights": {"x": 50, "y": -10, "z": 60}}, "weight of y is negative"),
        ({"weights": {"x": "40%", "y": 30, "z": 30}}, "weight of x is not a number"),
        ({"weights": {"x": 0, "y": 0, "z": 0}}, "add up to 0"),
        ({"weights": {"x": 1, "y": 1, "z": 1, "w": 1}}, "unknown aspect key(s) w"),
        ({"x": 1}, 'needs the form {"weights"'),
    ]:
        with pytest.raises(ValueError, match=None) as e:
            check(bad)
        assert fragment in str(e.value)


def test_dynamic_aspects_are_validated():
    check = validate_aspects(2)
    got = check({"aspects": [{"name": " Clarity\n", "definition": "Clear."}, {"name": "Depth", "definition": "Deep."}]})
    assert [a.name for a in got] == ["Clarity", "Depth"]
    for bad, fragment in [
        ({"aspects": [{"name": "a", "definition": "d"}]}, "expected exactly 2 aspects, got 1"),
        ({"aspects": [{"name": "a", "definition": "d"}, {"name": "A", "definition": "e"}]}, "listed twice"),
        ({"aspects": [{"name": "", "definition": "d"}, {"name": "b", "definition": "e"}]}, "aspect 1: 'name'"),
        ({"aspects": [{"name": "a"}, {"name": "b", "definition": "e"}]}, "aspect 1: 'definition'"),
        ({"aspect": []}, 'needs the form {"aspects"'),
    ]:
        with pytest.raises(ValueError) as e:
            check(bad)
        assert fragment in str(e.value)


def test_chain_of_thought_reads_the_last_line_only():
    assert _read_cot(Completion("A has 9 points, B 10 points.\nScores: 3 7")) == ((3.0, 7.0), None)
    got, why = _read_cot(Completion("Scores: 3 7\nOn reflection they are close."))
    assert got is None and "last line" in why


def test_learned_model_refuses_malformed_numbers():
    with pytest.raises(ArtifactError, match="malformed learned aggregator"):
        Learned.from_dict({"aspects": ["x"], "classes": ["a", "b"], "coef": [[1.0, 2.0]], "intercept": [0]}, "l.json")
    with pytest.raises(ArtifactError, match="malformed learned aggregator"):
        Learned.from_dict({"aspects": ["x"], "classes": ["a", "maybe"], "coef": [[1.0]], "intercept": [0]}, "l.json")
    with pytest.raises(ArtifactError, match="malformed learned aggregator"):  # cannot say a or b
        Learned.from_dict({"aspects": ["x"], "classes": ["a", "tie"], "coef": [[1.0]], "intercept": [0]}, "l.json")
    ok = Learned.from_dict({"aspects": ["x"], "classes": ["a", "b"], "coef": [[-1.0]], "intercept": [0]}, "l.json")
    assert ok.predict(np.array([[2.0], [-2.0]])) == ["a", "b"]  # negative coef: A ahead -> a


def test_a_fold_that_learned_ties_and_one_side_forces_that_side():
    # Cross-validation on data with ties can train a fold on "b" and "tie" only; its forced
    # a-or-b answer (the "without ties" figure) is the one side it knows, not a crash.
    from hdeval.methods.dna.decision import fit_learned

    X = np.array([[-2.0], [-1.5], [0.1], [0.0], [-1.0], [0.2]])
    fold = fit_learned(X, ["b", "b", "tie", "tie", "b", "tie"], seed=0)
    assert fold.classes == ["b", "tie"]
    assert fold.predict_ab(np.array([[3.0], [-3.0]])) == ["b", "b"]
    assert set(fold.predict(np.array([[3.0], [-3.0]]))) <= {"b", "tie"}


# --------------------------------------------------------------------------- end to end


def test_cli_train_on_faireval_slice_then_rerun_makes_no_calls(faireval40, tmp_path):
    out = tmp_path / "art"
    args = ["train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--llm", "fake",
            "--cache-dir", tmp_path / "cache", "--out", out, "-q"]
    r = run_cli(*args)
    assert r.exit_code == 0, r.output
    assert "held-out agreement with human labels: llm_weights w/o ties" in r.stdout
    assert "learned w/o ties" in r.stdout
    m = json.loads((out / "metrics.json").read_text())
    # 40 pairs, 4 predefined aspects: 40 weight prompts + 4 x 40 scoring prompts, each one call;
    # the position probe finds the fake's bias on its 20 training pairs: every pair in both orders
    assert m["position_probe"]["action"] == "swapped"
    assert m["usage"]["calls"] == 40 + 2 * 4 * 40
    assert m["usage"]["cache_hits"] == 0  # each reply holds both sides: read twice, paid and counted once
    for split in ("test", "train"):
        for key in ("llm_weights", "learned"):
            a = m[split][key]
            assert 0 <= a["w_ties"] <= 1 and 0 <= a["wo_ties"] <= 1
            assert sum(sum(c.values()) for c in a["confusion"].values()) == m["split"][split]
    assert set(m["mean_weights"]) == {"helpfulness", "relevance", "accuracy", "level_of_detail"}
    assert math.isclose(sum(m["mean_weights"].values()), 1.0, abs_tol=1e-5)
    assert m["learned"]["classes"] == ["a", "b", "tie"]  # FairEval has ties
    assert set(m["learned"]["coefficients"]["a"]) == set(m["mean_weights"])
    assert m["failure_rate"] == 0.0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "dna" and manifest["method_args"]["mode"] == "dna"
    assert {"prompts/dna_weights.toml", "prompts/dna_score.toml", "learned.json"} <= set(manifest["files"])
    r2 = run_cli(*args, "--force")  # the same -o: an existing artifact is replaced only with --force
    assert r2.exit_code == 0 and "LLM calls made: 0," in r2.stderr


def test_llmbar_slice_has_no_ties_so_learned_model_has_two_classes(llmbar60, tmp_path):
    ev = _train(tmp_path, llmbar60, task="llmbar")
    m = ev.metrics
    assert m["learned"]["classes"] == ["a", "b"]
    assert "tie" not in m["test"]["learned"]["confusion"]
    assert m["test"]["llm_weights"]["n_wo_ties"] == m["split"]["test"]
    assert set(m["mean_weights"]) == set(load_task("llmbar").aspect_keys)


def test_dynamic_aspects_are_per_instance_and_learned_is_skipped(faireval40, tmp_path):
    fake = FakeBackend()
    ev = _train(tmp_path, faireval40, backend=fake, aspect_source="dynamic", k=3)
    m = ev.metrics
    assert "dynamic aspects differ per instance" in m["learned"]["skipped"]
    assert "learned" not in m["test"]
    assert all(set(v) == {"mean", "instances"} for v in m["mean_weights"].values())
    assert sum(v["instances"] for v in m["mean_weights"].values()) == 40 * 3
    # the aspect prompt shows the question alone, never the responses
    pairs = read_task_samples(faireval40, load_task("faireval"))
    asked = [r for r in fake.requests if r.kind == "dna_aspects"]
    assert len(asked) == 40
    for req in asked:
        text = "\n".join(x.content for x in req.messages)
        assert not any(p.output_a[:80] in text or p.output_b[:80] in text for p in pairs)
    assert not any(p.output_a[:80] in "\n".join(x.content for x in r.messages)
                   for r in fake.requests if r.kind == "dna_weights" for p in pairs)


def test_artifact_scores_new_pairs_and_rescoring_is_free(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40)
    path = ev.save(tmp_path / "art")
    new = write_jsonl(tmp_path / "new.jsonl", [
        {"id": "n1", "source": "How do I boil an egg?", "output_a": "Put it in boiling water for nine minutes, "
         "then cool it in cold water so the shell peels easily.", "output_b": "Eggs.", "label": None},
        {"id": "n2", "source": "Name a prime.", "output_a": "4", "output_b": "7 is a prime number.", "label": "b"},
    ])
    art = load_artifact(path)
    assert art.method == "dna" and art.learned is not None
    pairs = read_task_samples(new, art.task, require_labels=False)
    fake = FakeBackend()
    from hdeval.llm.client import open_llm
    from hdeval.llm.config import LLMConfig

    llm = open_llm(LLMConfig("fake", cache_dir=str(tmp_path / "cache2")), fake)
    try:
        res = art.score(pairs, backend=llm)
        assert art.settings.swap  # the position probe found the fake's bias: both orders
        assert fake.calls == 2 + 2 * 2 * 4
        rows = art.output_rows(pairs, res)
        again = art.score(pairs, backend=llm)
        assert fake.calls == 2 + 2 * 2 * 4  # all from the cache
    finally:
        llm.close()
    assert again.labels == res.labels
    assert [r["id"] for r in rows] == ["n1", "n2"]
    r1, r2 = rows
    assert r1["prediction"] in ("a", "b", "tie") and r1["learned_prediction"] in ("a", "b", "tie")
    assert "human" not in r1 and r2["human"] == "b"
    assert [x["aspect"] for x in r1["aspects"]] == ["Helpfulness", "Relevance", "Accuracy", "Level of detail"]
    w = [x["weight"] for x in r1["aspects"]]
    assert math.isclose(sum(w), 1.0, abs_tol=1e-5)
    # the totals are the weighted sums of the per-aspect scores shown
    ta = sum(x["weight"] * x["a"] for x in r1["aspects"])
    assert math.isclose(r1["totals"]["a"], ta, abs_tol=1e-4)
    assert r1["prediction"] == decide(r1["totals"]["a"], r1["totals"]["b"])


def test_report_on_a_dna_artifact_shows_llm_weights_and_learned_weights(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40)
    path = ev.save(tmp_path / "art")
    r = run_cli("report", path)
    assert r.exit_code == 0, r.output
    assert "LLM weights per aspect (mean over instances):" in r.stdout
    assert "learned aggregation (logistic regression on per-aspect differences A - B):" in r.stdout
    data = json.loads((path / "report" / "report.json").read_text())
    assert data["llm_weights"] == ev.metrics["mean_weights"]
    for k, w in ev.metrics["mean_weights"].items():
        assert any(line.split()[:2] == [k, f"{w:.3f}"] for line in r.stdout.splitlines())
    share = data["learned"]["weight_share"]
    assert set(share) == set(ev.task.aspect_keys) and math.isclose(sum(share.values()), 1.0, abs_tol=1e-5)
    coef = np.abs(ev.learned.coef).sum(axis=0)
    assert math.isclose(share["accuracy"], coef[ev.learned.aspects.index("accuracy")] / coef.sum(), abs_tol=1e-5)
    assert data["learned"]["coefficients"] == ev.metrics["learned"]["coefficients"]
    page = (path / "report" / "report.html").read_text()
    assert "<h2>Weights</h2>" in page and "<h2>Confusion matrix (llm weights)</h2>" in page


def test_report_on_a_dynamic_dna_artifact_shows_mean_weights_per_proposed_aspect(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40, aspect_source="dynamic", k=3)
    r = run_cli("report", ev.save(tmp_path / "art"))
    assert r.exit_code == 0, r.output
    assert "LLM weights (mean over the instances that proposed the aspect):" in r.stdout
    name, w = next(iter(ev.metrics["mean_weights"].items()))
    assert f"{w['mean']:.3f}  ({w['instances']} instances)" in r.stdout and name in r.stdout
    assert "dynamic aspects differ per instance" in r.stdout


def test_report_on_a_method_without_one_is_a_clear_error(tmp_path):
    rows = [{"id": f"s{i}", "doc_id": f"d{i // 2}", "source": f"text {i}", "output": "summary " * (i + 1),
             "scores": {"coherence": 1 + i % 5, "consistency": 2, "fluency": 3, "relevance": 1 + i % 3}}
            for i in range(12)]
    data = write_jsonl(tmp_path / "s.jsonl", rows)
    path = train(task="summeval", data=str(data), method="direct", llm="fake",
                 cache_dir=str(tmp_path / "cache")).save(tmp_path / "art")
    r = run_cli("report", path)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.strip() == (f"error: hdeval report cannot draw {path}: its evaluator (method 'direct') "
                                "writes no report; its numbers are in metrics.json")


def test_edited_learned_weights_are_refused(faireval40, tmp_path):
    path = _train(tmp_path, faireval40).save(tmp_path / "art")
    f = path / "learned.json"
    f.write_text(f.read_text().replace("a", "b", 1))
    with pytest.raises(ArtifactError, match="learned.json does not match its checksum"):
        load_artifact(path)


def test_swap_asks_both_orders_and_reports_position_consistency(faireval40, tmp_path):
    fake = FakeBackend()
    ev = _train(tmp_path, faireval40, backend=fake, swap=True)
    m = ev.metrics
    assert m["usage"]["calls"] == 40 + 2 * 4 * 40
    # the fake favours the first-shown response on some aspects: not every pair keeps its winner
    assert 0 < m["position_consistency"] < 1
    assert "position_consistency" in m["test"]
    scored = [r for r in fake.requests if r.kind == "dna_score"]
    a0 = read_task_samples(faireval40, load_task("faireval"))[0]
    firsts = ["Response A:\n" + a0.output_a[:50] in r.messages[1].content for r in scored]
    swapped = ["Response A:\n" + a0.output_b[:50] in r.messages[1].content for r in scored]
    assert sum(firsts) == sum(swapped) == 4
    art = load_artifact(ev.save(tmp_path / "art"))
    assert art.settings.swap and "helpfulness:a~swap" in art.columns_needed()


@pytest.mark.parametrize("mode, kinds", [
    ("direct", {"dna_direct"}),
    ("cot", {"dna_cot"}),
    ("prompt-agg", {"dna_weights", "dna_score", "dna_prompt_agg"}),
])
def test_baselines_use_their_own_prompts(faireval40, tmp_path, mode, kinds):
    fake = FakeBackend()
    ev = _train(tmp_path, faireval40, backend=fake, dna_mode=mode)
    assert {r.kind for r in fake.requests} == kinds
    primary = mode.replace("-", "_")
    assert ev.metrics["primary"] == primary and ev.metrics["test"][primary]["n"] == 20
    if mode == "prompt-agg":
        assert "learned" in ev.metrics["test"]  # aspect scores exist, so the learned variant does too
    else:
        assert "no aspect scores" in ev.metrics["learned"]["skipped"]
        assert "mean_weights" not in ev.metrics
    art = load_artifact(ev.save(tmp_path / "art"))
    assert art.settings.mode == mode


# --------------------------------------------------------------------------- unusable replies


def _responders(**over):
    table = dict(RESPONDERS)
    table.update(over)
    return table


def test_malformed_weights_are_reasked_with_feedback_then_a_recorded_failure(faireval40, tmp_path):
    pairs = read_task_samples(faireval40, load_task("faireval"))
    doomed = pairs[3].fields["source"]
    good = RESPONDERS["dna_weights"]

    def weights(request, fake):
        if doomed in request.data["question"]:
            return Completion('{"weights": {"helpfulness": -5}}')  # never usable
        if len(request.messages) == 2:
            return Completion("Sure! helpfulness matters most.")  # first try: no JSON
        return good(request, fake)

    # replies a server that does not honour the JSON constraint could send
    fake = FakeBackend(responders=_responders(dna_weights=weights), honour_constraints=False)
    ev = _train(tmp_path, faireval40, backend=fake)
    asked = [r for r in fake.requests if r.kind == "dna_weights"]
    retry = [r for r in asked if len(r.messages) == 4 and doomed not in r.messages[1].content]
    assert retry and "holds no JSON object" in retry[0].messages[3].content
    assert len([r for r in asked if doomed in r.messages[1].content]) == 3  # attempts, then give up
    m = ev.metrics
    assert m["failed_pairs"] == 1 and m["failure_rate"] == 1 / 40
    row = [r for r in ev.output_rows(pairs, ev.score(pairs, backend=FakeBackend(responders=_responders(
        dna_weights=weights), honour_constraints=False))) if r["id"] == pairs[3].id][0]
    assert row["prediction"] is None and "weights:" in row["failures"][0]
    assert "3 replies were unusable (last: no weight for relevance, accuracy, level_of_detail)" in row["failures"][0]


def test_malformed_dynamic_aspects_are_reasked_then_the_run_stops_above_the_failure_rate(faireval40, tmp_path):
    def aspects(request, fake):
        return Completion('{"aspects": [{"name": "only one", "definition": "x"}]}')

    fake = FakeBackend(responders=_responders(dna_aspects=aspects))
    with pytest.raises(ScoringError) as e:
        _train(tmp_path, faireval40, backend=fake, aspect_source="dynamic")
    msg = str(e.value)
    assert "100% of pairs could not be judged (threshold 20%)" in msg
    assert "expected exactly 4 aspects, got 1" in msg and "replies are cached" in msg
    asked = [r for r in fake.requests if r.kind == "dna_aspects"]
    assert len(asked) == 40 * 3
    retries = [r for r in asked if len(r.messages) > 2]
    assert len(retries) == 40 * 2 and all("expected exactly 4 aspects, got 1" in r.messages[-1].content
                                          for r in retries)
    assert not any(r.kind == "dna_score" for r in fake.requests)


def test_unreadable_scores_are_failures_not_crashes(faireval40, tmp_path):
    good = RESPONDERS["dna_score"]

    def score(request, fake):
        shown = request.data["question"] + request.data["response_a"] + request.data["response_b"]
        if request.data["aspect"] == "Accuracy" and "time management" in shown:
            return Completion("Both are fine.")
        return good(request, fake)

    ev = _train(tmp_path, faireval40, backend=FakeBackend(responders=_responders(dna_score=score),
                                                          honour_constraints=False))
    assert ev.metrics["failed_pairs"] == 1 and ev.metrics["score_failures"] == 2  # its :a and :b cells


# --------------------------------------------------------------------------- bad input and options


@pytest.mark.parametrize("over, fragment", [
    ({"output_b": None}, "line 2: field 'output_b' (Response B) is missing"),
    ({"label": "both"}, "line 2: field 'label' is 'both', not one of a, b, tie"),
    ({"output_a": ""}, "line 2: field 'output_a' (Response A) is empty"),
])
def test_bad_pairwise_input_is_one_error_line_before_any_llm_call(tmp_path, over, fragment):
    rows = [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"question {i}", "output_a": f"answer a{i}",
             "output_b": f"answer b{i}", "label": "ab"[i % 2]} for i in range(6)]
    rows[1].update(over)
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    r = run_cli("train", "--task", "faireval", "--data", data, "--method", "dna", "--llm", "fake",
             "--cache-dir", tmp_path / "cache", "--out", tmp_path / "art")
    assert r.exit_code == 2
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and fragment in errors[0]
    assert str(data) in errors[0]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "art").exists()


def test_bad_options_and_shapes_are_clear_errors(faireval40, tmp_path):
    with pytest.raises(ConfigError, match="--k must be a whole number from 1 to 10, got 0"):
        _train(tmp_path, faireval40, k=0)
    with pytest.raises(ConfigError, match="--tie-margin must be 0 or more"):
        _train(tmp_path, faireval40, tie_margin=-1.0)
    r = run_cli("train", "--task", "summeval", "--method", "dna", "--llm", "fake", "--cache-dir", tmp_path / "c")
    assert r.exit_code == 2 and "method 'dna' does not support pointwise tasks" in r.stderr
    r = run_cli("train", "--task", "faireval", "--method", "dna", "--dna-mode", "vote", "--llm", "fake")
    assert r.exit_code == 2 and "vote" in r.output


def test_learned_is_skipped_when_training_labels_lack_a_side(tmp_path):
    rows = [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"question {i}" + " why" * i,
             "output_a": "answer " + "word " * i, "output_b": "reply " + "text " * (12 - i),
             "label": "a" if i % 3 else "tie"} for i in range(12)]
    ev = _train(tmp_path, write_jsonl(tmp_path / "at.jsonl", rows))
    assert ev.metrics["learned"] == {"skipped": "the training split's usable pairs lack an a or a b label"}
    assert "learned" not in ev.metrics["test"] and ev.metrics["test"]["llm_weights"]["n"] == 6
    assert "learned.json" not in json.loads((ev.save(tmp_path / "art") / "manifest.json").read_text())["files"]


PROBE = "position probe: aspect scores in the swapped order ({} per pair)"
IF_BIAS = "aspect scores in the swapped order of the other pairs ({} per pair; only if the probe finds a position bias)"


@pytest.mark.parametrize("options, stages", [
    ({}, ["weights", "aspect scores (4 per pair x 1 order(s))", PROBE.format(4), IF_BIAS.format(4)]),
    ({"swap": True}, ["weights", "aspect scores (4 per pair x 2 order(s))"]),
    ({"swap": False}, ["weights", "aspect scores (4 per pair x 1 order(s))", PROBE.format(4)]),
    ({"aspect_source": "dynamic", "k": 3}, ["aspects", "weights", "aspect scores (3 per pair x 1 order(s))",
                                             PROBE.format(3), IF_BIAS.format(3)]),
    ({"dna_mode": "cot", "swap": True}, ["cot x 2 order(s)"]),
    ({"dna_mode": "prompt-agg"}, ["weights", "aspect scores (4 per pair x 1 order(s))", PROBE.format(4),
                                  IF_BIAS.format(4), "prompt aggregation x 1 order(s)",
                                  "prompt aggregation in the swapped order (only if the probe finds a position bias)"]),
])
def test_dry_run_counts_the_calls_of_each_stage_a_run_makes(faireval40, tmp_path, options, stages):
    from hdeval.run.train import TrainConfig, plan

    cfg = TrainConfig(task="faireval", data=str(faireval40), method="dna", llm="fake",
                      cache_dir=str(tmp_path / "cache"), options=options)
    probe = FakeBackend()
    _, before, _ = plan(cfg, backend=probe)
    assert probe.calls == 0 and [p.stage for p in before] == stages
    assert all(p.cached in (0, None) and p.prompt_tokens > 0 and p.completion_tokens > 0 for p in before)
    ev = _train(tmp_path, faireval40, **options)
    # a stage that runs only if the position probe finds a bias is an upper bound (the fake's is found)
    assert [p.upper_bound for p in before] == ["only if the probe" in s for s in stages]
    found = ev.metrics.get("position_probe", {}).get("action") == "swapped"
    assert found == any(p.upper_bound for p in before)
    assert sum(p.score_calls for p in before) == ev.metrics["usage"]["calls"]
    _, after, _ = plan(cfg, backend=FakeBackend())
    # requests known before the run are now all cached; those that depend on replies stay unknown
    assert all(p.cached is None or p.cached == p.score_calls for p in after)
    assert any(p.cached == p.score_calls for p in after)


def test_dry_run_cli_prints_the_dna_stages_and_writes_nothing(faireval40, tmp_path):
    r = run_cli("train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--dry-run",
             "--llm", "fake", "--cache-dir", tmp_path / "cache", "--price-in", "1", "--price-out", "2")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    # the table starts after the lines that say which LLM would be called
    lines = lines[next(i for i, line in enumerate(lines) if line.split()[:1] == ["stage"]) - 1:]
    assert lines[1].split() == ["stage", "calls", "cached", "est.prompt-tok", "est.completion-tok"]
    assert lines[2].split()[:3] == ["weights", "40", "0"]
    assert lines[3].split()[:8] == ["aspect", "scores", "(4", "per", "pair", "x", "1", "order(s))"]
    assert lines[3].split()[8:10] == ["160", "0"]
    # without --swap: the position probe's 20 training pairs, then the other 20 pairs only if it finds a bias
    assert lines[4].startswith(PROBE.format(4)) and lines[4].split()[-4:-2] == ["80", "0"]
    assert lines[5].startswith(IF_BIAS.format(4)) and lines[5].split()[-5:-2] == ["<=", "80", "0"]
    assert "total: <= 360 LLM calls (0 already cached)" in r.stdout and "estimated cost" in r.stdout
    assert "decompose" not in r.stdout and not (tmp_path / "artifacts").exists()


def test_tie_margin_turns_close_totals_into_ties(faireval40, tmp_path):
    base = _train(tmp_path, faireval40)
    wide = _train(tmp_path, faireval40, tie_margin=0.5)
    assert wide.metrics["usage"]["calls"] == 0  # same prompts: all cached
    t0 = base.score_table
    t1 = wide.score_table
    diff = (t0["total_a"] - t0["total_b"]).abs()
    assert list(t1["prediction"][diff <= 0.5].unique()) == ["tie"]
    assert (t1["prediction"][diff > 0.5] == t0["prediction"][diff > 0.5]).all()
    assert (diff <= 0.5).any() and (diff > 0.5).any()


def test_dna_over_an_openai_compatible_server_with_faults_matches_the_fake(data_dir, tmp_path):
    from llm_server import FaultMix, FaultServer

    data = slice_jsonl(data_dir / "faireval.jsonl", tmp_path / "faireval16.jsonl", 16)
    ref = _train(tmp_path, data)
    with FaultServer(FaultMix(0.2, ("429-retry-after", "500", "503"), seed=5, retry_after="0")) as server:
        r = run_cli("train", "--task", "faireval", "--data", data, "--method", "dna", "--llm", "test-model",
                 "--base-url", server.url, "--cache-dir", tmp_path / "cache-http", "--max-retries", "8",
                 "--out", tmp_path / "art", "-q")
        assert r.exit_code == 0, r.output
        log = list(server.log)
    assert {a.kind for a in log} == {"dna_weights", "dna_score"}
    assert any(a.outcome != "ok" for a in log)  # faults were injected and survived
    m = json.loads((tmp_path / "art" / "metrics.json").read_text())
    assert m["test"] == ref.metrics["test"] and m["learned"] == ref.metrics["learned"]


# --------------------------------------------------------------------------- logprob-weighted scores


def _lp(*alts):
    return tuple(TokenLogprob(t, math.log(p)) for t, p in alts)


def test_aspect_scores_are_weighted_by_the_score_tokens_logprobs():
    from hdeval.methods.dna.replies import _read_pair_weighted

    c = Completion("7 4", (_lp(("7", 0.6), ("8", 0.3), ("6", 0.1)), _lp((" ", 0.99), (",", 0.01)),
                           _lp(("4", 0.5), ("5", 0.5))))
    (a, b), why = _read_pair_weighted(c)
    assert why is None and math.isclose(a, 0.6 * 7 + 0.3 * 8 + 0.1 * 6) and math.isclose(b, 4.5)
    # a leading-space token and the two-digit 10 as one token
    c = Completion("10 3", (_lp(("10", 0.8), ("9", 0.2)), _lp((" 3", 0.9), (" 2", 0.1))))
    (a, b), _ = _read_pair_weighted(c)
    assert math.isclose(a, 9.8) and math.isclose(b, 2.9)


@pytest.mark.parametrize("completion", [
    Completion("7 4"),  # no logprobs
    Completion("10 4", (_lp(("1", 0.9), ("9", 0.1)), _lp(("0", 1.0)), _lp((" ", 1.0)), _lp(("4", 1.0)))),  # 10 split
    Completion("7 4", (_lp(("6", 0.9), ("7", 0.1)), _lp((" ", 1.0)), _lp(("4", 1.0)))),  # tokens disagree with text
    Completion("7 4", (_lp(("7", 0.9)), _lp((" ", 1.0)), (TokenLogprob("4", float("nan")),))),  # unreadable
])
def test_logprobs_that_do_not_line_up_fall_back_to_the_reply_text(completion):
    from hdeval.methods.dna.replies import _read_pair_weighted

    assert _read_pair_weighted(completion) == ((7.0 if completion.text.startswith("7") else 10.0, 4.0), None)


def test_dna_run_asks_for_logprobs_and_uses_them_unless_turned_off(faireval40, tmp_path):
    good = RESPONDERS["dna_score"]

    def score(request, fake):
        c = good(request, fake)
        if not request.top_logprobs:
            return c
        got = json.loads(c.text)  # asked by schema: '{"score_a": 7, "score_b": 4}'
        sa, sb = got["score_a"], got["score_b"]
        first = _lp((str(sa), 0.5), (str(max(1, sa - 1)), 0.5)) if sa > 1 else _lp(("1", 1.0))
        return Completion(c.text, (_lp(('{"score_a": ', 1.0)), first, _lp((', "score_b": ', 1.0)),
                                   _lp((str(sb), 1.0)), _lp(("}", 1.0))), c.prompt_tokens, 5)

    fake = FakeBackend(responders=_responders(dna_score=score))
    on = _train(tmp_path, faireval40, backend=fake)
    asked = [r for r in fake.requests if r.kind == "dna_score"]
    assert asked and all(r.top_logprobs == 10 for r in asked)
    t = on.score_table
    half = t["helpfulness:a"] % 1
    assert set(half.round(6)) <= {0.0, 0.5} and (half == 0.5).any()  # a weighted score between two digits
    assert (t["helpfulness:b"] % 1 == 0).all()
    fake_off = FakeBackend(responders=_responders(dna_score=score))
    off = _train(tmp_path, faireval40, backend=fake_off, logprob_scores=False)
    assert not any(r.top_logprobs for r in fake_off.requests if r.kind == "dna_score")
    assert (off.score_table["helpfulness:a"] % 1 == 0).all()
    assert off.method_args()["logprobs"] is False and on.method_args()["logprobs"] is True
    # an artifact written before the option (no "logprobs" in method_args) scores from the text
    path = on.save(tmp_path / "art")
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    del m["method_args"]["logprobs"]
    mf.write_text(json.dumps(m))
    assert load_artifact(path).settings.logprobs is False


def test_apply_reports_agreement_only_when_the_input_has_labels(tmp_path):
    # Unlabelled new pairs (the README's examples/new_pairs.jsonl) used to print an "agreement"
    # line of nulls with n 0; labelled ones still get the agreement line.
    ex = REPO / "examples"
    art = tmp_path / "art"
    r = run_cli("train", "--task", ex / "pairs_task.toml", "--method", "dna", "--llm", "fake",
                "--cache-dir", tmp_path / "cache", "-o", art, "-q")
    assert r.exit_code == 0, r.output
    r = run_cli("apply", art, ex / "new_pairs.jsonl", "-o", tmp_path / "new.jsonl", "--cache-dir", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    assert "agreement with the human labels" not in r.output
    assert len((tmp_path / "new.jsonl").read_text().splitlines()) == 2
    r = run_cli("apply", art, ex / "pairs.jsonl", "-o", tmp_path / "old.jsonl", "--cache-dir", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    # its own training file: the held-out pairs' agreement, the training pairs' apart
    held = next(x for x in r.output.splitlines() if x.startswith("agreement with the human labels in the input (rows "
                                                                  "not in the artifact's training split): "))
    got = json.loads(held.split("): ", 1)[1])
    trained = next(x for x in r.output.splitlines() if x.startswith("TRAINING ROWS ONLY ("))
    apart = json.loads(trained.split("agreement ", 1)[1])
    n_train = int(trained.split("(", 1)[1].split(" ", 1)[0])
    assert 0 < n_train < 16
    assert got["llm"]["n"] == got["learned"]["n"] == 16 - n_train
    assert apart["llm"]["n"] == apart["learned"]["n"] == n_train


class _Stages(Progress):
    """Records each stage's label, its announced total and the units actually advanced."""

    def __init__(self):
        self.stages: list[list] = []
        self.lines: list[str] = []
        self.expected: list[int] = []

    def expect(self, units):
        self.expected.append(units)

    def stage(self, label, total):
        self.stages.append([label, total, 0])

    def advance(self, n=1, cached=False):
        self.stages[-1][2] += n

    def message(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("options", [{}, {"swap": True}, {"dna_mode": "prompt-agg"}, {"dna_mode": "direct"}])
def test_progress_counts_the_calls_the_dry_run_lists_under_its_stage_names(faireval40, tmp_path, options):
    from hdeval.run.train import TrainConfig, plan

    cfg = TrainConfig.from_options(task="faireval", data=str(faireval40), method="dna", llm="fake",
                                   cache_dir=str(tmp_path / "cache"), **options)
    _, planned, _ = plan(cfg, backend=FakeBackend())
    rec = _Stages()
    fake = FakeBackend()
    train(cfg, progress=rec, backend=fake)
    calls = {p.stage: p.score_calls for p in planned}
    # every stage drawn as a bar is a dry-run stage, counting calls (not "prompts" read twice); the
    # position probe's stage and those it adds (the fake's bias is found) judge 20 pairs each
    assert [s[0] for s in rec.stages] == [
        f"{p.stage}, {20 if p.stage.startswith('position probe') or 'other pairs' in p.stage else 40} pairs, calls"
        for p in planned if p.stage not in ("weights", "aspects")]
    for label, total, done in rec.stages:
        assert total == done == calls[label.rsplit(", ", 2)[0]]
    if "weights" in calls:
        assert "weights: 40 calls, one per pair" in rec.lines
    assert sum(calls.values()) == fake.calls


@pytest.mark.parametrize("options", [{}, {"swap": True}, {"dna_mode": "prompt-agg", "swap": True},
                                     {"dna_mode": "cot"}, {"aspect_source": "dynamic", "k": 3}])
def test_progress_is_told_the_whole_runs_calls_the_dry_run_lists(tmp_path, options):
    """The whole run's ETA: before the first call the progress is told the calls of every stage
    it may draw, the dry run's figure for those stages (the aspects and weights calls are not
    drawn), and exactly what the stages then ran on replies that all parse: the stages that run
    only if the position probe finds a bias (upper bounds in the dry run) when it found one."""
    from hdeval.run.train import TrainConfig, plan

    ex = REPO / "examples"
    cfg = TrainConfig.from_options(task=str(ex / "pairs_task.toml"), data=str(ex / "pairs.jsonl"), method="dna",
                                   llm="fake", cache_dir=str(tmp_path / "cache"), method_options=options)
    _, planned, _ = plan(cfg, backend=FakeBackend())
    rec = _Stages()
    fitted = train(cfg, progress=rec, backend=FakeBackend())
    drawn = [p for p in planned if p.stage not in ("weights", "aspects")]
    assert rec.expected[0] == sum(p.score_calls for p in drawn) > 0
    found = fitted.metrics.get("position_probe", {}).get("action") == "swapped"
    ran = sum(p.score_calls for p in drawn if found or not p.upper_bound)
    assert ran == sum(total for _, total, _ in rec.stages) == sum(done for _, _, done in rec.stages)


# --------------------------------------------------------------------------- the tie margin


def test_learned_tie_margin_covers_the_close_pairs_humans_tie_and_records_how():
    from hdeval.methods.dna.decision import learn_tie_margin

    # humans tie every pair within 0.4; beyond 1.0 the judge's side is right
    close = [0.0, 0.05, -0.1, 0.15, -0.2, 0.25, -0.3, 0.35, -0.38, 0.4]
    far = [s * (1 + 0.1 * i) for i in range(20) for s in ([1] if i % 2 else [-1])]
    diffs = close + far
    human = ["tie"] * len(close) + ["a" if d > 0 else "b" for d in far]
    margin, info = learn_tie_margin(diffs, human, [f"d{i // 2}" for i in range(len(diffs))], seed=0)
    assert margin == 0.4  # snapped down to the widest human tie below the crossing
    assert (info["train_w_ties"], info["train_w_ties_at_0"]) == (1.0, round(21 / 30, 6))
    assert info["from"] == "training split" and info["rule"] == "logistic crossing"
    # folds keep a document's two pairs together; each fold's margin is learned without its pairs
    assert info["cv_folds"] == 5 and 0.8 < info["cv_w_ties"] <= info["train_w_ties"] and info["human_ties"] == 10
    # no human ties: any margin can only lose, so it stays 0
    assert learn_tie_margin([0.1, -0.2, 0.5], ["a", "b", "a"])[0] == 0.0
    # every training pair a human tie: every pair is predicted one
    assert learn_tie_margin([0.1, -0.2, 0.5], ["tie"] * 3)[0] == 0.5
    assert learn_tie_margin([], [])[0] == 0.0


def _old_margin(diffs, human):
    # the rule learn_tie_margin replaced: the best training agreement over 0 and every |diff|
    cands = np.unique(np.concatenate([[0.0], np.abs(diffs)]))
    return float(cands[int(np.argmax([_agree(diffs, human, m) for m in cands]))])


def _agree(diffs, human, margin):
    return float(np.mean(np.where(np.abs(diffs) <= margin, human == "tie",
                                  np.where(diffs > 0, "a", "b") == human)))


def test_learned_tie_margin_does_not_chase_the_training_splits_noise():
    # DnA-like totals: 4 weighted aspect scores (latent + judge noise, rounded to 1-10); humans tie
    # pairs of close latent quality. Over many training splits, the margin's training agreement
    # must not flatter it much more than margin 0's, and held out it must not lose to the old rule.
    from hdeval.methods.dna.decision import learn_tie_margin

    new_gap, old_gap, new_test, old_test = [], [], [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        qa, qb = rng.uniform(2, 9, (2, 160))
        d = qa - qb + rng.normal(0, 0.3, 160)
        human = np.where(np.abs(d) <= 0.6, "tie", np.where(d > 0, "a", "b")).astype(object)
        w = rng.dirichlet(np.ones(4), 160)
        sa = np.clip(np.round(qa[:, None] + 0.8 * rng.normal(size=(160, 4))), 1, 10)
        sb = np.clip(np.round(qb[:, None] + 0.8 * rng.normal(size=(160, 4))), 1, 10)
        diffs = (w * (sa - sb)).sum(axis=1)
        tr, te = slice(0, 80), slice(80, 160)
        new, _ = learn_tie_margin(diffs[tr], human[tr], seed=seed)
        old = _old_margin(diffs[tr], human[tr])
        for m, gap, test in ((new, new_gap, new_test), (old, old_gap, old_test)):
            test.append(_agree(diffs[te], human[te], m))
            gap.append(_agree(diffs[tr], human[tr], m) - test[-1])
    assert np.mean(new_gap) < np.mean(old_gap) - 0.01
    # the margin is kept only when cross-validation on the training pairs says it beats margin 0:
    # with honest ties that costs a little (a helpful margin is sometimes dropped), with a
    # position-biased judge it saves much more (test_a_margin_is_never_worse_on_training_than_none)
    assert np.mean(new_test) >= np.mean(old_test) - 0.005


def test_a_margin_is_never_worse_on_training_than_none():
    """The logistic crossing can fall where the training pairs themselves
    agree less with ties than without (0.35 against 0.425 here, as 0.414 against 0.525 with a
    judge that favours the first response); margin 0 is a candidate, chosen by grouped CV."""
    from hdeval.methods.dna.decision import learn_tie_margin

    rng = np.random.default_rng(183)
    d = np.round(rng.normal(0, 1.5, 40) * 2) / 2  # half-point totals
    p_tie, p_wrong = rng.uniform(0.2, 0.5), rng.uniform(0.1, 0.4)
    u = rng.random(40)
    human = np.where(u < p_tie, "tie", np.where(u < p_tie + p_wrong, np.where(d > 0, "b", "a"),
                                                 np.where(d > 0, "a", "b"))).astype(object)
    margin, info = learn_tie_margin(d, human, [f"q{i // 2}" for i in range(40)], seed=0)
    assert info["learned_margin"] > 0 and margin == 0.0 and info["rule"] == "margin 0"
    assert info["train_w_ties"] == info["train_w_ties_at_0"]
    assert info["cv_w_ties_at_0"] is not None


def _sim_train(tmp_path, rows, name="sim", backend=None, **options):
    from simjudge import pair_backend, write_pairs

    data = write_pairs(tmp_path / f"{name}.jsonl", rows)
    return train(task="faireval", data=str(data), method="dna", llm="fake", cache_dir=str(tmp_path / "cache"),
                 backend=backend or pair_backend(), method_options=options)


@pytest.mark.slow
def test_learned_margin_predicts_the_close_pairs_humans_tie_and_beats_margin_zero(tmp_path):
    # the simulated judge gives close totals where humans see close quality (and tie it)
    from simjudge import pairwise_rows

    rows = pairwise_rows(200, seed=0)
    learned = _sim_train(tmp_path, rows)
    at_zero = _sim_train(tmp_path, rows, tie_margin=0.0)
    direct = _sim_train(tmp_path, rows, dna_mode="direct")
    tm = learned.metrics["tie_margin"]
    assert tm["from"] == "training split" and tm["value"] > 0 and tm["pairs"] == learned.metrics["split"]["train"]
    assert tm["train_w_ties"] > tm["train_w_ties_at_0"]
    assert learned.settings.tie_margin == tm["value"] and learned.settings.tie_margin_from == "training split"
    got, zero = learned.metrics["test"]["llm_weights"], at_zero.metrics["test"]["llm_weights"]
    # held out: ties are predicted where humans gave them, and agreement with ties rises
    assert got["confusion"]["tie"].get("tie", 0) > zero["confusion"]["tie"].get("tie", 0)
    assert got["w_ties"] >= zero["w_ties"] + 0.03
    assert got["wo_ties"] == zero["wo_ties"]  # the forced a/b verdict does not depend on the margin
    # the bar: not below the direct baseline's agreement with ties
    assert got["w_ties"] >= direct.metrics["test"]["direct"]["w_ties"]
    assert at_zero.metrics["tie_margin"] == {"value": 0.0, "from": "given", "how": "set with --tie-margin"}
    assert "tie margin" in learned.summary_line() and "learned on the training split" in learned.summary_line()


@pytest.mark.slow
def test_test_rows_never_decide_the_margin(tmp_path):
    from simjudge import pairwise_rows

    rows = pairwise_rows(120, seed=1)
    first = _sim_train(tmp_path, rows, "first")
    test_ids = set(first.score_table["pair_id"][first.score_table["split"] == "test"])
    # every held-out label becomes a tie: a margin that looked at them would widen
    changed = [dict(r, label="tie") if r["id"] in test_ids else r for r in rows]
    second = _sim_train(tmp_path, changed, "second")
    assert set(second.score_table["pair_id"][second.score_table["split"] == "test"]) == test_ids
    assert second.metrics["tie_margin"] == first.metrics["tie_margin"]


@pytest.mark.slow
def test_the_artifact_records_and_applies_its_learned_margin(tmp_path):
    from simjudge import pairwise_rows, write_pairs

    rows = pairwise_rows(100, seed=2)  # enough human ties (9 of 50 training pairs) for a margin
    ev = _sim_train(tmp_path, rows)
    art = ev.save(tmp_path / "art")
    manifest = json.loads((art / "manifest.json").read_text())
    margin = ev.metrics["tie_margin"]["value"]
    assert manifest["method_args"]["tie_margin"] == margin > 0
    assert manifest["method_args"]["tie_margin_from"] == "training split"
    assert json.loads((art / "metrics.json").read_text())["tie_margin"]["from"] == "training split"
    back = load_artifact(art)
    assert back.settings.tie_margin == margin
    from simjudge import pair_backend

    pairs = read_task_samples(write_pairs(tmp_path / "again.jsonl", rows), load_task("faireval"))
    res = back.score(pairs, backend=pair_backend())
    assert res.labels == list(ev.score_table["prediction"])  # apply decides ties as training did
    # an artifact without a decided margin is refused with one line
    manifest["method_args"]["tie_margin"] = None
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="no usable tie margin"):
        load_artifact(art)


def test_an_artifact_whose_margin_the_previous_rule_chose_still_loads_and_applies(tmp_path):
    # written by the code before the margin was learned by a logistic crossing (its metrics say
    # "the candidate with the highest agreement..."): pairwise_rows(40, seed=2), the simulated judge
    from simjudge import pair_backend, pairwise_rows, write_pairs

    from hdeval.methods.pair_report import dna_report

    art = REPO / "tests" / "golden" / "dna_artifact_margin_v1"
    old = json.loads((art / "metrics.json").read_text())["tie_margin"]
    assert "rule" not in old and "cv_w_ties" not in old  # the previous format
    back = load_artifact(art)
    assert back.settings.tie_margin == old["value"] > 0 and back.settings.tie_margin_from == "training split"
    pairs = read_task_samples(write_pairs(tmp_path / "again.jsonl", pairwise_rows(40, seed=2)), load_task("faireval"))
    res = back.score(pairs, backend=pair_backend())
    recorded = [line.split(",") for line in (art / "scores.csv").read_text().splitlines()]
    column = recorded[0].index("prediction")
    assert res.labels == [row[column] for row in recorded[1:]]  # ties decided as when it was trained
    assert f"tie margin {old['value']} (learned on the training split)" in back.summary_line()
    assert any(line.startswith(f"tie margin {old['value']} (learned on 20 training pairs")
               for line in dna_report(back)[1])


def test_a_margin_the_user_gives_is_kept_and_recorded_as_given(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40, tie_margin=0.25)
    assert ev.settings.tie_margin == 0.25 and ev.settings.tie_margin_from == "given"
    assert ev.metrics["tie_margin"]["from"] == "given"
    manifest = json.loads((ev.save(tmp_path / "art") / "manifest.json").read_text())
    assert manifest["method_args"]["tie_margin"] == 0.25 and manifest["method_args"]["tie_margin_from"] == "given"
    r = run_cli("train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--llm", "fake",
                "--cache-dir", tmp_path / "cache", "-o", tmp_path / "cli", "--tie-margin", "-1")
    assert r.exit_code == 2 and "--tie-margin must be 0 or more" in r.output


# --------------------------------------------------------------------------- swap flip rate


def _first_wins(request, fake):
    # a judge that always prefers whatever it is shown first: every verdict flips with the order
    return Completion(json.dumps({"score_a": 8, "score_b": 3}) if request.json_schema else "8 3", None, 10, 4)


@pytest.mark.slow
def test_swap_flip_rate_is_the_share_of_verdicts_that_change_with_the_order(tmp_path):
    from simjudge import pair_backend, pairwise_rows

    rows = pairwise_rows(60, seed=4)
    steady = _sim_train(tmp_path, rows, "steady", backend=pair_backend(noise=0.0), swap=True, tie_margin=0.0)
    assert steady.metrics["swap_flip_rate"] == 0.0 and steady.metrics["test"]["swap_flip_rate"] == 0.0
    fickle = FakeBackend(responders={**RESPONDERS, "dna_score": _first_wins})
    biased = _sim_train(tmp_path, rows, "biased", backend=fickle, swap=True, tie_margin=0.0)
    m = biased.metrics
    assert m["swap_flip_rate"] == 1.0 and m["test"]["swap_flip_rate"] == m["train"]["swap_flip_rate"] == 1.0
    assert m["swap_flip_rate"] == round(1 - m["position_consistency"], 6)
    assert "swap flip rate 1.0" in biased.summary_line()
    # one order judged (--no-swap, half the calls): no rate, and the run says why
    one = _sim_train(tmp_path, rows, "one", backend=fickle, tie_margin=0.0, swap=False)
    assert one.metrics["swap_flip_rate"] is None and "--swap" in one.metrics["swap_flip_note"]
    assert "swap_flip_rate" not in one.metrics["test"]


@pytest.mark.parametrize("llm", ["gpt-4o-mini", ["x"], {"model": 5}])
def test_an_artifact_whose_llm_is_not_an_object_of_text_is_one_line_naming_the_manifest(tmp_path, llm):
    import shutil

    art = tmp_path / "art"
    shutil.copytree(REPO / "tests" / "golden" / "dna_artifact_margin_v1", art)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["llm"] = llm
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as exc:
        load_artifact(art)
    assert str(art / "manifest.json") in str(exc.value) and "'llm'" in str(exc.value)


@pytest.mark.parametrize("mode", ["direct", "dna"])
def test_each_cached_reply_is_counted_once(tmp_path, mode):
    """Each reply holds both sides' scores and is read once per side; a
    fully cached run counted every cache hit twice (1812 for 906 pairs)."""
    from simjudge import pair_backend, pairwise_rows, write_pairs

    data = write_pairs(tmp_path / "pairs.jsonl", pairwise_rows(12))
    runs = [train(task="faireval", data=str(data), llm="fake", method="dna", dna_mode=mode,
                  cache_dir=str(tmp_path / "c"), backend=pair_backend()).metrics["usage"] for _ in range(2)]
    first, again = runs
    assert first["calls"] > 0 and first["cache_hits"] == 0, first
    assert again["calls"] == 0 and again["cache_hits"] == first["calls"], runs


@pytest.mark.slow
def test_a_judge_that_favours_the_first_response_gets_no_margin_that_loses_to_none(tmp_path):
    """With a +1 bonus for the response shown first and no --swap, a learned
    margin made DnA's held-out agreement with ties worse than margin 0 and than its direct
    baseline. The margin is now kept only when cross-validation on training pairs says it helps."""
    from simjudge import pair_backend, pairwise_rows

    rows = pairwise_rows(200, seed=0)
    biased = pair_backend(first_bonus=1.0)
    # one order, as the issue ran it (without --swap or --no-swap the position probe adds the other)
    dna = _sim_train(tmp_path, rows, backend=biased, swap=False)
    direct = _sim_train(tmp_path, rows, backend=pair_backend(first_bonus=1.0), dna_mode="direct", swap=False)
    tm = dna.metrics["tie_margin"]
    assert tm["train_w_ties"] >= tm["train_w_ties_at_0"]  # never worse on training than no margin
    assert tm["cv_w_ties"] is not None and tm["cv_w_ties_at_0"] is not None
    if tm["value"] > 0:
        assert tm["cv_w_ties"] >= tm["cv_w_ties_at_0"]
    assert dna.metrics["test"]["llm_weights"]["w_ties"] >= direct.metrics["test"]["direct"]["w_ties"]


# --------------------------------------------------------------------------- position bias


def test_the_position_probe_measures_the_first_shown_responses_advantage_not_the_flip_rate():
    from hdeval.methods.dna.decision import p_text, position_bias

    rng = np.random.default_rng(0)
    d = rng.normal(0, 1.5, 30)  # each pair's A - B as the judge sees it, before the order
    noise = rng.normal(0, 0.5, (2, 30))
    # (total A, total B) shown A first, then B first; the judge adds `bonus` to whatever is first
    def totals(bonus):
        return [(5 + x + e1 + bonus, 5.0, 5 + x + e2, 5.0 + bonus) for x, e1, e2 in zip(d, *noise)]

    fair, biased = position_bias(totals(0.0)), position_bias(totals(1.0))
    assert not fair["biased"] and fair["p_value"] > 0.05 and abs(fair["first_position_advantage"]) < 0.2
    assert fair["flip_rate"] > 0  # a noisy fair judge flips verdicts too: the rate cannot decide
    assert biased["biased"] and biased["p_value"] < 0.001 and biased["pairs"] == 30
    assert biased["first_position_advantage"] == pytest.approx(1.0 + fair["first_position_advantage"])
    # the same advantage on every pair is beyond doubt, none at all is no bias
    same = position_bias([(6.0, 5.0, 5.0, 6.0)] * 5)
    assert same["biased"] and same["p_value"] == 0.0 and same["first_position_advantage"] == 1.0
    assert not position_bias([(6.0, 5.0, 6.0, 5.0)] * 5)["biased"]
    # a pair that failed in one order is left out; one pair cannot be tested
    one = position_bias([(6.0, 5.0, 5.0, 6.0), (math.nan, 5.0, 5.0, 6.0)])
    assert one["pairs"] == 1 and one["p_value"] is None and not one["biased"]
    assert (p_text(0.0), p_text(0.0004), p_text(0.0123), p_text(1.0)) == (
        "p < 0.001", "p < 0.001", "p = 0.012", "p = 1.000")


def _probe_run(tmp_path, rows, name, bonus, dna_mode="dna", **options):
    from simjudge import pair_backend, write_pairs

    rec = _Stages()
    data = write_pairs(tmp_path / f"{name}.jsonl", rows)
    fitted = train(task="faireval", data=str(data), method="dna", llm="fake", cache_dir=str(tmp_path / name),
                   backend=pair_backend(first_bonus=bonus), dna_mode=dna_mode, method_options=options,
                   progress=rec)
    return fitted, rec


@pytest.mark.slow
def test_a_judge_that_favours_the_first_response_is_judged_in_both_orders_with_a_warning(tmp_path):
    """Without --swap a judge that adds +1 to the response shown first is found out by the
    position probe, said in one warning line, and every pair is judged in both
    orders; held out, DnA's agreement with ties is then not below its direct baseline's (pooled
    over 10 synthetic data sets of 200 pairs: one set's 100 held-out pairs move it by +-.05)."""
    from simjudge import pairwise_rows

    got = {"dna": [], "direct": []}
    for seed in range(10):
        rows = pairwise_rows(200, seed=seed)
        for mode in got:
            ev, rec = _probe_run(tmp_path, rows, f"{mode}{seed}", 1.0, dna_mode=mode)
            probe = ev.metrics["position_probe"]
            assert probe["biased"] and probe["action"] == "swapped" and probe["pairs"] == 30
            assert probe["first_position_advantage"] == pytest.approx(1.0, abs=0.25)
            warned = [line for line in rec.lines if "position bias" in line]
            assert warned == [probe["warning"]], rec.lines
            assert warned[0].startswith("warning: position bias: the response shown first gets +")
            assert "p < 0.001" in warned[0] and "both orders" in warned[0] and "--no-swap" in warned[0]
            # judged in both orders, as --swap does: the artifact scores new pairs so too
            assert ev.settings.swap and ev.metrics["swap_flip_rate"] is not None
            # the margin, chosen by grouped CV with margin 0 a candidate, is never worse on training than 0
            tm = ev.metrics["tie_margin"]
            assert tm["train_w_ties"] >= tm["train_w_ties_at_0"] and tm["cv_w_ties_at_0"] is not None
            got[mode].append(ev.metrics["test"][ev.metrics["primary"]]["w_ties"])
    assert np.mean(got["dna"]) >= np.mean(got["direct"]), got
    # --no-swap: one order as asked, with the warning naming --swap
    one, rec = _probe_run(tmp_path, pairwise_rows(200, seed=0), "one", 1.0, swap=False)
    assert one.metrics["position_probe"]["action"] == "warned" and not one.settings.swap
    warned = [line for line in rec.lines if "position bias" in line]
    assert len(warned) == 1 and "--swap judges both orders" in warned[0]
    assert one.metrics["swap_flip_rate"] is None


@pytest.mark.slow
def test_a_fair_noisy_judge_keeps_one_order_and_no_warning(tmp_path):
    """The verdicts of a fair judge with noise flip with the order too (10-20% of the probed
    pairs here): that alone must not make the run pay for both orders or warn."""
    from simjudge import pairwise_rows

    rows = pairwise_rows(200, seed=0)
    for mode in ("dna", "direct"):
        fair, rec = _probe_run(tmp_path, rows, f"fair-{mode}", 0.0, dna_mode=mode)
        probe = fair.metrics["position_probe"]
        assert probe["flip_rate"] >= 0.05 and not probe["biased"] and probe["action"] == "none"
        assert probe["warning"] is None and not any("position bias" in line for line in rec.lines)
        assert not fair.settings.swap and fair.metrics["swap_flip_rate"] is None
        # the probe only measures: the verdicts are those of one order (--no-swap)
        one, _ = _probe_run(tmp_path, rows, f"one-{mode}", 0.0, dna_mode=mode, swap=False)
        assert fair.metrics["test"] == one.metrics["test"] and fair.metrics["tie_margin"] == one.metrics["tie_margin"]
        assert list(fair.score_table["prediction"]) == list(one.score_table["prediction"])
        per_pair = 4 if mode == "dna" else 1
        assert fair.metrics["usage"]["calls"] == (200 if mode == "dna" else 0) + per_pair * (200 + 30)


def test_the_position_warning_reaches_a_quiet_cli_run(faireval40, tmp_path):
    # the fake LLM adds a point to the response shown first on some aspects (dna/fake.py)
    r = run_cli("train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--llm", "fake",
                "--cache-dir", tmp_path / "cache", "-o", tmp_path / "art", "-q")
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: position bias")]
    assert len(warned) == 1 and "both orders" in warned[0]
    m = json.loads((tmp_path / "art" / "metrics.json").read_text())
    assert m["position_probe"]["action"] == "swapped" and m["position_probe"]["warning"] == warned[0]
    assert m["position_probe"]["pairs"] == m["split"]["train"] == 20  # fewer than 30: all of them
    assert json.loads((tmp_path / "art" / "manifest.json").read_text())["method_args"]["swap"] is True


def test_a_probe_call_that_fails_does_not_cost_its_pair_the_verdict_of_one_order(tmp_path):
    """Without a bias found the probe's swapped-order replies only measure: the verdicts are
    those of one order. A probe reply that could not be read made its pair a failure, so the
    pair lost the verdict its first-order reply gave (and the run could stop above the failure
    rate for calls --no-swap never needed)."""
    from simjudge import declared, pair_backend, pairwise_rows

    rows = pairwise_rows(60, seed=1)
    fair = pair_backend(noise=0.0)
    read = fair.responders["dna_direct"]

    def no_swapped_reply(request, fake):  # the swapped order, where response B is shown first
        if "Answer one" in declared(request, "response_a"):
            return read(request, fake)
        return Completion("I would rather not say.", None, 10, 4)

    flaky = FakeBackend(logprobs=False, honour_constraints=False,
                        responders={**fair.responders, "dna_direct": no_swapped_reply})
    (tmp_path / "clean").mkdir(), (tmp_path / "flaky").mkdir()  # each its own cache
    clean = _sim_train(tmp_path / "clean", rows, backend=fair, dna_mode="direct", tie_margin=0.0)
    assert clean.metrics["position_probe"]["action"] == "none"
    got = _sim_train(tmp_path / "flaky", rows, backend=flaky, dna_mode="direct", tie_margin=0.0)
    probe = got.metrics["position_probe"]
    assert probe["action"] == "none" and probe["pairs"] == 0  # nothing measured, nothing acted on
    assert got.metrics["failure_rate"] == 0.0, got.metrics["failure_rate"]
    assert list(got.score_table["prediction"]) == list(clean.score_table["prediction"])
    assert got.metrics["test"] == clean.metrics["test"]


def test_the_position_warning_is_printed_once_without_quiet(faireval40, tmp_path):
    # the run shows it as the probe finds it; the summary after training must not repeat it
    r = run_cli("train", "--task", "faireval", "--data", faireval40, "--method", "dna", "--llm", "fake",
                "--cache-dir", tmp_path / "cache", "-o", tmp_path / "art")
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: position bias")]
    assert len(warned) == 1 and "both orders" in warned[0], r.stderr
