"""The aggregator as a scikit-learn estimator: the contract scikit-learn's tools rely on
(clone, get/set_params, cross_val_predict, searches over ``kind``) and hdeval's own layout
(aspects with ranges, one model per range group)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

import hdeval.learn.aggregate as aggregate
from hdeval.core.errors import ConfigError
from hdeval.core.metrics import mean_spearman
from hdeval.learn.aggregate import (
    Aggregator,
    cross_val_predictions,
    cv_folds,
    select_cv,
)

ASPECTS = ["fluency", "coherence", "quality"]
RANGES = [(1.0, 5.0), (1.0, 5.0), (0.0, 1.0)]
GROUPS = [["fluency", "coherence"], ["quality"]]


def _data(n_docs: int = 20, per_doc: int = 4, n_features: int = 6, seed: int = 0):
    """Criterion scores X (with a few NaN, as failed LLM scores), human scores Y in range,
    and the doc_id of every row."""
    rng = np.random.default_rng(seed)
    n = n_docs * per_doc
    X = rng.uniform(1, 5, size=(n, n_features))
    Y = np.column_stack([
        np.clip(X[:, 0] + 0.3 * rng.normal(size=n), 1, 5),
        np.clip(0.5 * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=n), 1, 5),
        np.clip((X[:, 3] - 1) / 4 + 0.05 * rng.normal(size=n), 0, 1),
    ])
    X[rng.random(X.shape) < 0.03] = np.nan
    docs = [f"d{i // per_doc}" for i in range(n)]
    return X, Y, docs


def _task_agg(kind: str = "lr", **params) -> Aggregator:
    return Aggregator(kind, ASPECTS, RANGES, GROUPS, random_state=0, **params)


# scikit-learn's own estimator checks, on the generic layout (no task: outputs y0, y1, ...,
# no clipping). lr and dt run every check; rf and nn only differ in the model
# make_regressor builds, so they run the contract checks below instead of the full suite
# (which refits a 100-tree forest / an MLP some hundred times).
@parametrize_with_checks([Aggregator(kind="lr"), Aggregator(kind="dt")])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.parametrize("kind", ["lr", "dt", "rf", "nn"])
def test_clone_params_and_refit_are_deterministic(kind):
    X, Y, _ = _data()
    agg = _task_agg(kind)
    params = agg.get_params()
    assert params["kind"] == kind and params["aspects"] == ASPECTS and params["random_state"] == 0
    fitted = clone(agg).fit(X, Y)
    assert agg.get_params() == params and not hasattr(agg, "models_")  # fit left the template alone
    twin = clone(fitted)
    assert not hasattr(twin, "models_") and twin.get_params() == params
    np.testing.assert_array_equal(twin.fit(X, Y).predict(X), fitted.predict(X))
    # pickling keeps a fitted aggregator's predictions
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(fitted)).predict(X), fitted.predict(X))


def test_set_params_changes_the_model_kind():
    X, Y, _ = _data()
    agg = _task_agg("lr").set_params(kind="dt")
    assert agg.kind == "dt"
    fitted = agg.fit(X, Y)
    assert type(fitted.model_for("fluency")[0].named_steps["model"]).__name__ == "DecisionTreeRegressor"


def test_task_layout_one_model_per_range_group_and_predictions_clipped():
    X, Y, _ = _data()
    agg = _task_agg("lr").fit(X, Y)
    assert len(agg.models_) == 2
    assert agg.model_for("coherence")[1] == 1 and agg.model_for("quality")[1] is None
    # far outside the training data a linear model extrapolates; predictions stay in range
    pred = agg.predict(np.full((3, X.shape[1]), 100.0))
    lo, hi = np.array(RANGES).T
    assert pred.shape == (3, 3) and np.all(pred >= lo) and np.all(pred <= hi)
    assert np.any(pred == hi) or np.any(pred == lo)
    with pytest.raises(KeyError):
        agg.model_for("nonexistent")


def test_bad_shapes_and_unfitted_use_fail_clearly():
    X, Y, _ = _data()
    with pytest.raises(ValueError, match="3 aspect"):
        _task_agg().fit(X, Y[:, :2])
    with pytest.raises(ValueError):
        _task_agg().fit(X[:-1], Y)
    with pytest.raises(ValueError, match="do not match"):
        Aggregator("lr", ASPECTS, RANGES, [["fluency"], ["quality"]]).fit(X, Y)
    with pytest.raises(NotFittedError):
        _task_agg().predict(X)
    fitted = _task_agg().fit(X, Y)
    with pytest.raises(ValueError, match="features"):
        fitted.predict(X[:, :-1])
    with pytest.raises(ConfigError, match="unknown aggregator 'svm'"):
        _task_agg("svm").fit(X, Y)


def _manual_oof(template: Aggregator, X, Y, docs) -> np.ndarray:
    """The hand-written CV loop the aggregator had before it was an estimator."""
    pred = np.zeros_like(Y)
    for tr, va in cv_folds(docs, template.random_state):
        pred[va] = clone(template).fit(X[tr], Y[tr]).predict(X[va])
    return pred


@pytest.mark.parametrize("kind", ["lr", "dt", "rf"])
def test_cross_val_predictions_match_the_hand_written_loop(kind):
    X, Y, docs = _data()
    got = cross_val_predictions(_task_agg(kind), X, Y, docs)
    np.testing.assert_array_equal(got, _manual_oof(_task_agg(kind), X, Y, docs))


def test_cross_val_predictions_never_fit_on_the_held_out_document():
    """Grouped folds: a document's rows are predicted by a model that never saw them, so a
    target that is pure per-document noise is not learned (in-sample it would be)."""
    rng = np.random.default_rng(1)
    X, _, docs = _data(n_docs=30, per_doc=3)
    X = np.nan_to_num(X, nan=3.0)
    doc_level = {d: rng.uniform(1, 5) for d in set(docs)}
    Y = np.array([[doc_level[d]] * 2 + [0.5] for d in docs])
    # a feature that identifies the document lets a tree memorise it
    X[:, 0] = [int(d[1:]) for d in docs]
    oof = cross_val_predictions(_task_agg("dt"), X, Y, docs)
    assert mean_spearman(Y[:, :1], _task_agg("dt").fit(X, Y).predict(X)[:, :1]) > 0.99
    assert mean_spearman(Y[:, :1], oof[:, :1]) < 0.6


def test_selection_picks_the_best_cross_validated_kind():
    X, Y, docs = _data()
    kinds = ("lr", "dt", "rf")
    best, scores, _, _ = select_cv(_task_agg("lr"), X, Y, docs, kinds)
    best = best.kind
    expected = {k: mean_spearman(Y, _manual_oof(_task_agg(k), X, Y, docs)) for k in kinds}
    assert scores == expected
    assert best == max(kinds, key=lambda k: (expected[k], -kinds.index(k)))
    assert best == "lr"  # the data is (noisy) linear in the criteria


def test_from_fitted_rebuilds_a_loaded_aggregator_that_clones_to_the_same_model():
    X, Y, _ = _data()
    for kind, params in (("nn", {"alpha": 0.5, "hidden_layer_sizes": (8,)}), ("lr", {})):
        fitted = _task_agg(kind, **params).fit(X, Y)
        loaded = Aggregator.from_fitted(kind, ASPECTS, [list(r) for r in RANGES], GROUPS, 0,
                                        fitted.models_, X.shape[1])
        np.testing.assert_array_equal(loaded.predict(X), fitted.predict(X))
        assert clone(loaded).get_params() == fitted.get_params()
        np.testing.assert_array_equal(clone(loaded).fit(X, Y).predict(X), fitted.predict(X))
    with pytest.raises(ValueError):
        Aggregator.from_fitted("lr", ASPECTS, RANGES, [["fluency"]], 0, fitted.models_, X.shape[1])


# --------------------------------------------------------------------------- nn tuning
SMALL_GRID = {"alpha": (10.0, 0.1), "hidden_layer_sizes": ((8,), (16, 8))}


@pytest.fixture
def small_grid(monkeypatch):
    """A four-point grid: the tests check how the grid is searched, not what it finds."""
    monkeypatch.setattr(aggregate, "NN_GRID", SMALL_GRID)


def test_tune_chooses_the_best_grid_point_by_grouped_cv_and_is_deterministic(small_grid):
    X, Y, docs = _data(n_docs=12, per_doc=3)
    chosen, scores, grid, _ = select_cv(_task_agg("nn"), X, Y, docs, ("nn",))
    score = scores["nn"]
    n_points = len(SMALL_GRID["alpha"]) * len(SMALL_GRID["hidden_layer_sizes"])
    assert len(grid) == n_points and score == max(grid.values())
    # the chosen point's own CV score is the best, and the first such point in grid order wins
    name = f"alpha={chosen.alpha:g},hidden={'x'.join(map(str, chosen.hidden_layer_sizes))}"
    assert grid[name] == score and list(grid).index(name) == [v for v in grid.values()].index(score)
    assert chosen.get_params()["aspects"] == ASPECTS  # only the nn parameters changed
    again, scores2, grid2, _ = select_cv(_task_agg("nn"), X, Y, docs, ("nn",))
    assert (again.get_params(), scores2, grid2) == (chosen.get_params(), scores, grid)


def test_tune_leaves_kinds_without_hyper_parameters_alone():
    X, Y, docs = _data()
    t = _task_agg("lr")
    same, scores, grid, _ = select_cv(t, X, Y, docs, ("lr",))
    assert same is t and grid == {}
    assert scores["lr"] == mean_spearman(Y, cross_val_predictions(t, X, Y, docs))


def test_auto_selection_scores_nn_with_its_tuned_parameters(small_grid):
    X, Y, docs = _data(n_docs=12, per_doc=3)
    best, scores, grid, _ = select_cv(_task_agg("lr"), X, Y, docs)
    assert set(scores) == {"lr", "dt", "rf", "nn"} and scores["nn"] == max(grid.values())
    assert best.kind == max(scores, key=lambda k: (scores[k], -list(scores).index(k)))


# --------------------------------------------------------------------------- pruning
def test_pruning_expands_only_criteria_with_positive_importance():
    from hdeval.methods.hdeval.prune import prune

    X, Y, docs = _data()
    X = np.nan_to_num(X, nan=3.0)
    X[:, 4] = 2.0  # a constant criterion: shuffling it changes nothing, importance exactly 0
    keys = [f"c{i}" for i in range(X.shape[1])]
    res = prune(_task_agg("lr"), X, Y, keys, ["c4", "c0", "c3"], docs, top_k=3)
    assert res.importance["c4"] == 0.0
    assert res.importance["c0"] > 0 and res.importance["c3"] > 0
    assert res.selected == ("c0", "c3") or res.selected == ("c3", "c0")
    assert res.n_positive == 2
    # top_k stays the upper bound, most important first
    top1 = prune(_task_agg("lr"), X, Y, keys, ["c4", "c0", "c3"], docs, top_k=1)
    assert top1.selected == (max(("c0", "c3"), key=res.importance.get),)
    none = prune(_task_agg("lr"), X, Y, keys, ["c4"], docs, top_k=2)
    assert none.selected == () and none.n_positive == 0


# --------------------------------------------------------------------------- training
def test_subtree_means_average_each_aspect_with_its_own_descendants_only():
    from hdeval.core.types import CriteriaTree, Criterion, ScoreMatrix
    from hdeval.methods.hdeval.loop import subtree_means

    tree = CriteriaTree([
        Criterion("a", "A", "", None, 1), Criterion("b", "B", "", None, 1),
        Criterion("a/x", "X", "", "a", 2), Criterion("a/x/y", "Y", "", "a/x", 3),
        Criterion("b/z", "Z", "", "b", 2),
    ])
    keys = ["a", "b", "a/x", "b/z", "a/x/y"]
    values = np.array([[1.0, 5.0, 2.0, 3.0, 6.0],
                       [2.0, 4.0, np.nan, 4.0, 2.0]])
    m = ScoreMatrix(["s1", "s2"], keys, values)
    got = subtree_means(tree, m, ["a", "b"])
    np.testing.assert_allclose(got, [[3.0, 4.0], [2.0, 4.0]])  # NaN (failed score) ignored


def test_training_records_sklearn_warnings_in_the_layer_report_not_the_terminal(toy, monkeypatch, small_grid):
    import warnings

    from hdeval.core.progress import Progress
    from hdeval.run.train import train

    task, data = toy
    monkeypatch.setattr(aggregate, "NN_MAX_ITER", 1)  # no MLP converges in one iteration
    messages: list[str] = []

    class Collect(Progress):
        def message(self, text):
            messages.append(text)

    with warnings.catch_warnings(record=True) as leaked:
        warnings.simplefilter("always")
        ev = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="nn",
                   cache_dir=str(toy[0].parent / "cache"), progress=Collect())
    assert not [w for w in leaked if "sklearn" in w.filename or "Convergence" in w.category.__name__]
    notes = ev.manifest_extra["layers"][0]["notes"]
    assert any(n.startswith("ConvergenceWarning: ") for n in notes), notes
    assert any("note: ConvergenceWarning" in m for m in messages)
    assert ev.manifest_extra["layers"][0]["params"]["alpha"] in SMALL_GRID["alpha"]
    assert "mean_subtree" in ev.metrics and any("own-subtree mean" in m for m in messages)


# --------------------------------------------------------------------------- fitting speed
def test_parallel_fitting_gives_exactly_the_serial_results(small_grid):
    """Folds, kinds, grid points and pruning folds run as parallel jobs; every fit is seeded,
    so the numbers must not depend on the number of workers."""
    from hdeval.learn.aggregate import select_cv
    from hdeval.methods.hdeval.prune import prune

    X, Y, docs = _data(n_docs=12, per_doc=3)
    serial = select_cv(_task_agg("lr"), X, Y, docs, n_jobs=1)
    parallel = select_cv(_task_agg("lr"), X, Y, docs, n_jobs=2)
    assert serial[0].get_params() == parallel[0].get_params()
    assert serial[1] == parallel[1] and serial[2] == parallel[2]
    np.testing.assert_array_equal(serial[3], parallel[3])
    # train's chooser: the simple candidates too, through the same batch of jobs
    from hdeval.learn.aggregate import SIMPLE_KINDS, cv_candidates

    one, two = (cv_candidates(_task_agg("lr"), X, Y, docs, SIMPLE_KINDS, n_jobs=n) for n in (1, 2))
    assert [(c.kind, c.spearman) for c in one] == [(c.kind, c.spearman) for c in two]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a.predictions, b.predictions)
    keys = [f"c{i}" for i in range(X.shape[1])]
    # a seeded tree shows the same as a seeded forest here, at a tenth of the fits (rf: 15 s)
    p1 = prune(_task_agg("dt"), X, Y, keys, keys[2:], docs, top_k=2, n_jobs=1)
    p2 = prune(_task_agg("dt"), X, Y, keys, keys[2:], docs, top_k=2, n_jobs=2)
    assert p1 == p2


def test_selection_returns_the_chosen_templates_cross_validated_predictions(small_grid):
    """Training reuses these instead of cross-validating the chosen kind a second time: they
    must be exactly what cross-validating it again would give."""

    X, Y, docs = _data(n_docs=12, per_doc=3)
    for kinds in (("lr", "dt", "rf", "nn"), ("dt", "rf")):
        best, scores, _, oof = select_cv(_task_agg("lr"), X, Y, docs, kinds)
        np.testing.assert_array_equal(oof, _manual_oof(best, X, Y, docs))
        assert scores[best.kind] == mean_spearman(Y, oof)
    chosen, scores, _, oof = select_cv(_task_agg("nn"), X, Y, docs, ("nn",))
    np.testing.assert_array_equal(oof, _manual_oof(chosen, X, Y, docs))
    assert scores["nn"] == mean_spearman(Y, oof)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_warnings_raised_in_worker_jobs_reach_the_caller_in_call_order(n_jobs):
    import warnings

    from hdeval.learn.aggregate import run_jobs

    calls = [(warnings.warn, (f"job {i}", UserWarning)) for i in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_jobs(calls, n_jobs) == [None, None, None]
    assert [str(w.message) for w in caught] == ["job 0", "job 1", "job 2"]
    assert all(w.category is UserWarning for w in caught)


# a whole three-layer training run twice (the second with worker processes): CI runs it; the
# default run checks the same property on select_cv and prune directly
# (test_parallel_fitting_gives_exactly_the_serial_results)
@pytest.mark.slow
def test_a_training_run_gives_the_same_metrics_with_one_or_two_workers(toy, monkeypatch, small_grid):
    from hdeval.run.train import train

    task, data = toy
    runs = []
    for n in (1, 2):
        monkeypatch.setenv("HDEVAL_JOBS", str(n))
        ev = train(task=str(task), data=str(data), llm="fake", layers=3, aggregator="auto",
                   children=2, top_k=2, cache_dir=str(toy[0].parent / "cache"))
        runs.append((ev.metrics, ev.manifest_extra["layers"]))
    for metrics, _ in runs:
        metrics.pop("usage")  # the second run answers from the cache
    assert json.dumps(runs[0], sort_keys=True) == json.dumps(runs[1], sort_keys=True)


def test_hdeval_jobs_sets_the_number_of_workers_and_bad_values_fail_clearly(monkeypatch):
    monkeypatch.setenv("HDEVAL_JOBS", "3")
    assert aggregate.default_jobs() == 3
    monkeypatch.setenv("HDEVAL_JOBS", "auto")
    assert 1 <= aggregate.default_jobs() <= aggregate.MAX_JOBS
    monkeypatch.delenv("HDEVAL_JOBS")
    assert aggregate.default_jobs() == 1  # opt-in: no worker processes unless asked
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("HDEVAL_JOBS", bad)
        with pytest.raises(ConfigError, match="HDEVAL_JOBS must be a whole number >= 1"):
            aggregate.default_jobs()


def test_a_bad_hdeval_jobs_stops_training_before_any_llm_call(toy, monkeypatch, fake_calls):
    from hdeval.run.train import train

    task, data = toy
    monkeypatch.setenv("HDEVAL_JOBS", "many")
    with pytest.raises(ConfigError, match="HDEVAL_JOBS"):
        train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr",
              cache_dir=str(toy[0].parent / "cache"))
    assert fake_calls == []


def test_overlapping_one_thread_users_leave_the_threads_as_they_found_them() -> None:
    """The labelling app fits in one thread while it picks in another: neither may lift the BLAS
    limit (the process's) under the other, the last one out restores it, and OpenMP's limit (each
    thread's own) is set and restored in each thread."""
    import threading

    from threadpoolctl import threadpool_info

    from hdeval.learn.aggregate import one_thread

    def threads(api: str) -> list[int]:
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == api]

    before, omp_before = threads("blas"), threads("openmp")
    inside, released = threading.Event(), threading.Event()
    seen: dict[str, list[int]] = {}

    def other() -> None:
        seen["openmp, the second user before"] = threads("openmp")
        with one_thread():
            seen["openmp, the second user"] = threads("openmp")
            inside.set()
            released.wait(10)
        seen["openmp, the second user after"] = threads("openmp")

    t = threading.Thread(target=other)
    with one_thread():
        t.start()
        assert inside.wait(10)
    seen["blas, the first user gone"] = threads("blas")
    released.set()
    t.join(10)
    assert seen["blas, the first user gone"] == [1] * len(before)
    assert seen["openmp, the second user"] == [1] * len(omp_before)
    assert threads("blas") == before and threads("openmp") == omp_before
    assert seen["openmp, the second user after"] == seen["openmp, the second user before"]
