"""Recommendations: mode, predicted speedups, fallback, errors."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.features import Scenario, candidates, get_hardware
from ficco.training.predict.policy import DecisionPolicy, ModePolicy
from ficco.training.predict.predictor import Predictor


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
    assert np.all(eager.schedules == "serial/sm")
    raw_speedup = graph.speedups[np.arange(len(table)), graph.raw]
    assert not (graph.fallback & (raw_speedup >= policy.graph.slowest)).any()  # only the guard's in graph
    both = predictor.decide(table.X, table.modes)  # a mixed batch: each row under its mode's policy
    assert np.array_equal(both.fallback, np.where(table.modes == "eager", eager.fallback, graph.fallback))


def test_a_slower_host_moves_eager_answers_toward_fewer_launches_and_leaves_graph_alone(trained, table):
    """The host factor scales the eager host-time pair column only; the default is the model card's."""
    from ficco.features.launch_cost import host_prices

    predictor = Predictor(scorer=trained.scorer, ratio=trained.ratio, policy=trained.choice.policy,
                          card={"host_factor": 1.25}, version="v1", hardware_id="h200x2")  # fmt: skip
    assert predictor.host_factor == 1.25
    rows = table.subset(table.modes == "eager")
    default = predictor.decide(rows.X, rows.modes)
    same = predictor.decide(rows.X, rows.modes, host_factor=1.25)
    np.testing.assert_array_equal(default.final, same.final)
    slow = predictor.decide(rows.X, rows.modes, host_factor=8.0)
    fast = predictor.decide(rows.X, rows.modes, host_factor=8.0, fast=True)
    reference = predictor.decide(rows.X, rows.modes, host_factor=8.0, fast=False)
    np.testing.assert_array_equal(fast.final, reference.final)
    np.testing.assert_allclose(fast.speedups, reference.speedups, rtol=1e-5)
    prices = host_prices(rows.X)
    picked = lambda d: prices[np.arange(len(rows)), d.raw]  # noqa: E731
    assert (slow.raw != default.raw).any() and picked(slow).mean() < picked(default).mean()
    graph = table.subset(table.modes == "graph")
    np.testing.assert_array_equal(
        predictor.decide(graph.X, graph.modes, host_factor=8.0).speedups,
        predictor.decide(graph.X, graph.modes).speedups,
    )
    rec = predictor.recommend([Scenario(m=1024)], mode="eager", host_factor=2.0)[0]
    assert rec.host_factor == 2.0
    assert predictor.recommend([Scenario(m=1024)], mode="eager")[0].host_factor == 1.25
    with pytest.raises(ValueError, match="host_factor must be in"):
        predictor.decide(rows.X, rows.modes, host_factor=0.0)


@pytest.fixture(scope="module")
def shipped():
    from ficco.files import SHIPPED_MODELS
    from ficco.training.predict.registry import load_predictor

    return load_predictor(SHIPPED_MODELS, "h200x2")


def test_the_issues_answer_no_longer_contradicts_itself(shipped):
    """ag_gemm m=160 n=3584 k=5120 in graph mode was shard/dma/hp at a predicted speedup of 0.824."""
    rec = shipped.recommend([Scenario(m=160, n=3584, k=5120)], mode="graph")[0]
    band = shipped.policy.of("graph").noise_band
    assert rec.predicted_speedup >= 1 / (1 + band)
    assert rec.predicted_speedup == rec.predicted_speedups[rec.schedule]
    assert rec.schedule != "shard/dma/hp"  # its twin ties it: stream priority is raised only for a gain
    if rec.fallback:
        assert "slower than serial/sm, beyond the noise band" in rec.fallback_reason


def test_no_answer_on_committed_or_random_scenarios_is_predicted_slower_than_serial(shipped):
    """benchmarks.answer_consistency's check over every committed dataset of the model's hardware and 2,000
    random scenarios, in both modes: no pick below 1 / (1 + noise band), no /hp pick tied with its twin."""
    from benchmarks.answer_consistency import check_answers, dataset_scenarios, random_scenarios

    sets = {**dataset_scenarios("h200x2"), "random": random_scenarios(shipped, 2000, seed=1)}
    assert len(sets) > 5
    for mode in ("eager", "graph"):
        for name, scenarios in sets.items():
            found = check_answers(shipped, scenarios, mode)
            assert found["below_band"] == 0 and found["hp_ties"] == 0, (name, mode, found)
            assert found["lowest_speedup"] >= shipped.policy.of(mode).slowest - 1e-9
