"""Grouped cross-validation: held-out predictions, and the choice of configuration and decision policy.

Folds hold out whole groups, so every prediction is for scenarios the model never saw: a group is one
model family (all scenarios of one model config), and the ``grid`` family is split into its quartiles of
GEMM FLOPs (``grid/q1`` smallest .. ``grid/q4``), each a group of its own. With more than ``MAX_FOLDS``
groups, several groups share a fold (largest group first into the smallest fold), which keeps the cost
bounded; a group is never split across folds.

Selection without nested refits: each configuration is fitted once per fold, which gives a held-out
prediction of every scenario under every configuration. Fold ``f`` is then predicted with the
configuration and decision policy (``training.policy``) of lowest mean loss
(``training.metrics.pick_loss``) on the *other* folds' held-out predictions, so fold ``f``'s labels
never choose how fold ``f`` is predicted. (The models that
predicted the other folds did train on fold ``f``; a full nested CV would refit them without it, at
``n_folds`` times the cost.) The model that ships uses the choice of lowest loss over all folds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ficco.training.fit import TrainConfig, fit_classifier, fit_regressor
from ficco.training.metrics import pick_loss
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES, SERIAL_INDEX, ScheduleClassifier, SpeedupRegressor
from ficco.training.policy import DecisionPolicy
from ficco.training.table import ScheduleTable
from tqdm import tqdm

GRID_FAMILY = "grid"
"""The family name of the dataset's synthetic shape grid (not a model config)."""
GRID_REGIONS = 4
"""Size regions the grid family is split into for cross-validation."""
MAX_FOLDS = 8
"""Most folds cross-validation runs (each fits every configuration once)."""


def gemm_flops(table: ScheduleTable) -> np.ndarray:
    """GEMM FLOPs of each scenario (``Scenario.gemm_flops``), float64 ``[n]``."""
    return np.array([s.gemm_flops for s in table.scenarios], dtype=np.float64)


def cv_groups(table: ScheduleTable) -> np.ndarray:
    """The cross-validation group of each scenario, str ``[n]``: its family, or ``grid/q<i>`` for the grid."""
    groups = table.families.astype(object).copy()
    grid = table.families == GRID_FAMILY
    if grid.any():
        flops = np.log(gemm_flops(table)[grid])
        edges = np.quantile(flops, np.linspace(0, 1, GRID_REGIONS + 1)[1:-1])
        region = np.searchsorted(edges, flops, side="right") + 1
        groups[grid] = [f"{GRID_FAMILY}/q{r}" for r in region]
    return groups


def cv_folds(groups: np.ndarray, max_folds: int = MAX_FOLDS) -> np.ndarray:
    """Fold name of each scenario, str ``[n]``: its groups joined by ``+`` (one group per fold if they fit).

    Groups go largest first (ties by name) into the fold with the fewest scenarios so far.
    """
    names, sizes = np.unique(groups, return_counts=True)
    members: list[list[str]] = [[] for _ in range(min(max_folds, len(names)))]
    load = np.zeros(len(members), dtype=np.int64)
    for i in sorted(range(len(names)), key=lambda i: (-sizes[i], names[i])):
        f = int(np.argmin(load))
        members[f].append(str(names[i]))
        load[f] += sizes[i]
    fold_of = {g: "+".join(sorted(m)) for m in members for g in m}
    return np.array([fold_of[g] for g in groups], dtype=object)


def region_holdout(table: ScheduleTable, quantile: float = 0.75) -> np.ndarray:
    """The size-extrapolation split: True for scenarios in the top ``1 - quantile`` of GEMM FLOPs, ``[n]``."""
    flops = gemm_flops(table)
    return flops >= np.quantile(flops, quantile)


def classifier_proba(classifier: ScheduleClassifier, X: np.ndarray) -> np.ndarray:
    """Class probabilities spread over all schedule columns, ``[n, S]`` (0 for schedules not learnt)."""
    out = np.zeros((len(X), len(SCHEDULES)))
    out[:, [SCHEDULE_INDEX[c] for c in classifier.classes_]] = classifier.predict_proba(X)
    return out


def regressor_speedups(regressor: SpeedupRegressor, X: np.ndarray) -> np.ndarray:
    """Predicted speedup over serial of every schedule on every scenario, ``[n, S]``."""
    pairs = np.repeat(X, len(SCHEDULES), axis=0)
    return regressor.predict(pairs, list(SCHEDULES) * len(X)).reshape(len(X), len(SCHEDULES))


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Picks:
    """Schedule column indices picked for ``n`` scenarios, before and after the fallback."""

    final: np.ndarray
    """What is recommended, ``[n]``: serial/sm where the fallback fired, the model's pick elsewhere."""
    raw: np.ndarray
    """The model's most probable valid schedule, ``[n]``."""
    fallback: np.ndarray
    """Where the fallback replaced a non-serial pick, bool ``[n]``."""


def apply_policy(proba: np.ndarray, speedup: np.ndarray, policy: DecisionPolicy) -> Picks:
    """Picks from probabilities ``[n, S]`` and predicted speedups ``[n, S]`` under ``policy``."""
    raw = policy.pick(proba, speedup)
    rows = np.arange(len(raw))
    fallback = policy.mask(proba[rows, raw], speedup[rows, raw], raw == SERIAL_INDEX)
    return Picks(final=np.where(fallback, SERIAL_INDEX, raw), raw=raw, fallback=fallback)


@dataclass(frozen=True, kw_only=True, slots=True)
class Choice:
    """A training configuration and decision policy (speedup weight, fallback thresholds) chosen together."""

    config: TrainConfig
    """How the classifier is trained."""
    policy: DecisionPolicy
    """How its outputs become a pick, and when the pick falls back to serial/sm."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class CrossValidation:
    """Held-out results of grouped cross-validation over ``n`` scenarios."""

    groups: np.ndarray
    """Group of each scenario, str ``[n]``."""
    folds: np.ndarray
    """Fold of each scenario, str ``[n]``."""
    picks: Picks
    """Held-out picks, each fold under its own choice."""
    choice: Choice
    """The choice of lowest loss over all folds (what the shipped model uses)."""
    fold_choices: dict[str, Choice]
    """The choice each fold was predicted with."""
    config_loss: dict[str, float]
    """Mean held-out loss of each configuration under its best decision policy, keyed by its settings."""
    speedup_weight_loss: dict[str, float]
    """Mean held-out loss of each speedup weight under its best configuration and thresholds."""


def held_out_outputs(
    table: ScheduleTable,
    folds: np.ndarray,
    configs: tuple[TrainConfig, ...],
    *,
    seed: int,
    n_jobs: int,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Each fold predicted by models fitted on the other folds: class probabilities of every configuration
    ``[n_configs, n, S]`` and predicted speedups ``[n, S]``."""
    names = sorted(set(folds))
    proba = np.zeros((len(configs), len(table), len(SCHEDULES)))
    speedup = np.zeros((len(table), len(SCHEDULES)))
    with tqdm(total=len(names) * (len(configs) + 1), desc="cross-validation", disable=not progress) as bar:
        for name in names:
            test = folds == name
            train, held = table.subset(~test), table.subset(test)
            speedup[test] = regressor_speedups(fit_regressor(train, seed=seed, n_jobs=n_jobs), held.X)
            bar.update()
            for c, config in enumerate(configs):
                classifier = fit_classifier(train, config, seed=seed, n_jobs=n_jobs)
                proba[c, test] = classifier_proba(classifier, held.X)
                bar.update()
    return proba, speedup


def cross_validate(
    table: ScheduleTable,
    *,
    configs: tuple[TrainConfig, ...],
    policies: tuple[DecisionPolicy, ...],
    seed: int,
    n_jobs: int,
    progress: bool = False,
) -> CrossValidation:
    """Run grouped cross-validation over ``configs`` x ``policies``; see the module docstring.

    Raises ``ValueError`` if the table has fewer than 2 groups.
    """
    groups = cv_groups(table)
    if len(set(groups)) < 2:
        raise ValueError(
            "grouped cross-validation needs at least 2 groups (model families or grid regions); "
            f"got {sorted(set(groups))}"
        )
    folds = cv_folds(groups)
    proba, speedup = held_out_outputs(table, folds, configs, seed=seed, n_jobs=n_jobs, progress=progress)
    choices = [Choice(config=config, policy=policy) for config in configs for policy in policies]
    loss = np.stack([
        pick_loss(table.time_of(apply_policy(proba[i // len(policies)], speedup, choice.policy).final)[0],
                  table.best_ms, table.serial_ms)
        for i, choice in enumerate(choices)
    ])  # fmt: skip
    final, raw, fallback = (np.zeros(len(table), dtype=dtype) for dtype in (np.int64, np.int64, bool))
    fold_choices = {}
    for name in sorted(set(folds)):
        test = folds == name
        i = int(np.argmin(loss[:, ~test].mean(axis=1)))
        picks = apply_policy(proba[i // len(policies), test], speedup[test], choices[i].policy)
        final[test], raw[test], fallback[test] = picks.final, picks.raw, picks.fallback
        fold_choices[name] = choices[i]
    mean = loss.mean(axis=1)
    by_config = mean.reshape(len(configs), len(policies)).min(axis=1)
    return CrossValidation(
        groups=groups,
        folds=folds,
        picks=Picks(final=final, raw=raw, fallback=fallback),
        choice=choices[int(np.argmin(mean))],
        fold_choices=fold_choices,
        config_loss={_config_key(cfg): float(v) for cfg, v in zip(configs, by_config, strict=True)},
        speedup_weight_loss={
            f"{w:g}": float(
                min(v for v, ch in zip(mean, choices, strict=True) if ch.policy.speedup_weight == w)
            )
            for w in sorted({policy.speedup_weight for policy in policies})
        },
    )


def _config_key(config: TrainConfig) -> str:
    return ",".join(f"{k}={v}" for k, v in config.to_dict().items())
