"""Feature ablation: what a pair column is worth under grouped cross-validation, per mode and op group.

    .venv/bin/python -m benchmarks.studies.feature_ablation --dataset datasets/h200x2 --jobs 2 \
        --out reports/feature-ablation-fv3.json
    .venv/bin/python -m benchmarks.studies.feature_ablation --dataset datasets/h200x2 \
        --dataset datasets/h200x2-moe --jobs 2 --out reports/feature-ablation-fv3-moe.json

The shipped grouped cross-validation (``training.crossval``: the configuration grid, the fallback policies,
model families and grid quartiles held out) runs once with every pair column (``training.model.
PAIR_FEATURE_NAMES``) and once per ``--mask NAME`` (default: fv3's ``eager_host_over_gpu``) with that
column held at 0 in every model it fits (``training.fit.fit_pair_model(masked=...)``: no tree splits on a
constant column, so each is the model fitted without it). Per mode and op group: the mean serial-safe loss
(``training.metrics.pick_loss``) of the held-out picks (each fold under the choice made on the other folds)
and their metrics; per variant the CV loss by configuration and the choice; and against the full model, a
bootstrap over cross-validation groups of the paired per-row loss difference (negative: the column helps).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.studies.model_study import family_bootstrap, mode_metrics

DEFAULT_MASKS = ("eager_host_over_gpu",)
"""The column fv3 adds."""


def cell_losses(table, picks: np.ndarray) -> dict[str, float]:
    """Mean :func:`training.metrics.pick_loss` of ``picks`` per ``mode`` and per ``mode/op group`` (the
    latter only when the table has both op groups)."""
    from ficco.training.metrics import pick_loss

    loss = pick_loss(table.time_of(picks)[0], table.best_ms, table.serial_ms)
    out = {"all": float(loss.mean())}
    groups = table.op_groups
    for mode in sorted(set(table.modes)):
        out[mode] = float(loss[table.modes == mode].mean())
        if len(set(groups)) > 1:
            for group in sorted(set(groups)):
                on = (table.modes == mode) & (groups == group)
                out[f"{mode}/{group}"] = float(loss[on].mean())
    return out


def run(table, masked: tuple[str, ...], *, n_jobs: int) -> tuple[dict, np.ndarray]:
    """Grouped CV with ``masked`` columns held at 0: its summary and the held-out picks ``[n]``."""
    from ficco.training.crossval import cross_validate

    cv = cross_validate(table, n_jobs=n_jobs, masked=masked)
    groups = table.op_groups
    metrics = {"all": mode_metrics(table, cv.final)}
    if len(set(groups)) > 1:
        metrics |= {
            g: mode_metrics(table.subset(groups == g), cv.final[groups == g]) for g in sorted(set(groups))
        }
    summary = {
        "masked": list(masked),
        "choice": {"config": cv.choice.config.key(), "policy": cv.choice.policy.to_dict()},
        "config_loss": {k: round(v, 5) for k, v in cv.config_loss.items()},
        "loss": {k: round(v, 5) for k, v in cell_losses(table, cv.final).items()},
        "metrics": metrics,
    }
    return summary, cv.final


def paired_loss(table, new: np.ndarray, old: np.ndarray) -> dict[str, dict]:
    """Per mode, the group bootstrap of the per-row loss of ``new`` minus ``old`` picks."""
    from ficco.training.crossval import cv_groups
    from ficco.training.metrics import pick_loss

    diff = pick_loss(table.time_of(new)[0], table.best_ms, table.serial_ms)
    diff -= pick_loss(table.time_of(old)[0], table.best_ms, table.serial_ms)
    groups = cv_groups(table)
    return {
        m: family_bootstrap(groups[table.modes == m], diff[table.modes == m])
        for m in sorted(set(table.modes))
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, action="append", required=True, help="repeat to combine")
    parser.add_argument("--mask", action="append", help=f"pair column to ablate (default {DEFAULT_MASKS})")
    parser.add_argument("--jobs", type=int, default=1, help="XGBoost threads")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from ficco.features import FEATURE_SCHEMA_VERSION
    from ficco.training.dataset_table import load_dataset_table

    table = load_dataset_table(*args.dataset).table
    full, full_picks = run(table, (), n_jobs=args.jobs)
    variants = {"all columns": full}
    for name in args.mask or DEFAULT_MASKS:
        summary, picks = run(table, (name,), n_jobs=args.jobs)
        summary["loss_difference_full_minus_masked"] = paired_loss(table, full_picks, picks)
        variants[f"- {name}"] = summary
    result = {
        "datasets": [str(p) for p in args.dataset],
        "feature_schema": FEATURE_SCHEMA_VERSION,
        "variants": variants,
    }
    for name, summary in variants.items():
        print(f"{name:<32} " + "  ".join(f"{k} {v:.5f}" for k, v in summary["loss"].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
