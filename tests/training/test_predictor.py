"""Recommendations: vectorised, masked to valid schedules, with the safe fallback."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ficco.features import Scenario, candidates, get_hardware
from ficco.training.policy import DecisionPolicy
from ficco.training.predictor import Predictor


def _predictor(trained, policy):
    return Predictor(
        classifier=trained.classifier,
        regressor=trained.regressor,
        policy=policy,
        card={},
        version="v1",
        hardware_id="h200x2",
    )


def test_recommend_probabilities_cover_only_valid_schedules(trained, table):
    recs = _predictor(trained, DecisionPolicy()).recommend(table.scenarios)
    assert len(recs) == len(table)
    for scenario, rec in zip(table.scenarios, recs, strict=True):
        valid = {str(s) for s in candidates(scenario)}
        assert set(rec.probabilities) <= valid
        assert sum(rec.probabilities.values()) == pytest.approx(1.0)
        assert rec.schedule in valid
        assert rec.schedule == max(rec.probabilities, key=rec.probabilities.get)  # speedup_weight 0
        assert not rec.fallback and rec.fallback_reason is None
        assert rec.predicted_speedup > 0
        assert (rec.model_version, rec.hardware_id) == ("v1", "h200x2")


def test_recommend_falls_back_to_serial_when_unsure(trained, table):
    sure = _predictor(trained, DecisionPolicy()).recommend(table.scenarios)
    unsure = _predictor(trained, DecisionPolicy(min_probability=0.999)).recommend(table.scenarios)
    changed = [(a, b) for a, b in zip(sure, unsure, strict=True) if a.schedule != "serial/sm"]
    assert changed
    for a, b in changed:
        if a.probabilities[a.schedule] < 0.999:
            assert b.schedule == "serial/sm" and b.fallback and b.predicted_speedup == 1.0
            assert "unsure" in b.fallback_reason
            assert b.probabilities == a.probabilities


def test_recommend_falls_back_when_the_gain_is_within_noise(trained, table):
    recs = _predictor(trained, DecisionPolicy(min_gain=0.9)).recommend(table.scenarios)
    assert all(r.schedule == "serial/sm" for r in recs)
    assert any("noise floor" in (r.fallback_reason or "") for r in recs)


def test_recommend_rejects_scenarios_on_other_hardware(trained):
    other = Scenario(hardware=get_hardware("h100x2"))
    with pytest.raises(ValueError, match="trained for hardware 'h200x2'; 1 scenario"):
        _predictor(trained, DecisionPolicy()).recommend([Scenario(), other])


def test_recommend_many_scenarios_at_once(trained):
    hw = get_hardware("h200x2")
    scenarios = [Scenario(m=2 * (64 + i), n=128 * (1 + i % 64), k=4096, hardware=hw) for i in range(3000)]
    recs = _predictor(trained, DecisionPolicy()).recommend(scenarios)
    assert len(recs) == 3000
    assert dataclasses.is_dataclass(recs[0])


def test_decide_agrees_with_the_evaluation_picks(trained, table):
    from ficco.training.crossval import apply_policy, classifier_proba, regressor_speedups
    from ficco.training.model import schedule_indices

    policy = DecisionPolicy(speedup_weight=16.0, min_probability=0.4, min_gain=0.01)
    decision = _predictor(trained, policy).decide(table.X)
    picks = apply_policy(
        classifier_proba(trained.classifier, table.X), regressor_speedups(trained.regressor, table.X), policy
    )
    np.testing.assert_array_equal(schedule_indices(decision.schedules.tolist()), picks.final)
    np.testing.assert_array_equal(decision.fallback, picks.fallback)
