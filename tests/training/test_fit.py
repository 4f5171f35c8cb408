"""Training rows: cost weights and near-best soft labels."""

from __future__ import annotations

import numpy as np
import pytest
from ficco.training.fit import TrainConfig, classifier_rows, cost_weights


def test_cost_weights_have_mean_one_and_a_floor():
    times = np.array([[1.0, 1.0, np.nan], [1.0, 2.0, 4.0], [1.0, 1.1, np.nan]])
    w = cost_weights(times)
    assert w[0] == pytest.approx(0.1)  # every other schedule ties: floored
    assert w[1] > w[2] > w[0]
    raw = np.array([0.0, (np.log(2) + np.log(4)) / 2, np.log(1.1)])
    np.testing.assert_allclose(w[1:], raw[1:] / raw.mean())


def test_classifier_rows_hard_labels_one_row_per_scenario(table):
    X, y, w = classifier_rows(table, TrainConfig())
    assert len(X) == len(table) and list(y) == list(table.labels)
    np.testing.assert_array_equal(w, 1.0)


def test_classifier_rows_near_best_share_weight(table):
    X, y, w = classifier_rows(table, TrainConfig(near_best=0.05, weighting="cost"))
    assert len(X) > len(table)
    np.testing.assert_allclose(w.sum(), cost_weights(table.times_ms).sum())
    assert set(table.labels) <= set(y)


def test_train_config_validates():
    with pytest.raises(ValueError, match=r"TrainConfig\.weighting must be one of"):
        TrainConfig(weighting="regret")
    with pytest.raises(ValueError, match=r"TrainConfig.near_best must be a number in \[0, 0.1\]; got 0.5"):
        TrainConfig(near_best=0.5)
