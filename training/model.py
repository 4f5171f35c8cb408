"""One XGBoost model over (scenario, schedule, mode) pairs, on the scikit-learn estimator API.

Objectives ``ratio`` (regressor of ``log(t / t_serial)``), ``rank`` and ``ndcg`` (rankers, one query per
(scenario, mode)); saved as XGBoost UBJSON, never pickle. See docs/training.md.

>>> from ficco.features import Scenario, feature_matrix
>>> X = feature_matrix([Scenario(m=2**i) for i in range(10, 17)])
>>> Z, rows = pair_matrix(X, ["eager"] * len(X))
>>> Z.shape[1] == len(PAIR_FEATURE_NAMES)
True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from os import PathLike
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ficco.features import FEATURE_SCHEMA_VERSION, SCHEDULE_INDEX, SCHEDULES
from ficco.features.label_source import LABEL_VERSION
from ficco.training.predict.pairs import (
    DESCRIPTORS,
    HOST_FEATURE_NAME,
    LABEL_VERSION_NAME,
    PAIR_FEATURE_NAMES,
    PAIR_FEATURE_NAMES_OF,
    SCHEDULE_FEATURE_NAMES,
    SERIAL_INDEX,
    FeatureSchemaError,
    check_feature_schema,
    check_modes,
    check_X,
    check_Z,
    pair_matrix,
    saved_pair_params,
    schedule_indices,
    valid_mask,
)

__all__ = [  # the pair names are training.predict.pairs'; the training code imports them from here too
    "DESCRIPTORS",
    "HOST_FEATURE_NAME",
    "LABEL_VERSION_NAME",
    "MAX_GRADE",
    "OBJECTIVES",
    "PAIR_FEATURE_NAMES",
    "PAIR_FEATURE_NAMES_OF",
    "RELEVANCE_STEP",
    "SCHEDULES",
    "SCHEDULE_FEATURE_NAMES",
    "SCHEDULE_INDEX",
    "SERIAL_INDEX",
    "FeatureSchemaError",
    "PairModel",
    "check_X",
    "check_feature_schema",
    "check_modes",
    "pair_costs",
    "pair_matrix",
    "relevance_grades",
    "schedule_indices",
    "valid_mask",
]

OBJECTIVES = ("ratio", "rank", "ndcg")
"""The pair model's objectives (docs/training.md); every one but ``ratio`` ranks within a query."""
RELEVANCE_STEP = 0.01
"""Slowdown per relevance grade of the ``ndcg`` objective, in ``log(t / t_best)`` (about 1%, the best set's
floor, below which two schedules' order is measurement noise)."""
MAX_GRADE = 31
"""The fastest schedule's grade: XGBoost's NDCG with exponential gain takes grades up to 31."""


def relevance_grades(y: np.ndarray, qid: np.ndarray) -> np.ndarray:
    """``ndcg`` relevance of pairs ``y = log(t / t_serial)`` ``[N]`` in queries ``qid`` ``[N]``:
    ``MAX_GRADE`` minus whole ``RELEVANCE_STEP``s of slowdown behind the query's fastest, at least 0,
    float64 ``[N]`` (31: within 1% of the fastest; 0: 31% or more behind it)."""
    _, query = np.unique(qid, return_inverse=True)
    fastest = np.full(query.max() + 1 if len(query) else 0, np.inf)
    np.minimum.at(fastest, query, y)
    behind = np.floor((y - fastest[query]) / RELEVANCE_STEP + 1e-9)
    return MAX_GRADE - np.minimum(behind, MAX_GRADE)


@dataclass(kw_only=True, repr=False, eq=False)  # the __init__ scikit-learn asks for: it stores each parameter
class PairModel(BaseEstimator):
    """XGBoost over (scenario, schedule, mode) pairs; ``objective`` says which (docs/training.md).

    Fitted attributes: ``booster_`` (the ``xgboost.Booster``; its attributes carry the parameters and the
    feature schema), ``feature_schema_`` (``features.FEATURE_SCHEMA_VERSION`` when fitted here, the file's
    when loaded) and ``n_features_in_`` (``len(PAIR_FEATURE_NAMES_OF[feature_schema_])``).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "objective": [StrOptions(set(OBJECTIVES))],
        "n_estimators": [Interval(Integral, 1, 5000, closed="both")],
        "max_depth": [Interval(Integral, 1, 16, closed="both")],
        "learning_rate": [Interval(Real, 0.0, 1.0, closed="right")],
        "min_child_weight": [Interval(Real, 0.0, None, closed="left")],
        "reg_lambda": [Interval(Real, 0.0, None, closed="left")],
        "random_state": [Interval(Integral, 0, 2**31 - 1, closed="both")],
        "n_jobs": [Interval(Integral, 1, 256, closed="both")],
    }

    objective: str = "ratio"
    """``ratio`` (``XGBRegressor``), ``rank`` (``XGBRanker``, pairwise) or ``ndcg`` (``rank:ndcg``)."""
    n_estimators: int = 150
    """Boosting rounds. The fast path (``training.predict.fastpath``) walks every tree, so fewer is faster."""
    max_depth: int = 6
    learning_rate: float = 0.1
    """Shrinkage (XGBoost ``eta``)."""
    min_child_weight: float = 1.0
    """Least summed hessian in a leaf."""
    reg_lambda: float = 1.0
    """L2 penalty on leaf values."""
    random_state: int = 0
    n_jobs: int = 1
    """Threads; fixed so that results do not depend on the machine."""

    def _xgb(self) -> Any:
        """The unfitted XGBoost estimator of ``objective``."""
        import xgboost as xgb

        common = {k: v for k, v in self.get_params().items() if k != "objective"}  # XGBoost's, by name
        common |= {"tree_method": "hist", "verbosity": 0}
        if self.objective == "rank":
            return xgb.XGBRanker(objective="rank:pairwise", **common)
        if self.objective == "ndcg":
            return xgb.XGBRanker(objective="rank:ndcg", lambdarank_pair_method="topk", **common)
        return xgb.XGBRegressor(objective="reg:squarederror", **common)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, Z: Any, y: Any, *, qid: Any = None, sample_weight: Any = None) -> PairModel:
        """Learn from pairs ``Z`` ``[N, len(PAIR_FEATURE_NAMES)]`` and ``y = log(t / t_serial)`` ``[N]``;
        ``qid`` ``[N]`` (int, sorted) names each pair's (scenario, mode) query, which the rankers need;
        ``sample_weight`` ``[N]`` (positive; None: 1) weighs each pair, equal within a query."""
        Z = np.asarray(Z, dtype=np.float32)
        y = np.asarray(y, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != len(PAIR_FEATURE_NAMES):
            raise ValueError(f"Z must have {len(PAIR_FEATURE_NAMES)} columns; got shape {Z.shape}")
        if y.shape != (len(Z),) or not np.all(np.isfinite(y)):
            raise ValueError(f"y must be {len(Z)} finite log time ratios; got shape {y.shape}")
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype=np.float64)
            if sample_weight.shape != (len(Z),) or not np.all(sample_weight > 0):
                raise ValueError(
                    f"sample_weight must be {len(Z)} positive weights; got {sample_weight.shape}"
                )
        model = self._xgb()
        if self.objective != "ratio":
            if qid is None or len(qid) != len(Z) or np.any(np.diff(qid) < 0):
                raise ValueError(f"objective={self.objective!r} needs qid: one sorted query id per pair")
            qid = np.asarray(qid)
            relevance = -y if self.objective == "rank" else relevance_grades(y, qid)  # faster is better
            # XGBoost's rankers weigh whole queries: one weight per query, in query order
            starts = np.flatnonzero(np.r_[True, np.diff(qid) != 0])
            weights = None if sample_weight is None else sample_weight[starts]
            model.fit(Z, relevance, qid=qid, sample_weight=weights)
        else:
            model.fit(Z, y, sample_weight=sample_weight)
        booster = model.get_booster()
        booster.feature_names = None  # predictions take plain arrays in PAIR_FEATURE_NAMES order
        booster.set_attr(
            ficco_estimator=type(self).__name__,
            ficco_params=json.dumps(self.get_params(), sort_keys=True),
            ficco_feature_schema=FEATURE_SCHEMA_VERSION,
        )
        self.booster_ = booster
        self.feature_schema_ = FEATURE_SCHEMA_VERSION
        self.n_features_in_ = len(PAIR_FEATURE_NAMES)
        return self

    def predict(self, Z: Any) -> np.ndarray:
        """Raw outputs of pairs ``Z`` ``[N, n_features_in_]``: predicted ``log(t / t_serial)`` (``ratio``) or
        scores (``rank``, higher = faster), float64 ``[N]``."""
        check_is_fitted(self, "booster_")
        Z = check_Z(Z, self.n_features_in_, self.feature_schema_)
        if len(Z) == 0:
            return np.empty(0)
        return np.asarray(self.booster_.inplace_predict(Z), dtype=np.float64)

    def cost(self, Z: Any) -> np.ndarray:
        """Lower is faster, float64 ``[N]``: the predicted log ratio, or the negated rank score."""
        out = self.predict(Z)
        return out if self.objective == "ratio" else -out

    def set_threads(self, threads: int) -> None:
        """Predict on ``threads`` CPU threads from now on (XGBoost's ``nthread``)."""
        check_is_fitted(self, "booster_")
        self.booster_.set_param({"nthread": threads})

    def save_model(self, path: str | PathLike) -> None:
        """Write the fitted booster (with its attributes) in XGBoost's format; ``.ubj`` gives UBJSON."""
        check_is_fitted(self, "booster_")
        self.booster_.save_model(str(path))

    @classmethod
    def load_model(cls, path: str | PathLike) -> PairModel:
        """Read a file written by :meth:`save_model`; ``xgboost.core.XGBoostError`` for a file XGBoost cannot
        parse, :class:`FeatureSchemaError` for another feature schema, ``ValueError`` for another model."""
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(str(path))
        params, schema = saved_pair_params(booster, str(path))
        estimator = cls(**params)
        estimator.booster_ = booster
        estimator.feature_schema_ = schema
        estimator.n_features_in_ = len(PAIR_FEATURE_NAMES_OF[schema])
        return estimator


def pair_costs(
    model: PairModel,
    X: np.ndarray,
    modes: Sequence[str],
    host_factor: float | np.ndarray = 1.0,
    label_version: float | np.ndarray = LABEL_VERSION,
) -> np.ndarray:
    """``model.cost`` of every valid schedule of each scenario row, float64 ``[n, S]`` (+inf: invalid), on a
    machine of ``host_factor`` and executor ``label_version`` (or each row's ``[n]``: :func:`pair_matrix`)."""
    Z, (rows, cols) = pair_matrix(
        X, modes, schema=model.feature_schema_, host_factor=host_factor, label_version=label_version
    )
    out = np.full((len(X), len(SCHEDULES)), np.inf)
    out[rows, cols] = model.cost(Z)
    return out
