"""The aggregator as a scikit-learn estimator: the contract scikit-learn's tools rely on
(clone, get/set_params, cross_val_predict, searches over ``kind``) and hdeval's own layout
(aspects with ranges, one model per range group)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

from hdeval.aggregate import (
    Aggregator,
    cross_val_predictions,
    cv_folds,
    select_kind,
)
from hdeval.errors import ConfigError
from hdeval.metrics import mean_spearman

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


def test_select_kind_picks_the_best_cross_validated_kind():
    X, Y, docs = _data()
    kinds = ("lr", "dt", "rf")
    best, scores = select_kind(_task_agg("lr"), X, Y, docs, kinds)
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
