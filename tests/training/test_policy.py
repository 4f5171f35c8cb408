"""The decision policy: the speedup-weighted pick and the safe fallback to serial/sm."""

from __future__ import annotations

import numpy as np
import pytest
from ficco.training.policy import DecisionPolicy


def test_mask_falls_back_when_unsure_or_gain_within_noise():
    policy = DecisionPolicy(min_probability=0.5, min_gain=0.02)
    p = np.array([0.4, 0.9, 0.9, 0.3])
    speedup = np.array([1.5, 1.01, 1.5, 1.0])
    serial = np.array([False, False, False, True])
    np.testing.assert_array_equal(policy.mask(p, speedup, serial), [True, True, False, False])


def test_default_policy_never_falls_back():
    assert not DecisionPolicy().mask(np.array([0.01]), np.array([0.5]), np.array([False])).any()


def test_reason_names_the_rule():
    policy = DecisionPolicy(min_probability=0.5, min_gain=0.02)
    assert "unsure" in policy.reason(0.4, 1.5)
    assert "+1.0%" in policy.reason(0.9, 1.01) and "2%" in policy.reason(0.9, 1.01)


def test_thresholds_are_validated():
    with pytest.raises(ValueError, match=r"min_probability must be in \[0, 1\); got 1.5"):
        DecisionPolicy(min_probability=1.5)
    with pytest.raises(ValueError, match="min_gain must be None or in"):
        DecisionPolicy(min_gain=-0.1)
    with pytest.raises(ValueError, match=r"speedup_weight must be in \[0, 1000\]; got -1"):
        DecisionPolicy(speedup_weight=-1)


def test_pick_weighs_probabilities_by_predicted_speedup():
    proba = np.array([[0.5, 0.4, 0.0], [0.2, 0.8, 0.0], [0.3, 0.3, 0.4]])
    speedup = np.array([[1.0, 1.2, 9.0], [1.0, 1.0, 9.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(DecisionPolicy().pick(proba, speedup), [0, 1, 2])
    # 0.4 * 1.2**2 = 0.576 > 0.5; equal speedups change nothing; an invalid schedule (p = 0) is never picked
    np.testing.assert_array_equal(DecisionPolicy(speedup_weight=2.0).pick(proba, speedup), [1, 1, 2])
