"""How fast a runtime decides from an exported schedule table, and how often the table gives the model's pick.

    python -m benchmarks.table_lookup                                   # every committed h200x2 dataset
    python -m benchmarks.table_lookup --dataset datasets/h200x2 --out /tmp/table-lookup.json

Exports the promoted h200x2 model's tables (``ficco export``, both modes) for every (op, n, k) of the
datasets, then:

- off the grid, per mode: for every shape, ``--random`` token counts drawn log-uniformly from [1, 65536]
  that a scenario of it can have and that are no point of ``training.export.token_grid`` (what a runtime
  meets between the export's grid points): the share where ``TableSource``'s answer is the model's own pick
  (``Predictor.decide`` at that token count), per split class of the token count too, and how many answers
  could not run there (``Schedule.check``);
- per dataset and mode: the same agreement on the dataset's (scenario, mode) rows, and the lookup time,
  ``TableSource.answer(scenario, mode)`` over every row, ``--repeats`` passes, the median pass's time per
  decision in microseconds (a dict lookup, the split class and a bisection), beside
  ``PredictorSource.recommend`` of one scenario (the model asked per shape) for scale.

Prints tables and writes JSON (default ``benchmarks/results/table-lookup.json``). Goal: at least 98% agreement
off the grid in both modes, and no answer that cannot run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import REPO
from ficco.features import Scenario, Schedule, feature_matrix
from ficco.features.schedule import max_splits
from ficco.runtime.sources import PredictorSource, TableSource
from ficco.tables import text_table
from ficco.training.dataset_table import load_dataset_table
from ficco.training.export import dataset_shapes, export, token_grid
from ficco.training.predict.registry import load_predictor

DEFAULT_DATASETS = sorted(p for p in (REPO / "datasets").glob("h200x2*") if (p / "manifest.json").exists())
GOAL_AGREEMENT = 0.98
"""Least share of off-grid token counts where the table gives the model's pick."""


def off_grid_scenarios(shapes: list, hardware, count: int, seed: int, world_size: int = 2) -> list[Scenario]:
    """``count`` scenarios per shape at log-uniform token counts in [1, 65536] it can have that are no
    point of ``token_grid(world_size)``."""
    rng = np.random.default_rng(seed)
    grid = set(token_grid(world_size).tolist())
    out = []
    for op, n, k, experts, top_k in shapes:
        drawn = 0
        while drawn < count:
            m = int(np.exp(rng.uniform(0.0, np.log(65536))))
            if m in grid or (m * (top_k or 1)) % world_size:
                continue
            out.append(Scenario(op=op, m=m, n=n, k=k, experts=experts, top_k=top_k, world_size=world_size,
                                hardware=hardware))  # fmt: skip
            drawn += 1
    return out


def off_grid(source: TableSource, predictor, scenarios: list[Scenario], mode: str) -> dict:
    """Agreement with the model (in all and per split class) and unrunnable answers at ``scenarios``."""
    answers = [source.answer(s, mode).schedule for s in scenarios]
    model = predictor.decide(feature_matrix(scenarios), [mode] * len(scenarios)).schedules
    same = np.asarray(answers, dtype=object) == model
    unrunnable = 0
    for s, a in zip(scenarios, answers, strict=True):
        try:
            Schedule.parse(a).check(s)
        except ValueError:
            unrunnable += 1
    classes = np.array([max_splits(s.rows, s.world_size) for s in scenarios])
    return {
        "mode": mode,
        "n": len(scenarios),
        "agreement": float(same.mean()),
        "by_split_class": {
            str(c): {"n": int((classes == c).sum()), "agreement": float(same[classes == c].mean())}
            for c in sorted(set(classes.tolist()), reverse=True)
        },
        "unrunnable": unrunnable,
    }


def per_decision_us(source: TableSource, rows: list, repeats: int) -> float:
    """Median over ``repeats`` passes of one pass's time over ``rows`` ((scenario, mode)), us per decision."""
    answer = source.answer
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for scenario, mode in rows:
            answer(scenario, mode)
        times.append((time.perf_counter() - start) / len(rows) * 1e6)
    return statistics.median(times)


def model_per_decision_us(predictor, rows: list, n: int = 200) -> float:
    """Median time of ``PredictorSource.recommend`` of one scenario over ``n`` rows, us."""
    source = PredictorSource(predictor)
    times = []
    for scenario, mode in rows[:n]:
        start = time.perf_counter()
        source.recommend([scenario], mode)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, action="append", help="Dataset directory (repeatable).")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--random", type=int, default=32, help="Off-grid token counts per shape.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "table-lookup.json")
    args = parser.parse_args()
    datasets = args.dataset or DEFAULT_DATASETS
    predictor = load_predictor(args.models, "h200x2")
    shapes = sorted({s for d in datasets for s in dataset_shapes([d], tp=2, dtype="bf16")})
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        paths = export(predictor, out=tmp, shapes=shapes, world_size=2)
        export_s = time.perf_counter() - start
        source = TableSource.load(tmp, machine=None)
        sizes = {p.name: p.stat().st_size for p in paths}
        header = source.tables[0].header
    scenarios = off_grid_scenarios(shapes, predictor.profile, args.random, args.seed)
    random_results = [off_grid(source, predictor, scenarios, mode) for mode in ("eager", "graph")]
    results = []
    for dataset in datasets:
        table = load_dataset_table(dataset).table
        model = predictor.decide(table.X, table.modes).schedules
        for mode in sorted(set(table.modes)):
            on = table.modes == mode
            rows = [(s, mode) for s, m in zip(table.scenarios, table.modes, strict=True) if m == mode]
            looked_up = np.asarray([source.answer(s, m).schedule for s, m in rows], dtype=object)
            results.append({
                "dataset": dataset.name,
                "mode": mode,
                "n_rows": len(rows),
                "agreement": float(np.mean(looked_up == model[on])),
                "lookup_us": per_decision_us(source, rows, args.repeats),
                "model_us": model_per_decision_us(predictor, rows),
            })  # fmt: skip
    n_breakpoints = [
        sum(len(k.breakpoints) for k in e.tracks) for t in source.tables for e in t.entries.values()
    ]
    summary = {
        "model": f"{predictor.hardware_id}/{predictor.version}",
        "n_shapes": len(shapes),
        "export_s": round(export_s, 1),
        "files": sizes,
        "grid": header["grid"],
        "mean_breakpoints_per_shape": float(np.mean(n_breakpoints)),
        "off_grid": random_results,
        "goal_agreement": GOAL_AGREEMENT,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "results": results,
    }
    rows = [[r["dataset"], r["mode"], str(r["n_rows"]), f"{r['agreement']:.2%}", f"{r['lookup_us']:.2f}",
             f"{r['model_us']:.0f}"] for r in results]  # fmt: skip
    print(
        text_table(
            ["dataset", "mode", "rows", "table = model", "lookup us", "model us"], rows, align="<<>>>>"
        )
    )
    print(f"{len(shapes)} shapes exported in {export_s:.0f} s; {summary['mean_breakpoints_per_shape']:.1f} "
          "breakpoints per shape (all split classes)")  # fmt: skip
    rows = [[r["mode"], str(r["n"]), f"{r['agreement']:.2%}", str(r["unrunnable"]),
             ", ".join(f"{c}: {v['agreement']:.2%}" for c, v in r["by_split_class"].items())]
            for r in random_results]  # fmt: skip
    print(f"\noff the grid: {args.random} random token counts per shape (goal: >= {GOAL_AGREEMENT:.0%}, none "
          "unrunnable)")  # fmt: skip
    print(
        text_table(["mode", "lookups", "table = model", "cannot run", "by split class"], rows, align="<>>><")
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
