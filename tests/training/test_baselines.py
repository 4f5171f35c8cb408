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


def test_vllm_sp_rule_matches_vllms_threshold_formula():
    from ficco.features import Scenario, get_hardware
    from ficco.training.peer_rules import vllm_sp_min_tokens, vllm_sp_rule

    # vLLM: min_token_num = SP_MIN_PER_GPU_SIZE_MB * tp * MiB // (hidden * elem_bytes), None below 8192
    assert vllm_sp_min_tokens(8192, 2, 2, 90) == 8 * 2 * 1024 * 1024 // (8192 * 2) == 1024
    assert vllm_sp_min_tokens(8192, 4, 2, 100) == 32 * 4 * 1024 * 1024 // (8192 * 2)
    assert vllm_sp_min_tokens(4096, 2, 2, 90) is None and vllm_sp_min_tokens(8192, 2, 2, 80) is None
    hw = get_hardware("h200x2")
    # hidden size: k of the all-gather's GEMM, n of the reduce-scatter's
    cases = [
        Scenario(op="ag_gemm", m=1024, n=4096, k=8192, hardware=hw),  # at the threshold: on
        Scenario(op="ag_gemm", m=1022, n=4096, k=8192, hardware=hw),  # below: off
        Scenario(op="gemm_rs", m=4096, n=4096, k=8192, hardware=hw),  # hidden = n = 4096: off
        Scenario(op="gemm_rs", m=4096, n=8192, k=4096, hardware=hw),  # hidden = n = 8192: on
    ]
    assert vllm_sp_rule(tuple(cases)).tolist() == [True, False, False, True]


def test_pytorch_autoheuristic_follows_the_tree():
    from ficco.training.peer_rules import autoheuristic_fuse

    assert not autoheuristic_fuse(65536, 8192, 8192)  # m*n = 537M > 403M: never
    assert autoheuristic_fuse(8192, 8192, 128)  # m*n = 67M: medium output, fuse
    assert not autoheuristic_fuse(1024, 8192, 16)  # m*n = 8.4M <= 14M and m*k small: no
    assert autoheuristic_fuse(1024, 8192, 32768)  # m*n small but m*k = 33.5M > 26M: fuse


def test_ficco_async_tp_threshold_learns_where_async_tp_wins(table):
    from ficco.training.baselines import PEER_RULES, AsyncTPModel, serial_or_async_tp

    train, test = table.subset(np.arange(len(table)) % 2 == 0), table.subset(np.arange(len(table)) % 2 == 1)
    rules = serial_or_async_tp(train, test)
    assert list(rules) == list(PEER_RULES) and all(len(v) == len(test) for v in rules.values())
    oracle = rules["oracle_serial_or_async_tp"]
    has = np.isfinite(test.async_tp_ms)
    agree = np.mean(rules["ficco_async_tp_threshold"][has] == oracle[has])
    assert agree > 0.8, agree
    model = AsyncTPModel().fit(train)
    assert set(model.min_gain_) == set(train.modes) and set(model.min_gain_.values()) <= {
        0.0,
        0.01,
        0.02,
        0.03,
        0.05,
    }
