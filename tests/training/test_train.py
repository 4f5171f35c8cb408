"""Training the shipped model: determinism."""

from __future__ import annotations

import pytest

from ficco.training.train import train_model


@pytest.mark.heavy
def test_train_model_is_deterministic(table, trained, fast_configs, fast_policies):
    again = train_model(table, configs=fast_configs, policies=fast_policies)
    assert again.scorer.booster_.save_raw("ubj") == trained.scorer.booster_.save_raw("ubj")
    assert again.ratio.booster_.save_raw("ubj") == trained.ratio.booster_.save_raw("ubj")
    assert again.evaluation.summary == trained.evaluation.summary
    assert again.choice == trained.choice
