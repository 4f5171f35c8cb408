"""Fitting the pair model to a dataset table: training configurations and the training pairs.

Every measured (scenario, mode, schedule) of a table becomes one training pair (``training.model``), its
target ``log(t / t_serial)``; the (scenario, mode) row is the ranker's query.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from ficco.training.dataset_table import DatasetTable
from ficco.training.model import PAIR_FEATURE_NAMES, PairModel, pair_matrix


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Hyper-parameters of the pair model."""

    objective: Literal["ratio", "rank", "ndcg"] = "ratio"
    """``ratio`` (XGBRegressor of log(t / t_serial)), ``rank`` (XGBRanker, rank:pairwise) or ``ndcg``
    (XGBRanker, rank:ndcg on graded relevance): ``training.model``."""
    max_depth: int = 6
    """Depth of each tree, in [1, 16]."""
    n_estimators: int = 150
    """Boosting rounds, in [1, 5000]."""
    learning_rate: float = 0.1
    """XGBoost shrinkage, in (0, 1]."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def estimator(self, *, seed: int, n_jobs: int) -> PairModel:
        """An unfitted ``training.model.PairModel`` of these hyper-parameters."""
        return PairModel(**self.to_dict(), random_state=seed, n_jobs=n_jobs)

    def key(self) -> str:
        """A short name for logs and the card, e.g. ``ratio,d6,n150,lr0.1``."""
        return f"{self.objective},d{self.max_depth},n{self.n_estimators},lr{self.learning_rate:g}"


RATIO_CONFIG = TrainConfig(objective="ratio", max_depth=4, n_estimators=60, learning_rate=0.25)
"""The time-ratio regressor: a candidate pick model, and the fallback's source of predicted gain."""
CONFIG_GRID: tuple[TrainConfig, ...] = (
    RATIO_CONFIG,
    TrainConfig(objective="ndcg", max_depth=6, n_estimators=100, learning_rate=0.15),
)
"""Candidates for cross-validation, the regressor first (ties in the selection go to it: it alone also
gives the fallback its time ratio); the ranker's settings: docs/training.md."""


def training_pairs(table: DatasetTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every measured pair of ``table`` (at its host factor): pair matrix ``[N, P]``, ``log(t / t_serial)``
    ``[N]`` and query id (the table row) ``[N]``, sorted by query."""
    measured = np.isfinite(table.times_ms)
    Z, (rows, cols) = pair_matrix(table.X, table.modes, valid=measured, host_factor=table.host_factor)
    y = np.log(table.times_ms[rows, cols] / table.serial_ms[rows])
    return Z, y, rows


def fit_pair_model(
    table: DatasetTable, config: TrainConfig, *, seed: int, n_jobs: int, masked: tuple[str, ...] = ()
) -> PairModel:
    """Fit the pair model of ``config`` on every measured pair of ``table``. ``masked``: pair columns held
    at 0, on which no tree splits, so the model is the one fitted without them (a feature ablation,
    ``benchmarks.studies.feature_ablation``); ValueError for a name that is not a pair column."""
    unknown = sorted(set(masked) - set(PAIR_FEATURE_NAMES))
    if unknown:
        raise ValueError(f"masked must name pair columns {list(PAIR_FEATURE_NAMES)}; got {unknown}")
    Z, y, qid = training_pairs(table)
    Z[:, [PAIR_FEATURE_NAMES.index(name) for name in masked]] = 0.0
    return config.estimator(seed=seed, n_jobs=n_jobs).fit(Z, y, qid=qid)
