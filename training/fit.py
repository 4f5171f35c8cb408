"""Fitting the pair model to a dataset table: training configurations and the training pairs.

Every measured (scenario, mode, schedule) of a table becomes one training pair (``training.model``), its
target ``log(t / t_serial)``; the (scenario, mode) row is the ranker's query.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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
    extra_weight: float = 1.0
    """Weight of each row outside the target datasets (``DatasetTable.target``: ``ficco train --extra``),
    in [0, 1]; 0 leaves them out. Cross-validation on the target's folds chooses it (:func:`configs_for`)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.extra_weight <= 1.0:
            raise ValueError(f"TrainConfig.extra_weight must be in [0, 1]; got {self.extra_weight!r}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def estimator(self, *, seed: int, n_jobs: int) -> PairModel:
        """An unfitted ``training.model.PairModel`` of these hyper-parameters."""
        params = {k: v for k, v in self.to_dict().items() if k != "extra_weight"}
        return PairModel(**params, random_state=seed, n_jobs=n_jobs)

    def key(self) -> str:
        """A short name for logs and the card, e.g. ``ratio,d6,n150,lr0.1`` (``,x0.3`` for an extra
        weight other than 1)."""
        key = f"{self.objective},d{self.max_depth},n{self.n_estimators},lr{self.learning_rate:g}"
        return key if self.extra_weight == 1.0 else f"{key},x{self.extra_weight:g}"


RATIO_CONFIG = TrainConfig(objective="ratio", max_depth=6, n_estimators=150, learning_rate=0.1)
"""The time-ratio regressor: a candidate pick model, and the fallback's source of predicted gain."""
CONFIG_GRID: tuple[TrainConfig, ...] = (
    RATIO_CONFIG,
    TrainConfig(objective="ndcg", max_depth=6, n_estimators=100, learning_rate=0.15),
)
"""Candidates for cross-validation, the regressor first (ties in the selection go to it: it alone also
gives the fallback its time ratio); the ranker's settings: docs/training.md."""
EXTRA_WEIGHTS: tuple[float, ...] = (1.0, 0.3, 0.0)
"""Weights of rows outside the target that cross-validation tries when a table has such rows (0: the
target alone, so adding a dataset cannot make the held-out picks worse beyond the selection's noise)."""


def configs_for(table: DatasetTable, configs: tuple[TrainConfig, ...]) -> tuple[TrainConfig, ...]:
    """``configs`` as cross-validation tries them on ``table``: each at every weight of
    :data:`EXTRA_WEIGHTS` when some rows lie outside the target, else as they are."""
    if table.is_target.all():
        return configs
    return tuple(replace(c, extra_weight=w) for c in configs for w in EXTRA_WEIGHTS)


def ratio_config(config: TrainConfig) -> TrainConfig:
    """The time-ratio regressor that answers beside ``config``'s model: :data:`RATIO_CONFIG` at its extra
    weight."""
    return replace(RATIO_CONFIG, extra_weight=config.extra_weight)


def training_pairs(table: DatasetTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every measured pair of ``table`` (each at its row's host factor and label version): pair matrix
    ``[N, P]``, ``log(t / t_serial)`` ``[N]`` and query id (the table row) ``[N]``, sorted by query."""
    measured = np.isfinite(table.times_ms)
    Z, (rows, cols) = pair_matrix(
        table.X,
        table.modes,
        valid=measured,
        host_factor=table.host_factors,
        label_version=table.label_versions,
    )
    y = np.log(table.times_ms[rows, cols] / table.serial_ms[rows])
    return Z, y, rows


def fit_pair_model(
    table: DatasetTable, config: TrainConfig, *, seed: int, n_jobs: int, masked: tuple[str, ...] = ()
) -> PairModel:
    """Fit the pair model of ``config`` on every measured pair of ``table``, rows outside the target at
    ``config.extra_weight``. ``masked``: pair columns held
    at 0, on which no tree splits, so the model is the one fitted without them (a feature ablation,
    ``benchmarks.studies.feature_ablation``); ValueError for a name that is not a pair column."""
    unknown = sorted(set(masked) - set(PAIR_FEATURE_NAMES))
    if unknown:
        raise ValueError(f"masked must name pair columns {list(PAIR_FEATURE_NAMES)}; got {unknown}")
    if config.extra_weight == 0.0:
        table = table.subset(table.is_target)
    Z, y, qid = training_pairs(table)
    Z[:, [PAIR_FEATURE_NAMES.index(name) for name in masked]] = 0.0
    weight = None
    if not table.is_target.all() and config.extra_weight != 1.0:
        weight = np.where(table.is_target, 1.0, config.extra_weight)[qid]
    return config.estimator(seed=seed, n_jobs=n_jobs).fit(Z, y, qid=qid, sample_weight=weight)
