"""The fast path gives the reference path's outputs and picks, on a whole dataset."""

from __future__ import annotations

import numpy as np
import pytest
from ficco.training.fastpath import CompiledForest
from ficco.training.fit import training_pairs
from ficco.training.model import PairModel
from ficco.training.policy import DecisionPolicy
from ficco.training.predictor import Predictor


@pytest.mark.parametrize("objective", ["ratio", "rank"])
def test_margins_match_xgboost(table, objective):
    Z, y, qid = training_pairs(table)
    model = PairModel(objective=objective, n_estimators=40, max_depth=6).fit(Z, y, qid=qid)
    forest = CompiledForest.from_boosters([model.booster_, model.booster_])
    margins = forest.predict(Z)
    assert margins.shape == (len(Z), 2)
    np.testing.assert_allclose(margins[:, 0], model.predict(Z), rtol=0, atol=1e-5)
    assert forest.predict(Z[:0]).shape == (0, 2)


def test_fast_and_reference_paths_pick_the_same_on_the_whole_dataset(trained, table):
    predictor = Predictor(scorer=trained.scorer, ratio=trained.ratio, policy=DecisionPolicy(min_gain=0.02),
                          card={}, version="v", hardware_id="h200x2")  # fmt: skip
    fast = predictor.decide(table.X, table.modes, fast=True)
    reference = predictor.decide(table.X, table.modes, fast=False)
    np.testing.assert_array_equal(fast.final, reference.final)
    np.testing.assert_array_equal(fast.raw, reference.raw)
    np.testing.assert_allclose(fast.speedups, reference.speedups, rtol=1e-5)
