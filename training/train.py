"""Training the model that ships: cross-validate, fit on the whole dataset, register.

``ficco train --dataset datasets/h200x2 --promote`` runs :func:`train_and_register`; the same dataset and
seed give the same model files and metrics (XGBoost ``hist`` with a fixed seed and thread count).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ficco.training.crossval import Choice
from ficco.training.evaluate import Evaluation, evaluate
from ficco.training.fit import CONFIG_GRID, TrainConfig, fit_classifier, fit_regressor
from ficco.training.model import ScheduleClassifier, SpeedupRegressor
from ficco.training.policy import POLICY_GRID, DecisionPolicy
from ficco.training.table import LoadedDataset, ScheduleTable


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TrainedModel:
    """Estimators fitted on a whole table with the cross-validated choice, and that evaluation."""

    classifier: ScheduleClassifier
    """The schedule classifier."""
    regressor: SpeedupRegressor
    """The speedup regressor."""
    evaluation: Evaluation
    """Held-out metrics, baselines and the choice of configuration and decision policy."""

    @property
    def choice(self) -> Choice:
        return self.evaluation.cv.choice


def train_model(
    table: ScheduleTable,
    *,
    seed: int = 0,
    n_jobs: int = 1,
    configs: tuple[TrainConfig, ...] = CONFIG_GRID,
    policies: tuple[DecisionPolicy, ...] = POLICY_GRID,
    progress: bool = False,
) -> TrainedModel:
    """Evaluate by grouped cross-validation, then fit both estimators on every scenario of ``table``."""
    evaluation = evaluate(
        table, seed=seed, n_jobs=n_jobs, configs=configs, policies=policies, progress=progress
    )
    config = evaluation.cv.choice.config
    return TrainedModel(
        classifier=fit_classifier(table, config, seed=seed, n_jobs=n_jobs),
        regressor=fit_regressor(table, seed=seed, n_jobs=n_jobs),
        evaluation=evaluation,
    )


def register_trained(root: str | Path, trained: TrainedModel, dataset: LoadedDataset, *, seed: int) -> str:
    """Register ``trained`` under ``root`` for the dataset's hardware; return the new version."""
    import pandas as pd
    from ficco.training.registry import register

    return register(
        root,
        dataset.hardware.id,
        classifier=trained.classifier,
        regressor=trained.regressor,
        policy=trained.choice.policy,
        dataset_hash=dataset.hash,
        info={
            "dataset": dataset.info,
            "hardware": dataset.hardware.to_dict(),
            "config": trained.choice.config.to_dict(),
            "seed": seed,
            "metrics": trained.evaluation.summary,
            "software": {"pandas": pd.__version__},
        },
    )
