"""Fixed-schedule baselines and the size-threshold heuristic."""

from __future__ import annotations

import numpy as np

from ficco.training.baselines import baseline_picks, fit_best_fixed, fit_size_heuristic, fixed_picks
from ficco.training.metrics import mean_loss
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES, SERIAL_INDEX, valid_mask


def test_fixed_picks_fall_back_to_serial_where_invalid(table):
    s8 = SCHEDULE_INDEX["finer/dma/s8/chunk"]
    picks = fixed_picks(table, s8)
    valid = valid_mask(table.X)[:, s8]
    assert not valid.all() and valid.any()
    assert np.all(picks[valid] == s8) and np.all(picks[~valid] == SERIAL_INDEX)


def test_best_fixed_has_the_lowest_loss(table):
    best = fit_best_fixed(table)
    losses = {s: mean_loss(table, fixed_picks(table, SCHEDULE_INDEX[s])) for s in SCHEDULES}
    assert losses[SCHEDULES[best]] == min(losses.values())


def test_size_heuristic_is_no_worse_than_serial_on_its_training_data(table):
    rule = fit_size_heuristic(table)
    tiers = (SCHEDULES[rule.serial], SCHEDULES[rule.shard], SCHEDULES[rule.finer])
    assert [t.split("/")[0] for t in tiers] == ["serial", "shard", "finer"]
    for serial in ("serial/sm", "serial/dma"):
        assert mean_loss(table, rule.picks(table)) <= mean_loss(
            table, fixed_picks(table, SCHEDULE_INDEX[serial])
        )


def test_baseline_picks_names(table):
    picks = baseline_picks(table, table.subset(np.arange(10)))
    assert set(picks) == {
        "always_serial",
        "always_shard_dma",
        "always_shard_sm",
        "best_fixed",
        "size_heuristic",
    }
    assert all(len(p) == 10 for p in picks.values())
    assert np.all(picks["always_serial"] == SERIAL_INDEX)
