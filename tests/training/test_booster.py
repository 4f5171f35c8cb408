"""Answering without XGBoost: the shipped model read with numpy (training/predict/booster.py) decides as the
XGBoost model does, on the fast path and on a batch large enough for the reference path."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import xgboost as xgb

from ficco.features import Scenario, feature_matrix
from ficco.files import SHIPPED_MODELS
from ficco.training.model import PairModel
from ficco.training.predict import booster as booster_module
from ficco.training.predict.booster import NumpyBooster, SavedPairModel, read_ubjson
from ficco.training.predict.registry import current_version, load_predictor

CURRENT = SHIPPED_MODELS / "h200x2" / str(current_version(SHIPPED_MODELS, "h200x2"))


def _scenarios(count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    ops = rng.choice(["ag_gemm", "gemm_rs"], count)
    return feature_matrix(
        [
            Scenario(op=str(op), m=2 * int(m), n=128 * int(n), k=128 * int(k))
            for op, m, n, k in zip(
                ops, rng.integers(64, 32769, count), rng.integers(1, 225, count), rng.integers(1, 225, count),
                strict=True,
            )
        ]
    )  # fmt: skip


def _load_without(module: str):
    """The shipped current model, loaded as if ``module`` were not installed."""
    with pytest.MonkeyPatch.context() as patch:
        find_spec = importlib.util.find_spec
        patch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == module else find_spec(n, *a))
        return load_predictor(SHIPPED_MODELS, "h200x2")


@pytest.fixture(scope="module")
def both():
    """The shipped current model loaded with XGBoost, and with numpy alone."""
    return load_predictor(SHIPPED_MODELS, "h200x2"), _load_without("xgboost")


def test_ubjson_reads_the_document_xgboost_writes():
    for name in ("model.ubj", "ratio.ubj"):
        booster = xgb.Booster()
        booster.load_model(str(CURRENT / name))
        assert read_ubjson((CURRENT / name).read_bytes()) == json.loads(bytes(booster.save_raw("json")))


def test_without_xgboost_the_registry_gives_numpy_models(both):
    with_xgboost, numpy_only = both
    assert isinstance(with_xgboost.scorer, PairModel)
    assert isinstance(numpy_only.scorer, SavedPairModel) and isinstance(numpy_only.ratio, SavedPairModel)
    assert numpy_only.scorer.objective == with_xgboost.scorer.objective
    assert numpy_only.feature_schema == with_xgboost.feature_schema


@pytest.mark.parametrize("count", [1, 40])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_numpy_model_decides_as_xgboost_on_the_fast_path(both, mode, count):
    X = _scenarios(count)
    a, b = (p.decide(X, [mode] * count, fast=True) for p in both)
    np.testing.assert_array_equal(a.final, b.final)
    np.testing.assert_array_equal(a.fallback, b.fallback)
    np.testing.assert_allclose(a.speedups, b.speedups, rtol=1e-9)


def test_numpy_model_walks_every_tree_like_xgboost(both):
    with_xgboost, numpy_only = both
    X = _scenarios(300)
    reference = with_xgboost.decide(X, ["eager"] * len(X), fast=False)
    walked = numpy_only.decide(X, ["eager"] * len(X), fast=False)  # NumpyBooster.inplace_predict
    np.testing.assert_array_equal(reference.final, walked.final)  # both add in float32, in tree order
    np.testing.assert_array_equal(reference.speedups, walked.speedups)


def test_numpy_model_takes_the_fast_path_for_a_large_batch(both, monkeypatch):
    with_xgboost, numpy_only = both
    X = _scenarios(50)
    monkeypatch.setattr(
        "ficco.training.predict.predictor.FAST_PATH_MAX_NODES", 0
    )  # XGBoost would take its own
    monkeypatch.setattr("ficco.training.predict.fastpath.CHUNK_CURSORS", 1)  # one row at a time
    chunked = numpy_only.decide(X, ["graph"] * len(X))
    whole = with_xgboost.decide(X, ["graph"] * len(X), fast=True)
    np.testing.assert_array_equal(chunked.final, whole.final)
    np.testing.assert_allclose(chunked.speedups, whole.speedups, rtol=1e-9)


def test_malformed_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="UBJSON"):
        read_ubjson(b"{L")
    with pytest.raises(ValueError, match="unknown UBJSON marker"):
        read_ubjson(b"q")
    data = (CURRENT / "model.ubj").read_bytes()
    (tmp_path / "cut.ubj").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError):
        NumpyBooster.load(tmp_path / "cut.ubj")
    (tmp_path / "other.ubj").write_bytes(data.replace(b"PairModel", b"OtherOne1"))
    with pytest.raises(ValueError, match="OtherOne1 model, not a PairModel"):
        SavedPairModel(NumpyBooster.load(tmp_path / "other.ubj"), "other.ubj")
    assert booster_module.load_pair_model(CURRENT / "model.ubj").objective


def test_without_scikit_learn_xgboost_still_predicts_the_large_batches(both):
    """``ficco[service]``: XGBoost without scikit-learn; the same answers as the trained PairModel's."""
    with_xgboost, _ = both
    service = _load_without("sklearn")
    assert isinstance(service.scorer, SavedPairModel) and isinstance(service.scorer.booster_, xgb.Booster)
    X = _scenarios(200)
    for fast in (True, False):
        a, b = (p.decide(X, ["eager"] * len(X), fast=fast) for p in (with_xgboost, service))
        np.testing.assert_array_equal(a.final, b.final)
        np.testing.assert_array_equal(a.speedups, b.speedups)
