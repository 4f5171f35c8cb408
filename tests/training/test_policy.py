"""The pick: the guard against schedules predicted slower than serial, the /hp tie rule, the fallback."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.features.launch_cost import TWIN_OF
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES, SERIAL_INDEX
from ficco.training.predict.policy import (
    DEFAULT_NOISE_BAND,
    DecisionPolicy,
    ModePolicy,
    apply_policy,
    card_noise_band,
)

S = len(SCHEDULES)
HP = np.array([s.endswith("/hp") for s in SCHEDULES])


def _rows(n: int, picks: dict[str, float], costs: dict[str, float] | None = None):
    """Costs and log ratios of ``n`` equal rows: serial/sm, and each schedule of ``picks`` at its predicted
    speedup; costs: ``costs`` (default: in the order given, the first lowest)."""
    cost = np.full((n, S), np.inf)
    log_ratio = np.full((n, S), np.nan)
    cost[:, SERIAL_INDEX], log_ratio[:, SERIAL_INDEX] = 0.0, 0.0
    for i, (name, speedup) in enumerate(picks.items()):
        j = SCHEDULE_INDEX[name]
        cost[:, j] = (costs or {}).get(name, -10.0 + i)
        log_ratio[:, j] = -np.log(speedup)
    return cost, log_ratio


def test_policy_fields_out_of_range_name_the_value():
    with pytest.raises(ValueError, match=r"min_gain must be None or in \[0, 1\); got 1.5"):
        DecisionPolicy(min_gain=1.5)
    with pytest.raises(ValueError, match=r"noise_band must be in \[0, 1\); got -0.1"):
        DecisionPolicy(noise_band=-0.1)


def test_pick_is_the_lowest_cost_and_falls_back_within_the_noise():
    shard = SCHEDULE_INDEX["shard/dma"]
    cost = np.full((2, S), np.inf)
    cost[:, SERIAL_INDEX], cost[:, shard] = 0.0, -1.0
    log_ratio = np.zeros((2, S))
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
    cost = np.full((4, S), np.inf)
    cost[:, SERIAL_INDEX], cost[:, shard] = 0.0, -1.0
    log_ratio = np.zeros((4, S))
    log_ratio[:, shard] = np.log(1 / 1.01)  # a predicted 1% gain everywhere
    policy = ModePolicy(eager=DecisionPolicy(min_gain=0.02), graph=DecisionPolicy())
    final, _, fallback, _ = apply_policy(cost, log_ratio, policy, ["eager", "graph", "graph", "eager"])
    assert list(fallback) == [True, False, False, True]
    assert list(final) == [SERIAL_INDEX, shard, shard, SERIAL_INDEX]
    with pytest.raises(ValueError, match="mode must be one of \\['eager', 'graph'\\]; got 'cuda'"):
        policy.of("cuda")


def test_a_pick_predicted_slower_than_serial_beyond_the_band_gives_way_to_the_next_in_order():
    """The issue's case: the ranker's first choice predicted 21% slower than serial; the next schedule of
    its order that is not slower beyond the band is picked (serial/sm when none is: a fallback)."""
    policy = ModePolicy.uniform(DecisionPolicy(noise_band=0.01))
    cost, log_ratio = _rows(1, {"shard/dma/hp": 0.824, "finer/dma/s2/chunk": 0.995, "shard/sm": 1.2})
    final, raw, fallback, _ = apply_policy(cost, log_ratio, policy, ["graph"])
    assert SCHEDULES[raw[0]] == "shard/dma/hp" and SCHEDULES[final[0]] == "finer/dma/s2/chunk"
    assert not fallback[0]  # within the band of serial: a tie, kept in the ranker's order
    cost, log_ratio = _rows(1, {"shard/dma/hp": 0.824, "finer/dma/s2/chunk": 0.985})
    final, _, fallback, _ = apply_policy(cost, log_ratio, policy, ["graph"])
    assert final[0] == SERIAL_INDEX and fallback[0]
    wide = ModePolicy.uniform(DecisionPolicy(noise_band=0.25))  # 0.824 is within a 25% band of serial
    cost, log_ratio = _rows(1, {"shard/dma/hp": 0.824, "shard/dma": 0.824})
    assert SCHEDULES[apply_policy(cost, log_ratio, wide, ["graph"]).final[0]] == "shard/dma"  # the tie rule


def test_a_hp_pick_within_the_band_of_its_twin_gives_way_to_it():
    policy = ModePolicy.uniform(DecisionPolicy(noise_band=0.01))
    for hp, plain, kept in [(1.3, 1.3, "shard/dma"), (1.3, 1.29, "shard/dma"), (1.3, 1.2, "shard/dma/hp")]:
        cost, log_ratio = _rows(1, {"shard/dma/hp": hp, "shard/dma": plain})
        assert SCHEDULES[apply_policy(cost, log_ratio, policy, ["eager"]).final[0]] == kept, (hp, plain)
    # the twin must pass the guard itself: a /hp pick at the edge keeps its priority over a slower twin
    cost, log_ratio = _rows(1, {"shard/dma/hp": 1 / 1.01, "shard/dma": 1 / 1.015})
    assert SCHEDULES[apply_policy(cost, log_ratio, policy, ["eager"]).final[0]] == "shard/dma/hp"


def test_no_pick_is_predicted_slower_than_serial_beyond_the_band_on_random_rows():
    """Any costs and predicted ratios: every final pick's predicted speedup is at least 1 / (1 + band) of its
    mode, and never a /hp schedule whose valid twin is predicted within the band of it."""
    rng = np.random.default_rng(0)
    n = 20_000
    cost = rng.normal(size=(n, S))
    log_ratio = rng.normal(scale=0.2, size=(n, S))
    invalid = rng.random((n, S)) < 0.3
    invalid[:, SERIAL_INDEX] = False
    invalid |= invalid[:, TWIN_OF]  # a schedule and its twin run the same scenarios
    cost[invalid], log_ratio[invalid] = np.inf, np.nan
    modes = np.where(rng.random(n) < 0.5, "eager", "graph")
    policy = ModePolicy(eager=DecisionPolicy(noise_band=0.015), graph=DecisionPolicy(noise_band=0.009))
    final = apply_policy(cost, log_ratio, policy, modes).final
    rows = np.arange(n)
    speedups = np.exp(-log_ratio)
    speedups[:, SERIAL_INDEX] = 1.0
    band = np.where(modes == "eager", 0.015, 0.009)
    assert np.isfinite(cost[rows, final]).all()
    assert (speedups[rows, final] >= 1 / (1 + band)).all()
    twin = TWIN_OF[final]
    tied = HP[final] & (speedups[rows, twin] * (1 + band) >= speedups[rows, final])
    assert not (tied & (speedups[rows, twin] >= 1 / (1 + band))).any()
    unguarded = apply_policy(cost, log_ratio, ModePolicy.uniform(DecisionPolicy(noise_band=0.99)), modes)
    assert (speedups[rows, unguarded.final] < 1 / 1.015).sum() > n // 10  # the guard has work to do


def test_card_policy_round_trips_and_old_cards_get_their_band_from_the_noise_ceiling():
    policy = ModePolicy(eager=DecisionPolicy(min_gain=0.03, noise_band=0.015), graph=DecisionPolicy())
    assert policy.to_dict() == {
        "eager": {"min_gain": 0.03, "noise_band": 0.015},
        "graph": {"min_gain": None, "noise_band": DEFAULT_NOISE_BAND},
    }
    assert ModePolicy.from_dict(policy.to_dict()) == policy
    assert ModePolicy.from_dict({"min_gain": 0.01}) == ModePolicy.uniform(DecisionPolicy(min_gain=0.01))
    with pytest.raises(ValueError, match=r"ModePolicy\.graph must be a DecisionPolicy; got float"):
        ModePolicy(graph=0.02)
    ceiling = {"family_holdout": {"ceiling": {"geomean_regret": 0.0152}}}
    old = {"policy": {"eager": {"min_gain": None}, "graph": {"min_gain": 0.02}},
           "metrics": {"modes": {"eager": ceiling}}}  # fmt: skip
    assert card_noise_band(old, "eager") == 0.0152
    assert card_noise_band(old, "graph") == DEFAULT_NOISE_BAND  # no re-measure of graph rows
    loaded = ModePolicy.from_card(old)
    assert loaded == ModePolicy(eager=DecisionPolicy(noise_band=0.0152), graph=DecisionPolicy(min_gain=0.02))
    assert ModePolicy.from_card({**old, "policy": policy.to_dict()}) == policy  # the recorded band wins


def test_reasons_quote_the_numbers():
    assert "+1.0%" in DecisionPolicy(min_gain=0.02).reason(1.01)
    text = DecisionPolicy(noise_band=0.0094).guard_reason("shard/dma/hp", 0.824)
    assert "shard/dma/hp is predicted 21.36% slower than serial/sm" in text and "0.94%" in text
