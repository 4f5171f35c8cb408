"""Graph-mode study: where the shipped ranker misses in CUDA-graph mode, and which changes to the model or its
decision rule close the gap to the noise ceiling without losing the unseen model families.

    .venv/bin/python -m benchmarks.studies.graph_study --refits 5 --out reports/graph-study-h200x2.json

Every candidate is scored the way ``ficco evaluate`` scores the model (``training.evaluate``), per mode:

- ``cv``: grouped cross-validation of the training data (``datasets/h200x2`` + ``datasets/h200x2-moe``;
  ``training.crossval`` folds: model families and grid quartiles held out), geometric-mean regret, the same on
  the rows the re-measure (``noise.parquet``) covers beside the noise ceiling there, and the picks more than
  2% slower than serial/sm;
- ``v2``: those held-out picks scored against the independent sweep ``datasets/h200x2-v2`` (``rescored``);
- ``unseen``: a model fitted on all the training data, scored on the scenarios of each unseen-family set
  (``--unseen``, repeated) that the training data lacks (``training.evaluate.unseen``), and their mean.

Candidates (the shipped ranker, ``training.fit.CONFIG_GRID``'s ``ndcg`` configuration, under each):

- ``current``: as shipped (no fallback in either mode, the card's choice);
- ``wave_gemm``: two more scenario columns, the GEMM's time counted in whole waves of 128x256 output tiles
  over the SMs (``log2``) and the communication's roofline time over it (``log2``);
- ``wave_inflation``: ``log2`` of the waves all ``w * s`` chunks of a split take over the unsplit GEMM's
  waves, for ``s`` in 1, 2, 4, 8;
- ``min_child_weight_3``: larger leaves;
- ``per_mode``: one ranker per execution mode;
- ``bagged_8``: the mean score of 8 rankers, each fitted on a bootstrap resample of the training queries
  (8x the trees a decision walks);
- ``graph_blend_<a>``: graph mode picks by ranker cost plus ``a`` times the time-ratio regressor's predicted
  ``log(t / t_serial)`` (the regressor the fallback already evaluates; eager picks unchanged);
- ``graph_margin_<m>``: a graph pick falls back to serial/sm when the ranker scores it less than ``m``
  above serial/sm (eager picks unchanged).

With ``--refits N``, every single-ranker candidate is also refitted ``N`` times, each on its own random
95% of the pairs (seeds 1..N), and ``refits`` records the mean, min and max of its CV, v2 and unseen-mean
regret per mode: how far a refit alone moves the numbers, the yardstick a candidate's difference to
``current`` needs to beat.

Prints a table and writes the JSON (``--out``). Single-threaded XGBoost; the fits are deterministic.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import REPO

TRAINING = ("datasets/h200x2", "datasets/h200x2-moe")
UNSEEN = ("datasets/h200x2-unseen", "datasets/h200x2-unseen-v3", "datasets/h200x2-heldout",
          "datasets/h200x2-heldout-v3")  # fmt: skip
BLENDS = (0.5, 1.0, 2.0, 8.0)
"""Weights ``a`` of the time-ratio regressor in graph mode."""
MARGINS = (0.3, 0.75)
"""Ranker-score margins of the graph fallback."""
BAGS = 8
"""Bootstrap rankers of ``bagged_8``."""
REFIT_SUBSAMPLE = 0.95
"""Share of the pairs each ``--refits`` refit samples (with its own seed): a perturbation of the fit alone."""
TILE = (128, 256)
"""Output tile of Hopper's large bf16 GEMM kernels (``features.vector._WAVE_TILE``)."""

Extra = Callable[[object, np.ndarray], np.ndarray] | None
"""Extra scenario columns of a candidate: (table, pair rows ``[N]``) -> ``[N, e]``."""


def wave_columns(table) -> np.ndarray:
    """Per row of ``table``: ``log2`` whole-wave GEMM time (us), ``log2`` roofline comm time over it, and
    ``log2`` wave inflation of a split into ``w * s`` chunks for ``s`` in 1, 2, 4, 8: float64 ``[n, 6]``."""
    from ficco.features.vector import roofline_comm_us

    out = []
    for s in table.scenarios:
        hw = s.hardware

        def waves(rows: float, n: int = s.n, sm: int = hw.sm_count) -> int:
            return math.ceil(math.ceil(rows / TILE[0]) * math.ceil(n / TILE[1]) / sm)

        tile_us = 1e6 * 2 * TILE[0] * TILE[1] * s.k / (hw.peak_bf16_tflops * 1e12 / hw.sm_count)
        per_rank = max(1, s.experts // s.world_size) if s.experts else 1
        t_wave = waves(s.rows) * tile_us * per_rank
        chunked = [
            s.world_size * k * waves(s.rows / (s.world_size * k)) / waves(s.rows) for k in (1, 2, 4, 8)
        ]
        out.append([math.log2(t_wave), math.log2(roofline_comm_us(s) / t_wave), *np.log2(chunked)])
    return np.asarray(out)


def pairs(table, valid: np.ndarray, extra: Extra) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pair matrix of ``table``'s ``valid`` (row, schedule) cells with ``extra``'s columns appended."""
    from ficco.training.predict.pairs import pair_matrix

    Z, (rows, cols) = pair_matrix(table.X, table.modes, valid=valid, host_factor=table.host_factors)
    if extra is not None:
        Z = np.hstack([Z, extra(table, rows).astype(np.float32)])
    return Z, rows, cols


def fit(table, extra: Extra, *, objective: str = "ndcg", seed: int = 0, **params):
    """A booster of the shipped configuration (or the time-ratio regressor) on every measured pair."""
    from ficco.training.fit import CONFIG_GRID, RATIO_CONFIG
    from ficco.training.model import relevance_grades

    config = (
        RATIO_CONFIG if objective == "ratio" else next(c for c in CONFIG_GRID if c.objective == objective)
    )
    model = config.estimator(seed=seed, n_jobs=1)._xgb()
    model.set_params(**params)  # XGBoost's own names: min_child_weight, subsample
    Z, rows, cols = pairs(table, np.isfinite(table.times_ms), extra)
    y = np.log(table.times_ms[rows, cols] / table.serial_ms[rows])
    if objective == "ratio":
        model.fit(Z, y)
    else:
        model.fit(Z, relevance_grades(y, rows), qid=rows)
    return model.get_booster()


def costs(booster, table, extra: Extra, *, objective: str = "ndcg") -> np.ndarray:
    """Cost (lower is faster) of every valid schedule of each row, ``[n, S]`` (+inf: invalid); for the
    regressor, its predicted ``log(t / t_serial)`` (0 for serial/sm, by definition)."""
    from ficco.training.predict.pairs import SERIAL_INDEX, valid_mask

    Z, rows, cols = pairs(table, valid_mask(table.X), extra)
    out = np.full(table.times_ms.shape, np.inf)
    raw = booster.inplace_predict(Z)
    out[rows, cols] = raw if objective == "ratio" else -raw
    if objective == "ratio":
        out[:, SERIAL_INDEX] = 0.0
    return out


def bagged(fitter: Callable, table, *, bags: int) -> list:
    """``bags`` boosters, each ``fitter`` of a bootstrap resample of ``table``'s rows (queries)."""
    out = []
    for b in range(bags):
        index = np.sort(np.random.default_rng(b).integers(0, len(table), len(table)))
        out.append(fitter(table.subset(index), seed=b))
    return out


def candidate_costs(name: str, train, tests: list, extra: Extra, **jitter) -> list[np.ndarray]:
    """Ranker costs ``[n, S]`` of each table of ``tests`` for candidate ``name`` trained on ``train``;
    ``jitter``: further booster parameters (a refit's ``seed`` and ``subsample``)."""
    if name == "per_mode":
        boosters = {m: fit(train.subset(train.modes == m), extra, **jitter) for m in ("eager", "graph")}
        out = [np.zeros(test.times_ms.shape) for test in tests]
        for o, test in zip(out, tests, strict=True):
            for mode, booster in boosters.items():
                on = test.modes == mode
                o[on] = costs(booster, test.subset(on), extra)
        return out
    if name == "bagged_8":
        boosters = bagged(lambda t, seed: fit(t, extra, seed=seed), train, bags=BAGS)
        return [np.mean([costs(b, test, extra) for b in boosters], axis=0) for test in tests]
    params = {"min_child_weight": 3.0} if name == "min_child_weight_3" else {}
    booster = fit(train, extra, **params, **jitter)
    return [costs(booster, test, extra) for test in tests]


def decide(
    cost: np.ndarray, ratio: np.ndarray, modes: np.ndarray, rule: tuple[str, float] | None
) -> np.ndarray:
    """Picks ``[n]`` from ranker costs and regressor log ratios ``[n, S]`` under a graph-mode ``rule``
    (``("blend", a)`` or ``("margin", m)``; None: the ranker's own pick)."""
    from ficco.training.predict.pairs import SERIAL_INDEX

    graph = modes == "graph"
    if rule is not None and rule[0] == "blend":
        cost = np.where(graph[:, None], cost + rule[1] * np.where(np.isinf(cost), 0.0, ratio), cost)
    picks = cost.argmin(axis=1)
    if rule is not None and rule[0] == "margin":
        n = np.arange(len(picks))
        low = (cost[n, SERIAL_INDEX] - cost[n, picks] < rule[1]) & graph
        picks = np.where(low, SERIAL_INDEX, picks)
    return picks


def mode_scores(table, picks: np.ndarray, noise=None, rescore=None) -> dict:
    """Per mode: geomean regret, picks > 2% slower than serial, and (with ``noise``) the same regret and the
    ceiling on the re-measured rows, (with ``rescore``) the regret and slow picks against its labels."""
    from ficco.training.evaluate import aligned_rows
    from ficco.training.metrics import score

    out = {}
    for mode in ("eager", "graph"):
        on = table.modes == mode
        sub, p = table.subset(on), picks[on]
        s = score(sub, p)
        row = {
            "geomean_regret": s["geomean_regret"],
            "n_slower_than_serial_2pct": s["n_slower_than_serial_2pct"],
        }
        if noise is not None:
            rows, other = aligned_rows(sub, noise)
            row["on_ceiling_rows"] = score(sub.subset(rows), p[rows])["geomean_regret"]
            row["ceiling"] = score(sub.subset(rows), noise.best[other])["geomean_regret"]
        if rescore is not None:
            rows, other = aligned_rows(sub, rescore)
            r = score(rescore.subset(other), p[rows])
            row["v2_geomean_regret"] = r["geomean_regret"]
            row["v2_n_slower_than_serial_2pct"] = r["n_slower_than_serial_2pct"]
        out[mode] = row
    return out


def study(unseen_paths: tuple[str, ...], refits: int = 0) -> dict:
    """Every candidate's scores (module docstring)."""
    from ficco.training.crossval import cv_folds, cv_groups
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.evaluate import unseen

    loaded = load_dataset_table(*(REPO / p for p in TRAINING))
    table, noise = loaded.table, loaded.noise
    v2 = load_dataset_table(REPO / "datasets/h200x2-v2").table
    tests = {Path(p).name: unseen(load_dataset_table(REPO / p).table, table)[0] for p in unseen_paths}
    folds = cv_folds(cv_groups(table))
    cache: dict[int, np.ndarray] = {}

    def wave(index: slice) -> Extra:
        def columns(t, rows: np.ndarray) -> np.ndarray:
            if id(t) not in cache:
                cache[id(t)] = (t, wave_columns(t))  # keep t alive: ids stay unique
            return cache[id(t)][1][rows][:, index]

        return columns

    extras: dict[str, Extra] = {"wave_gemm": wave(slice(0, 2)), "wave_inflation": wave(slice(2, 6))}
    models = ("current", "wave_gemm", "wave_inflation", "min_child_weight_3", "per_mode", "bagged_8")
    rules: dict[str, tuple[str, float]] = {f"graph_blend_{a:g}": ("blend", a) for a in BLENDS}
    rules |= {f"graph_margin_{m:g}": ("margin", m) for m in MARGINS}
    held = {name: np.zeros(table.times_ms.shape) for name in (*models, "ratio")}
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        train, sub = table.subset(~test), table.subset(test)
        for name in models:
            held[name][test] = candidate_costs(name, train, [sub], extras.get(name))[0]
        held["ratio"][test] = costs(fit(train, None, objective="ratio"), sub, None, objective="ratio")
    full = {
        name: dict(
            zip(tests, candidate_costs(name, table, list(tests.values()), extras.get(name)), strict=True)
        )
        for name in models
    }
    ratio = fit(table, None, objective="ratio")
    full["ratio"] = {t: costs(ratio, test, None, objective="ratio") for t, test in tests.items()}

    results = {}
    for name in (*models, *rules):
        source, rule = (name, None) if name in models else ("current", rules[name])
        picks = decide(held[source], held["ratio"], table.modes, rule)
        by_set = {
            t: mode_scores(test, decide(full[source][t], full["ratio"][t], test.modes, rule))
            for t, test in tests.items()
        }
        results[name] = {
            "cv": mode_scores(table, picks, noise, v2),
            "unseen": by_set,
            "unseen_mean": {
                m: float(np.mean([s[m]["geomean_regret"] for s in by_set.values()]))
                for m in ("eager", "graph")
            },
        }
    for name in models[:-1] if refits else ():  # bagged_8 resamples already
        results[name]["refits"] = refit_spread(name, table, tests, folds, noise, v2, extras.get(name), refits)
    return results


def refit_spread(
    name: str, table, tests: dict, folds: np.ndarray, noise, v2, extra: Extra, refits: int
) -> dict:
    """Candidate ``name`` refitted ``refits`` times (seeds 1.., ``REFIT_SUBSAMPLE`` of the pairs each): the
    spread of CV, v2 and unseen-mean regret a refit alone gives, per mode (mean, min, max)."""
    runs = []
    for seed in range(1, refits + 1):
        jitter = {"seed": seed, "subsample": REFIT_SUBSAMPLE}
        held = np.zeros(table.times_ms.shape)
        for fold in sorted(set(folds.tolist())):
            test = folds == fold
            held[test] = candidate_costs(name, table.subset(~test), [table.subset(test)], extra, **jitter)[0]
        full = candidate_costs(name, table, list(tests.values()), extra, **jitter)
        cv = mode_scores(table, held.argmin(axis=1), noise, v2)
        by_set = [mode_scores(test, c.argmin(axis=1)) for test, c in zip(tests.values(), full, strict=True)]
        for mode in ("eager", "graph"):
            unseen_mean = float(np.mean([s[mode]["geomean_regret"] for s in by_set]))
            cells = {"cv": cv[mode]["geomean_regret"], "v2": cv[mode]["v2_geomean_regret"]}
            runs.append({"mode": mode, **cells, "unseen_mean": unseen_mean})
    out = {}
    for mode in ("eager", "graph"):
        rows = [r for r in runs if r["mode"] == mode]
        out[mode] = {
            key: {"mean": float(np.mean([r[key] for r in rows])), "min": min(r[key] for r in rows),
                  "max": max(r[key] for r in rows)}
            for key in ("cv", "v2", "unseen_mean")
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--unseen", action="append", help="Unseen-family dataset (repeat); default: all four."
    )
    parser.add_argument(
        "--refits", type=int, default=0, help="Refits per single-ranker candidate (spread of a refit alone)."
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "graph-study-h200x2.json")
    args = parser.parse_args()
    from ficco.tables import text_table

    results = study(tuple(args.unseen or UNSEEN), args.refits)
    rows = []
    for name, r in results.items():
        e, g = r["cv"]["eager"], r["cv"]["graph"]
        rows.append([name, f"{e['geomean_regret']:.2%}", f"{g['geomean_regret']:.2%}",
                     f"{g['on_ceiling_rows']:.2%} / {g['ceiling']:.2%}", str(g["n_slower_than_serial_2pct"]),
                     f"{g['v2_geomean_regret']:.2%}", str(g["v2_n_slower_than_serial_2pct"]),
                     f"{r['unseen_mean']['eager']:.2%}", f"{r['unseen_mean']['graph']:.2%}"])  # fmt: skip
    header = ["candidate", "CV eager", "CV graph", "graph on ceiling rows / ceiling", "graph >2% slower",
              "v2 graph", "v2 >2% slower", "unseen eager", "unseen graph"]  # fmt: skip
    print(text_table(header, rows, align="<" + ">" * (len(header) - 1)))
    cells = [(m, k) for m in ("eager", "graph") for k in ("cv", "unseen_mean")]
    spread = [
        [name, *(f"{r['refits'][m][k]['mean']:.2%} [{r['refits'][m][k]['min']:.2%}, "
                 f"{r['refits'][m][k]['max']:.2%}]" for m, k in cells)]
        for name, r in results.items() if "refits" in r
    ]  # fmt: skip
    if spread:
        header = ["refits: mean [min, max]", "CV eager", "unseen eager", "CV graph", "unseen graph"]
        print(text_table(header, spread, align="<>>>>"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
