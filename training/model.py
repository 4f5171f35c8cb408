"""XGBoost estimators over the feature vector: the schedule classifier and the speedup regressor.

Both keep the scikit-learn estimator contract (``__init__`` only stores keyword arguments, ``fit``
returns ``self``, learned state ends in ``_``, predicting before ``fit`` raises :class:`NotFittedError`)
and save to XGBoost's own UBJSON format, never pickle. A saved booster carries its class list, its
parameters and the feature-schema version as booster attributes, so a model file describes itself.

>>> from features import Scenario, feature_matrix
>>> X = feature_matrix([Scenario(m=2**i) for i in range(10, 17)])
>>> y = ["serial/sm"] * 3 + ["finer/dma/s4/chunk"] * 4
>>> clf = ScheduleClassifier(n_estimators=20, min_child_weight=0.1).fit(X, y)
>>> clf.predict(X[[0, -1]]).tolist()
['serial/sm', 'finer/dma/s4/chunk']
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from os import PathLike
from typing import Any, ClassVar

import numpy as np
from ficco.features import FEATURE_NAMES, FEATURE_SCHEMA_VERSION, SERIAL, Schedule, all_schedules
from ficco.training._params import Interval, check_is_fitted, validate_params

SCHEDULES: tuple[str, ...] = tuple(str(s) for s in all_schedules())
"""Every schedule string in canonical order (serial/sm first): the column order of schedule arrays."""
SCHEDULE_INDEX: dict[str, int] = {s: i for i, s in enumerate(SCHEDULES)}
SERIAL_INDEX = SCHEDULE_INDEX[str(SERIAL)]

_MAX_FINER_SPLITS = FEATURE_NAMES.index("max_finer_splits")
_SPLITS = np.array([Schedule.parse(s).splits for s in SCHEDULES])
_DESCRIPTOR_NAMES = ("sched_serial", "sched_shard", "sched_finer", "sched_dma", "sched_log2_splits",
                     "sched_chunk_grain", "sched_high_priority")  # fmt: skip


def _descriptor(schedule: Schedule) -> list[float]:
    """The regressor's view of a schedule: one row of ``_DESCRIPTOR_NAMES``."""
    return [
        float(schedule.granularity == "serial"),
        float(schedule.granularity == "shard"),
        float(schedule.granularity == "finer"),
        float(schedule.executor == "dma"),
        float(np.log2(schedule.splits)),
        float(schedule.grain == "chunk"),
        float(schedule.priority == "high"),
    ]


_DESCRIPTORS = np.array([_descriptor(Schedule.parse(s)) for s in SCHEDULES])


class FeatureSchemaError(ValueError):
    """A model was trained on a feature schema other than the one this code computes."""


def check_feature_schema(found: str, source: str, *, hardware_id: str | None = None) -> None:
    """Raise :class:`FeatureSchemaError` naming both versions and the command that rebuilds the model."""
    if found != FEATURE_SCHEMA_VERSION:
        hw = hardware_id or "<hardware_id>"
        raise FeatureSchemaError(
            f"{source} was trained on feature schema {found!r}, but this code computes feature schema "
            f"{FEATURE_SCHEMA_VERSION!r}; its predictions would be meaningless. Rebuild it from its dataset "
            f"with `ficco train --dataset DIR --promote`, or measure afresh with "
            f"`ficco retrain --hardware {hw}`."
        )


def schedule_indices(schedules: Sequence[str]) -> np.ndarray:
    """Canonical column index of each schedule string, int ``[len(schedules)]``; ValueError if unknown."""
    out = np.empty(len(schedules), dtype=np.int64)
    for i, text in enumerate(schedules):
        index = SCHEDULE_INDEX.get(text)
        if index is None:
            Schedule.parse(text)  # raises the error naming the string and the allowed forms
            raise ValueError(f"schedule {text!r} is not in the design space {list(SCHEDULES)}")
        out[i] = index
    return out


def valid_mask(X: np.ndarray, schedules: Sequence[str] = SCHEDULES) -> np.ndarray:
    """Which of ``schedules`` can run each scenario, from its features: bool ``[n, len(schedules)]``.

    A schedule needs the split rows divisible by ``world_size * splits`` (:meth:`Schedule.check`).
    Serial and shard (splits 1) always run; the finer splits 2, 4, 8 divide one another, so ``finer/sN``
    runs exactly when ``N <= max_finer_splits``. ``tests/training/test_model.py`` checks this against
    :func:`features.candidates`.
    """
    splits = _SPLITS[schedule_indices(schedules)]
    return splits[None, :] <= _check_X(X)[:, _MAX_FINER_SPLITS, None]


def _check_X(X: Any) -> np.ndarray:
    """``X`` as float64 ``[n, len(FEATURE_NAMES)]``; ValueError naming the expected and found shape."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
        raise ValueError(
            f"X must be a 2-D array with {len(FEATURE_NAMES)} columns (features.FEATURE_NAMES, schema "
            f"{FEATURE_SCHEMA_VERSION}); got shape {X.shape}"
        )
    return X


class _XGBEstimator:
    """Shared parameters, booster construction and UBJ persistence of the two estimators."""

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "n_estimators": [Interval("int", 1, 5000)],
        "max_depth": [Interval("int", 1, 16)],
        "learning_rate": [Interval("float", 0.0, 1.0, closed="right")],
        "min_child_weight": [Interval("float", 0.0, None)],
        "reg_lambda": [Interval("float", 0.0, None)],
        "random_state": [Interval("int", 0, 2**31 - 1)],
        "n_jobs": [Interval("int", 1, 256)],
    }
    _objective: ClassVar[str]

    def __init__(
        self,
        *,
        n_estimators: int = 200,
        max_depth: int = 4,
        learning_rate: float = 0.1,
        min_child_weight: float = 1.0,
        reg_lambda: float = 1.0,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.random_state = random_state
        self.n_jobs = n_jobs

    def get_params(self) -> dict[str, Any]:
        """The constructor arguments, by name."""
        return {name: getattr(self, name) for name in self._parameter_constraints}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _train(self, data: Any, extra: dict[str, Any], attributes: dict[str, str]) -> Any:
        """Train a booster on an ``xgboost.DMatrix``; deterministic for a fixed seed and thread count."""
        import xgboost as xgb

        params = {
            "objective": self._objective,
            "tree_method": "hist",
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "seed": self.random_state,
            "nthread": self.n_jobs,
            "verbosity": 0,
            **extra,
        }
        booster = xgb.train(params, data, num_boost_round=self.n_estimators)
        booster.set_attr(
            ficco_estimator=type(self).__name__,
            ficco_params=json.dumps(self.get_params(), sort_keys=True),
            ficco_feature_schema=FEATURE_SCHEMA_VERSION,
            **attributes,
        )
        return booster

    def save_model(self, path: str | PathLike) -> None:
        """Write the fitted booster (with its attributes) in XGBoost's format; ``.ubj`` gives UBJSON."""
        check_is_fitted(self)
        self.booster_.save_model(str(path))

    def save_raw(self) -> bytes:
        """The fitted booster as UBJSON bytes (what :meth:`save_model` writes to a ``.ubj`` file)."""
        check_is_fitted(self)
        return bytes(self.booster_.save_raw("ubj"))

    @classmethod
    def load_model(cls, path: str | PathLike) -> Any:
        """Read a file written by :meth:`save_model`; its parameters and learned state come back.

        Raises ``xgboost.core.XGBoostError`` for a file XGBoost cannot parse, :class:`FeatureSchemaError`
        for another feature schema, and ``ValueError`` for a model of another estimator.
        """
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(str(path))
        kind = booster.attr("ficco_estimator")
        if kind != cls.__name__:
            raise ValueError(f"{path} holds a {kind or 'foreign XGBoost'} model, not a {cls.__name__}")
        check_feature_schema(booster.attr("ficco_feature_schema") or "<none>", str(path))
        estimator = cls(**json.loads(booster.attr("ficco_params")))
        estimator._restore(booster)
        return estimator

    def _restore(self, booster: Any) -> None:
        self.booster_ = booster


class ScheduleClassifier(_XGBEstimator):
    """Multi-class XGBoost (``multi:softprob``, hist) from the feature vector to the best schedule.

    Classes are the schedule strings seen in ``y`` plus ``serial/sm`` (always a valid, safe choice);
    schedules never seen in training are never predicted. Probabilities are masked to the schedules
    valid for each scenario (:func:`valid_mask`) and renormalised.

    Parameters
    ----------
    n_estimators : int, default=200
        Boosting rounds (each grows one tree per class).
    max_depth : int, default=4
        Depth of each tree.
    learning_rate : float, default=0.1
        Shrinkage (XGBoost ``eta``).
    min_child_weight : float, default=1.0
        Least summed hessian (sample weight) in a leaf.
    reg_lambda : float, default=1.0
        L2 penalty on leaf values.
    random_state : int, default=0
        XGBoost seed.
    n_jobs : int, default=1
        Threads. Fixed, so that results do not depend on the machine; one is fastest for the few hundred
        scenarios of a dataset (two threads on a busy 2-core machine ran 4x slower, spin-waiting).

    Attributes
    ----------
    classes_ : tuple of str
        Schedule strings in canonical order; column order of :meth:`predict_proba`.
    booster_ : xgboost.Booster
        The fitted booster.
    """

    _objective = "multi:softprob"

    def fit(self, X: Any, y: Sequence[str], sample_weight: Any = None) -> ScheduleClassifier:
        """Learn from features ``X`` ``[n, n_features]`` and best-schedule strings ``y`` ``[n]``."""
        import xgboost as xgb

        validate_params(self)
        X = _check_X(X)
        y = list(y)
        if len(y) != len(X):
            raise ValueError(f"y must have one label per row of X ({len(X)}); got {len(y)}")
        codes = schedule_indices(y)
        classes = np.union1d(codes, [SERIAL_INDEX])
        if len(classes) < 2:
            raise ValueError(
                f"ScheduleClassifier needs at least 2 classes; got 1 class ({SCHEDULES[classes[0]]!r}): "
                "every training scenario has the same best schedule, so there is nothing to learn"
            )
        weight = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if weight is not None and (weight.shape != (len(X),) or not np.all(weight >= 0)):
            raise ValueError(f"sample_weight must be {len(X)} non-negative numbers; got shape {weight.shape}")
        self.classes_ = tuple(SCHEDULES[c] for c in classes)
        data = xgb.DMatrix(
            X, label=np.searchsorted(classes, codes), weight=weight, feature_names=list(FEATURE_NAMES)
        )
        self.booster_ = self._train(
            data, {"num_class": len(classes)}, {"ficco_classes": json.dumps(self.classes_)}
        )
        return self

    def _restore(self, booster: Any) -> None:
        super()._restore(booster)
        self.classes_ = tuple(json.loads(booster.attr("ficco_classes")))

    def predict_proba(self, X: Any) -> np.ndarray:
        """Probabilities over ``classes_`` (0 where a schedule cannot run), float64 ``[n, n_classes]``."""
        check_is_fitted(self)
        X = _check_X(X)
        if len(X) == 0:
            return np.empty((0, len(self.classes_)))
        proba = np.asarray(self.booster_.inplace_predict(X), dtype=np.float64).reshape(len(X), -1)
        proba *= valid_mask(X, self.classes_)
        total = proba.sum(axis=1, keepdims=True)
        # serial/sm is a class and always valid; an all-zero row only comes from float underflow
        empty = total[:, 0] <= 0
        proba[empty, self.classes_.index(str(SERIAL))] = 1.0
        total[empty] = 1.0
        return proba / total

    def predict(self, X: Any) -> np.ndarray:
        """The most probable valid schedule of each scenario: str array ``[n]`` (ties: canonical order)."""
        proba = self.predict_proba(X)
        return np.asarray(self.classes_, dtype=object)[proba.argmax(axis=1)]


class SpeedupRegressor(_XGBEstimator):
    """XGBoost regression of a schedule's speedup over serial, ``t_serial / t_schedule``, for a scenario.

    The input is a (scenario, schedule) pair: the scenario's feature vector beside a short description of
    the schedule (granularity, executor, splits, grain, priority); the target is the log speedup.
    Parameters are those of :class:`ScheduleClassifier` (defaults: 200 rounds of depth 6 at rate 0.15).

    Attributes
    ----------
    booster_ : xgboost.Booster
        The fitted booster.
    """

    _objective = "reg:squarederror"

    def __init__(
        self, *, n_estimators: int = 200, max_depth: int = 6, learning_rate: float = 0.15, **kwargs: Any
    ) -> None:
        super().__init__(
            n_estimators=n_estimators, max_depth=max_depth, learning_rate=learning_rate, **kwargs
        )

    @staticmethod
    def _pairs(X: Any, schedules: Sequence[str]) -> np.ndarray:
        """Regressor input ``[N, n_features + n_descriptors]`` for rows of ``X`` paired with ``schedules``."""
        X = _check_X(X)
        if len(schedules) != len(X):
            raise ValueError(f"schedules must have one entry per row of X ({len(X)}); got {len(schedules)}")
        return np.hstack([X, _DESCRIPTORS[schedule_indices(schedules)]])

    def fit(self, X: Any, y: Any, schedules: Sequence[str]) -> SpeedupRegressor:
        """Learn from pairs: features ``X`` ``[N, F]``, ``schedules`` ``[N]`` and speedups ``y`` ``[N]``."""
        import xgboost as xgb

        validate_params(self)
        Z = self._pairs(X, schedules)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (len(Z),) or not np.all(y > 0):
            raise ValueError(f"y must be {len(Z)} positive speedups (t_serial / t); got shape {y.shape}")
        data = xgb.DMatrix(Z, label=np.log(y), feature_names=[*FEATURE_NAMES, *_DESCRIPTOR_NAMES])
        self.booster_ = self._train(data, {}, {})
        return self

    def predict(self, X: Any, schedules: Sequence[str]) -> np.ndarray:
        """Predicted speedup over serial of ``schedules[i]`` on scenario ``X[i]``: float64 ``[N]``."""
        check_is_fitted(self)
        Z = self._pairs(X, schedules)
        if len(Z) == 0:
            return np.empty(0)
        speedup = np.exp(np.asarray(self.booster_.inplace_predict(Z), dtype=np.float64))
        speedup[np.asarray(schedules) == str(SERIAL)] = 1.0  # by definition
        return speedup
