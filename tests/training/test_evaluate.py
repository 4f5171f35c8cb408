"""The evaluation summary: keys, consistency, the fallback accounting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ficco.training.crossval import Picks
from ficco.training.evaluate import fallback_summary
from ficco.training.model import SCHEDULE_INDEX, SERIAL_INDEX
from ficco.training.policy import DecisionPolicy

METRICS = (
    "top1",
    "within_2pct",
    "geomean_regret",
    "p95_regret",
    "max_regret",
    "captured_speedup",
    "n_scenarios",
)


@pytest.fixture(scope="module")
def evaluation(trained):
    return trained.evaluation


def test_summary_has_the_documented_keys(evaluation, table):
    s = evaluation.summary
    assert set(METRICS) <= set(s)
    assert s["n_scenarios"] == len(table)
    assert set(s["baselines"]) == {"always_serial", "always_shard_dma", "always_shard_sm", "best_fixed",
                                   "size_heuristic"}  # fmt: skip
    for metrics in (*s["baselines"].values(), s["region_holdout"], *s["per_family"].values()):
        assert set(METRICS) <= set(metrics)
    assert isinstance(s["never_worse_than_serial"], bool)
    assert s["never_worse_than_serial"] == (not s["families_worse_than_serial"])
    json.dumps(s)  # serialisable as is


def test_summary_is_consistent_with_the_held_out_picks(evaluation, table):
    s = evaluation.summary
    assert s["top1"] == pytest.approx(np.mean(evaluation.cv.picks.final == table.best), abs=1e-6)
    assert sum(m["n_scenarios"] for m in s["per_family"].values()) == len(table)
    assert s["baselines"]["always_serial"]["n_regressions_vs_serial"] == 0
    assert s["baselines"]["always_serial"]["speedup_vs_serial"] == 1.0
    assert s["region_holdout"]["n_scenarios"] == pytest.approx(len(table) / 4, abs=2)


def test_model_beats_always_serial_on_synthetic_data(evaluation):
    s = evaluation.summary
    assert s["captured_speedup"] > s["baselines"]["always_serial"]["captured_speedup"]
    assert s["geomean_regret"] < s["baselines"]["size_heuristic"]["geomean_regret"]


def test_fallback_summary_counts_avoided_regressions_and_given_up_gains(tiny_table):
    table = tiny_table  # scenario 0: shard/dma 2x faster; 1: shard/dma 1.2x slower; 2: shard/dma 2x faster
    shard = SCHEDULE_INDEX["shard/dma"]
    picks = Picks(
        raw=np.array([shard, shard, shard]),
        final=np.array([SERIAL_INDEX, SERIAL_INDEX, shard]),
        fallback=np.array([True, True, False]),
    )
    fb = fallback_summary(table, picks, DecisionPolicy(min_probability=0.5))
    assert (fb["n_fallbacks"], fb["regressions_avoided"], fb["gains_given_up"]) == (2, 1, 1)
    assert (fb["regressions_without_fallback"], fb["regressions_with_fallback"]) == (1, 0)
    assert fb["geomean_speedup_given_up"] == pytest.approx(2.0)
    assert fb["net_speedup_change"] == pytest.approx((1 / 1.2) ** (-1 / 3) * 2 ** (-1 / 3) - 1)
