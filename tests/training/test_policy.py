"""The pick and the safe fallback."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.training.model import SCHEDULE_INDEX, SERIAL_INDEX
from ficco.training.predict.policy import DecisionPolicy, ModePolicy, apply_policy


def test_min_gain_out_of_range_names_the_value():
    with pytest.raises(ValueError, match=r"min_gain must be None or in \[0, 1\); got 1.5"):
        DecisionPolicy(min_gain=1.5)


def test_pick_is_the_lowest_cost_and_falls_back_within_the_noise():
    shard = SCHEDULE_INDEX["shard/dma"]
    cost = np.full((2, 30), np.inf)
    cost[:, SERIAL_INDEX], cost[:, shard] = 0.0, -1.0
    log_ratio = np.zeros((2, 30))
    log_ratio[:, shard] = [np.log(1 / 1.01), np.log(1 / 1.5)]  # predicted gains 1% and 50%
    modes = ["eager", "eager"]
    policy = ModePolicy.uniform(DecisionPolicy(min_gain=0.02))
    final, raw, fallback, speedup = apply_policy(cost, log_ratio, policy, modes)
    assert list(raw) == [shard, shard]
    assert list(final) == [SERIAL_INDEX, shard] and list(fallback) == [True, False]
    np.testing.assert_allclose(speedup, [1.01, 1.5])
    final, _, fallback, _ = apply_policy(cost, log_ratio, ModePolicy(), modes)
    assert list(final) == [shard, shard] and not fallback.any()


def test_each_mode_falls_back_under_its_own_threshold():
    shard = SCHEDULE_INDEX["shard/dma"]
    cost = np.full((4, 30), np.inf)
    cost[:, SERIAL_INDEX], cost[:, shard] = 0.0, -1.0
    log_ratio = np.zeros((4, 30))
    log_ratio[:, shard] = np.log(1 / 1.01)  # a predicted 1% gain everywhere
    policy = ModePolicy(eager=DecisionPolicy(min_gain=0.02), graph=DecisionPolicy())
    final, _, fallback, _ = apply_policy(cost, log_ratio, policy, ["eager", "graph", "graph", "eager"])
    assert list(fallback) == [True, False, False, True]
    assert list(final) == [SERIAL_INDEX, shard, shard, SERIAL_INDEX]
    with pytest.raises(ValueError, match="mode must be one of \\['eager', 'graph'\\]; got 'cuda'"):
        policy.of("cuda")


def test_card_policy_round_trips_and_old_cards_mean_both_modes():
    policy = ModePolicy(eager=DecisionPolicy(min_gain=0.03), graph=DecisionPolicy())
    assert policy.to_dict() == {"eager": {"min_gain": 0.03}, "graph": {"min_gain": None}}
    assert ModePolicy.from_dict(policy.to_dict()) == policy
    assert ModePolicy.from_dict({"min_gain": 0.01}) == ModePolicy.uniform(DecisionPolicy(min_gain=0.01))
    with pytest.raises(ValueError, match=r"ModePolicy\.graph must be a DecisionPolicy; got float"):
        ModePolicy(graph=0.02)


def test_reason_quotes_gain_and_floor():
    assert "+1.0%" in DecisionPolicy(min_gain=0.02).reason(1.01)
