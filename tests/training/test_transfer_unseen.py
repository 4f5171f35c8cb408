"""A transfer test scores only the scenarios the training data does not hold."""

from __future__ import annotations

import numpy as np
import pytest

from ficco.training.evaluate import unseen


def test_transfer_leaves_out_the_training_scenarios(table):
    ids = np.unique(table.scenario_ids)
    train = table.subset(np.isin(table.scenario_ids, ids[: len(ids) // 2]))
    test, shared = unseen(table, train)
    assert not set(test.scenario_ids) & set(train.scenario_ids)
    assert set(test.scenario_ids) == set(ids[len(ids) // 2 :])
    assert shared == len(ids) // 2
    with pytest.raises(ValueError, match="every scenario of the transfer dataset"):
        unseen(train, table)
