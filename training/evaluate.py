"""Evaluation on unseen scenarios: the JSON object behind ``ficco evaluate --json`` and the model card.

Two splits:

1. Grouped cross-validation (``training.crossval``): every scenario is predicted by a model that never
   saw its model family (or its region of the grid). The top-level metrics and the baselines are these
   held-out predictions, with the safe fallback applied (what a user gets).
2. Region holdout: train on the scenarios below the 75th percentile of GEMM FLOPs, predict the largest
   quarter (size extrapolation). It uses the configuration and decision policy chosen in step 1.

Baselines (``training.baselines``) that need fitting are fitted on the same training folds.
Metric definitions: ``training.metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from ficco.training.baselines import FIXED, baseline_picks
from ficco.training.crossval import (
    Choice,
    CrossValidation,
    Picks,
    apply_policy,
    classifier_proba,
    cross_validate,
    region_holdout,
    regressor_speedups,
)
from ficco.training.fit import CONFIG_GRID, TrainConfig, fit_classifier, fit_regressor
from ficco.training.metrics import score
from ficco.training.policy import POLICY_GRID, DecisionPolicy
from ficco.training.table import ScheduleTable

BASELINE_NOTES: dict[str, str] = {
    "always_serial": f"always {FIXED['always_serial']} (no overlap)",
    "always_shard_dma": f"always {FIXED['always_shard_dma']}: shard-level overlap on the copy engines, what "
    "PyTorch async-TP does",
    "always_shard_sm": f"always {FIXED['always_shard_sm']}: shard-level overlap with NCCL kernels",
    "best_fixed": "the one schedule of lowest loss on the training folds",
    "size_heuristic": "three-tier size-threshold rule after the FiCCO paper, thresholds fit on the training "
    "folds (training/baselines.py)",
}


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Evaluation:
    """The outcome of :func:`evaluate`."""

    summary: dict[str, Any]
    """The JSON object (metrics, baselines, fallback, per family, region holdout, selection)."""
    cv: CrossValidation
    """Held-out picks of the model and the cross-validated choice."""
    baselines: dict[str, np.ndarray]
    """Held-out picks of each baseline (schedule column indices ``[n]``), on the same folds."""


def held_out_baselines(table: ScheduleTable, folds: np.ndarray) -> dict[str, np.ndarray]:
    """Every baseline's picks, each fold's fitted on the other folds: name -> ``[n]``."""
    out: dict[str, np.ndarray] = {}
    for name in sorted(set(folds)):
        test = folds == name
        for baseline, picks in baseline_picks(table.subset(~test), table.subset(test)).items():
            out.setdefault(baseline, np.zeros(len(table), dtype=np.int64))[test] = picks
    return out


def fallback_summary(table: ScheduleTable, picks: Picks, policy: DecisionPolicy) -> dict[str, Any]:
    """What the safe fallback did to the held-out picks: regressions it avoided and speedup it gave up."""
    t_raw = table.time_of(picks.raw)[0]
    serial = table.serial_ms
    avoided = picks.fallback & (t_raw > serial)
    given_up = picks.fallback & (t_raw < serial)
    with_fallback, without = score(table, picks.final), score(table, picks.raw)
    return {
        "policy": policy.to_dict(),
        "n_fallbacks": int(picks.fallback.sum()),
        "regressions_without_fallback": without["n_regressions_vs_serial"],
        "regressions_with_fallback": with_fallback["n_regressions_vs_serial"],
        "regressions_avoided": int(avoided.sum()),
        "gains_given_up": int(given_up.sum()),
        "geomean_speedup_given_up": float(np.exp(np.mean(np.log(serial[given_up] / t_raw[given_up]))))
        if given_up.any()
        else 1.0,
        "net_speedup_change": with_fallback["speedup_vs_serial"] / without["speedup_vs_serial"] - 1.0,
        "without_fallback": without,
    }


def per_family(table: ScheduleTable, picks: np.ndarray) -> dict[str, dict[str, Any]]:
    """Metrics of ``picks`` on each family's scenarios."""
    return {
        family: score(table.subset(table.families == family), picks[table.families == family])
        for family in sorted(set(table.families))
    }


def region_summary(table: ScheduleTable, choice: Choice, *, seed: int, n_jobs: int) -> dict[str, Any]:
    """Metrics and baselines of the region holdout (train below the 75th percentile of GEMM FLOPs)."""
    test = region_holdout(table)
    train, held = table.subset(~test), table.subset(test)
    classifier = fit_classifier(train, choice.config, seed=seed, n_jobs=n_jobs)
    regressor = fit_regressor(train, seed=seed, n_jobs=n_jobs)
    picks = apply_policy(
        classifier_proba(classifier, held.X), regressor_speedups(regressor, held.X), choice.policy
    )
    return {
        "split": "train on GEMM FLOPs below the 75th percentile, test on the largest quarter",
        **score(held, picks.final),
        "baselines": {name: score(held, p) for name, p in baseline_picks(train, held).items()},
    }


def evaluate(
    table: ScheduleTable,
    *,
    seed: int = 0,
    n_jobs: int = 1,
    configs: tuple[TrainConfig, ...] = CONFIG_GRID,
    policies: tuple[DecisionPolicy, ...] = POLICY_GRID,
    progress: bool = False,
) -> Evaluation:
    """Cross-validate, score the held-out picks against the baselines and run the region holdout."""
    cv = cross_validate(
        table, configs=configs, policies=policies, seed=seed, n_jobs=n_jobs, progress=progress
    )
    baselines = held_out_baselines(table, cv.folds)
    families = per_family(table, cv.picks.final)
    worse = [name for name, m in families.items() if m["speedup_vs_serial"] < 1.0]
    summary = {
        **score(table, cv.picks.final),
        "baselines": {name: score(table, picks) for name, picks in baselines.items()},
        "baseline_notes": BASELINE_NOTES,
        "never_worse_than_serial": not worse,
        "families_worse_than_serial": worse,
        "fallback": fallback_summary(table, cv.picks, cv.choice.policy),
        "per_family": families,
        "region_holdout": region_summary(table, cv.choice, seed=seed, n_jobs=n_jobs),
        "cv": {
            "groups": {name: int(np.sum(cv.groups == name)) for name in sorted(set(cv.groups))},
            "folds": sorted(set(cv.folds)),
            "selection": "per fold, the config and decision policy of lowest loss on the other folds' "
            "held-out predictions (training/crossval.py)",
            "config": cv.choice.config.to_dict(),
            "policy": cv.choice.policy.to_dict(),
            "config_loss": cv.config_loss,
            "speedup_weight_loss": cv.speedup_weight_loss,
            "fold_choices": {
                fold: {"config": c.config.to_dict(), "policy": c.policy.to_dict()}
                for fold, c in cv.fold_choices.items()
            },
            "seed": seed,
        },
    }
    return Evaluation(summary=rounded(summary), cv=cv, baselines=baselines)


def rounded(value: Any, digits: int = 6) -> Any:
    """``value`` with every float rounded to ``digits`` decimals, recursively (stable JSON diffs)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value
