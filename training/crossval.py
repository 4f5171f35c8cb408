"""Grouped cross-validation: held-out predictions, and the choice of objective and fallback threshold.

Groups are model families (the ``grid`` family split by GEMM FLOPs quartile); each fold is predicted with
the choice of lowest loss on the other folds' held-out predictions. See docs/training.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from sklearn.model_selection import GroupKFold
from tqdm import tqdm

from ficco.features import MODES
from ficco.features.dataset import GRID_FAMILY
from ficco.training.dataset_table import DatasetTable
from ficco.training.fit import CONFIG_GRID, TrainConfig, configs_for, fit_pair_model, ratio_config
from ficco.training.metrics import pick_loss
from ficco.training.model import pair_costs
from ficco.training.predict.policy import POLICY_GRID, DecisionPolicy, ModePolicy, apply_policy

log = logging.getLogger(__name__)

GRID_REGIONS = 4
"""Size regions the grid family is split into for cross-validation."""
MAX_FOLDS = 8
"""Most folds cross-validation runs (each fits every configuration once)."""
EXTRA_ROWS_ERRORS = 1.5
"""Standard errors by which a configuration that weighs rows outside the target must beat its weightless
twin (the target alone) to be chosen (:func:`choose`): about one chance in 40 that rows which do not help are
taken in on the selection's noise alone."""


def gemm_flops(table: DatasetTable) -> np.ndarray:
    """GEMM FLOPs of each row's scenario (``Scenario.gemm_flops``), float64 ``[n]``."""
    return np.array([s.gemm_flops for s in table.scenarios], dtype=np.float64)


def cv_groups(table: DatasetTable) -> np.ndarray:
    """The cross-validation group of each row, str ``[n]``: its family, or ``grid/q<i>`` for the grid, the
    quartile edges of GEMM FLOPs taken from the target rows alone (``DatasetTable.target``), so rows added
    from other datasets never move a target row to another group."""
    groups = table.families.astype(object).copy()
    grid = table.families == GRID_FAMILY
    edges_from = grid & table.is_target
    if edges_from.any():
        flops = np.log(gemm_flops(table))
        edges = np.quantile(flops[edges_from], np.linspace(0, 1, GRID_REGIONS + 1)[1:-1])
        region = np.searchsorted(edges, flops[grid], side="right") + 1
        groups[grid] = [f"{GRID_FAMILY}/q{r}" for r in region]
    return groups


def cv_folds(groups: np.ndarray, max_folds: int = MAX_FOLDS, target: np.ndarray | None = None) -> np.ndarray:
    """Fold number of each row, int ``[n]``, from ``GroupKFold`` over the ``groups`` of the ``target`` rows
    (bool ``[n]``, default all; no group split): a row outside the target takes its group's fold, or -1
    (never held out, always trained on) when no target row is of its group."""
    target = np.ones(len(groups), dtype=bool) if target is None else target
    own = groups[target]
    n_splits = min(max_folds, len(set(own)))
    fold_of: dict[str, int] = {}
    for f, (_, test) in enumerate(GroupKFold(n_splits=n_splits).split(own, groups=own)):
        fold_of.update(dict.fromkeys(own[test], f))
    return np.array([fold_of.get(g, -1) for g in groups], dtype=np.int64)


def region_holdout(table: DatasetTable, quantile: float = 0.75) -> np.ndarray:
    """The size-extrapolation split: True for rows in the top ``1 - quantile`` of the target rows' GEMM FLOPs
    (the edge from the target rows alone), ``[n]``."""
    flops = gemm_flops(table)
    return flops >= np.quantile(flops[table.is_target], quantile)


@dataclass(frozen=True, kw_only=True, slots=True)
class Choice:
    """A training configuration and fallback policy chosen together."""

    config: TrainConfig
    policy: ModePolicy
    """When its pick falls back to serial/sm, per mode."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class CrossValidation:
    """Held-out results of grouped cross-validation over ``n`` rows."""

    groups: np.ndarray
    """Group of each row, str ``[n]``."""
    folds: np.ndarray
    """Fold of each row, int ``[n]``."""
    final: np.ndarray
    """Held-out recommended schedule column of each row, ``[n]`` (each fold under its own choice)."""
    raw: np.ndarray
    """The model's own pick before the fallback, ``[n]``."""
    fallback: np.ndarray
    """Where the fallback replaced the pick, bool ``[n]``."""
    choice: Choice
    """The choice of lowest loss over all folds (what the shipped model uses)."""
    config_loss: dict[str, float]
    """Mean held-out loss of each configuration under its best policy per mode, keyed by
    ``TrainConfig.key``."""


def held_out_costs(
    table: DatasetTable,
    folds: np.ndarray,
    configs: tuple[TrainConfig, ...],
    *,
    seed: int,
    n_jobs: int,
    progress: bool,
    masked: tuple[str, ...] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Each fold (``folds`` >= 0) predicted by models fitted on the other folds: costs of every configuration
    ``[n_configs, n, S]`` and, beside each, the time-ratio regressor's ``log(t / t_serial)`` at that
    configuration's ``extra_weight`` ``[n_configs, n, S]``. ``masked``: pair columns every model is fitted
    without (``training.fit.fit_pair_model``)."""
    names = sorted(set(folds.tolist()) - {-1})
    cost = np.zeros((len(configs), len(table), table.times_ms.shape[1]))
    ratio = np.zeros(cost.shape)
    ratios = {c: ratio_config(c) for c in configs}
    fits = len(dict.fromkeys([*configs, *ratios.values()]))
    with tqdm(total=len(names) * fits, desc="cross-validation", disable=not progress) as bar:
        for name in names:
            test = folds == name
            train, held = table.subset(~test), table.subset(test)
            done: dict[TrainConfig, np.ndarray] = {}
            for config in dict.fromkeys([*configs, *ratios.values()]):
                model = fit_pair_model(train, config, seed=seed, n_jobs=n_jobs, masked=masked)
                done[config] = pair_costs(model, held.X, held.modes, held.host_factors, held.label_versions)
                bar.update()
            for c, config in enumerate(configs):
                cost[c, test], ratio[c, test] = done[config], done[ratios[config]]
    return cost, ratio


def _loss(table: DatasetTable, cost: np.ndarray, ratio: np.ndarray, policy: ModePolicy) -> np.ndarray:
    """:func:`pick_loss` of each row's held-out pick under ``policy``, ``[n]``."""
    final = apply_policy(cost, ratio, policy, table.modes).final
    return pick_loss(table.time_of(final)[0], table.best_ms, table.serial_ms)


def choose(
    loss: np.ndarray,
    modes: np.ndarray,
    rows: np.ndarray,
    policies: tuple[DecisionPolicy, ...],
    base: np.ndarray | None = None,
    groups: np.ndarray | None = None,
) -> tuple[int, ModePolicy, np.ndarray]:
    """The configuration and per-mode policy of lowest mean loss over ``rows`` (bool ``[n]``), from each
    row's ``loss`` under every (configuration, policy), ``[n_configs, n_policies, n]``: per configuration each
    mode's best policy on its rows, then the best configuration under those (ties: the earlier). ``base``
    (int ``[n_configs]``, :func:`weightless`): each configuration's twin without the rows outside the target;
    a configuration that weighs those rows competes only where its loss is below its twin's by more than
    :data:`EXTRA_ROWS_ERRORS` standard errors of their difference, taken over ``groups`` (str ``[n]``, the
    cross-validation groups: rows of one model family move together) or else over rows: extra rows must earn
    their place beyond the selection's noise. Returns its index, the :class:`ModePolicy` (a mode without
    rows: the first policy) and every configuration's mean loss ``[n_configs]``."""
    total = np.zeros(len(loss))
    per_row = np.zeros((len(loss), len(modes)))
    best: list[dict[str, int]] = [{} for _ in loss]
    for mode in sorted(set(modes[rows].tolist())):
        on = rows & (modes == mode)
        means = loss[:, :, on].mean(axis=2)  # [n_configs, n_policies]
        for c, p in enumerate(means.argmin(axis=1)):
            best[c][mode] = int(p)
            total[c] += means[c, p] * on.sum()
            per_row[c, on] = loss[c, p, on]
    mean = total / rows.sum()
    eligible = np.ones(len(loss), dtype=bool)
    index = np.unique(groups[rows], return_inverse=True)[1] if groups is not None else None
    for c, b in enumerate(range(len(loss)) if base is None else base):
        if b != c:
            diff = per_row[c, rows] - per_row[b, rows]
            if index is not None:
                diff = np.bincount(index, weights=diff) / np.bincount(index)  # each group's mean difference
            error = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else 0.0
            eligible[c] = diff.mean() < -EXTRA_ROWS_ERRORS * error
    c = int(np.argmin(np.where(eligible, mean, np.inf)))
    policy = ModePolicy(**{m: policies[best[c].get(m, 0)] for m in MODES})
    return c, policy, mean


def weightless(configs: tuple[TrainConfig, ...]) -> np.ndarray:
    """Each configuration's index in ``configs`` at ``extra_weight`` 0 (itself where it is at 0, or where
    ``configs`` has no such twin), int ``[n_configs]``."""
    index = {c: i for i, c in enumerate(configs)}
    return np.array([index.get(replace(c, extra_weight=0.0), i) for i, c in enumerate(configs)])


def cross_validate(
    table: DatasetTable,
    *,
    configs: tuple[TrainConfig, ...] = CONFIG_GRID,
    policies: tuple[DecisionPolicy, ...] = POLICY_GRID,
    seed: int = 0,
    n_jobs: int = 1,
    progress: bool = False,
    masked: tuple[str, ...] = (),
    policy: ModePolicy | None = None,
    bands: Mapping[str, float] | None = None,
) -> CrossValidation:
    """Run grouped cross-validation over ``configs`` x ``policies`` (docs/training.md). ``masked``: pair
    columns every model is fitted without (a feature ablation). ``policy``: every fold decides under this
    one instead of choosing from ``policies`` (a given recipe, e.g. a registered model's, re-run on other
    folds). ``bands``: each mode's noise band (``training.predict.policy``; a mode left out:
    ``DEFAULT_NOISE_BAND``), which every policy takes. ``ValueError`` for fewer than 2 groups."""
    if policy is not None:
        policies = tuple(dict.fromkeys(policy.of(m) for m in MODES))
    configs = configs_for(table, configs)
    groups = cv_groups(table)
    scored = table.is_target
    if len(set(groups[scored])) < 2:
        raise ValueError(
            "grouped cross-validation needs at least 2 groups (model families or grid regions); "
            f"got {sorted(set(groups[scored]))}"
        )
    folds = cv_folds(groups, target=scored)
    cost, ratio = held_out_costs(
        table, folds, configs, seed=seed, n_jobs=n_jobs, progress=progress, masked=masked
    )
    # loss[c, p]: each row's held-out loss under configuration c with policy p in every mode
    bands = dict(bands or {})
    loss = np.stack([
        np.stack([_loss(table, cost[c], ratio[c], ModePolicy.uniform(p).with_bands(bands)) for p in policies])
        for c in range(len(configs))
    ])  # fmt: skip
    base = weightless(configs)
    final, raw = (np.zeros(len(table), dtype=np.int64) for _ in range(2))
    fallback = np.zeros(len(table), dtype=bool)
    for name in sorted(set(folds[scored].tolist())):
        test = (folds == name) & scored
        c, chosen, _ = choose(loss, table.modes, scored & ~test, policies, base, groups)
        final[test], raw[test], fallback[test], _ = apply_policy(
            cost[c, test], ratio[c, test], (policy or chosen).with_bands(bands), table.modes[test]
        )
    c, chosen, by_config = choose(loss, table.modes, scored, policies, base, groups)
    choice = Choice(config=configs[c], policy=(policy or chosen).with_bands(bands))
    config_loss = {c.key(): float(v) for c, v in zip(configs, by_config, strict=True)}
    log.info(
        "cross-validation loss by config %s; chose %s, %s", config_loss, choice.config.key(), choice.policy
    )
    return CrossValidation(
        groups=groups, folds=folds, final=final, raw=raw, fallback=fallback, choice=choice,
        config_loss=config_loss,
    )  # fmt: skip
