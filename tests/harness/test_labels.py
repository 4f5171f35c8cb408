"""Best sets: ties within the floor, noise-driven ties, clear losers, failed schedules, per-mode labelling
(eager: 10th percentile over rounds, graph: median), relabelling stored rows."""

import math

import numpy as np
import pytest

from ficco.features.dataset import label_quantile, with_label_times
from ficco.harness.backend import Measurement, ScenarioResult
from ficco.harness.labels import best_set, label_result, relabel


def test_best_set_keeps_ties_within_the_floor_and_drops_clear_losers():
    rounds = np.array(
        [
            [1.000, 1.001, 0.999, 1.000, 1.002],  # the fastest
            [1.008, 1.009, 1.007, 1.008, 1.010],  # 0.8% slower: inside the 1% floor
            [1.100, 1.101, 1.099, 1.100, 1.102],  # 10% slower, steady: out
        ]
    )
    assert best_set(rounds).tolist() == [True, True, False]


def test_best_set_keeps_a_schedule_the_noise_cannot_separate():
    noisy = np.array(
        [
            [1.00, 1.30, 0.80, 1.20, 0.90],
            [1.05, 0.85, 1.35, 0.95, 1.25],  # median 5% slower, but the rounds overlap completely
            [2.00, 2.01, 1.99, 2.00, 2.02],
        ]
    )
    assert best_set(noisy).tolist() == [True, True, False]


def test_best_set_never_holds_a_failed_schedule_and_is_empty_without_times():
    rounds = np.array([[math.nan] * 3, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    assert best_set(rounds).tolist() == [False, True, True]
    assert not best_set(np.full((2, 3), math.nan)).any()


def test_best_set_is_reproducible_and_checks_its_arguments():
    rng = np.random.default_rng(0)
    rounds = 1.0 + 0.05 * rng.standard_normal((30, 5))
    assert (best_set(rounds, seed=3) == best_set(rounds, seed=3)).all()
    with pytest.raises(ValueError, match=r"\[schedules, rounds\] array"):
        best_set(np.ones(3))
    with pytest.raises(ValueError, match="margin >= 0, alpha in"):
        best_set(np.ones((2, 2)), alpha=1.5)
    with pytest.raises(ValueError, match=r"quantile in \(0, 1\); got .*quantile=1.0"):
        best_set(np.ones((2, 2)), quantile=1.0)


def test_label_result_labels_each_mode_separately():
    def m(schedule: str, mode: str, t: float) -> Measurement:
        return Measurement(schedule=schedule, mode=mode, median_ms=t, round_ms=(t, t, t))

    result = ScenarioResult(
        measurements=[
            m("serial/sm", "eager", 1.0),
            m("shard/dma", "eager", 2.0),
            m("serial/sm", "graph", 2.0),
            m("shard/dma", "graph", 1.0),
            Measurement(schedule="finer/dma/s2/chunk", mode="graph", ok=False, error="x"),
        ]
    )
    labelled = [(x.schedule, x.mode, x.in_best_set) for x in label_result(result).measurements]
    assert labelled == [
        ("serial/sm", "eager", True),
        ("shard/dma", "eager", False),
        ("serial/sm", "graph", False),
        ("shard/dma", "graph", True),
        ("finer/dma/s2/chunk", "graph", False),
    ]


def test_eager_labels_take_the_10th_percentile_and_graph_the_median():
    """Schedule a is steady at 1.0; b runs at 0.7 in 9 rounds of 30 and 1.3 otherwise (interrupted): its
    low quantile is clearly the faster in eager mode, its median clearly the slower in graph mode."""
    a = (1.0,) * 30
    b = (*(0.7,) * 9, *(1.3,) * 21)
    result = ScenarioResult(
        measurements=[
            Measurement.from_rounds(schedule, mode, rounds)
            for mode in ("eager", "graph")
            for schedule, rounds in (("serial/sm", a), ("shard/dma", b))
        ]
    )
    labelled = {(x.schedule, x.mode): x.in_best_set for x in label_result(result).measurements}
    assert labelled == {
        ("serial/sm", "eager"): False,
        ("shard/dma", "eager"): True,
        ("serial/sm", "graph"): True,
        ("shard/dma", "graph"): False,
    }
    assert label_quantile("eager") == 0.1 and label_quantile("graph") == 0.5
    with pytest.raises(ValueError, match=r"mode must be one of \['eager', 'graph'\]; got 'decode'"):
        label_quantile("decode")


def test_relabel_recomputes_the_best_set_as_label_result_does():
    from ficco.features import Scenario
    from ficco.features.dataset import rows_frame
    from ficco.harness.dataset import result_rows

    rng = np.random.default_rng(1)
    scenario = Scenario(op="ag_gemm", m=1024, n=1024, k=1024)
    measurements = [
        Measurement.from_rounds(s, mode, tuple(t * (1 + 0.05 * rng.standard_normal(12))))
        for mode in ("eager", "graph")
        for s, t in (("serial/sm", 1.0), ("shard/dma", 0.97), ("shard/sm", 1.3))
    ]
    truth = label_result(ScenarioResult(measurements=measurements))
    rows = rows_frame(result_rows("llama", scenario, ScenarioResult(measurements=measurements), "gpu"))
    relabelled = relabel(rows.assign(in_best_set=~rows["in_best_set"]).iloc[::-1])  # stale flags, any order
    expected = {(m.schedule, m.mode): m.in_best_set for m in truth.measurements}
    keys = zip(relabelled["schedule"], relabelled["mode"], strict=True)
    got = dict(zip(keys, relabelled["in_best_set"], strict=True))
    assert got == expected
    timed = with_label_times(relabelled)
    eager = timed["mode"] == "eager"
    assert (timed.loc[eager, "time_ms"] == timed.loc[eager, "p10_ms"]).all()
    assert (timed.loc[~eager, "time_ms"] == timed.loc[~eager, "median_ms"]).all()
