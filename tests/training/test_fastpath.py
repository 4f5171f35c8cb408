"""The fast path gives the reference path's outputs and picks, on a whole dataset."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.features import FEATURE_NAMES
from ficco.training.fastpath import SpecialisedForest
from ficco.training.fit import training_pairs
from ficco.training.model import DESCRIPTORS, PairModel, pair_costs
from ficco.training.policy import DecisionPolicy
from ficco.training.predictor import Predictor


@pytest.mark.parametrize("objective", ["ratio", "rank"])
def test_specialised_margins_match_xgboost(table, objective):
    Z, y, qid = training_pairs(table)
    model = PairModel(objective=objective, n_estimators=40, max_depth=6).fit(Z, y, qid=qid)
    modes = {"eager": np.array([0.0]), "graph": np.array([1.0])}
    forest = SpecialisedForest.compile([model.booster_] * 2, DESCRIPTORS, modes, len(FEATURE_NAMES))
    for mode in modes:
        on = table.modes == mode
        margins = forest.predict(table.X[on].astype(np.float32), mode)
        assert margins.shape == (int(on.sum()), len(DESCRIPTORS), 2)
        want = pair_costs(model, table.X[on], table.modes[on])
        sign = 1.0 if objective == "ratio" else -1.0
        valid = np.isfinite(want)
        np.testing.assert_allclose(sign * margins[:, :, 1][valid], want[valid], rtol=0, atol=1e-5)
        assert len(forest.used[mode]) < 40 * len(DESCRIPTORS)  # specialisation shares trees


def test_fast_and_reference_paths_pick_the_same_on_the_whole_dataset(trained, table):
    predictor = Predictor(scorer=trained.scorer, ratio=trained.ratio, policy=DecisionPolicy(min_gain=0.02),
                          card={}, version="v", hardware_id="h200x2")  # fmt: skip
    fast = predictor.decide(table.X, table.modes, fast=True)
    reference = predictor.decide(table.X, table.modes, fast=False)
    np.testing.assert_array_equal(fast.final, reference.final)
    np.testing.assert_array_equal(fast.raw, reference.raw)
    np.testing.assert_allclose(fast.speedups, reference.speedups, rtol=1e-5)
