"""The model registry: round trip, atomic promotion, clear load errors."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from ficco.features import FEATURE_SCHEMA_VERSION
from ficco.training.predict import registry
from ficco.training.predict.policy import DecisionPolicy, ModePolicy
from ficco.training.predict.registry import (
    ModelLoadError,
    current_version,
    list_models,
    load_predictor,
    promote,
)

WHEN = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def _register(root, trained, *, when=WHEN, hardware_id="h200x2"):
    return registry.register(
        root,
        hardware_id,
        scorer=trained.scorer,
        ratio=trained.ratio,
        policy=trained.choice.policy,
        dataset_hash="0123456789abcdef",
        info={"ops": ["ag_gemm", "gemm_rs"], "modes": ["eager", "graph"], "software": {"pandas": "x"}},
        created_at=when,
    )


def test_register_and_load_round_trip(tmp_path, trained, table):
    version = _register(tmp_path, trained)
    assert version == "20261122T120000Z-01234567"
    files = sorted(p.name for p in (tmp_path / "h200x2" / version).iterdir())
    two = trained.ratio is not trained.scorer
    assert files == ["card.json", "model.ubj", *(["ratio.ubj"] if two else [])]
    predictor = load_predictor(tmp_path, "h200x2", version)
    assert predictor.version == version and predictor.hardware_id == "h200x2"
    card = predictor.card
    assert card["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert card["dataset_hash"] == "0123456789abcdef"
    assert card["objective"] == trained.scorer.objective
    assert card["ops"] == ["ag_gemm", "gemm_rs"] and card["modes"] == ["eager", "graph"]
    assert card["policy"] == trained.choice.policy.to_dict()
    assert card["created_at"] == "2026-11-22T12:00:00+00:00"
    assert {"ficco", "xgboost", "numpy", "python", "pandas"} <= set(card["software"])
    again = predictor.decide(table.X, table.modes)
    want = load_predictor(tmp_path, "h200x2", version).decide(table.X, table.modes, fast=False)
    np.testing.assert_array_equal(again.final, want.final)
    from ficco.training.fit import training_pairs

    Z = training_pairs(table)[0]
    np.testing.assert_array_equal(predictor.scorer.predict(Z), trained.scorer.predict(Z))
    np.testing.assert_array_equal(predictor.ratio.predict(Z), trained.ratio.predict(Z))


def test_register_never_overwrites_a_version(tmp_path, trained):
    first, second = _register(tmp_path, trained), _register(tmp_path, trained)
    assert second == f"{first}-2"
    assert [c["version"] for c in list_models(tmp_path)["h200x2"]] == [first, second]


def test_promote_makes_current_and_loads_by_default(tmp_path, trained):
    version = _register(tmp_path, trained)
    assert current_version(tmp_path, "h200x2") is None
    with pytest.raises(ModelLoadError, match="no current model for hardware 'h200x2'"):
        load_predictor(tmp_path, "h200x2")
    promote(tmp_path, "h200x2", version)
    assert (tmp_path / "h200x2" / "CURRENT").read_text() == version + "\n"
    assert load_predictor(tmp_path, "h200x2").version == version
    with pytest.raises(ValueError, match="no such registered version"):
        promote(tmp_path, "h200x2", "nope")


def test_registered_files_are_readable_by_other_users(tmp_path, trained):
    version = _register(tmp_path, trained)
    promote(tmp_path, "h200x2", version)
    paths = [tmp_path / "h200x2" / "CURRENT", tmp_path / "h200x2" / version]
    paths += list((tmp_path / "h200x2" / version).iterdir())
    for path in paths:
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"


def test_promote_is_atomic_when_the_rename_fails(tmp_path, trained, monkeypatch):
    old = _register(tmp_path, trained)
    new = _register(tmp_path, trained)
    promote(tmp_path, "h200x2", old)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        promote(tmp_path, "h200x2", new)
    monkeypatch.undo()
    assert current_version(tmp_path, "h200x2") == old
    assert sorted(p.name for p in (tmp_path / "h200x2").iterdir()) == sorted(["CURRENT", old, new])


def test_load_rejects_another_feature_schema_with_both_versions(tmp_path, trained):
    version = _register(tmp_path, trained)
    card_path = tmp_path / "h200x2" / version / "card.json"
    card = json.loads(card_path.read_text())
    card["feature_schema_version"] = "fv0"
    card_path.write_text(json.dumps(card))
    with pytest.raises(ModelLoadError) as err:
        load_predictor(tmp_path, "h200x2", version)
    message = str(err.value)
    assert "'fv0'" in message and repr(FEATURE_SCHEMA_VERSION) in message
    assert "ficco train --dataset" in message and "ficco retrain --hardware h200x2" in message


def test_load_rejects_a_corrupt_model_file(tmp_path, trained):
    version = _register(tmp_path, trained)
    (tmp_path / "h200x2" / version / "model.ubj").write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=f"model h200x2/{version} under .* is corrupt"):
        load_predictor(tmp_path, "h200x2", version)


def test_load_rejects_files_that_do_not_belong_together(tmp_path, trained):
    version = _register(tmp_path, trained)
    card_path = tmp_path / "h200x2" / version / "card.json"
    card = json.loads(card_path.read_text())
    card["objective"] = "rank" if card["objective"] == "ratio" else "ratio"
    card_path.write_text(json.dumps(card))
    with pytest.raises(ModelLoadError, match="do not belong"):
        load_predictor(tmp_path, "h200x2", version)


def test_load_rejects_a_corrupt_card(tmp_path, trained):
    version = _register(tmp_path, trained)
    (tmp_path / "h200x2" / version / "card.json").write_text("{")
    with pytest.raises(ModelLoadError, match=r"card .* is corrupt"):
        load_predictor(tmp_path, "h200x2", version)
    assert "error" in list_models(tmp_path)["h200x2"][0]


def test_load_missing_model_says_how_to_get_one(tmp_path, trained):
    _register(tmp_path, trained)
    with pytest.raises(ModelLoadError, match=r"no model for hardware 'h100x8'.*\['h200x2'\].*ficco train"):
        load_predictor(tmp_path, "h100x8")
    with pytest.raises(ModelLoadError, match="no model h200x2/missing"):
        load_predictor(tmp_path, "h200x2", "missing")


def test_default_model_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FICCO_MODEL_ROOT", str(tmp_path))
    assert registry.default_model_root() == tmp_path
    monkeypatch.delenv("FICCO_MODEL_ROOT")
    assert registry.default_model_root().name == "models"


SHIPPED = Path(__file__).resolve().parents[2] / "models"


def shipped_versions(schema: str) -> list[str]:
    """The repository's registered h200x2 versions of feature schema ``schema``."""
    cards = sorted((SHIPPED / "h200x2").glob("*/card.json"))
    return [c.parent.name for c in cards if json.loads(c.read_text())["feature_schema_version"] == schema]


def test_fv2_models_still_load_and_build_fv2_pairs(table):
    from ficco.training.model import PAIR_FEATURE_NAMES_OF

    versions = shipped_versions("fv2")
    assert versions, "the repository holds no fv2 model any more: drop fv2 from features.FEATURE_SCHEMAS"
    for version in versions:
        predictor = load_predictor(SHIPPED, "h200x2", version)
        assert predictor.feature_schema == predictor.card["feature_schema_version"] == "fv2"
        assert predictor.scorer.n_features_in_ == len(PAIR_FEATURE_NAMES_OF["fv2"])
        decision = predictor.decide(table.X, table.modes, fast=False)
        assert np.isfinite(decision.speedup).all()
        # its card's policy predates the per-mode one: one threshold for both modes, and the noise band
        card = predictor.card
        bands = {mode: card["metrics"]["modes"][mode]["family_holdout"]["ceiling"]["geomean_regret"]
                 for mode in ("eager", "graph")}  # fmt: skip
        assert predictor.policy == ModePolicy.uniform(DecisionPolicy(**card["policy"])).with_bands(bands)


def test_load_rejects_a_card_whose_schema_is_not_its_files(tmp_path, trained):
    version = _register(tmp_path, trained)
    card_path = tmp_path / "h200x2" / version / "card.json"
    card = json.loads(card_path.read_text())
    assert card["feature_schema_version"] == FEATURE_SCHEMA_VERSION == trained.scorer.feature_schema_
    assert card["pair_feature_names"][-1] == "eager_host_over_gpu"
    card["feature_schema_version"] = "fv2"
    card_path.write_text(json.dumps(card))
    files = f"says feature schema 'fv2' but its model files were trained on '{FEATURE_SCHEMA_VERSION}'"
    with pytest.raises(ModelLoadError, match=files):
        load_predictor(tmp_path, "h200x2", version)
