"""Predictor fast-path benchmark: one scenario's decision, a batch of 10,000, and picks against the reference.

    .venv/bin/python -m benchmarks.predict_fastpath                                  # models/ current h200x2
    .venv/bin/python -m benchmarks.predict_fastpath --model-root /tmp/reg --dataset datasets/h200x2
    .venv/bin/python -m benchmarks.predict_fastpath --version 20261123T052114Z-b9f8a2fb \
        --dataset datasets/h200x2 --dataset datasets/h200x2-moe                     # a registered version

1. Single decision: ``Predictor.recommend([scenario], mode)`` (features, pairs, both forests, fallback,
   the measured neighbours, the Recommendation) on one core (the process is pinned to CPU 0, XGBoost to one
   thread), for ``--single`` distinct scenarios after a warm-up, on the fast path
   (``training.predict.fastpath``) and on the reference path (``xgboost.Booster.inplace_predict``), and the
   neighbour count alone (``training.predict.coverage``, part of ``recommend``); median and p90
   microseconds.
2. Batch: ``recommend`` of 10,000 distinct scenarios (the predictor picks its path by batch size),
   ``--reps`` times; best and median seconds.
3. Equality: with ``--dataset`` (repeat it to combine datasets), the fast and the reference path's picks on
   every (scenario, mode) row.

Writes ``benchmarks/results/predict-fastpath.json`` (``--out``) and prints a table. Goals: single decision
<= 100 us, 10,000 scenarios <= 0.3 s, picks identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks import REPO

GOALS = {"single_us": 100.0, "batch_10k_s": 0.3}


def random_scenarios(count: int, seed: int, hardware) -> list:
    """``count`` distinct dense scenarios on ``hardware`` (world size 2): tokens 128-64k, n and k 128-28k."""
    from ficco.features import Scenario

    rng = np.random.default_rng(seed)
    seen, out = set(), []
    while len(out) < count:
        key = (str(rng.choice(["ag_gemm", "gemm_rs"])), 2 * int(rng.integers(64, 32769)),
               128 * int(rng.integers(1, 225)), 128 * int(rng.integers(1, 225)))  # fmt: skip
        if key not in seen:
            seen.add(key)
            out.append(Scenario(op=key[0], m=key[1], n=key[2], k=key[3], hardware=hardware))
    return out


def time_single(predictor, scenarios: list, mode: str, path: str) -> list[float]:
    """Microseconds of each one-scenario decision: ``decide`` (features, both forests, pick, fallback) on
    the ``fast`` or ``reference`` path, ``recommend`` (the fast decision, the neighbour count and the
    Recommendation), or ``neighbours`` (the count alone)."""
    from ficco.features import feature_matrix

    out = []
    for s in scenarios:
        start = time.perf_counter()
        if path == "recommend":
            predictor.recommend([s], mode=mode)
        elif path == "neighbours":
            predictor.coverage.count([s], mode)
        else:
            predictor.decide(feature_matrix([s]), [mode], fast=path == "fast")
        out.append((time.perf_counter() - start) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-root", type=Path, default=REPO / "models")
    parser.add_argument("--hardware", default="h200x2")
    parser.add_argument("--version", default=None, help="Registered version (default: the current one).")
    parser.add_argument("--dataset", type=Path, action="append", help="Dataset(s) for the equality check.")
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "predict-fastpath.json")
    args = parser.parse_args()

    from ficco.features import get_hardware
    from ficco.tables import text_table
    from ficco.training.predict.registry import load_predictor

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    predictor = load_predictor(args.model_root, args.hardware, args.version)
    for model in (predictor.scorer, predictor.ratio):
        model.booster_.set_param({"nthread": 1})
    hw = get_hardware(args.hardware)
    scenarios = random_scenarios(args.single + 10_000, 0, hw)
    single, batch = scenarios[: args.single], scenarios[args.single :]
    results: dict = {"model_version": predictor.version, "feature_schema": predictor.feature_schema,
                     "objective": predictor.scorer.objective,
                     "trees": int(predictor.scorer.n_estimators + (0 if predictor.ratio is predictor.scorer
                     else predictor.ratio.n_estimators)),
                     "distinct_trees": {m: len(t.roots) for m, t in predictor._fast.trees.items()},
                     "single": {}, "batch_10k": {}}  # fmt: skip
    for mode in ("eager", "graph"):
        time_single(predictor, single[:50], mode, "recommend")  # warm-up
        paths = ("fast", "recommend", "reference") + (
            ("neighbours",) if predictor.coverage is not None else ()
        )
        for path in paths:
            us = time_single(predictor, single, mode, path)
            results["single"][f"{mode}/{path}"] = {
                "median_us": statistics.median(us), "p90_us": float(np.percentile(us, 90)),
            }  # fmt: skip
        seconds = []
        for _ in range(args.reps):
            start = time.perf_counter()
            predictor.recommend(batch, mode=mode)
            seconds.append(time.perf_counter() - start)
        results["batch_10k"][mode] = {"best_s": min(seconds), "median_s": statistics.median(seconds)}
    if args.dataset:
        from ficco.training.dataset_table import load_dataset_table

        table = load_dataset_table(*args.dataset).table
        fast = predictor.decide(table.X, table.modes, fast=True)
        reference = predictor.decide(table.X, table.modes, fast=False)
        results["equality"] = {"dataset": " + ".join(map(str, args.dataset)), "rows": len(table),
                               "different_picks": int(np.sum(fast.final != reference.final))}  # fmt: skip
    results["goals"] = GOALS
    results["machine"] = {"cpu": platform.processor() or platform.machine(),
                          "python": platform.python_version(),
                          "cores_used": 1}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"model {predictor.version} ({results['objective']}, {results['trees']} trees, distinct per mode "
        f"after specialisation {results['distinct_trees']}), one core"
    )
    single = [[name, f"{r['median_us']:.1f}", f"{r['p90_us']:.1f}"] for name, r in results["single"].items()]
    print(text_table(["single decision", "median us", "p90 us"], single, align="<>>"))
    batch = [[name, f"{r['best_s']:.3f}", f"{r['median_s']:.3f}"] for name, r in results["batch_10k"].items()]
    print(text_table(["batch of 10,000", "best s", "median s"], batch, align="<>>"))
    if "equality" in results:
        e = results["equality"]
        print(f"picks fast vs reference on {e['dataset']}: {e['different_picks']} of {e['rows']} rows differ")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
