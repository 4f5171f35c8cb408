"""Training pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ficco.training.fit import RATIO_CONFIG, fit_pair_model, training_pairs
from ficco.training.model import PAIR_FEATURE_NAMES


def test_training_pairs_are_every_measured_pair_sorted_by_query(table):
    Z, y, qid = training_pairs(table)
    assert len(Z) == int(np.isfinite(table.times_ms).sum())
    assert np.all(np.diff(qid) >= 0)
    column = PAIR_FEATURE_NAMES.index
    serial = Z[:, column("sched_serial")] == 1
    sm = Z[:, column("sched_dma")] == 0
    np.testing.assert_allclose(y[serial & sm], 0.0)  # serial/sm: log(t_serial / t_serial)


def split_columns(model) -> set[int]:
    """The pair columns any tree of ``model`` splits on."""
    trees = json.loads(bytes(model.booster_.save_raw("json")))["learner"]["gradient_booster"]["model"]
    return {
        column
        for tree in trees["trees"]
        for column, left in zip(tree["split_indices"], tree["left_children"], strict=True)
        if left >= 0
    }


def test_a_masked_column_is_never_split_on(table):
    host = PAIR_FEATURE_NAMES.index("eager_host_over_gpu")
    assert host in split_columns(fit_pair_model(table, RATIO_CONFIG, seed=0, n_jobs=1))
    masked = fit_pair_model(table, RATIO_CONFIG, seed=0, n_jobs=1, masked=("eager_host_over_gpu",))
    assert host not in split_columns(masked)
    with pytest.raises(ValueError, match=r"masked must name pair columns .*; got \['no_such_column'\]"):
        fit_pair_model(table, RATIO_CONFIG, seed=0, n_jobs=1, masked=("no_such_column",))
