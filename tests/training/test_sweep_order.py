"""The order a new machine's sweep measures in: what the prior does not know first, spread over the plan."""

from __future__ import annotations

import numpy as np

from ficco.training.sweep_order import FLOOR, measurement_order, standardised


def test_the_order_starts_where_the_sources_disagree_most_and_spreads():
    X = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 0.0], [5.0, 5.0], [0.0, 10.0]])
    value = np.array([1.0, 1.0, 0.0, 0.0, 0.0])
    order = measurement_order(X, value)
    assert sorted(order.tolist()) == list(range(len(X)))
    assert order[0] == 0  # the most uncertain (ties: the lower index)
    assert order[1] != 1  # its near twin is not next: the far corners teach more
    np.testing.assert_array_equal(measurement_order(X, value), order)  # deterministic


def test_uncertainty_outweighs_distance_by_the_floor():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # at equal distances from the first pick (0), the uncertain one (1) before the certain one (2)
    assert measurement_order(X, np.array([2.0, 1.0, 0.0])).tolist() == [0, 1, 2]
    # a certain scenario far enough away still comes before an uncertain twin
    far = np.array([[0.0], [0.01], [100.0]])
    assert measurement_order(far, np.array([1.0, 1.0, 0.0])).tolist()[:2] == [0, 2]
    assert FLOOR > 0


def test_duplicates_and_no_uncertainty():
    X = np.zeros((4, 3))
    assert sorted(measurement_order(X, np.array([0.0, 2.0, 1.0, 0.0])).tolist()) == [0, 1, 2, 3]
    assert measurement_order(X, np.array([0.0, 2.0, 1.0, 0.0]))[0] == 1
    assert len(measurement_order(np.zeros((0, 3)), np.zeros(0))) == 0
    Z = standardised(np.array([[1.0, 5.0], [3.0, 5.0]]))
    assert Z.shape == (2, 1) and np.allclose(Z[:, 0], [-1.0, 1.0])
