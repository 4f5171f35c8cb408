"""The estimators: the scikit-learn contract, masking of invalid schedules, UBJ persistence."""

from __future__ import annotations

import numpy as np
import pytest
from ficco.features import FEATURE_SCHEMA_VERSION, Scenario, candidates, feature_matrix, get_hardware
from ficco.training._params import NotFittedError
from ficco.training.model import (
    SCHEDULES,
    FeatureSchemaError,
    ScheduleClassifier,
    SpeedupRegressor,
    valid_mask,
)


def _scenarios() -> list[Scenario]:
    """Scenarios whose split rows are divisible by w*8, w*4, w*2 and only w (and MoE ones)."""
    hw = get_hardware("h200x8")
    out = []
    for w in (2, 4, 8):
        for m in (w * 8 * 64, w * 4 * 3, w * 2 * 5, w * 7, w):
            for op in ("ag_gemm", "gemm_rs"):
                out.append(Scenario(op=op, m=m, n=1024, k=512, world_size=w, hardware=hw))
        out.append(
            Scenario(op="a2a_gemm", m=3 * w, n=256, k=512, world_size=w, hardware=hw, experts=w, top_k=1)
        )
        out.append(
            Scenario(op="gemm_a2a", m=w, n=256, k=512, world_size=w, hardware=hw, experts=8 * w, top_k=3)
        )
    return out


@pytest.fixture(scope="module")
def data(table):
    return table.X, list(table.labels)


def test_valid_mask_matches_candidates():
    scenarios = _scenarios()
    mask = valid_mask(feature_matrix(scenarios))
    for scenario, row in zip(scenarios, mask, strict=True):
        expected = {str(s) for s in candidates(scenario)}
        assert {SCHEDULES[j] for j in np.flatnonzero(row)} == expected, scenario.key()


@pytest.mark.parametrize("estimator", [ScheduleClassifier(), SpeedupRegressor()])
def test_predict_unfitted_raises(estimator):
    X = feature_matrix([Scenario()])
    with pytest.raises(NotFittedError, match="not fitted yet"):
        if isinstance(estimator, SpeedupRegressor):
            estimator.predict(X, ["serial/sm"])
        else:
            estimator.predict(X)


def test_init_only_stores_and_fit_validates(data):
    X, y = data
    clf = ScheduleClassifier(max_depth=0)  # no error yet: __init__ only stores
    assert clf.get_params()["max_depth"] == 0
    with pytest.raises(ValueError) as err:
        clf.fit(X, y)
    assert str(err.value) == (
        "The 'max_depth' parameter of ScheduleClassifier must be an int in the range [1, 16]. Got 0 instead."
    )
    with pytest.raises(ValueError, match=r"'learning_rate' parameter .* range \(0, 1\]\. Got 1\.5"):
        ScheduleClassifier(learning_rate=1.5).fit(X, y)


def test_fit_returns_self_and_learns_classes(data):
    X, y = data
    clf = ScheduleClassifier(n_estimators=10)
    assert clf.fit(X, y) is clf
    assert set(clf.classes_) == set(y) | {"serial/sm"}
    assert list(clf.classes_) == sorted(clf.classes_, key=SCHEDULES.index)
    assert clf.predict_proba(X).shape == (len(X), len(clf.classes_))


def test_fit_is_deterministic(data):
    X, y = data
    first = ScheduleClassifier(n_estimators=20, random_state=3).fit(X, y).save_raw()
    second = ScheduleClassifier(n_estimators=20, random_state=3).fit(X, y).save_raw()
    assert first == second


def test_predict_proba_masks_invalid_schedules():
    hw = get_hardware("h200x2")
    train = [Scenario(m=2 * 8 * (i + 1) * 128, n=4096, k=4096, hardware=hw) for i in range(40)]
    clf = ScheduleClassifier(n_estimators=10).fit(feature_matrix(train), ["finer/dma/s8/chunk"] * 40)
    odd = Scenario(m=2 * 3 * 1024 + 2, n=4096, k=4096, hardware=hw)  # rows / w is odd: no finer split runs
    proba = clf.predict_proba(feature_matrix([odd]))
    assert proba[0, clf.classes_.index("finer/dma/s8/chunk")] == 0.0
    assert proba.sum() == pytest.approx(1.0)
    assert clf.predict(feature_matrix([odd]))[0] == "serial/sm"
    assert clf.predict(feature_matrix(train[:1]))[0] == "finer/dma/s8/chunk"


def test_predict_never_returns_a_class_absent_in_training(data):
    X, y = data
    clf = ScheduleClassifier(n_estimators=10).fit(X, y)
    assert set(clf.predict(X)) <= set(y) | {"serial/sm"}


def test_fit_rejects_one_class_and_unknown_labels(data):
    X, _ = data
    with pytest.raises(ValueError, match="at least 2 classes; got 1 class \\('serial/sm'\\)"):
        ScheduleClassifier().fit(X, ["serial/sm"] * len(X))
    with pytest.raises(ValueError, match="unknown schedule 'shard/tpu'"):
        ScheduleClassifier().fit(X[:2], ["serial/sm", "shard/tpu"])
    with pytest.raises(ValueError, match="X must be a 2-D array with"):
        ScheduleClassifier().fit(X[:, :5], ["serial/sm"] * len(X))


def test_save_load_round_trip(tmp_path, data):
    X, y = data
    clf = ScheduleClassifier(n_estimators=15, max_depth=3).fit(X, y)
    clf.save_model(tmp_path / "m.ubj")
    loaded = ScheduleClassifier.load_model(tmp_path / "m.ubj")
    assert loaded.get_params() == clf.get_params()
    assert loaded.classes_ == clf.classes_
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))
    with pytest.raises(ValueError, match="not a SpeedupRegressor"):
        SpeedupRegressor.load_model(tmp_path / "m.ubj")


def test_load_model_rejects_other_feature_schema(tmp_path, data):
    X, y = data
    clf = ScheduleClassifier(n_estimators=5).fit(X, y)
    clf.booster_.set_attr(ficco_feature_schema="fv0")
    clf.save_model(tmp_path / "old.ubj")
    with pytest.raises(FeatureSchemaError) as err:
        ScheduleClassifier.load_model(tmp_path / "old.ubj")
    assert "'fv0'" in str(err.value) and repr(FEATURE_SCHEMA_VERSION) in str(err.value)


def test_regressor_learns_speedups_and_serial_is_one(table):
    rows, cols = np.nonzero(np.isfinite(table.times_ms))
    speedup = table.serial_ms[rows] / table.times_ms[rows, cols]
    schedules = [SCHEDULES[c] for c in cols]
    reg = SpeedupRegressor(n_estimators=60).fit(table.X[rows], speedup, schedules)
    predicted = reg.predict(table.X[rows], schedules)
    assert np.all(predicted[np.array(schedules) == "serial/sm"] == 1.0)
    assert np.corrcoef(np.log(predicted), np.log(speedup))[0, 1] > 0.9
