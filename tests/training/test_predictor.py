"""Recommendations: mode, predicted speedups, fallback, errors."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.features import Scenario, candidates, get_hardware
from ficco.training.policy import DecisionPolicy, ModePolicy
from ficco.training.predictor import Predictor


def _predictor(trained, policy=None):
    return Predictor(scorer=trained.scorer, ratio=trained.ratio, policy=policy or trained.choice.policy,
                     card={}, version="v1", hardware_id="h200x2")  # fmt: skip


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_recommend_answers_each_scenario_in_its_mode(trained, mode):
    hw = get_hardware("h200x2")
    scenarios = [Scenario(m=m, n=8192, k=4096, hardware=hw) for m in (6, 1024, 32768)]
    recs = _predictor(trained).recommend(scenarios, mode=mode)
    for s, rec in zip(scenarios, recs, strict=True):
        valid = {str(c) for c in candidates(s)}
        assert rec.mode == mode and rec.schedule in valid
        assert set(rec.predicted_speedups) == valid
        assert rec.predicted_speedups["serial/sm"] == 1.0
        assert rec.fallback is (rec.fallback_reason is not None)


def test_modes_can_pick_differently_but_never_invalidly(trained, table):
    predictor = _predictor(trained)
    eager = predictor.decide(table.X, ["eager"] * len(table))
    graph = predictor.decide(table.X, ["graph"] * len(table))
    assert not np.array_equal(eager.speedups, graph.speedups)


def test_fallback_replaces_a_small_predicted_gain_with_serial(trained):
    predictor = _predictor(trained, ModePolicy.uniform(DecisionPolicy(min_gain=0.99)))
    rec = predictor.recommend([Scenario(m=32768)], mode="eager")[0]
    assert rec.schedule == "serial/sm" and rec.predicted_speedup == 1.0
    assert (rec.fallback and "noise floor" in rec.fallback_reason) or not rec.fallback


def test_recommend_rejects_unknown_mode_and_foreign_hardware(trained):
    with pytest.raises(ValueError, match="mode must be one of"):
        _predictor(trained).recommend([Scenario()], mode="compiled")
    with pytest.raises(ValueError, match="trained for hardware 'h200x2'"):
        _predictor(trained).recommend([Scenario(hardware=get_hardware("h100x8"))])


def test_each_mode_falls_back_under_its_own_policy(trained, table):
    policy = ModePolicy(eager=DecisionPolicy(min_gain=0.99), graph=DecisionPolicy())
    predictor = _predictor(trained, policy)
    eager = predictor.decide(table.X, ["eager"] * len(table))
    graph = predictor.decide(table.X, ["graph"] * len(table))
    assert np.all(eager.schedules == "serial/sm") and not graph.fallback.any()
    both = predictor.decide(table.X, table.modes)  # a mixed batch: each row under its mode's policy
    assert np.array_equal(both.fallback, np.where(table.modes == "eager", eager.fallback, graph.fallback))
