"""Feature ablation: held-out (grouped CV) gain of candidate feature changes, on v2 datasets.

    .venv/bin/python benchmarks/feature_ablation.py --dataset datasets/h200x2 \
        --out reports/feature-ablation.json

Each variant edits the feature matrix of the schedule table, keeping its width so the estimators run
unchanged: a removed feature becomes a constant column (XGBoost never splits on a constant, so this is the
same as dropping it); a candidate feature overwrites one of the hardware columns, which are constant
within one hardware profile's dataset. Every variant runs the same grouped cross-validation
(``training.crossval``) and reports the chosen configuration's mean held-out loss and per-mode geomean
regret and best-set share.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

SLOTS = ("hw_peak_tflops", "hw_hbm_gbps", "hw_link_gbps", "hw_sm_count")
"""Constant columns a candidate feature may overwrite."""
DUPLICATES = ("log2_rows", "log2_shard_rows", "log2_gemm_bytes", "log2_arith_intensity", "log2_t_gemm_us",
              "gemm_waves")  # fmt: skip
"""Features that (on a dense dataset) are a function of the ones kept."""


def wave_fill(rows: float, n: int, sm_count: int, tile_m: int = 128, tile_n: int = 256) -> float:
    """Share of the last wave of 128x256 output tiles that is busy for a ``[rows, n]`` GEMM, in (0, 1]."""
    tiles = math.ceil(rows / tile_m) * math.ceil(n / tile_n)
    waves = tiles / sm_count
    return waves / math.ceil(waves)


def candidate_columns(table) -> dict[str, np.ndarray]:
    """Candidate features per row: the wave fill of one chunk's GEMM at 1, 2, 4, 8 splits per shard."""
    out = {}
    for s in (1, 2, 4, 8):
        out[f"chunk_wave_fill_s{s}"] = np.array([
            wave_fill(sc.rows / (sc.world_size * s), sc.n, sc.hardware.sm_count) for sc in table.scenarios
        ])  # fmt: skip
    return out


def variant(table, *, drop: tuple[str, ...] = (), add: dict[str, np.ndarray] | None = None):
    """``table`` with ``drop`` set constant and ``add`` written over the hardware columns."""
    from ficco.features import FEATURE_NAMES

    X = table.X.copy()
    for name in drop:
        X[:, FEATURE_NAMES.index(name)] = 0.0
    for slot, values in zip(SLOTS, (add or {}).values(), strict=False):
        X[:, FEATURE_NAMES.index(slot)] = values
    return dataclasses.replace(table, X=X)


def run(table) -> dict:
    """Grouped CV of the shipped grid on ``table``: loss and per-mode held-out metrics."""
    from ficco.training.crossval import cross_validate
    from ficco.training.metrics import score

    cv = cross_validate(table)
    out = {"config": cv.choice.config.key(), "loss": min(cv.config_loss.values())}
    for mode in sorted(set(table.modes)):
        on = table.modes == mode
        m = score(table.subset(on), cv.final[on])
        out[mode] = {k: m[k] for k in ("geomean_regret", "in_best_set", "top1", "n_slower_than_serial_2pct")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from ficco.features import FEATURE_NAMES
    from ficco.training.table import load_dataset_table

    results = {}
    for path in args.dataset:
        table = load_dataset_table(path).table
        constant = [n for i, n in enumerate(FEATURE_NAMES) if np.ptp(table.X[:, i]) == 0]
        wave = candidate_columns(table)
        variants = {
            "fv1 (all 29)": variant(table),
            "- duplicates": variant(table, drop=DUPLICATES),
            "+ chunk wave fill": variant(table, add=wave),
            "- duplicates + chunk wave fill": variant(table, drop=DUPLICATES, add=wave),
        }
        results[str(path)] = {"constant_features": constant,
                              "variants": {name: run(t) for name, t in variants.items()}}  # fmt: skip
        for name, r in results[str(path)]["variants"].items():
            modes = "  ".join(f"{m} regret {r[m]['geomean_regret']:.4f} best-set {r[m]['in_best_set']:.3f}"
                              for m in sorted(set(table.modes)))  # fmt: skip
            print(f"{path}  {name:<32} loss {r['loss']:.5f}  {modes}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
