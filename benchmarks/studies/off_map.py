"""Picks off the measured map: how slow are picks with few measured neighbours, and what should run there?

    .venv/bin/python -m benchmarks.studies.off_map --out reports/off-map-h200x2.json

A measured neighbour (``training.predict.coverage``) of a scenario is a training row of the same op, mode,
world size and dtype whose m, n and k each lie within 2x of the scenario's. Two sets of picks:

1. **Family holdout** of the shipped model's training data (``datasets/h200x2`` + ``datasets/h200x2-moe``,
   ``ficco evaluate``'s folds): each fold picked by the shipped configuration and fallback policy (the
   card's) fitted on the other folds, its neighbours counted in those folds.
2. **Unseen families** (``datasets/h200x2-unseen``, ``-unseen-v3``, ``-heldout``, ``-heldout-v3``, their
   scenarios the training data lack): the shipped model's own picks, its neighbours counted in its own
   coverage.

Per mode and neighbour bucket: rows, picks more than 2% slower than serial/sm ("slow"), the geometric-mean
regret of the pick and of serial/sm. Then each off-map rule "serial/sm where fewer than T neighbours" (T = 0:
never) per mode: geometric-mean regret and slow picks. The planner's default (``docs/planner.md``) is read
from this.

Prints both tables and writes the JSON (``--out``). Single-threaded XGBoost; the fits are deterministic.
"""

from __future__ import annotations

import numpy as np

from benchmarks import REPO, study_main

TRAINING = ("datasets/h200x2", "datasets/h200x2-moe")
UNSEEN = ("datasets/h200x2-unseen", "datasets/h200x2-unseen-v3", "datasets/h200x2-heldout",
          "datasets/h200x2-heldout-v3")  # fmt: skip
BUCKETS: tuple[tuple[int, int], ...] = ((0, 0), (1, 2), (3, 9), (10, 1 << 30))
"""Neighbour-count buckets, inclusive."""
THRESHOLDS: tuple[int, ...] = (0, 1, 2, 3, 5, 10)
"""Off-map rules: serial/sm where a pick has fewer neighbours than this (0: never)."""
SLOW = 1.02
"""A pick more than 2% slower than serial/sm (``training.metrics``' ``WITHIN``)."""


def held_out(table, card: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each family-holdout fold's picks (the card's configuration and policy fitted on the other folds)
    and neighbour counts in those folds, int ``[n]`` each."""
    from ficco.training.crossval import cv_folds, cv_groups, held_out_costs
    from ficco.training.fit import TrainConfig
    from ficco.training.predict.coverage import Coverage
    from ficco.training.predict.policy import ModePolicy, apply_policy

    folds = cv_folds(cv_groups(table))
    config = TrainConfig(**card["config"])
    cost, ratio = held_out_costs(table, folds, (config,), seed=int(card.get("seed", 0)), n_jobs=1,
                                 progress=True)  # fmt: skip
    picks = apply_policy(cost[0], ratio, ModePolicy.from_dict(card["policy"]), table.modes)[0]
    near = np.zeros(len(table), dtype=np.int64)
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        coverage = Coverage.of(table.subset(~test).scenarios, table.modes[~test])
        held = table.subset(test)
        for mode in set(held.modes.tolist()):
            on = np.flatnonzero(test)[held.modes == mode]
            near[on] = coverage.count([table.scenarios[i] for i in on], mode)
    return picks, near


def shipped(table, predictor) -> tuple[np.ndarray, np.ndarray]:
    """The shipped model's picks on ``table`` and their neighbour counts in its coverage, int ``[n]``."""
    near = np.zeros(len(table), dtype=np.int64)
    for mode in set(table.modes.tolist()):
        on = np.flatnonzero(table.modes == mode)
        near[on] = predictor.coverage.count([table.scenarios[i] for i in on], mode)
    return predictor.decide(table.X, table.modes).final, near


def scores(times: np.ndarray, serial: np.ndarray, best: np.ndarray) -> dict:
    """Geometric-mean regret and slow picks of picked times ``times`` ``[n]``."""
    return {
        "geomean_regret": float(np.expm1(np.mean(np.log(times / best)))) if len(times) else None,
        "slow": int(np.sum(times > SLOW * serial)),
    }


def summarise(table, picks: np.ndarray, near: np.ndarray) -> dict:
    """Per mode: the buckets and the off-map rules (module docstring)."""
    times = table.time_of(picks)[0]
    out = {}
    for mode in ("eager", "graph"):
        on = table.modes == mode
        serial, best, t, n = table.serial_ms[on], table.best_ms[on], times[on], near[on]
        buckets = {}
        for low, high in BUCKETS:
            b = (n >= low) & (n <= high)
            buckets[f"{low}-{high}" if high < 1 << 30 else f">={low}"] = {
                "rows": int(b.sum()), "pick": scores(t[b], serial[b], best[b]),
                "serial": scores(serial[b], serial[b], best[b]),
            }  # fmt: skip
        rules = {str(th): scores(np.where(n < th, serial, t), serial, best) for th in THRESHOLDS}
        out[mode] = {"rows": int(on.sum()), "buckets": buckets, "serial_below": rules}
    return out


def study() -> dict:
    """Both sets' summaries (module docstring)."""
    from ficco.training.dataset_table import concat_tables, load_dataset_table
    from ficco.training.evaluate import unseen
    from ficco.training.predict.registry import load_predictor

    predictor = load_predictor(REPO / "models", "h200x2")
    if predictor.coverage is None:
        raise SystemExit("the current h200x2 model carries no coverage; see training/predict/coverage.py")
    table = load_dataset_table(*(REPO / p for p in TRAINING)).table
    picks, near = held_out(table, predictor.card)
    tests = [unseen(load_dataset_table(REPO / p).table, table)[0] for p in UNSEEN]
    combined = concat_tables(*tests)
    unseen_picks, unseen_near = shipped(combined, predictor)
    return {
        "model": f"{predictor.hardware_id}/{predictor.version}",
        "family_holdout": summarise(table, picks, near),
        "unseen": summarise(combined, unseen_picks, unseen_near),
        "unseen_sets": list(UNSEEN),
    }


def text(results: dict) -> str:
    """Both sets as text tables: buckets, then rules."""
    from ficco.tables import text_table

    def pct(v) -> str:
        return "-" if v is None else f"{v:.2%}"

    blocks = []
    for name in ("family_holdout", "unseen"):
        rows, rule_rows = [], []
        for mode, r in results[name].items():
            for bucket, b in r["buckets"].items():
                pick, serial = b["pick"], b["serial"]
                rows.append([mode, bucket, str(b["rows"]), str(pick["slow"]), pct(pick["geomean_regret"]),
                             pct(serial["geomean_regret"])])  # fmt: skip
            for th, s in r["serial_below"].items():
                rule_rows.append([mode, th, pct(s["geomean_regret"]), str(s["slow"])])
        blocks.append(f"{name}: picks by measured neighbours")
        blocks.append(text_table(["mode", "neighbours", "rows", "slow", "pick regret", "serial regret"], rows,
                                 align="<<>>>>"))  # fmt: skip
        blocks.append(f"{name}: serial/sm where fewer than T neighbours (T=0: never)")
        blocks.append(text_table(["mode", "T", "geomean regret", "slow"], rule_rows, align="<>>>"))
    return "\n".join(blocks)


def main() -> None:
    study_main(__doc__, REPO / "reports" / "off-map-h200x2.json", study, text)


if __name__ == "__main__":
    main()
