"""benchmarks/studies/safe_picks.py: the vetoes and the fallback act where they should, and only there."""

from __future__ import annotations

import numpy as np

from benchmarks.studies import safe_picks
from ficco.training.predict.pairs import SERIAL_INDEX


def test_a_vetoed_schedule_gives_way_to_the_next_ranked_one():
    cost = np.array([[0.0, -2.0, -1.0], [0.0, -2.0, -1.0]])
    veto = np.array([[False, True, False], [False, True, False]])
    on = np.array([True, False])
    assert safe_picks.apply(cost, veto, on).tolist() == [2, 1]


def test_fallback_goes_serial_only_below_the_gain_and_on_selected_rows():
    cost = np.array([[0.0, -1.0], [0.0, -1.0], [0.0, -1.0]])
    ratio = np.log(np.array([[1.0, 1 / 1.01], [1.0, 1 / 1.10], [1.0, 1 / 1.01]]))  # speedups 1.01, 1.10
    modes = np.array(["graph", "graph", "eager"])
    assert safe_picks.fallback(cost, ratio, modes, 0.05, both=False).tolist() == [SERIAL_INDEX, 1, 1]


def test_a_row_alone_vetoes_exactly_what_it_measured_slow_and_never_serial(table):
    for i in range(0, len(table), max(1, len(table) // 5)):
        row = table.subset(np.array([i]))
        veto = safe_picks.neighbour_veto(row, row)[0]
        with np.errstate(invalid="ignore"):
            slow = row.times_ms[0] / row.serial_ms[0] > safe_picks.SLOW
        slow[SERIAL_INDEX] = False
        assert veto.tolist() == slow.tolist()


def test_no_neighbour_no_veto(table):
    graph, eager = table.subset(table.modes == "graph"), table.subset(table.modes == "eager")
    assert not safe_picks.neighbour_veto(graph, eager).any()  # another mode is never a neighbour
