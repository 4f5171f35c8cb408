"""benchmarks/studies/feature_ablation.py: losses per mode, the paired difference, a masked run."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.studies import feature_ablation as ablation
from ficco.training.metrics import pick_loss


def test_cell_losses_are_the_mean_pick_loss_per_mode(table):
    picks = np.nanargmin(table.times_ms, axis=1)
    picks[::3] = 0  # serial/sm on a third of the rows
    loss = pick_loss(table.time_of(picks)[0], table.best_ms, table.serial_ms)
    cells = ablation.cell_losses(table, picks)
    assert cells["all"] == loss.mean()
    for mode in ("eager", "graph"):
        assert cells[mode] == loss[table.modes == mode].mean()


def test_identical_picks_differ_by_nothing(table):
    picks = np.nanargmin(table.times_ms, axis=1)
    diff = ablation.paired_loss(table, picks, picks)
    assert diff == {m: {"mean": 0.0, "ci95": [0.0, 0.0]} for m in ("eager", "graph")}


@pytest.mark.heavy
def test_masked_run_reports_the_mask_and_every_mode(table):
    summary, picks = ablation.run(table, ("eager_host_over_gpu",), n_jobs=1)
    assert summary["masked"] == ["eager_host_over_gpu"] and len(picks) == len(table)
    assert set(summary["loss"]) == {"all", "eager", "graph"}
    assert set(summary["metrics"]["all"]) == {"eager", "graph"}
