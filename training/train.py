"""Training the model that ships: cross-validate, fit on the whole dataset, register.

``ficco train --dataset datasets/h200x2 --promote`` runs :func:`train_model` and :func:`register_trained`;
the same dataset and seed give the same model files and metrics (XGBoost ``hist`` with a fixed seed and
thread count).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import MODES
from ficco.features.provenance import registry_id, rows_backend
from ficco.training.crossval import Choice
from ficco.training.dataset_table import DatasetTable, LoadedDataset
from ficco.training.evaluate import Evaluation, evaluate
from ficco.training.fit import CONFIG_GRID, TrainConfig, fit_pair_model, ratio_config
from ficco.training.model import PairModel
from ficco.training.predict.policy import POLICY_GRID, DecisionPolicy, ModePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TrainedModel:
    """The pair model fitted on a whole table with the cross-validated choice, and that evaluation."""

    scorer: PairModel
    """The model that picks (ranker or time-ratio regressor)."""
    ratio: PairModel
    """The time-ratio regressor (``scorer`` itself when the choice is the regressor)."""
    evaluation: Evaluation
    """Held-out metrics, baselines, ceiling and the choice of configuration and fallback policy."""

    @property
    def choice(self) -> Choice:
        return self.evaluation.cv.choice


def train_model(
    table: DatasetTable,
    *,
    noise: DatasetTable | None = None,
    seed: int = 0,
    n_jobs: int = 1,
    configs: tuple[TrainConfig, ...] = CONFIG_GRID,
    policies: tuple[DecisionPolicy, ...] = POLICY_GRID,
    progress: bool = False,
) -> TrainedModel:
    """Evaluate by grouped cross-validation, then fit the chosen model on every row of ``table``."""
    evaluation = evaluate(
        table, noise=noise, seed=seed, n_jobs=n_jobs, configs=configs, policies=policies, progress=progress
    )
    config = evaluation.cv.choice.config
    scorer = fit_pair_model(table, config, seed=seed, n_jobs=n_jobs)
    ratio = (
        scorer
        if config == ratio_config(config)
        else fit_pair_model(table, ratio_config(config), seed=seed, n_jobs=n_jobs)
    )
    log.info("trained %s on %d rows (%s)", config.key(), len(table), evaluation.cv.choice.policy)
    return TrainedModel(scorer=scorer, ratio=ratio, evaluation=evaluation)


def register_trained(
    root: str | Path,
    trained: TrainedModel,
    dataset: LoadedDataset,
    *,
    seed: int,
    learner: str = "sources",
    promotion: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """Register ``trained`` under ``root``; return ``(registry id, version)``: the dataset's hardware id, or
    for simulated rows that id with ``-sim`` (its profile renamed to it, ``features.provenance``). The card
    records the ``learner`` (``sources`` or ``pooled``), the ``promotion`` check's verdict, if one ran, and,
    beside the metrics, what each target dataset's plan holds that it lacks (``gaps``:
    ``harness.gaps.dataset_gaps``)."""
    import pandas as pd

    from ficco.harness.gaps import dataset_gaps
    from ficco.training.predict.coverage import Coverage
    from ficco.training.predict.registry import register

    table = dataset.table
    backend = rows_backend(dataset.info["backends"])
    model_id = registry_id(dataset.hardware.id, backend)
    hardware = replace(dataset.hardware, id=model_id)
    world_sizes = answered_world_sizes(table)
    fidelity = simulator_fidelity(dataset, world_sizes)
    version = register(
        root,
        model_id,
        scorer=trained.scorer,
        ratio=trained.ratio,
        policy=guard_policy(trained.choice.policy, fidelity),
        dataset_hash=dataset.hash,
        coverage=Coverage.of(table.scenarios, table.modes),
        info={
            **({"sim_fidelity": fidelity} if fidelity else {}),
            "dataset": dataset.info,
            "model_backend": backend,
            "hardware": hardware.to_dict(),
            "world_sizes": world_sizes,
            "ops": sorted({s.op for s in table.scenarios}),
            "m_range": {
                op: [
                    min(s.m for s in table.scenarios if s.op == op),
                    max(s.m for s in table.scenarios if s.op == op),
                ]
                for op in sorted({s.op for s in table.scenarios})
            },
            "modes": sorted(set(np.asarray(table.modes).tolist())),
            "config": trained.choice.config.to_dict(),
            "host_factor": dataset.info.get("host_factor", round(table.host_factor, 4)),
            "choice_reason": choice_reason(trained.evaluation),
            "seed": seed,
            "learner": learner,
            **({"promotion": promotion} if promotion is not None else {}),
            "metrics": trained.evaluation.summary,
            "gaps": [gaps for path in dataset.paths if (gaps := dataset_gaps(path)) is not None],
            "software": {"pandas": pd.__version__},
        },
    )
    return model_id, version


def answered_world_sizes(table: DatasetTable) -> list[int]:
    """The world sizes a model trained on ``table`` answers: those of its target rows (the rows it was
    scored on), never those only its extra rows hold."""
    return sorted({s.world_size for s in table.subset(table.is_target).scenarios})


def simulator_fidelity(dataset: LoadedDataset, world_sizes: list[int]) -> dict | None:
    """The ``sim_fidelity`` of a model trained on the simulator's rows alone (``harness.sim.sim_fidelity`` of
    its largest world size and of the simulator version that made them); None for other rows."""
    if dataset.info["backends"] != ["sim"]:
        return None
    from ficco.features.dataset import read_manifest
    from ficco.harness.sim import sim_fidelity

    versions = {
        str(((read_manifest(p) or {}).get("fingerprint") or {}).get("sim_model", "?")) for p in dataset.paths
    }
    return sim_fidelity(max(world_sizes), versions.pop() if len(versions) == 1 else "mixed")


def guard_policy(policy: ModePolicy, fidelity: dict | None) -> ModePolicy:
    """``policy`` with each mode's ``min_gain`` at least the simulator's guard (``fidelity``'s
    ``guard_min_gain``): a simulated model falls back to serial where the simulator's own picks were
    measured to lose to it (docs/simulator.md)."""
    if not fidelity:
        return policy
    out = {}
    for mode in MODES:
        own, guard = policy.of(mode).min_gain, fidelity["guard_min_gain"].get(mode)
        out[mode] = replace(
            policy.of(mode), min_gain=own if guard is None else guard if own is None else max(own, guard)
        )
    return ModePolicy(**out)


def choice_reason(evaluation: Evaluation) -> str:
    """Why the shipped objective was chosen, from the cross-validated losses, for the model card."""
    loss = evaluation.summary["cv"]["config_loss"]
    chosen = evaluation.cv.choice.config.key()
    others = ", ".join(f"{k} {v:.4f}" for k, v in loss.items() if k != chosen)
    return (
        f"{chosen} had the lowest mean held-out serial-safe loss (training.metrics.pick_loss) under grouped "
        f"cross-validation: {loss[chosen]:.4f}, against {others}"
    )
