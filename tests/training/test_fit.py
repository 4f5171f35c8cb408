"""Training pairs."""

from __future__ import annotations

import numpy as np

from ficco.training.fit import training_pairs


def test_training_pairs_are_every_measured_pair_sorted_by_query(table):
    Z, y, qid = training_pairs(table)
    assert len(Z) == int(np.isfinite(table.times_ms).sum())
    assert np.all(np.diff(qid) >= 0)
    serial = Z[:, -8] == 1  # sched_serial
    np.testing.assert_allclose(y[serial & (Z[:, -5] == 0)], 0.0)  # serial/sm: log(t_serial / t_serial)
