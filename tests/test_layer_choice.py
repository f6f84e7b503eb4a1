"""The kept HD-Eval evaluator is chosen on training data, checked with a
simulated judge whose deeper criteria carry no signal, and one whose deeper criteria do."""

from __future__ import annotations

import json

import numpy as np
import pytest
from simjudge import pointwise_backend, pointwise_rows, write_pointwise

from hdeval.data.samples import read_samples
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train


def _train(tmp_path, rows, backend, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    task, data = write_pointwise(tmp_path, rows)
    return train(task=str(task), data=str(data), llm="fake", layers=3, cache_dir=str(tmp_path / "c"),
                 backend=backend, **kw)


def _sp(table):
    return table["average"]["spearman"]


@pytest.mark.slow
@pytest.mark.parametrize("aggregator", ["lr", "dt"])
@pytest.mark.parametrize("seed", [0, 1, 3])
def test_deep_noise_judge_keeps_an_evaluator_no_worse_than_layer_one(tmp_path, seed, aggregator):
    ev = _train(tmp_path, pointwise_rows(40, seed=seed), pointwise_backend(), aggregator=aggregator, seed=seed)
    m = ev.metrics
    assert len(m["layers"]) >= 2  # deeper layers were built and scored, then judged on training data
    kept = m["selection"]["kept_layer"]
    assert m["final"] == m["layers"][str(kept)]
    assert _sp(m["final"]) >= _sp(m["layers"]["1"]) - 0.03
    assert set(m["selection"]["cv_train_spearman"]) == set(m["layers"])
    # the kept evaluator asks only for the criteria of its own layers
    depth = {c.key: c.layer for c in ev.tree}
    assert all(depth[k] <= kept for k in ev.needed_criteria)


@pytest.mark.slow
def test_deeper_layers_are_kept_when_their_criteria_carry_signal(tmp_path):
    ev = _train(tmp_path, pointwise_rows(40, seed=0), pointwise_backend(noise=1.2, deep_signal=True),
                aggregator="lr")
    sel = ev.metrics["selection"]
    assert sel["kept_layer"] >= 2, sel
    assert any("/" in k for k in ev.needed_criteria)


@pytest.mark.slow
def test_test_rows_decide_nothing_and_the_choice_is_saved_and_said(tmp_path):
    rows = pointwise_rows(40, seed=1)
    ev = _train(tmp_path / "a", rows, pointwise_backend(), aggregator="lr", seed=1)
    test_ids = set(ev.run["split"]["test"])
    flipped = [dict(r, scores={a: 6.0 - v for a, v in r["scores"].items()}) if r["id"] in test_ids else r
               for r in rows]
    other = _train(tmp_path / "b", flipped, pointwise_backend(), aggregator="lr", seed=1)
    assert other.metrics["selection"] == ev.metrics["selection"]
    assert other.feature_keys == ev.feature_keys

    out = tmp_path / "art"
    ev.save(out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["selection"]["kept_layer"] == ev.metrics["selection"]["kept_layer"]
    assert metrics["selection"]["strongest_baseline"] in ("mean_subtree", "mean_all_criteria", "direct_layer1")
    loaded = load_artifact(out)
    assert loaded.feature_keys == ev.feature_keys
    samples = read_samples(tmp_path / "a" / "sim_qa.jsonl", loaded.task)[:6]
    backend = pointwise_backend()
    got = loaded.score(samples, backend=backend)
    assert (got.predictions == ev.score(samples, backend=pointwise_backend()).predictions).all()
    asked = {r.messages[-1].content.rsplit('criterion "', 1)[1].split('"')[0] for r in backend.requests}
    assert len(asked) == len(loaded.needed_criteria)  # only the kept layers' criteria are scored


def test_a_baseline_that_beats_the_evaluator_is_named_and_why_it_is_not_kept_is_said(toy, tmp_path):
    """mean_subtree may be recommended; the summary and metrics say plainly
    why it is not the evaluator the artifact keeps."""
    from hdeval.core.types import ScoreMatrix
    from hdeval.methods.hdeval.loop import BASELINE_NOT_KEPT, LayerReport, choose_layer
    from hdeval.methods.hdeval.summary import summary_lines

    task_file, data = toy
    ev = train(task=str(task_file), data=str(data), llm="fake", layers=1, aggregator="lr",
               cache_dir=str(tmp_path / "c"))
    aspects = list(ev.task.aspect_keys)
    samples = read_samples(data, ev.task)
    Y = np.array([[s.scores[a] for a in aspects] for s in samples])
    # criterion scores that are the human scores: every baseline is perfect on training rows,
    # and the evaluator's cross-validated figure is poor
    matrix = ScoreMatrix([s.id for s in samples], aspects, Y.copy())
    report = LayerReport(1, aspects, "lr", {"average": {"spearman": -0.2}}, {}, 0.0)
    tr = np.arange(len(samples))
    choice = choose_layer([report], ev.tree, matrix, Y, tr, aspects)
    assert choice["baseline_beats_evaluator"] and choice["baseline_not_kept"] == BASELINE_NOT_KEPT
    ev.metrics["selection"] = choice
    lines = summary_lines(ev, tmp_path / "art")
    note = [t for t, err in lines if t.startswith("note: the simple baseline")]
    assert len(note) == 1 and "not kept as the evaluator" in note[0]
    assert any(t.startswith("final evaluator: layer 1 of 1 built") for t, _ in lines)


def test_a_baseline_is_compared_with_the_evaluator_on_the_evaluator_s_own_figure():
    """The evaluator's figure ranks each cross-validation fold alone; the baselines' was pooled
    in-sample, which also credits agreeing on which document is better overall. With one
    document per fold, a baseline that ranks only the documents has a pooled figure of .91
    and ranks nothing within a fold: it must not be said to beat an evaluator at 0.3."""
    from hdeval.core.types import Aspect, CriteriaTree, ScoreMatrix
    from hdeval.methods.hdeval.loop import LayerReport, choose_layer

    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(5) for _ in range(12)]  # five documents: one per fold
    level = np.repeat(np.arange(5.0), 12)
    Y = (level + rng.normal(0, 0.7, len(level)))[:, None]
    signal = 10 * level + rng.normal(0, 0.1, len(level))  # the documents' order, nothing within
    tree = CriteriaTree.from_aspects([Aspect("quality", "Quality", "how good", 1, 5)])
    matrix = ScoreMatrix([str(i) for i in range(len(docs))], ["quality"], signal[:, None])
    report = LayerReport(1, ["quality"], "lr", {"average": {"spearman": 0.3}}, {}, 0.0, {"lr": 0.3})
    choice = choose_layer([report], tree, matrix, Y, np.arange(len(docs)), ["quality"], groups=docs)
    assert choice["baselines_train_spearman"]["direct_layer1"] > 0.7
    assert abs(choice["baselines_cv_spearman"]["direct_layer1"]) < 0.3
    assert "baseline_beats_evaluator" not in choice
    # the same baseline does beat an evaluator whose own figure is below it
    worse = LayerReport(1, ["quality"], "lr", {"average": {"spearman": -0.5}}, {}, 0.0, {"lr": -0.5})
    assert choose_layer([worse], tree, matrix, Y, np.arange(len(docs)), ["quality"], groups=docs)[
        "baseline_beats_evaluator"
    ]


def test_the_report_banner_names_the_layer_training_kept_and_why():
    """The banner read a key training never wrote and said "the last one trained"."""
    from hdeval.report.banner import Banner, layer_line

    banner = Banner()
    layer_line(banner, {"selection": {"kept_layer": 1, "reason": "layer 1 is not beaten"}}, ["1", "2", "3"])
    assert [(line.label, line.text) for line in banner.lines] == [("layer kept", "layer 1: layer 1 is not beaten")]


def test_one_cross_validated_figure_per_evaluator(toy, tmp_path):
    """metrics.json's cv_train, the layer choice and the aggregator choice gave two figures for
    one evaluator (pooled raw out-of-fold predictions, and the per-fold standardised ones the
    choice used): now all report the figure the choice used."""
    task_file, data = toy
    ev = train(task=str(task_file), data=str(data), llm="fake", layers=1, aggregator="auto",
               cache_dir=str(tmp_path / "c"))
    sel = ev.metrics["selection"]
    kept = str(sel["kept_layer"])
    chosen = sel["candidates_cv_spearman"][kept][sel["kept_aggregator"]]
    assert ev.metrics["cv_train"][kept]["average"]["spearman"] == pytest.approx(chosen, abs=1e-3)
    assert sel["cv_train_spearman"][kept] == pytest.approx(chosen, abs=1e-3)


def test_a_baseline_s_failed_score_leaves_out_its_row_not_its_fold():
    """A row with no criterion score is NaN in a baseline; standardising its fold with it would
    made that fold's range NaN, and the whole fold was ranked as one value."""
    from hdeval.learn.aggregate import fold_ranked_spearman

    rng = np.random.default_rng(1)
    Y = rng.normal(size=(60, 1))
    pred = Y + rng.normal(0, 0.1, Y.shape)
    docs = [f"d{i // 3}" for i in range(60)]
    whole = fold_ranked_spearman(pred, Y, docs)
    pred[[0, 7, 33], 0] = np.nan
    gapped = fold_ranked_spearman(pred, Y, docs)
    # 0.92 and 0.93 (standardising each fold alone costs a near-perfect predictor .08 when pooled);
    # leaving out the folds of the three rows instead gave 0.45
    assert whole > 0.9 and abs(gapped - whole) < 0.03


@pytest.mark.parametrize("n_docs", [4, 12])  # shuffled folds (fewer documents than folds), grouped ones
def test_a_baseline_s_figure_is_computed_on_the_candidates_own_folds(n_docs):
    """fold_ranked_spearman of a candidate's own out-of-fold predictions is the candidate's figure:
    the two share folds, so a baseline and the evaluator are scored alike."""
    from hdeval.learn.aggregate import Aggregator, cv_candidates, fold_ranked_spearman

    rng = np.random.default_rng(n_docs)
    n = n_docs * 5
    X = rng.normal(size=(n, 3))
    Y = (X @ [1.0, 0.5, 0.0] + rng.normal(0, 1, n))[:, None]
    groups = [f"d{i % n_docs}" for i in range(n)]
    template = Aggregator("lr", ["q"], [(-10.0, 10.0)], None, 7)
    for cand in cv_candidates(template, X, Y, groups, ("mean", "lr")):
        assert fold_ranked_spearman(cand.predictions, Y, groups, 7) == pytest.approx(cand.spearman, abs=1e-12)
