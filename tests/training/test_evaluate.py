"""Per-mode evaluation against baselines and the noise ceiling."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ficco.training.dataset_table import build_table
from ficco.training.evaluate import ceiling_picks, evaluate

METRICS = ("top1", "in_best_set", "geomean_regret", "p95_regret", "max_regret", "n_slower_than_serial_2pct")


def test_summary_layout_per_mode_with_ceiling_and_async_tp(trained):
    modes = trained.evaluation.summary["modes"]
    assert set(modes) == {"eager", "graph"}
    for result in modes.values():
        family = result["family_holdout"]
        assert {"model", "always_serial", "always_shard_dma", "best_fixed", "size_heuristic",
                "always_async_tp"} <= set(family)  # fmt: skip
        for metrics in family.values():
            assert all(k in metrics for k in METRICS)
        assert family["always_serial"]["geomean_regret"] > family["model"]["geomean_regret"]
        assert family["always_serial"]["n_slower_than_serial_2pct"] == 0


@pytest.mark.heavy
def test_ceiling_scores_the_remeasure_against_the_sweep(frame, table, fast_configs, fast_policies):
    from ficco.features import get_hardware

    rng = np.random.default_rng(0)
    again = frame[frame["scenario_id"].isin(sorted(set(frame["scenario_id"]))[:20])].copy()
    again["median_ms"] *= np.exp(0.02 * rng.standard_normal(len(again)))
    noise = build_table(again, get_hardware("h200x2"))
    rows, _ = ceiling_picks(table, noise)
    assert len(rows) == len(noise) == 40  # 20 scenarios x 2 modes
    assert np.array_equal(table.scenario_ids[rows], noise.scenario_ids)
    ev = evaluate(table, noise=noise, configs=fast_configs[:1], policies=fast_policies[:1])
    ceiling = ev.summary["modes"]["eager"]["family_holdout"]["ceiling"]
    assert ceiling["n_scenarios"] == 20 and ceiling["geomean_regret"] >= 0
    assert len(ev.regrets["eager"]["ceiling"]) == 20


def test_async_tp_counts_as_top1_when_no_slower_than_the_best(tiny_table):
    from ficco.training.evaluate import async_tp_score

    metrics, regret = async_tp_score(tiny_table)
    assert metrics["n_scenarios"] == 2  # the third has no async-TP time
    np.testing.assert_allclose(regret, [0.2, 0.5])
    assert metrics["top1"] == 0.0 and metrics["n_slower_than_serial_2pct"] == 1


@pytest.mark.heavy
def test_transfer_counts_the_scenarios_left_out_and_scores_its_ceiling(table, fast_configs, fast_policies):
    ids = np.unique(table.scenario_ids)
    train = table.subset(~np.isin(table.scenario_ids, ids[:30]))  # the transfer set: 30 fresh + the rest
    noise = table.subset(np.isin(table.scenario_ids, ids[:10]))  # its re-measure: 10 fresh scenarios
    other_host = dataclasses.replace(table, host_factors=np.full(len(table), 2.0))  # a slower host
    ev = evaluate(
        train, transfer=other_host, transfer_noise=noise, configs=fast_configs[:1], policies=fast_policies[:1]
    )
    assert ev.summary["transfer_split"] == {
        "host_factor": {"training": train.host_factor, "transfer": 2.0},
        "n_scenarios": 30, "n_dropped_shared_with_training": len(ids) - 30, "n_noise_scenarios": 10,
    }  # fmt: skip
    transfer = ev.summary["modes"]["eager"]["transfer"]
    assert transfer["model"]["n_scenarios"] == 30 and transfer["ceiling"]["n_scenarios"] == 10
    assert transfer["model_at_training_host_factor"]["n_scenarios"] == 30
    same_host = evaluate(train, transfer=table, configs=fast_configs[:1], policies=fast_policies[:1])
    assert "model_at_training_host_factor" not in same_host.summary["modes"]["eager"]["transfer"]
    assert (
        "transfer_split" not in evaluate(train, configs=fast_configs[:1], policies=fast_policies[:1]).summary
    )


def test_split_baselines_fit_each_op_group_on_its_own_rows(sim_dataset, sim_moe_dataset):
    from ficco.training.baselines import baseline_picks
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.evaluate import split_baselines

    both = load_dataset_table(sim_dataset, sim_moe_dataset).table
    eager = both.subset(both.modes == "eager")
    odd = np.arange(len(eager)) % 2 == 1
    train, test = eager.subset(~odd), eager.subset(odd)
    got = split_baselines(train, test)
    for group in ("dense", "moe"):
        here = test.op_groups == group
        want = baseline_picks(train.subset(train.op_groups == group), test.subset(here))
        assert want and set(got) == set(want)
        for name, picks in want.items():
            assert np.array_equal(got[name][here], picks), name
    assert split_baselines(train.subset(train.op_groups == "dense"), test) == {}  # no MoE rows to fit on


@pytest.mark.heavy
def test_rescore_scores_the_family_holdout_picks_against_an_independent_sweep(
    frame, table, fast_configs, fast_policies
):
    """Against its own labels the rescored picks score as the family holdout does and the training sweep's
    best has no regret; against another sweep of half the scenarios, only those rows count."""
    from ficco.features import get_hardware

    settings = {"configs": fast_configs[:1], "policies": fast_policies[:1]}
    same = evaluate(table, rescore=table, **settings).summary["modes"]["eager"]
    assert same["rescored"]["model"] == same["family_holdout"]["model"]
    assert same["rescored"]["first_sweep_best"]["geomean_regret"] == 0.0
    rng = np.random.default_rng(1)
    half = sorted(set(frame["scenario_id"]))[::2]
    other = frame[frame["scenario_id"].isin(half)].copy()
    for column in ("median_ms", "p10_ms"):
        other[column] *= np.exp(0.05 * rng.standard_normal(len(other)))
    rescore = build_table(other, get_hardware("h200x2"))
    result = evaluate(table, rescore=rescore, **settings).summary["modes"]["graph"]["rescored"]
    assert result["model"]["n_scenarios"] == result["first_sweep_best"]["n_scenarios"] == len(half)
    assert result["first_sweep_best"]["geomean_regret"] > 0
    assert "rescored" not in evaluate(table, **settings).summary["modes"]["graph"]


def test_peer_rules_are_scored_on_the_async_tp_rows_beside_the_model(trained):
    for mode, summary in trained.evaluation.summary["modes"].items():
        family = summary["family_holdout"]
        n = family["always_async_tp"]["n_scenarios"]
        for name in ("vllm_sp_rule", "pytorch_autoheuristic", "ficco_async_tp_threshold",
                     "oracle_serial_or_async_tp", "model_on_async_tp_rows"):  # fmt: skip
            assert family[name]["n_scenarios"] == n, (mode, name)
        oracle = family["oracle_serial_or_async_tp"]
        assert oracle["n_slower_than_serial_2pct"] == 0
        for name in ("vllm_sp_rule", "pytorch_autoheuristic", "ficco_async_tp_threshold"):
            assert family[name]["geomean_regret"] >= oracle["geomean_regret"] - 1e-12
