"""Metrics on a tiny hand-computed example."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ficco.training.metrics import pick_loss, score
from ficco.training.model import SCHEDULE_INDEX

SERIAL, SHARD_DMA, SHARD_SM = (SCHEDULE_INDEX[s] for s in ("serial/sm", "shard/dma", "shard/sm"))
"""The tiny table's schedules (see ``tiny_table`` in conftest.py)."""


def test_score_matches_hand_computation(tiny_table):
    table = tiny_table
    m = score(table, np.array([SHARD_DMA, SHARD_DMA, SHARD_SM]))  # regrets 0, 0.2, 0.01
    assert m["top1"] == pytest.approx(1 / 3)
    assert m["within_2pct"] == pytest.approx(2 / 3)
    assert m["geomean_regret"] == pytest.approx((1.2 * 1.01) ** (1 / 3) - 1)
    assert m["p95_regret"] == pytest.approx(0.01 + 0.9 * (0.2 - 0.01))  # linear interpolation at rank 1.9
    assert m["max_regret"] == pytest.approx(0.2)
    picked = (1.0 / 0.5) * (1.0 / 1.2) * (2.0 / 1.01)
    best = (1.0 / 0.5) * (1.0 / 1.0) * (2.0 / 1.0)
    assert m["captured_speedup"] == pytest.approx((picked / best) ** (1 / 3))
    assert m["speedup_vs_serial"] == pytest.approx(picked ** (1 / 3))
    assert m["n_regressions_vs_serial"] == 1
    assert m["n_unmeasured_picks"] == 0
    assert m["n_scenarios"] == 3


def test_score_of_the_oracle_is_perfect(tiny_table):
    table = tiny_table
    m = score(table, table.best)
    assert (m["top1"], m["within_2pct"], m["geomean_regret"], m["max_regret"]) == (1.0, 1.0, 0.0, 0.0)
    assert m["captured_speedup"] == pytest.approx(1.0)


def test_unmeasured_pick_is_charged_the_slowest_time(tiny_table):
    table = tiny_table
    finer = SCHEDULE_INDEX["finer/dma/s2/chunk"]
    m = score(table, np.array([finer, SERIAL, SERIAL]))
    assert m["n_unmeasured_picks"] == 1
    assert m["max_regret"] == pytest.approx(1.0)  # scenario 0 charged serial's 1.0 ms against 0.5


def test_pick_loss_penalises_slower_than_serial():
    best, serial = np.array([1.0, 1.0]), np.array([1.1, 1.0])
    loss = pick_loss(np.array([1.05, 1.05]), best, serial)
    assert loss[0] == pytest.approx(math.log(1.05))  # slower than best, faster than serial
    assert loss[1] == pytest.approx(2 * math.log(1.05))  # slower than serial too: counted twice
