"""Measured or simulated (training.provenance): the rule, and the registry that honours it."""

from __future__ import annotations

import pytest

from ficco.features.provenance import (
    MEASURED,
    SIMULATED,
    backend_of_id,
    model_backend,
    registry_id,
    rows_backend,
)
from ficco.training.predict import registry


def test_only_gpu_rows_are_measured():
    assert rows_backend(["gpu"]) == MEASURED
    assert rows_backend(["gpu", "sim"]) == SIMULATED  # one simulated row makes the model simulated
    assert rows_backend(["gloo"]) == SIMULATED  # CPU processes: times that mean nothing
    assert rows_backend([]) == SIMULATED


def test_a_card_says_its_backend_and_old_cards_follow_their_rows():
    assert model_backend({"model_backend": "simulated", "dataset": {"backends": ["gpu"]}}) == SIMULATED
    assert model_backend({"dataset": {"backends": ["sim"]}}) == SIMULATED
    assert model_backend({"dataset": {"backends": ["gpu"]}}) == MEASURED
    assert model_backend({}) == MEASURED  # the first models, trained on GPU sweeps, had neither field


def test_simulated_models_have_their_own_registry_id():
    assert registry_id("h200x2", SIMULATED) == "h200x2-sim"
    assert registry_id("h200x2-sim", SIMULATED) == "h200x2-sim"
    assert registry_id("h200x2-sim", MEASURED) == "h200x2"
    assert (backend_of_id("h200x2"), backend_of_id("h200x2-sim")) == (MEASURED, SIMULATED)


def _register(root, trained, hardware_id, backends):
    return registry.register(
        root, hardware_id, scorer=trained.scorer, ratio=trained.ratio, policy=trained.choice.policy,
        dataset_hash="0123456789abcdef", info={"dataset": {"backends": backends}},
    )  # fmt: skip


def test_register_refuses_a_simulated_model_under_a_measured_id(tmp_path, trained):
    with pytest.raises(ValueError, match=r"cannot register a simulated model under 'h200x2'.*'h200x2-sim'"):
        _register(tmp_path, trained, "h200x2", ["sim"])
    with pytest.raises(ValueError, match="cannot register a measured model under 'h200x2-sim'"):
        _register(tmp_path, trained, "h200x2-sim", ["gpu"])
    version = _register(tmp_path, trained, "h200x2-sim", ["sim"])
    assert registry.list_models(tmp_path)["h200x2-sim"][0]["model_backend"] == SIMULATED
    registry.promote(tmp_path, "h200x2-sim", version)
    assert registry.load_predictor(tmp_path, "h200x2-sim").backend == SIMULATED


def test_promote_refuses_a_simulated_card_under_a_measured_id(tmp_path, trained):
    """A simulated model copied by hand into a measured id's folder never becomes its current model."""
    import json
    import shutil

    measured = _register(tmp_path, trained, "h200x2", ["gpu"])
    registry.promote(tmp_path, "h200x2", measured)
    simulated = _register(tmp_path, trained, "h200x2-sim", ["sim"])
    shutil.copytree(tmp_path / "h200x2-sim" / simulated, tmp_path / "h200x2" / "99990101T000000Z-copied")
    card = tmp_path / "h200x2" / "99990101T000000Z-copied" / "card.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "version": "99990101T000000Z-copied"}))
    with pytest.raises(ValueError, match="cannot promote a simulated model under 'h200x2'"):
        registry.promote(tmp_path, "h200x2", "99990101T000000Z-copied")
    assert registry.current_version(tmp_path, "h200x2") == measured


def test_commands_name_the_hardware_not_its_sim_id(tmp_path):
    from typer.testing import CliRunner

    from ficco.cli import app

    result = CliRunner().invoke(app, ["retrain", "--hardware", "h200x2-sim", "--model-root", str(tmp_path)])
    assert result.exit_code == 2
    assert "name the hardware itself, 'h200x2' (with --backend sim" in result.output
    with pytest.raises(registry.ModelLoadError, match="`ficco retrain --backend sim --hardware h200x2`"):
        registry.load_predictor(tmp_path, "h200x2-sim")
