"""Training pairs."""

from __future__ import annotations

import numpy as np

from ficco.training.fit import training_pairs
from ficco.training.model import PAIR_FEATURE_NAMES


def test_training_pairs_are_every_measured_pair_sorted_by_query(table):
    Z, y, qid = training_pairs(table)
    assert len(Z) == int(np.isfinite(table.times_ms).sum())
    assert np.all(np.diff(qid) >= 0)
    column = PAIR_FEATURE_NAMES.index
    serial = Z[:, column("sched_serial")] == 1
    sm = Z[:, column("sched_dma")] == 0
    np.testing.assert_allclose(y[serial & sm], 0.0)  # serial/sm: log(t_serial / t_serial)
