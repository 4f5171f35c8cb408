"""Fitting the estimators to a schedule table: training configurations, sample weights, soft labels.

Two optional ways to make the classifier care about what a mistake costs, each a field of
:class:`TrainConfig` that cross-validation keeps only where it lowers the held-out loss:

- ``weighting="cost"``: weight each scenario by the regret of a wrong pick, the mean over its other
  measured schedules of ``log(t / t_best)`` (normalised to mean 1, floored at 0.1): a scenario where
  every schedule is within noise barely matters, one where the wrong pick doubles the time matters most.
- ``near_best=tol``: soft labels; every schedule within ``tol`` of the best becomes a training row of the
  scenario with a share of its weight falling linearly from the best (1) to ``tol`` slower (0), so
  near-ties within measurement noise do not look like disagreements between neighbouring scenarios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from ficco.training.model import SCHEDULES, ScheduleClassifier, SpeedupRegressor
from ficco.training.table import ScheduleTable

_MIN_COST_WEIGHT = 0.1
"""Floor of a normalised cost weight: no scenario is ignored outright."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Hyper-parameters of the schedule classifier and of its training rows."""

    max_depth: int = 4
    """Depth of each tree, in [1, 16]."""
    n_estimators: int = 200
    """Boosting rounds, in [1, 5000]."""
    learning_rate: float = 0.1
    """XGBoost shrinkage, in (0, 1]."""
    weighting: Literal["none", "cost"] = "none"
    """Sample weights: ``none`` (uniform) or ``cost`` (the regret of a wrong pick; module docstring)."""
    near_best: float = 0.0
    """Soft-label tolerance: schedules within this fraction of the best are labels too, in [0, 0.1]."""

    def __post_init__(self) -> None:
        if self.weighting not in ("none", "cost"):
            raise ValueError(f"TrainConfig.weighting must be one of ['none', 'cost']; got {self.weighting!r}")
        if not 0.0 <= self.near_best <= 0.1:
            raise ValueError(f"TrainConfig.near_best must be a number in [0, 0.1]; got {self.near_best!r}")
        # the estimator validates the tree parameters when it is fitted

    def to_dict(self) -> dict[str, object]:
        return {
            "max_depth": self.max_depth,
            "n_estimators": self.n_estimators,
            "learning_rate": self.learning_rate,
            "weighting": self.weighting,
            "near_best": self.near_best,
        }


CONFIG_GRID: tuple[TrainConfig, ...] = tuple(
    TrainConfig(max_depth=4, n_estimators=100, learning_rate=0.2, weighting=weighting, near_best=near_best)
    for weighting in ("none", "cost")
    for near_best in (0.0, 0.02)
)
"""Candidates for cross-validation, simplest first (ties in the selection go to the earlier one). On
simulated h200x2 data (439 scenarios, 0 and 1% noise), depth 3 or 6 with 200 rounds at rate 0.1 moved the
held-out geomean regret by at most 0.13 percentage points, at up to twice the time."""


def cost_weights(times_ms: np.ndarray) -> np.ndarray:
    """Cost of a wrong pick per scenario, mean 1: float64 ``[n]`` from times ``[n, S]`` (NaN = unmeasured)."""
    log_ratio = np.log(times_ms / np.nanmin(times_ms, axis=1, keepdims=True))
    others = np.isfinite(log_ratio) & (log_ratio > 0)
    cost = np.where(others, log_ratio, 0.0).sum(axis=1) / np.maximum(others.sum(axis=1), 1)
    if cost.mean() <= 0:
        return np.ones(len(cost))
    return np.maximum(cost / cost.mean(), _MIN_COST_WEIGHT)


def classifier_rows(table: ScheduleTable, config: TrainConfig) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Training rows of the classifier: features ``[N, F]``, labels ``[N]`` and weights ``[N]``.

    ``N = n`` with hard labels; with ``near_best > 0`` a scenario contributes one row per near-best schedule.
    """
    weight = cost_weights(table.times_ms) if config.weighting == "cost" else np.ones(len(table))
    closeness = np.zeros(table.times_ms.shape)
    if config.near_best > 0:
        gap = table.times_ms / table.best_ms[:, None] - 1.0
        closeness = np.nan_to_num(np.clip(1.0 - gap / config.near_best, 0.0, 1.0))  # NaN (unmeasured) -> 0
    closeness[np.arange(len(table)), table.best] = 1.0
    rows, cols = np.nonzero(closeness)
    share = weight[rows] * closeness[rows, cols] / closeness.sum(axis=1)[rows]
    return table.X[rows], [SCHEDULES[c] for c in cols], share


def fit_classifier(
    table: ScheduleTable, config: TrainConfig, *, seed: int, n_jobs: int
) -> ScheduleClassifier:
    """Fit the schedule classifier of ``config`` on every scenario of ``table``."""
    X, y, weight = classifier_rows(table, config)
    classifier = ScheduleClassifier(
        n_estimators=config.n_estimators,
        max_depth=config.max_depth,
        learning_rate=config.learning_rate,
        random_state=seed,
        n_jobs=n_jobs,
    )
    return classifier.fit(X, y, sample_weight=weight)


def fit_regressor(table: ScheduleTable, *, seed: int, n_jobs: int) -> SpeedupRegressor:
    """Fit the speedup regressor on every measured (scenario, schedule) pair of ``table``."""
    rows, cols = np.nonzero(np.isfinite(table.times_ms))
    speedup = table.serial_ms[rows] / table.times_ms[rows, cols]
    regressor = SpeedupRegressor(random_state=seed, n_jobs=n_jobs)
    return regressor.fit(table.X[rows], speedup, [SCHEDULES[c] for c in cols])
