"""The pair model: the scikit-learn estimator contract, pairs, validity, UBJ round trip."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from ficco.features import Scenario, candidates, feature_matrix, get_hardware
from ficco.features.launch_cost import host_over_gpu
from ficco.training.fit import training_pairs
from ficco.training.model import (
    OBJECTIVES,
    PAIR_FEATURE_NAMES,
    RELEVANCE_STEP,
    SCHEDULES,
    FeatureSchemaError,
    PairModel,
    pair_matrix,
    relevance_grades,
    valid_mask,
)
from ficco.training.predict.pairs import DESCRIPTORS


@pytest.fixture(scope="module")
def pairs(table):
    return training_pairs(table)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_fit_returns_self_and_learns_the_order(pairs, objective):
    Z, y, qid = pairs
    model = PairModel(objective=objective, n_estimators=30, max_depth=3)
    assert model.fit(Z, y, qid=qid) is model
    cost = model.cost(Z)
    # within a query, the predicted order agrees with the measured one far more often than chance
    agree = [np.corrcoef(cost[qid == q], y[qid == q])[0, 1] for q in np.unique(qid)[:50]]
    assert np.nanmean(agree) > 0.5


def test_predict_before_fit_raises_not_fitted(pairs):
    with pytest.raises(NotFittedError, match="PairModel"):
        PairModel().predict(pairs[0])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"objective": "classify"}, r"'objective' parameter of PairModel must be a str among"),
        ({"max_depth": 0}, r"'max_depth' parameter of PairModel must be an int in the range \[1, 16\]"),
        ({"learning_rate": 0.0}, r"'learning_rate' parameter of PairModel must be a float in the range"),
    ],
)
def test_fit_validates_parameters_the_sklearn_way(pairs, params, message):
    Z, y, qid = pairs
    with pytest.raises(ValueError, match=message):
        PairModel(**params).fit(Z, y, qid=qid)


@pytest.mark.parametrize("objective", ["rank", "ndcg"])
def test_rankers_need_sorted_query_ids(pairs, objective):
    Z, y, _ = pairs
    with pytest.raises(ValueError, match=f"objective='{objective}' needs qid"):
        PairModel(objective=objective).fit(Z, y)


def test_relevance_grades_one_per_percent_behind_the_fastest_of_each_query():
    y = np.log([1.0, 1.005, 1.011, 1.5, 0.8, 0.8 * 1.025])  # two queries; log(t / t_serial)
    qid = np.array([0, 0, 0, 0, 3, 3])
    grades = relevance_grades(y, qid)
    assert grades.tolist() == [31, 31, 30, 0, 31, 29]  # within 1%: a tie; 1.5x behind: the floor


def test_ndcg_does_not_learn_the_order_within_a_grade(pairs):
    # reorder the times inside every 1% grade of every query (what noise does): the ndcg model is the same
    # model, while the pairwise ranker, which learns every measured order, changes
    Z, y, qid = pairs
    _, query = np.unique(qid, return_inverse=True)
    fastest = np.full(query.max() + 1, np.inf)
    np.minimum.at(fastest, query, y)
    step = np.floor((y - fastest[query]) / RELEVANCE_STEP + 1e-9)
    shuffled = fastest[query] + RELEVANCE_STEP * (step + np.random.default_rng(0).uniform(0.05, 0.95, len(y)))
    shuffled[y == fastest[query]] = y[y == fastest[query]]  # each query's fastest stays its fastest
    np.testing.assert_array_equal(relevance_grades(shuffled, qid), relevance_grades(y, qid))
    for objective, same in (("ndcg", True), ("rank", False)):
        a, b = (
            PairModel(objective=objective, n_estimators=20, max_depth=3).fit(Z, t, qid=qid)
            for t in (y, shuffled)
        )
        assert np.array_equal(a.predict(Z), b.predict(Z)) is same, objective


def test_clone_and_get_params_round_trip():
    model = PairModel(objective="rank", max_depth=3)
    assert clone(model).get_params() == model.get_params()


def test_save_and_load_round_trip(tmp_path, pairs):
    Z, y, qid = pairs
    model = PairModel(objective="rank", n_estimators=10).fit(Z, y, qid=qid)
    model.save_model(tmp_path / "m.ubj")
    loaded = PairModel.load_model(tmp_path / "m.ubj")
    assert loaded.get_params() == model.get_params()
    np.testing.assert_array_equal(loaded.predict(Z), model.predict(Z))


def test_load_refuses_another_feature_schema(tmp_path, pairs):
    Z, y, _ = pairs
    model = PairModel(n_estimators=5).fit(Z, y)
    model.booster_.set_attr(ficco_feature_schema="fv0")
    model.save_model(tmp_path / "m.ubj")
    with pytest.raises(FeatureSchemaError, match="'fv0'"):
        PairModel.load_model(tmp_path / "m.ubj")


def test_pair_matrix_pairs_each_row_with_its_valid_schedules():
    hw = get_hardware("h200x2")
    scenarios = [Scenario(m=m, hardware=hw) for m in (6, 1024, 65536)]
    X = feature_matrix(scenarios)
    Z, (rows, cols) = pair_matrix(X, ["eager", "graph", "graph"])
    assert Z.shape == (int(valid_mask(X).sum()), len(PAIR_FEATURE_NAMES)) and Z.dtype == np.float32
    graph = Z[:, PAIR_FEATURE_NAMES.index("mode_graph")]
    assert np.all(graph[rows == 0] == 0) and np.all(graph[rows > 0] == 1)
    host = Z[:, PAIR_FEATURE_NAMES.index("eager_host_over_gpu")]
    want = host_over_gpu(X)[rows, cols].astype(np.float32)
    assert np.array_equal(host[rows == 0], want[rows == 0]) and np.all(host[rows == 0] > 0)
    assert np.all(host[rows > 0] == 0)  # graph mode: no host time
    with pytest.raises(ValueError, match="mode must be one of \\['eager', 'graph'\\]; got 'cuda'"):
        pair_matrix(X, ["eager", "cuda", "graph"])


def test_pair_matrix_columns_are_the_scenario_the_schedule_the_mode_the_version_and_the_host_time():
    hw = get_hardware("h200x4")
    scenarios = [Scenario(op=op, m=m, n=1536, k=4096, world_size=4, hardware=hw)
                 for op in ("ag_gemm", "gemm_rs") for m in (64, 4096, 262144)]  # fmt: skip
    X = feature_matrix(scenarios)
    modes = ["eager", "graph"] * 3
    versions, factors = np.array([1.0, 2.0, 3.0] * 2), np.array([0.5, 1.0, 2.24] * 2)
    Z, (rows, cols) = pair_matrix(X, modes, host_factor=factors, label_version=versions)
    graph = np.array(modes)[rows] == "graph"
    host = np.where(graph, 0.0, host_over_gpu(X, factors)[rows, cols])
    want = np.hstack([X[rows], DESCRIPTORS[cols], graph[:, None], versions[rows, None], host[:, None]])
    assert np.array_equal(Z, want.astype(np.float32))
    fv3 = pair_matrix(X, modes, schema="fv3", host_factor=factors)[0]
    assert np.array_equal(fv3, np.delete(Z, PAIR_FEATURE_NAMES.index("label_version"), axis=1))


@pytest.mark.parametrize("m", [2, 6, 8, 12, 16, 24, 1000, 1024, 4096])
def test_valid_mask_matches_candidates(m):
    s = Scenario(m=m, hardware=get_hardware("h200x2"))
    expected = {str(c) for c in candidates(s)}
    got = {SCHEDULES[i] for i in np.flatnonzero(valid_mask(feature_matrix([s]))[0])}
    assert got == expected
