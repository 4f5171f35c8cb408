"""benchmarks.studies.model_study: the aligned folds, the family bootstrap, per-mode fallback margins."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.studies import model_study as study
from ficco.training.crossval import cv_folds, cv_groups
from ficco.training.model import SERIAL_INDEX


def test_aligned_folds_keep_reference_and_spread_new_groups():
    groups = np.array(["a", "a", "b", "c", "x", "y", "y", "z"])
    folds = study.aligned_folds(groups, {"a": 0, "b": 1, "c": 1})
    assert folds[:4].tolist() == [0, 0, 1, 1]
    assert folds[5] == folds[6]  # a new group is never split
    assert set(folds[4:].tolist()) <= {0, 1}
    assert len({folds[4], folds[5], folds[7]}) == 2  # spread over both reference folds


def test_family_bootstrap_interval_covers_a_shift_and_resamples_whole_groups():
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 5)
    shift = study.family_bootstrap(groups, np.full(20, 0.01))
    assert np.isclose(shift["mean"], 0.01) and np.allclose(shift["ci95"], 0.01)
    # one group far off: resampling groups (not rows) makes the interval wide
    wild = study.family_bootstrap(groups, np.where(groups == "a", 1.0, 0.0))
    assert wild["ci95"][0] == 0.0 and wild["ci95"][1] >= 0.5


def test_margin_picks_fall_back_only_below_the_margin_chosen_on_other_folds(table):
    folds = cv_folds(cv_groups(table))
    raw = np.nanargmin(table.times_ms, axis=1)  # the oracle: never worth a fallback
    raw[raw == SERIAL_INDEX] = 1  # ... except where serial/sm is best
    signal = np.where(np.nanargmin(table.times_ms, axis=1) == SERIAL_INDEX, -1.0, 1.0)
    picks = study.margin_picks(table, folds, raw, signal, (-np.inf, 0.0))
    assert np.array_equal(picks, np.nanargmin(table.times_ms, axis=1))
    never = study.margin_picks(table, folds, raw, -signal, (-np.inf, 0.0))
    assert np.array_equal(never, raw)  # falling back where the pick is best never wins on the other folds


def test_margin_options_replace_the_pick_below_each_margin():
    raw, target = np.array([3, 4, 5]), np.array([0, 0, 9])
    options = study.margin_options(raw, np.array([-0.1, 0.02, 0.5]), target, (-np.inf, 0.0, 0.05))
    assert options.tolist() == [[3, 4, 5], [0, 4, 5], [0, 0, 5]]


def test_select_options_chooses_per_mode_on_the_other_folds(table):
    folds = cv_folds(cv_groups(table))
    oracle = np.nanargmin(table.times_ms, axis=1)
    serial = np.full(len(table), SERIAL_INDEX)
    eager = table.modes == "eager"
    # option 0 is the oracle in eager mode only, option 1 in graph mode only
    options = np.stack([np.where(eager, oracle, serial), np.where(eager, serial, oracle)])
    picks, chosen = study.select_options(table, folds, options)
    assert np.array_equal(picks, oracle)
    assert chosen["eager"]["all"] == 0 and chosen["graph"]["all"] == 1
    assert set(chosen["eager"]["folds"]) == {0} and len(chosen["eager"]["folds"]) == len(set(folds.tolist()))


def _predictions(n: int, n_schedules: int = 4) -> dict[str, np.ndarray]:
    """Section 3's predictions for ``n`` rows: every model picks column 2, predicted 10% faster than serial
    by the regressor and the bags on row 0; on row 1 one bag predicts it 30% slower (the ensemble's mean
    still predicts a gain, its lower bound at z = 2 does not)."""
    cost = np.tile(np.arange(n_schedules, dtype=np.float64), (n, 1))
    cost[:, 2] = -1.0
    log_ratio = np.full((n, n_schedules), np.log(1 / 1.1))
    bags = np.repeat(log_ratio[None], study.BAGS, axis=0)
    bags[0, 1, 2] = np.log(1 / 0.7)
    heuristic = np.full(n, 3)
    return {"rank": cost, "log_ratio": log_ratio, "bags": bags, "regularised": cost, "per_mode": cost,
            "heuristic": heuristic, "modes": np.full(n, "graph", dtype=object)}  # fmt: skip


def test_candidate_options_fall_back_only_where_the_bags_disagree():
    options = study.candidate_options(_predictions(2))
    assert list(options) == list(study.CANDIDATES)
    picks, labels = options["current"]
    assert len(picks) == len(labels) and np.all(picks == 2)  # the regressor alone: 10% gain, no fallback
    for name, target in (
        ("uncertainty_fallback_serial", SERIAL_INDEX),
        ("uncertainty_fallback_heuristic", 3),
    ):
        picks, labels = options[name]
        wide = labels.index("z=2.0,min_gain=0.0")
        assert picks[wide].tolist() == [2, target]  # the lower bound is below serial on row 1 only
        assert picks[labels.index("z=0.0,min_gain=0.0")].tolist() == [2, 2]  # the mean alone: no fallback


@pytest.mark.heavy
def test_generalization_study_current_reproduces_cross_validation(table, fast_configs):
    from ficco.training.crossval import cross_validate

    rank = next(c for c in fast_configs if c.objective == "rank")
    out = study.generalization_study(table, rank, n_jobs=1)
    cv = cross_validate(table, configs=(rank,))
    assert out["family_holdout"]["current"]["dense"] == study.mode_metrics(table, cv.final)
    assert set(out["family_holdout"]) == set(out["region_holdout"]) == set(study.CANDIDATES)
    assert set(out["against_current"]) == set(study.CANDIDATES[1:])


def test_fit_on_one_table_is_the_shipped_fit_and_each_table_keeps_its_host_factor(table, fast_configs):
    import dataclasses

    from ficco.training.fit import fit_pair_model
    from ficco.training.model import pair_costs

    rank = next(c for c in fast_configs if c.objective == "rank")
    alone = study.fit_on([table], rank, n_jobs=1)
    shipped = fit_pair_model(table, rank, seed=0, n_jobs=1)
    np.testing.assert_array_equal(
        pair_costs(alone, table.X, table.modes), pair_costs(shipped, table.X, table.modes)
    )
    slow_host = dataclasses.replace(table, host_factors=4 * table.host_factors)
    both = study.fit_on([table, slow_host], rank, n_jobs=1)
    doubled = study.fit_on([table, table], rank, n_jobs=1)
    assert not np.array_equal(
        pair_costs(both, table.X, table.modes), pair_costs(doubled, table.X, table.modes)
    )
