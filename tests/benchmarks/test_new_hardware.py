"""benchmarks.new_hardware: the fixed family halves, the budget's prefix, the tasks and the table."""

from __future__ import annotations

import numpy as np

from benchmarks import new_hardware as bench


def test_the_halves_are_fixed_disjoint_and_cover_the_nine_families():
    first, second = bench.halves()
    assert bench.halves() == (first, second)
    assert not set(first) & set(second) and len(first) + len(second) == 9
    assert first == tuple(sorted(first)) and first[0] < second[0]


def test_a_budget_buys_the_longest_prefix_that_fits():
    cost = np.array([30.0, 10.0, 40.0, 20.0])
    order = np.array([1, 3, 0, 2])
    assert bench.prefix(order, cost, 0.0).tolist() == []
    assert bench.prefix(order, cost, 0.5).tolist() == [1, 3]  # 30 s fit, the next 30 s would not
    assert bench.prefix(order, cost, 1.0).tolist() == [1, 3, 0]
    assert bench.prefix(order, cost, 10.0).tolist() == [1, 3, 0, 2]


def test_tasks_fit_deterministic_orders_and_the_zero_budget_once():
    todo = bench.tasks(["h200x4"], seeds=3, minutes=[0.0, 1.0])
    zero = [t for t in todo if t[4] == 0.0]
    assert len(zero) == 2 * 2  # two halves, with and without the prior
    assert {t[3] for t in todo if t[2] == "random"} == {0, 1, 2}
    assert {t[3] for t in todo if t[2] != "random"} == {0}
    assert len(todo) == len(set(todo))


def test_the_table_marks_what_retrain_does():
    point = {"target": "h200x4", "strategy": "ordered", "priors": "prior", "minutes": 1.0, "mode": "eager",
             "regret_mean": 0.021, "regret_min": 0.02, "regret_max": 0.022, "slow_mean": 3.0,
             "delta_vs_none": -0.01, "noise_band": 0.002, "default": True}  # fmt: skip
    result = {"halves": [["a"], ["b"]], "seeds": 3, "points": [point],
              "targets": {"h200x4": {"prior": {"describe": "x (measured)"}}}}  # fmt: skip
    text = bench.render(result)
    assert "**2.10% [2.00-2.20] (3) Δ-1.00±0.20**" in text and "| ordered | prior |" in text
