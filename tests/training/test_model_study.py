"""benchmarks/model_study.py: the aligned folds, the family bootstrap and the per-mode fallback margins."""

from __future__ import annotations

import numpy as np

from benchmarks import model_study as study
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
