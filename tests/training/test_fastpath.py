"""The fast path gives the reference path's outputs (bitwise) and picks, on a whole dataset."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.features import FEATURE_NAMES
from ficco.features.label_source import LABEL_VERSION
from ficco.features.launch_cost import TWIN_OF, host_over_gpu
from ficco.training.fit import training_pairs
from ficco.training.model import DESCRIPTORS, OBJECTIVES, PAIR_FEATURE_NAMES, PairModel, pair_costs
from ficco.training.predict.fastpath import SpecialisedForest
from ficco.training.predict.policy import DecisionPolicy, ModePolicy
from ficco.training.predict.predictor import Predictor
from tests.training.test_fit import split_columns


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_specialised_margins_match_xgboost(table, objective):
    Z, y, qid = training_pairs(table)
    model = PairModel(objective=objective, n_estimators=40, max_depth=6).fit(Z, y, qid=qid)
    host = PAIR_FEATURE_NAMES.index("eager_host_over_gpu")
    assert host in split_columns(model)  # the trees use the linked column
    version = float(LABEL_VERSION)  # fv4: mode_graph, label_version, then the (linked) host column
    modes = {"eager": np.array([0.0, version]), "graph": np.array([1.0, version, 0.0])}
    columns, column_of = np.unique(TWIN_OF, return_inverse=True)  # /hp schedules read their twin's column
    forest = SpecialisedForest.compile(
        [model.booster_] * 2, DESCRIPTORS, modes, len(FEATURE_NAMES), linked={"eager": (host, column_of)}
    )
    for mode in modes:
        on = table.modes == mode
        rows = table.X[on]
        if mode == "eager":  # the linked column's values, one per twin
            rows = np.hstack([rows, host_over_gpu(rows)[:, columns]])
        margins = forest.predict(rows.astype(np.float32), mode)
        assert margins.shape == (int(on.sum()), len(DESCRIPTORS), 2)
        want = pair_costs(model, table.X[on], table.modes[on])
        sign = 1.0 if objective == "ratio" else -1.0
        valid = np.isfinite(want)
        np.testing.assert_array_equal(sign * margins[:, :, 1][valid], want[valid])  # XGBoost's float32 sums
        assert len(forest.trees[mode].roots) < 40 * len(DESCRIPTORS)  # specialisation shares trees


def test_fast_and_reference_paths_pick_the_same_on_the_whole_dataset(trained, table):
    policy = ModePolicy.uniform(DecisionPolicy(min_gain=0.02))
    predictor = Predictor(scorer=trained.scorer, ratio=trained.ratio, policy=policy,
                          card={}, version="v", hardware_id="h200x2")  # fmt: skip
    fast = predictor.decide(table.X, table.modes, fast=True)
    reference = predictor.decide(table.X, table.modes, fast=False)
    np.testing.assert_array_equal(fast.final, reference.final)
    np.testing.assert_array_equal(fast.raw, reference.raw)
    np.testing.assert_array_equal(fast.speedups, reference.speedups)  # a batch's path never moves an answer


def test_fv2_model_fast_and_reference_paths_pick_the_same(table):
    from ficco.training.predict.registry import load_predictor
    from tests.training.test_registry import SHIPPED, shipped_versions

    predictor = load_predictor(SHIPPED, "h200x2", shipped_versions("fv2")[-1])
    fast = predictor.decide(table.X, table.modes, fast=True)
    reference = predictor.decide(table.X, table.modes, fast=False)
    np.testing.assert_array_equal(fast.final, reference.final)
    np.testing.assert_array_equal(fast.speedups, reference.speedups)


def test_one_scenario_at_a_time_answers_as_the_batch(trained, table):
    predictor = Predictor(scorer=trained.scorer, ratio=trained.ratio, policy=trained.choice.policy,
                          card={}, version="v", hardware_id="h200x2")  # fmt: skip
    batch = predictor.decide(table.X, table.modes, fast=True)
    for i in range(0, len(table), 7):  # the one-row walk and host column of a single decision
        one = predictor.decide(table.X[i : i + 1], table.modes[i : i + 1], fast=True)
        assert one.final[0] == batch.final[i]
        np.testing.assert_array_equal(one.speedups[0], batch.speedups[i])


def _walk(tree, x):
    """One tree on one row, the plain way."""
    while tree[0] != "leaf":
        tree = tree[3] if np.float32(x[tree[0]]) >= np.float32(tree[1]) else tree[2]
    return tree[1]


def test_flat_trees_store_a_recurring_child_pair_once_and_walk_like_the_trees():
    from ficco.training.predict.fastpath import FlatTrees

    shared = (1, 0.5, ("leaf", 2.0), ("leaf", 3.0))
    trees = [(0, 0.5, ("leaf", 1.0), shared), (2, -1.0, ("leaf", 4.0), shared), shared, ("leaf", 5.0)]
    flat = FlatTrees.from_trees(trees)
    assert len(flat.feature) == 4 + 2 + 2 + 2  # roots, two pairs with a leaf, the shared pair once
    assert flat.depth == 2
    X = np.random.default_rng(0).uniform(-2, 2, size=(64, 3)).astype(np.float32)
    want = np.array([[_walk(t, x) for t in trees] for x in X])
    np.testing.assert_array_equal(flat.leaves(X), want)
    np.testing.assert_array_equal(flat.leaves(X[:1]), want[:1])  # the one-row walk


def test_both_walks_reach_the_same_leaves_and_leaves_takes_the_cheaper(trained, table):
    from ficco.training.predict.fastpath import ROW_WALK_NODES_PER_STEP, FlatTrees, booster_trees, prune

    trees, _ = booster_trees(trained.scorer.booster_)
    generic = FlatTrees.from_trees([prune(t, {}) for t in trees])  # every split kept: many nodes a tree
    rows = np.random.default_rng(0).permutation(len(table))[:50]
    Z = training_pairs(table)[0][rows].astype(np.float32)
    np.testing.assert_array_equal(generic._row_by_row(Z), generic._cursors(Z))
    assert len(generic.feature) >= ROW_WALK_NODES_PER_STEP * len(generic.roots) * generic.depth
    np.testing.assert_array_equal(generic.leaves(Z), generic._cursors(Z))
