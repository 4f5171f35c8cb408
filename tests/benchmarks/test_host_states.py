"""benchmarks.studies.host.host_states: slow spells, the fast state, bins, whether CPUs slow together."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.studies.host.host_states import binned, json_bins, spells_ms, summarize, together


def _series(us: list[float], step_s: float = 0.001) -> np.ndarray:
    return np.column_stack([np.arange(len(us)) * step_s, us])


def test_spells_run_from_the_first_slow_sample_to_the_next_fast_one():
    t = np.arange(8) * 0.001
    slow = np.array([0, 1, 1, 0, 0, 1, 1, 1], dtype=bool)
    assert spells_ms(t, slow) == pytest.approx([2.0, 2.0])  # the last spell ends with the series


def test_summary_finds_the_fast_state_and_the_slow_share():
    s = summarize(_series([4.0] * 90 + [8.0] * 10), slow_factor=1.5)
    assert s["fast_us"] == 4.0 and s["slow_share"] == pytest.approx(0.1)
    assert s["slow_spells"] == 1 and s["longest_spell_ms"] == pytest.approx(9.0)


def test_bins_take_each_bins_median_and_leave_empty_bins_empty():
    series = np.array([[0.001, 4.0], [0.002, 6.0], [0.003, 5.0], [0.025, 9.0]])
    bins = binned(series, seconds=0.03)
    assert bins[0] == 5.0 and np.isnan(bins[1]) and bins[2] == 9.0
    assert json_bins(bins) == [5.0, None, 9.0]


def test_cpus_that_slow_down_together_correlate_and_independent_ones_do_not():
    a = [4.0] * 50 + [8.0] * 50
    b = [8.0] * 50 + [4.0] * 50
    assert together({0: _series(a), 1: _series(a)}, seconds=0.1, slow_factor=1.5) == pytest.approx(1.0)
    assert together({0: _series(a), 1: _series(b)}, seconds=0.1, slow_factor=1.5) == pytest.approx(-1.0)
    assert together({0: _series(a)}, seconds=0.1, slow_factor=1.5) is None  # one CPU: nothing to compare
