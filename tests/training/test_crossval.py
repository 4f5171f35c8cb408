"""Grouped cross-validation: groups, GroupKFold folds, held-out choice."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.training.crossval import cross_validate, cv_folds, cv_groups, region_holdout


def test_groups_are_families_and_grid_quartiles(table):
    groups = cv_groups(table)
    assert {g for g in groups if g.startswith("grid/")} == {"grid/q1", "grid/q2", "grid/q3", "grid/q4"}
    assert set(groups[table.families != "grid"]) == set(table.families[table.families != "grid"])


def test_folds_never_split_a_group_or_a_scenario(table):
    groups = cv_groups(table)
    folds = cv_folds(groups, max_folds=3)
    assert len(set(folds.tolist())) == 3
    for g in set(groups):
        assert len(set(folds[groups == g].tolist())) == 1
    for sid in set(table.scenario_ids):  # both modes of a scenario land in the same fold
        assert len(set(folds[table.scenario_ids == sid].tolist())) == 1


def test_region_holdout_is_the_largest_quarter(table):
    held = region_holdout(table)
    flops = np.array([s.gemm_flops for s in table.scenarios])
    assert flops[held].min() >= flops[~held].max()
    assert 0.2 < held.mean() < 0.35


@pytest.mark.heavy
def test_cross_validation_beats_always_serial(table, fast_configs, fast_policies):
    from ficco.training.metrics import mean_loss
    from ficco.training.model import SERIAL_INDEX

    cv = cross_validate(table, configs=fast_configs, policies=fast_policies)
    assert set(cv.config_loss) == {c.key() for c in fast_configs}
    assert mean_loss(table, cv.final) < 0.5 * mean_loss(table, np.full(len(table), SERIAL_INDEX))
    assert np.all(cv.final[cv.fallback] == SERIAL_INDEX)


def test_choose_takes_each_modes_best_policy_and_the_config_best_under_them():
    from ficco.training.crossval import choose
    from ficco.training.predict.policy import DecisionPolicy

    policies = (DecisionPolicy(), DecisionPolicy(min_gain=0.0), DecisionPolicy(min_gain=0.02))
    modes = np.array(["eager", "eager", "graph", "graph"], dtype=object)
    loss = np.ones((2, 3, 4))
    loss[0, 2, :2] = 0.1  # config 0: eager best under min_gain 0.02, graph under none (0.5)
    loss[0, 0, 2:] = 0.5
    loss[1, 1, :] = 0.4  # config 1: one policy for both modes, worse than config 0's pair (0.45 > 0.3)
    c, policy, by_config = choose(loss, modes, np.ones(4, dtype=bool), policies)
    assert c == 0 and policy.eager == policies[2] and policy.graph == policies[0]
    np.testing.assert_allclose(by_config, [0.3, 0.4])
    # rows of one mode only: the other mode keeps the first (laxest) policy
    c, policy, _ = choose(loss, modes, np.array([False, False, True, True]), policies)
    assert policy.eager == policies[0] and c == 1  # graph alone: config 1 (0.4) beats config 0 (0.5)


def test_extra_rows_must_beat_their_weightless_twin_by_extra_rows_errors_standard_errors():
    from ficco.training.crossval import choose, weightless
    from ficco.training.fit import TrainConfig, configs_for
    from ficco.training.predict.policy import DecisionPolicy

    config = TrainConfig(objective="ndcg", max_depth=2, n_estimators=3, learning_rate=0.3)
    configs = configs_for(_two_sources_stub(), (config,))
    base = weightless(configs)
    assert [c.extra_weight for c in configs] == [1.0, 0.3, 0.0]
    assert base.tolist() == [2, 2, 2]
    policies = (DecisionPolicy(),)
    modes = np.array(["eager"] * 200, dtype=object)
    rows = np.ones(200, dtype=bool)
    noise = np.random.default_rng(0).normal(0.0, 0.05, 200)
    loss = np.full((3, 1, 200), 0.10)
    loss[0, 0] = 0.10 + noise - 0.001  # weight 1: 0.001 better on average, within its per-row noise
    loss[1, 0] = 0.10 + 0.002  # weight 0.3: worse
    c, _, mean = choose(loss, modes, rows, policies, base)
    assert mean[0] < mean[2] and c == 2  # the marginal gain does not earn the extra rows their place
    assert choose(loss, modes, rows, policies)[0] == 0  # without twins: the lowest mean loss
    loss[0, 0] = 0.10 + noise * 0.1 - 0.02  # a gain far beyond its standard error
    assert choose(loss, modes, rows, policies, base)[0] == 0


@pytest.mark.parametrize("errors", [1.2, 1.8])
def test_a_gain_is_taken_only_beyond_the_configured_number_of_standard_errors(errors):
    from ficco.training.crossval import EXTRA_ROWS_ERRORS, choose
    from ficco.training.predict.policy import DecisionPolicy

    policies = (DecisionPolicy(),)
    modes = np.array(["eager"] * 100, dtype=object)
    rows = np.ones(100, dtype=bool)
    spread = np.tile([-1.0, 1.0], 50) * 0.01  # per-row differences of standard deviation 0.01
    standard_error = spread.std(ddof=1) / np.sqrt(100)
    loss = np.full((2, 1, 100), 0.10)
    loss[0, 0] = 0.10 + spread - errors * standard_error  # weighs extra rows; its twin (1) does not
    taken = choose(loss, modes, rows, policies, np.array([1, 1]))[0] == 0
    assert taken == (errors > EXTRA_ROWS_ERRORS)


def _two_sources_stub():
    """A stand-in table with rows outside the target (``configs_for`` reads ``is_target`` alone)."""

    class Table:
        is_target = np.array([True, False])

    return Table()


def test_the_standard_error_is_taken_over_groups_where_rows_of_a_family_move_together():
    from ficco.training.crossval import choose
    from ficco.training.predict.policy import DecisionPolicy

    policies = (DecisionPolicy(),)
    modes = np.array(["eager"] * 400, dtype=object)
    rows = np.ones(400, dtype=bool)
    groups = np.repeat([f"family{i}" for i in range(4)], 100)
    loss = np.full((2, 1, 400), 0.10)
    # extra rows: 0.01 better on every row of three families, 0.02 worse on the fourth: per row a clear gain
    loss[0, 0] = 0.10 - np.where(groups == "family3", -0.02, 0.01)
    base = np.array([1, 1])
    assert choose(loss, modes, rows, policies, base)[0] == 0
    # per family: four means, one of them against it, a gain within its standard error: the target alone
    assert choose(loss, modes, rows, policies, base, groups)[0] == 1
