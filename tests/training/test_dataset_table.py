"""Dataset rows -> one row per (scenario, mode)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ficco.features import get_hardware
from ficco.training.dataset_table import build_table
from ficco.training.model import SCHEDULES


def test_build_table_labels_match_harness_label_table(frame, table):
    from ficco.harness.dataset import label_table

    labels = label_table(frame).set_index(["scenario_id", "mode"])
    keys = list(zip(table.scenario_ids, table.modes, strict=True))
    assert sorted(labels.index) == sorted(keys)
    best = labels.loc[keys]
    np.testing.assert_allclose(table.best_ms, best["best_ms"].to_numpy())
    np.testing.assert_allclose(table.serial_ms, best["serial_ms"].to_numpy())
    assert list(table.labels) == list(best["best_schedule"])
    np.testing.assert_array_equal(table.in_best.sum(axis=1), best["best_set_size"].to_numpy())


def test_build_table_has_both_modes_and_async_tp(frame, table):
    assert set(table.modes) == {"eager", "graph"}
    assert np.all(np.isfinite(table.async_tp_ms))
    only = build_table(frame, get_hardware("h200x2"), modes=["graph"])
    assert set(only.modes) == {"graph"} and len(only) == len(table) // 2


def test_build_table_keeps_failed_rows_out(frame, table):
    failed = frame[~frame["ok"]]
    assert len(failed) > 0
    keys = list(zip(table.scenario_ids, table.modes, strict=True))
    for sid, mode, schedule in zip(failed["scenario_id"], failed["mode"], failed["schedule"], strict=True):
        i = keys.index((sid, mode))
        assert np.isnan(table.times_ms[i, SCHEDULES.index(schedule)])


def test_build_table_drops_scenarios_without_serial(frame):
    first = frame["scenario_id"].iloc[0]
    broken = frame.copy()
    broken.loc[(broken["scenario_id"] == first) & (broken["schedule"] == "serial/sm"), "ok"] = False
    table = build_table(broken, get_hardware("h200x2"))
    assert first not in set(table.scenario_ids)
    assert table.dropped == {"no successful serial/sm measurement": 2}  # both modes


def test_build_table_rejects_unknown_schedule(frame):
    bad = frame.copy()
    bad.loc[bad.index[0], "schedule"] = "shard/tpu"
    with pytest.raises(ValueError, match="unknown schedule 'shard/tpu'"):
        build_table(bad, get_hardware("h200x2"))


def test_subset_keeps_rows_aligned(table):
    part = table.subset(table.families == "grid")
    assert len(part) == int(np.sum(table.families == "grid"))
    assert set(part.families) == {"grid"}
    assert part.scenarios[0].key() == part.scenario_ids[0]


def test_repeat_sweeps_pool_into_geometric_means_and_widen_the_best_set(frame, table):
    """A second sweep whose times are 4x (every schedule but one) gives each time the geometric mean (2x);
    a schedule only the repeat has is taken as measured there; best set: any sweep's, plus the fastest."""
    repeat = frame.copy()
    for column in ("median_ms", "p10_ms"):  # the label statistics of both modes
        repeat[column] = repeat[column] * 4.0
    row, col = 0, SCHEDULES.index("shard/dma")
    sid, mode = table.scenario_ids[row], table.modes[row]
    here = (repeat["scenario_id"] == sid) & (repeat["mode"] == mode)
    repeat.loc[here & (repeat["schedule"] == "shard/dma"), ["median_ms", "p10_ms"]] = 1e-6  # its fastest
    repeat.loc[here & (repeat["schedule"] == "shard/dma"), "in_best_set"] = True
    pooled = build_table(frame, get_hardware("h200x2"), repeats=[repeat])
    assert list(pooled.scenario_ids) == list(table.scenario_ids)
    others = np.ones(table.times_ms.shape, dtype=bool)
    others[row, col] = False
    np.testing.assert_allclose(pooled.times_ms[others], 2.0 * table.times_ms[others], equal_nan=True)
    assert pooled.best[row] == col and pooled.in_best[row, col]
    assert (pooled.in_best >= table.in_best).all()  # any sweep's best set counts


def test_a_repeat_with_other_modes_adds_no_row(frame, table):
    graph = build_table(frame, get_hardware("h200x2"), modes=["graph"], repeats=[frame])
    assert set(graph.modes) == {"graph"}
    np.testing.assert_allclose(graph.times_ms, table.subset(table.modes == "graph").times_ms, equal_nan=True)


def test_the_table_carries_its_machines_host_factor_and_subsets_keep_it(frame, table):
    """The sweep's own host factor (``features.dataset.host_factor_of``); 1.0 where no eager time is
    host-bound (the toy frame as it is, graph rows alone)."""
    from ficco.features.dataset import host_factor_of

    hw = get_hardware("h200x2")
    fast_graphs = frame.copy()
    graph = fast_graphs["mode"] == "graph"
    fast_graphs.loc[graph, ["median_ms", "p10_ms"]] *= 0.1  # every eager time host-bound now
    factor = build_table(fast_graphs, hw).host_factor
    assert factor == pytest.approx(host_factor_of(fast_graphs)) and np.isfinite(factor) and factor != 1.0
    assert table.host_factor == 1.0 and build_table(frame[graph], hw).host_factor == 1.0
    slower = dataclasses.replace(table, host_factors=np.full(len(table), 1.7))
    assert slower.subset(np.arange(3)).host_factor == 1.7
    np.testing.assert_array_equal(slower.subset(np.arange(3)).host_factors, [1.7] * 3)


def test_schedule_columns_refuse_unknown_schedules_by_name():
    from ficco.training.model import schedule_indices

    assert list(schedule_indices(["serial/sm", SCHEDULES[-1]])) == [0, len(SCHEDULES) - 1]
    with pytest.raises(ValueError, match=r"unknown schedule 'shard/sm/cta8': unexpected fields \['cta8'\]"):
        schedule_indices(["shard/sm", "shard/sm/cta8"])
    with pytest.raises(ValueError, match=r"unknown schedule 'ring/sm'"):
        schedule_indices(["ring/sm"])
