"""HD-Eval on pairwise preference data (`hdeval train --method hdeval` on faireval / llmbar): both
responses scored per criterion with the pointwise prompt, a classifier on the per-criterion score
differences, pruning by held-out agreement, artifacts applied to new pairs, 0 calls on a rerun,
bad input and options refused before any LLM call."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli, write_jsonl

from hdeval.core.errors import ArtifactError, ConfigError, DataError
from hdeval.data.samples import read_samples, read_task_samples
from hdeval.data.tasks import load_task
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.client import open_llm
from hdeval.llm.config import LLMConfig
from hdeval.methods.hdeval.pairwise import PairwiseTreeEvaluator
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train


def _train(tmp_path, data, task="faireval", backend=None, **options):
    options.setdefault("layers", 2)
    return train(task=task, data=str(data), method="hdeval", llm="fake", cache_dir=str(tmp_path / "cache"),
                 backend=backend, **options)


def _new_pairs(tmp_path):
    return write_jsonl(tmp_path / "new.jsonl", [
        {"id": "n1", "source": "How do I boil an egg?", "output_a": "Put it in boiling water for nine minutes, "
         "then cool it in cold water so the shell peels easily.", "output_b": "Eggs.", "label": None},
        {"id": "n2", "source": "Name a prime.", "output_a": "4", "output_b": "7 is a prime number.", "label": "b"},
    ])


def test_cli_train_on_faireval_slice_reports_agreement_per_layer_and_reruns_free(faireval40, tmp_path):
    out = tmp_path / "art"
    args = ["train", "--task", "faireval", "--data", faireval40, "--method", "hdeval", "--layers", 3,
            "--llm", "fake", "--cache-dir", tmp_path / "cache", "--out", out, "-q"]
    r = run_cli(*args)
    assert r.exit_code == 0, r.output
    assert "held-out agreement with human labels: w/o ties" in r.stdout
    assert "equal-weight sum of the layer-1 differences" in r.stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["shape"] == "pairwise" and m["split"] == {"train": 20, "test": 20}
    assert m["classes"] == ["a", "b", "tie"]  # FairEval has ties
    assert set(m["layers"]) == {"1", "2", "3"} and m["final"] == m["layers"][str(m["selection"]["kept_layer"])]
    for a in list(m["layers"].values()) + [m["direct_layer1"]]:
        assert 0 <= a["w_ties"] <= 1 and 0 <= a["wo_ties"] <= 1
        assert sum(sum(c.values()) for c in a["confusion"].values()) == 20
        assert a["n_wo_ties"] == 20 - sum(a["confusion"].get("tie", {}).values())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "hdeval" and manifest["state"]["shape"] == "pairwise"
    assert manifest["state"]["classifier"]["kind"] in ("lr", "dt", "rf", "nn")
    assert {"tree.json", "classifier.skops", "prompts/score.toml", "scores.csv"} <= set(manifest["files"])
    assert set(m["importance"]) == set(manifest["state"]["features"])
    # 40 pairs x 2 responses x 4 aspects, 4 decompositions, then 80 x 16 layer-2 criteria, ...
    assert m["usage"]["calls"] >= 80 * 4 + 4 + 80 * 16
    r2 = run_cli(*args, "--force")
    assert r2.exit_code == 0 and "LLM calls made: 0," in r2.stderr


def test_the_kept_layer_is_chosen_on_training_agreement_and_test_labels_decide_nothing(faireval40, tmp_path):
    """For pairs too, the deepest layer is not kept by default."""
    ev = _train(tmp_path / "a", faireval40, layers=3, top_k=2, aggregator="lr")
    m, layers = ev.metrics, ev.manifest_extra["layers"]
    sel = m["selection"]
    cv = {r["layer"]: r["cv_train"]["w_ties"] for r in layers}
    assert sel["cv_train_w_ties"] == {str(k): v for k, v in cv.items()}
    best = 1
    for k in sorted(cv)[1:]:
        best = k if cv[k] > cv[best] + 0.01 else best
    kept = sel["kept_layer"]
    assert kept == best and m["final_layer"] == kept and m["final"] == m["layers"][str(kept)]
    in_kept = [k for r in layers if r["layer"] <= kept for k in r["added"]]
    assert ev.feature_keys == in_kept and sorted(ev.tree.keys) == sorted(in_kept)
    assert set(m["importance"]) == set(in_kept)
    # the kept layer and its classifier reload and score like the trained one
    back = load_artifact(ev.save(tmp_path / "art"))
    assert back.feature_keys == ev.feature_keys and back.metrics["selection"] == sel
    # flipping every test label changes no choice: only training rows decide
    test_ids = set(ev.run["split"]["test"])
    flip = {"a": "b", "b": "a", "tie": "tie"}
    rows = [json.loads(line) for line in open(faireval40, encoding="utf-8")]
    rows = [dict(r, label=flip[r["label"]]) if r["id"] in test_ids else r for r in rows]
    other = _train(tmp_path / "b", write_jsonl(tmp_path / "flipped.jsonl", rows), layers=3, top_k=2,
                   aggregator="lr")
    assert other.metrics["selection"] == sel and other.feature_keys == ev.feature_keys
    assert m["order_swap"]["pairs"] == len(test_ids) and 0 <= m["order_swap"]["verdict_changes"] <= 1


def test_order_swap_counts_verdicts_that_change_when_a_and_b_trade_places():
    from hdeval.learn.classify import make_classifier
    from hdeval.methods.hdeval.pairwise import order_swap

    X = np.array([[-2.0], [-1.0], [0.0], [0.0], [1.0], [2.0], [3.0], [0.5]])
    # a judge that prefers A even when the scores are level: its intercept is a position bias
    biased = make_classifier("lr", 0).fit(X, ["b", "b", "a", "a", "a", "a", "a", "a"])
    got = order_swap(biased, X)
    first, second = biased.predict(X), biased.predict(-X)
    expected = sum({"a": "b", "b": "a"}[p] != q for p, q in zip(first, second)) / len(X)
    assert got["pairs"] == 8 and got["verdict_changes"] == pytest.approx(expected) and expected > 0
    fair = make_classifier("lr", 0).fit(np.vstack([X, -X]), ["b", "b", "a", "a", "a", "a", "a", "a"] +
                                        ["a", "a", "b", "b", "b", "b", "b", "b"])
    assert order_swap(fair, np.array([[2.0], [-3.0]]))["verdict_changes"] == 0.0


def test_each_response_is_scored_alone_and_the_feature_is_the_difference(faireval40, tmp_path):
    fake = FakeBackend()
    ev = _train(tmp_path, faireval40, backend=fake, layers=1, aggregator="lr")
    pairs = read_task_samples(faireval40, load_task("faireval"))
    asked = [r for r in fake.requests if r.kind == "score"]
    assert len(asked) == 40 * 2 * 4 and {r.kind for r in fake.requests} == {"score"}
    for p in pairs[:5]:
        shows_a = [r for r in asked if p.output_a[:200] in r.messages[1].content]
        shows_b = [r for r in asked if p.output_b[:200] in r.messages[1].content]
        assert len(shows_a) == len(shows_b) == 4
        assert not any(p.output_b[:200] in r.messages[1].content for r in shows_a)
    t = ev.score_table
    assert list(t.columns[:2]) == ["pair_id", "split"] and t.columns[-1] == "human"
    # the classifier's input is score(A) - score(B): swapping the responses flips every feature
    swapped = [p.__class__(p.id, p.doc_id, p.fields, p.output_b, p.output_a, None) for p in pairs[:6]]
    llm = open_llm(LLMConfig("fake", cache_dir=str(tmp_path / "cache")), FakeBackend())
    try:
        a = ev.score(pairs[:6], backend=llm)
        b = ev.score(swapped, backend=llm)
    finally:
        llm.close()
    assert np.allclose(a.criteria.values, -b.criteria.values)
    assert np.allclose(a.criteria.values, a.side_a.values - a.side_b.values)
    rows = t.set_index("pair_id").loc[[p.id for p in pairs[:6]]]
    assert np.allclose(a.side_a.values[:, 0], rows["helpfulness:a"]) and np.allclose(a.side_b.values[:, 0],
                                                                                       rows["helpfulness:b"])


def test_llmbar_has_no_ties_so_the_classifier_has_two_classes(llmbar60, tmp_path):
    ev = _train(tmp_path, llmbar60, task="llmbar", layers=1)
    m = ev.metrics
    assert m["classes"] == ["a", "b"]
    assert "tie" not in m["final"]["confusion"] and m["final"]["n_wo_ties"] == m["split"]["test"]
    assert m["final"]["w_ties"] == m["final"]["wo_ties"]


def test_pruning_expands_only_criteria_with_positive_held_out_importance(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40, layers=3, top_k=2, aggregator="lr")
    layers = ev.manifest_extra["layers"]
    l2 = layers[1]
    assert set(l2["importance"]) == set(l2["added"]) and len(l2["added"]) == 16
    positive = {k for k, v in l2["importance"].items() if v > 0}
    assert set(l2["expand_next"]) <= positive and len(l2["expand_next"]) == min(2, len(positive))
    assert l2["expand_next"] == sorted(l2["expand_next"], key=lambda k: -l2["importance"][k])
    parents = {k.rsplit("/", 1)[0] for k in layers[2]["added"]}  # the tree explored, whichever layer is kept
    assert parents == set(l2["expand_next"])


@pytest.mark.parametrize("kind", ["dt", "rf", "nn"])
def test_other_aggregator_kinds_work_as_classifiers_and_reload(faireval40, tmp_path, kind):
    ev = _train(tmp_path, faireval40, layers=1, aggregator=kind)
    assert ev.metrics["aggregator"] == kind
    back = load_artifact(ev.save(tmp_path / "art"))
    assert isinstance(back, PairwiseTreeEvaluator) and back.kind == kind
    pairs = read_task_samples(_new_pairs(tmp_path), back.task, require_labels=False)
    llm = open_llm(LLMConfig("fake", cache_dir=str(tmp_path / "cache")), FakeBackend())
    try:
        res = back.score(pairs, backend=llm)
    finally:
        llm.close()
    assert all(lab in ("a", "b", "tie") for lab in res.labels)
    assert np.allclose(res.predictions.sum(axis=1), 1.0)


def test_apply_scores_new_pairs_and_a_second_apply_makes_no_calls(faireval40, tmp_path):
    path = _train(tmp_path, faireval40).save(tmp_path / "art")
    new = _new_pairs(tmp_path)
    args = ["apply", path, new, "-o", tmp_path / "out.jsonl", "--cache-dir", tmp_path / "cache2", "-q"]
    r = run_cli(*args)
    assert r.exit_code == 0, r.output
    ev = load_artifact(path)
    n = len(ev.needed_criteria)
    assert f"aggregator: {2 * n} LLM calls per sample" in r.stderr
    assert f"LLM calls made: {2 * 2 * n}," in r.stderr
    assert "agreement with the human labels in the input" in r.output
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [x["id"] for x in rows] == ["n1", "n2"]
    assert rows[0]["prediction"] in ("a", "b", "tie") and "human" not in rows[0] and rows[1]["human"] == "b"
    assert abs(sum(rows[0]["probabilities"].values()) - 1) < 1e-5
    assert set(rows[0]["criteria"]) == set(ev.needed_criteria)
    assert all(set(v) == {"a", "b"} for v in rows[0]["criteria"].values())
    r2 = run_cli(*args[:3], "-o", tmp_path / "out2.jsonl", *args[5:])
    assert r2.exit_code == 0 and "LLM calls made: 0," in r2.stderr
    assert (tmp_path / "out2.jsonl").read_text() == (tmp_path / "out.jsonl").read_text()
    r3 = run_cli("apply", path, new, "-o", tmp_path / "x.jsonl", "--explain", "--cache-dir", tmp_path / "cache2")
    assert r3.exit_code == 2 and (f"error: --explain cannot explain {path}: its evaluator (method 'hdeval', "
                                  "pairwise data) gives no explanations") in r3.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_apply_on_the_training_file_reports_the_training_pairs_agreement_apart(llmbar60, tmp_path):
    """As for pointwise scores: the headline agreement is the held-out pairs' (the artifact's own
    held-out figure), the training pairs' is reported apart and labelled."""
    from hdeval.run.apply import apply_file

    path = _train(tmp_path, llmbar60, task="llmbar", layers=1, aggregator="lr").save(tmp_path / "art")
    ev = load_artifact(path)
    train_ids = set(ev.run["split"]["train"])
    res = apply_file(path, str(llmbar60), str(tmp_path / "o.jsonl"), cache_dir=str(tmp_path / "cache"),
                     notify=lambda _: None)
    assert res.trust["in_training"] == len(train_ids) > 0
    assert res.agreement["hdeval"]["n"] == 60 - len(train_ids)
    assert res.agreement["hdeval"]["w_ties"] == ev.metrics["final"]["w_ties"]
    assert res.trust["agreement_training"]["hdeval"]["n"] == len(train_ids)
    r = run_cli("apply", path, llmbar60, "-o", tmp_path / "o2.jsonl", "--cache-dir", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    assert "agreement with the human labels in the input (rows not in the artifact's training split)" in r.output
    assert "TRAINING ROWS ONLY" in r.output


def test_scoring_single_outputs_with_a_pairwise_artifact_is_a_clear_error(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40, layers=1)
    rows = [{"id": "s1", "doc_id": "d", "source": "q", "output": "an answer"}]
    samples = read_samples(write_jsonl(tmp_path / "single.jsonl", rows), load_task("summeval"),
                           require_scores=False)
    with pytest.raises(DataError, match="it scores pairs"):
        ev.score(samples, backend=FakeBackend())
    with pytest.raises(DataError, match="no pairs to score"):
        ev.score([], backend=FakeBackend())


def test_a_direct_loader_names_the_artifact_it_was_given_and_the_generic_one(toy, faireval40, tmp_path):
    from hdeval.artifact.directory import open_artifact
    from hdeval.methods.hdeval.evaluator import Evaluator

    pair = _train(tmp_path, faireval40, layers=1, aggregator="lr").save(tmp_path / "pair")
    task, data = toy
    point = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr",
                  cache_dir=str(tmp_path / "cache")).save(tmp_path / "point")
    direct = train(task=str(task), data=str(data), method="direct", llm="fake",
                   cache_dir=str(tmp_path / "cache")).save(tmp_path / "direct")
    hint = "load it with hdeval.load(path) or score with hdeval apply"
    cases = [
        (lambda: Evaluator.load(pair), f"{pair} holds a pairwise HD-Eval evaluator, and Evaluator reads "
                                       "pointwise HD-Eval ones only"),
        (lambda: PairwiseTreeEvaluator.load(point), f"{point} holds a pointwise HD-Eval evaluator, and "
                                                    "PairwiseTreeEvaluator reads pairwise HD-Eval ones only"),
        (lambda: Evaluator.load(direct), f"{direct} holds a pointwise 'direct' evaluator, and Evaluator reads"),
        (lambda: Evaluator.from_artifact(open_artifact(pair)), f"{pair} holds a pairwise HD-Eval evaluator"),
        (lambda: PairwiseTreeEvaluator.from_artifact(open_artifact(point)), f"{point} holds a pointwise HD-Eval"),
        (lambda: Evaluator.from_artifact(open_artifact(direct)), f"{direct} holds a pointwise 'direct'"),
    ]
    for load, start in cases:
        with pytest.raises(ArtifactError) as err:
            load()
        msg = str(err.value)
        assert msg.startswith(start) and msg.endswith(hint) and "\n" not in msg, msg
    # each loads with its own loader, and with the generic one
    assert isinstance(PairwiseTreeEvaluator.load(pair), PairwiseTreeEvaluator)
    assert isinstance(load_artifact(pair), PairwiseTreeEvaluator)
    from hdeval.methods.hdeval.pairwise import PairEvaluator  # the name docs/python-api.md gave it

    assert PairEvaluator is PairwiseTreeEvaluator
    assert isinstance(Evaluator.load(point), Evaluator) and load_artifact(direct).method == "direct"


def test_edited_manifest_or_classifier_is_refused(faireval40, tmp_path):
    path = _train(tmp_path, faireval40, layers=2, aggregator="lr").save(tmp_path / "art")
    mf = path / "manifest.json"
    good = mf.read_text()
    m = json.loads(good)
    m["state"]["classifier"]["kind"] = "rf"
    mf.write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="the classifier is a LogisticRegression, but the manifest says classifier 'rf'"):
        load_artifact(path)
    m = json.loads(good)
    s = m["state"]
    s["features"][0], s["features"][1] = s["features"][1], s["features"][0]
    s["needed_criteria"] = s["features"]
    mf.write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="not in the order the classifier was trained on"):
        load_artifact(path)
    m = json.loads(good)
    m["state"]["classifier"]["classes"] = ["a", "b", "maybe"]
    mf.write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="must be a, b and optionally tie"):
        load_artifact(path)
    mf.write_text(good)
    assert isinstance(load_artifact(path), PairwiseTreeEvaluator)


def test_pairwise_options_and_one_sided_labels_are_refused_before_any_call(faireval40, tmp_path):
    fake = FakeBackend()
    with pytest.raises(ConfigError, match="leave --scorer out"):
        _train(tmp_path, faireval40, backend=fake, method_options={"scorer": "pairwise"})
    with pytest.raises(ConfigError, match="--comparisons is a PairEval option"):
        _train(tmp_path, faireval40, backend=fake, method_options={"comparisons": 5})
    rows = [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"question {i}", "output_a": f"answer a{i}",
             "output_b": f"answer b{i}", "label": "a"} for i in range(8)]
    with pytest.raises(DataError, match="needs pairs labelled a and pairs labelled b"):
        _train(tmp_path, write_jsonl(tmp_path / "onesided.jsonl", rows), backend=fake)
    assert fake.calls == 0


def test_bad_pairwise_input_is_one_error_line_before_any_llm_call(tmp_path):
    rows = [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"question {i}", "output_a": f"answer a{i}",
             "output_b": f"answer b{i}", "label": "ab"[i % 2]} for i in range(6)]
    rows[2]["label"] = "both"
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    r = run_cli("train", "--task", "faireval", "--data", data, "--llm", "fake",
             "--cache-dir", tmp_path / "cache", "--out", tmp_path / "art")
    assert r.exit_code == 2
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and str(data) in errors[0]
    assert "line 3: field 'label' is 'both', not one of a, b, tie" in errors[0]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "art").exists()


def test_report_shows_the_tree_with_held_out_importance(faireval40, tmp_path):
    ev = _train(tmp_path, faireval40, layers=2, aggregator="lr")
    path = ev.save(tmp_path / "art")
    r = run_cli("report", path, "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert "criteria tree (importance = drop in held-out agreement" in r.stdout
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    nodes = {n["key"]: n for n in data["tree"]}
    assert set(nodes) == set(ev.tree.keys)
    for c in ev.tree.layer(1):
        kids = ev.tree.children(c.key)
        assert kids and abs(nodes[c.key]["rolled_up"] - (ev.metrics["importance"][c.key] + sum(
            ev.metrics["importance"][k.key] for k in kids))) < 1e-5
        line = next(x for x in r.stdout.splitlines() if x.split()[:1] == [c.key])
        assert f"{ev.metrics['importance'][c.key]:.3f}" in line
    assert data["layers"] == ev.metrics["layers"]
    r = run_cli("explain", path, "--sample", "faireval-q1", "--data", faireval40, "--cache-dir", tmp_path / "c2")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.strip() == (f"error: hdeval explain cannot explain {path}: its evaluator (method 'hdeval', "
                                "pairwise data) gives no explanations; hdeval apply shows its scores, hdeval report "
                                "its numbers")
    assert not (tmp_path / "c2").exists()


def test_dry_run_counts_both_responses_per_criterion_and_matches_a_run(faireval40, tmp_path):
    from hdeval.run.train import TrainConfig, plan

    cfg = TrainConfig.from_options(task="faireval", data=str(faireval40), llm="fake", layers=2, aggregator="lr",
                                   cache_dir=str(tmp_path / "cache"))
    probe = FakeBackend()
    _, plans, _ = plan(cfg, backend=probe)
    assert probe.calls == 0
    assert [(p.layer, p.decompose_calls, p.score_calls, p.cached) for p in plans] == [
        (1, 0, 40 * 2 * 4, 0), (2, 4, 40 * 2 * 16, None)]
    ev = _train(tmp_path, faireval40, layers=2, aggregator="lr")
    assert ev.metrics["usage"]["calls"] == sum(p.decompose_calls + p.score_calls for p in plans)
    _, again, _ = plan(cfg, backend=FakeBackend())
    assert again[0].cached == 40 * 2 * 4
    with pytest.raises(ConfigError, match="--scorer pairwise does not apply to a pairwise task"):
        plan(TrainConfig(task="faireval", data=str(faireval40), llm="fake", options={"scorer": "pairwise"},
                         cache_dir=str(tmp_path / "cache")), backend=FakeBackend())
