"""Grouped cross-validation: groups, folds, picks under a policy."""

from __future__ import annotations

import numpy as np
import pytest
from ficco.training.crossval import apply_policy, cross_validate, cv_folds, cv_groups, region_holdout
from ficco.training.model import SCHEDULES, SERIAL_INDEX
from ficco.training.policy import DecisionPolicy


def test_cv_groups_split_the_grid_into_size_quartiles(table):
    groups = cv_groups(table)
    grid = groups[table.families == "grid"]
    assert set(grid) == {"grid/q1", "grid/q2", "grid/q3", "grid/q4"}
    assert np.all(groups[table.families != "grid"] == table.families[table.families != "grid"])
    flops = np.array([s.gemm_flops for s in table.scenarios])[table.families == "grid"]
    assert flops[grid == "grid/q1"].max() <= flops[grid == "grid/q4"].min()


def test_cv_folds_keep_groups_whole_and_cap_the_count():
    groups = np.array(["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"] * 1, dtype=object)
    folds = cv_folds(groups, max_folds=2)
    assert len(set(folds)) == 2
    for g in set(groups):
        assert len(set(folds[groups == g])) == 1
    assert set(folds) == {"a+d", "b+c"}
    assert len(set(cv_folds(groups, max_folds=8))) == 4


def test_region_holdout_is_the_largest_quarter(table):
    test = region_holdout(table)
    flops = np.array([s.gemm_flops for s in table.scenarios])
    assert flops[test].min() >= flops[~test].max()
    assert 0.2 < test.mean() < 0.3


def test_apply_policy_replaces_unsure_picks_with_serial():
    proba = np.zeros((2, len(SCHEDULES)))
    proba[0, 3], proba[0, SERIAL_INDEX] = 0.4, 0.35
    proba[1, 3] = 0.9
    picks = apply_policy(proba, np.full((2, len(SCHEDULES)), 1.2), DecisionPolicy(min_probability=0.5))
    np.testing.assert_array_equal(picks.raw, [3, 3])
    np.testing.assert_array_equal(picks.final, [SERIAL_INDEX, 3])
    np.testing.assert_array_equal(picks.fallback, [True, False])


def test_cross_validate_needs_two_groups(table, fast_configs):
    one = table.subset(table.families == "toy-mid")
    with pytest.raises(ValueError, match="at least 2 groups"):
        cross_validate(one, configs=fast_configs, policies=(DecisionPolicy(),), seed=0, n_jobs=1)
