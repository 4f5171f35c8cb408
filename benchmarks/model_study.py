"""Model study: do the MoE rows hurt the dense picks, and do per-mode fallback margins make picks safer?

    .venv/bin/python benchmarks/model_study.py --dense datasets/h200x2 --moe datasets/h200x2-moe \
        --out reports/model-study-h200x2.json

1. MoE rows (``moe``): the shipped configuration and fallback policy (``--config``, ``--min-gain``) are
   held fixed, and the dense rows are held out in the same folds with and without the MoE rows in
   training: the dense rows keep the folds of grouped cross-validation on the dense dataset alone
   (``training.crossval``), MoE rows of a family the dense data has go with it, the other MoE families
   are spread over the same folds by ``GroupKFold``. The dense rows' held-out metrics of both models per
   mode, and a bootstrap of the paired difference of their mean log regret that resamples whole
   cross-validation groups (model families, grid quartiles: the rows of one are not independent); the
   MoE rows' metrics of the combined model and of one trained on the MoE rows alone.
2. Fallback margins (``fallback``, dense rows): the pick falls back to serial/sm when a signal of its gain
   over serial is below a per-mode margin, chosen on the other folds' held-out picks (mean
   ``training.metrics.pick_loss``), never on the fold it is applied to. Signals: the time-ratio
   regressor's predicted ``log(t_serial / t_pick)`` (what ``training.policy`` uses, there with one margin
   for both modes), and the ranker's score of the pick minus serial/sm's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BOOTSTRAP = 4000
"""Family bootstrap resamples."""
METRICS = ("geomean_regret", "in_best_set", "max_regret", "n_slower_than_serial_2pct", "n_scenarios")
"""The metrics the study reports per mode."""
RATIO_MARGINS = (-np.inf, *np.linspace(-0.05, 0.10, 16))
"""Candidate margins on the predicted log speedup (-inf: never fall back)."""
RANK_MARGINS = (-np.inf, *np.linspace(0.0, 1.5, 16))
"""Candidate margins on the ranker's score difference (-inf: never fall back)."""


def aligned_folds(groups: np.ndarray, reference: dict[str, int]) -> np.ndarray:
    """Fold of each row ``[n]``: ``reference[group]`` where the group has one, else ``GroupKFold`` over the
    other groups into as many folds as ``reference`` uses."""
    from sklearn.model_selection import GroupKFold

    folds = np.array([reference.get(g, -1) for g in groups])
    rest = np.flatnonzero(folds < 0)
    if len(rest):
        n_splits = min(len(set(reference.values())), len(set(groups[rest])))
        for fold, (_, test) in enumerate(GroupKFold(n_splits=n_splits).split(rest, groups=groups[rest])):
            folds[rest[test]] = fold
    return folds


def family_bootstrap(groups: np.ndarray, diff: np.ndarray, *, n: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Mean of ``diff`` ``[n_rows]`` and its 95% interval, resampling whole ``groups`` with replacement."""
    names = sorted(set(groups))
    sums = np.array([diff[groups == g].sum() for g in names])
    counts = np.array([np.sum(groups == g) for g in names])
    draw = np.random.default_rng(seed).integers(0, len(names), size=(n, len(names)))
    means = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(diff.mean()), "ci95": [float(low), float(high)]}


def mode_metrics(table, picks: np.ndarray) -> dict:
    """:data:`METRICS` of ``picks`` on ``table`` per mode."""
    from ficco.training.metrics import score

    out = {}
    for mode in sorted(set(table.modes)):
        on = table.modes == mode
        metrics = score(table.subset(on), picks[on])
        out[mode] = {k: round(metrics[k], 4) for k in METRICS}
    return out


def log_regret(table, picks: np.ndarray) -> np.ndarray:
    """``log(t_pick / t_best)`` of each row ``[n]``."""
    return np.log(table.time_of(picks)[0] / table.best_ms)


def held_out_picks(table, folds: np.ndarray, config, policy, *, n_jobs: int) -> np.ndarray:
    """Held-out recommended columns ``[n]`` of ``config`` under ``policy`` (``training.crossval``)."""
    from ficco.training.crossval import held_out_costs
    from ficco.training.policy import ModePolicy, apply_policy

    cost, ratio = held_out_costs(table, folds, (config,), seed=0, n_jobs=n_jobs, progress=False)
    return apply_policy(cost[0], ratio, ModePolicy.uniform(policy), table.modes)[0]


def paired(table, groups: np.ndarray, new: np.ndarray, old: np.ndarray) -> dict:
    """Per mode, :func:`family_bootstrap` of the log regret of picks ``new`` minus ``old``."""
    diff = log_regret(table, new) - log_regret(table, old)
    return {
        m: family_bootstrap(groups[table.modes == m], diff[table.modes == m])
        for m in sorted(set(table.modes))
    }


def moe_study(dense, both, config, policy, *, n_jobs: int) -> dict:
    """Section 1 of the module docstring."""
    from ficco.training.crossval import cv_folds, cv_groups

    groups = cv_groups(dense)
    folds = cv_folds(groups)
    both_folds = aligned_folds(cv_groups(both), dict(zip(groups.tolist(), folds.tolist(), strict=True)))
    on_dense = both.op_groups == "dense"
    if not np.array_equal(both.scenario_ids[on_dense], dense.scenario_ids):
        raise ValueError("the dense rows of the combined datasets differ from the dense dataset's")
    alone = held_out_picks(dense, folds, config, policy, n_jobs=n_jobs)
    joint = held_out_picks(both, both_folds, config, policy, n_jobs=n_jobs)
    moe = both.subset(~on_dense)
    moe_alone = held_out_picks(moe, both_folds[~on_dense], config, policy, n_jobs=n_jobs)
    return {
        "dense": {
            "dense_only": mode_metrics(dense, alone),
            "dense_and_moe": mode_metrics(dense, joint[on_dense]),
            "log_regret_difference": paired(dense, groups, joint[on_dense], alone),
        },
        "moe": {
            "moe_only": mode_metrics(moe, moe_alone),
            "dense_and_moe": mode_metrics(moe, joint[~on_dense]),
        },
        "moe_folds": {
            g: int(f) for g, f in sorted(set(zip(cv_groups(moe), both_folds[~on_dense], strict=True)))
        },
    }


def margin_picks(table, folds: np.ndarray, raw: np.ndarray, signal: np.ndarray, margins) -> np.ndarray:
    """``raw`` with serial/sm where ``signal < margin``, the margin chosen per mode on the other folds."""
    from ficco.training.metrics import pick_loss
    from ficco.training.model import SERIAL_INDEX

    serial = np.full(len(table), SERIAL_INDEX)
    loss_raw, loss_serial = (
        pick_loss(table.time_of(p)[0], table.best_ms, table.serial_ms) for p in (raw, serial)
    )
    final = raw.copy()
    for mode in sorted(set(table.modes)):
        for fold in sorted(set(folds.tolist())):
            train = (table.modes == mode) & (folds != fold)
            loss = [np.where(signal < m, loss_serial, loss_raw)[train].mean() for m in margins]
            test = (table.modes == mode) & (folds == fold)
            final[test] = np.where(signal[test] < margins[int(np.argmin(loss))], SERIAL_INDEX, raw[test])
    return final


def fallback_study(dense, config, *, n_jobs: int) -> dict:
    """Section 2 of the module docstring."""
    from ficco.training.crossval import cv_folds, cv_groups, held_out_costs
    from ficco.training.model import SERIAL_INDEX

    groups = cv_groups(dense)
    folds = cv_folds(groups)
    cost, ratio = held_out_costs(dense, folds, (config,), seed=0, n_jobs=n_jobs, progress=False)
    rows = np.arange(len(dense))
    raw = cost[0].argmin(axis=1)
    signals = {
        "ratio_regressor": (-ratio[rows, raw], RATIO_MARGINS),
        "rank_score_difference": (cost[0][rows, SERIAL_INDEX] - cost[0][rows, raw], RANK_MARGINS),
    }
    out = {"no_fallback": mode_metrics(dense, raw)}
    for name, (signal, margins) in signals.items():
        picks = margin_picks(dense, folds, raw, signal, margins)
        out[name] = {**mode_metrics(dense, picks), "against_no_fallback": paired(dense, groups, picks, raw)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dense", type=Path, required=True, help="dense dataset directory")
    parser.add_argument("--moe", type=Path, required=True, help="MoE dataset directory (same hardware)")
    parser.add_argument("--config", default="rank,d6,n100,lr0.15", help="a TrainConfig.key of CONFIG_GRID")
    parser.add_argument("--min-gain", type=float, default=None, help="fallback threshold (default: none)")
    parser.add_argument("--jobs", type=int, default=1, help="XGBoost threads")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from ficco.training.fit import CONFIG_GRID
    from ficco.training.policy import DecisionPolicy
    from ficco.training.table import load_dataset_table

    config = {c.key(): c for c in CONFIG_GRID}[args.config]
    policy = DecisionPolicy(min_gain=args.min_gain)
    dense = load_dataset_table(args.dense).table
    both = load_dataset_table(args.dense, args.moe).table
    result = {
        "config": config.to_dict(),
        "policy": policy.to_dict(),
        "moe": moe_study(dense, both, config, policy, n_jobs=args.jobs),
        "fallback": fallback_study(dense, config, n_jobs=args.jobs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
