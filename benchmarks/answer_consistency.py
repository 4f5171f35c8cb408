"""Does every answer agree with its own prediction? The guarantee of ``training.predict.policy``, checked.

    python -m benchmarks.answer_consistency                      # the registry's models, every dataset
    python -m benchmarks.answer_consistency --random 2000 --no-tables --out /tmp/consistency.json

For each model the registry serves (each hardware's ``CURRENT``), in both modes:

- **answers**: ``Predictor.decide`` on every scenario of every committed dataset of its hardware
  (``datasets/*/manifest.json``) and on ``--random`` random scenarios of its ops (:func:`random_scenarios`:
  m, n and k log-uniform in [64, 65536] and [256, 32768], MoE layers of common expert counts): how many
  recommendations are predicted slower than serial/sm beyond the mode's noise band (speedup below
  ``1 / (1 + noise_band)``; goal 0), and how many are a ``/hp`` schedule whose normal-priority twin is
  predicted within the band of it (the tie rule; goal 0);
- **tables**: the schedule tables ``ficco export`` builds for ``--tables-dataset``'s shapes (default
  ``datasets/h200x2``, at its world size) and the grid tables shipped with the model
  (``training.export.read_grid_table``): ranges whose lowest predicted speedup is below the band (goal 0),
  ranges per table, and range boundaries where the schedule only changes its stream priority (twin flips:
  after the tie rule, only where the regressor predicts the ``/hp`` schedule faster than its twin by more
  than the band).

Prints a table and writes JSON (default ``benchmarks/results/answer-consistency.json``). Exit status 1 when a
goal is missed.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import REPO
from ficco.features import MODES, OPS, Scenario, feature_matrix
from ficco.features.launch_cost import TWIN_OF
from ficco.features.scenario import MOE_OPS
from ficco.features.schedule_table import ScheduleTableFile
from ficco.files import write_text_atomic
from ficco.tables import markdown_table
from ficco.training.predict.pairs import SCHEDULES

MOE_LAYERS = ((8, 2), (16, 4), (64, 6), (64, 8), (128, 8), (256, 8))
"""(experts, top_k) of the random MoE scenarios: Mixtral, Qwen-MoE, DeepSeek and gpt-oss-like layers."""
ROUNDING = 5e-5
"""A table's speedups are rounded to 4 decimals: the slack of its comparison with the band."""
_HP = np.array([s.endswith("/hp") for s in SCHEDULES])


def random_scenarios(predictor: Any, count: int, *, seed: int = 0) -> list[Scenario]:
    """``count`` valid scenarios of the ops ``predictor`` was trained on, on its hardware at its first world
    size: m log-uniform in [64, 65536], n and k in [256, 32768] (multiples of 64), MoE layers from
    :data:`MOE_LAYERS`."""
    from ficco.training.export import trained_world_sizes

    rng = np.random.default_rng(seed)
    hardware, world_size = predictor.profile, trained_world_sizes(predictor.card)[0]
    ops = [op for op in OPS if op in (predictor.card.get("ops") or ("ag_gemm", "gemm_rs"))]
    out: list[Scenario] = []
    while len(out) < count:
        op = ops[rng.integers(len(ops))]
        m, n, k = (int(np.exp(rng.uniform(np.log(lo), np.log(hi)))) for lo, hi in
                   ((64, 65536), (256, 32768), (256, 32768)))  # fmt: skip
        experts, top_k = MOE_LAYERS[rng.integers(len(MOE_LAYERS))] if op in MOE_OPS else (0, 0)
        shape = {"m": m - m % world_size, "n": max(64, n - n % 64), "k": max(64, k - k % 64)}
        try:
            out.append(Scenario(op=op, **shape, world_size=world_size, hardware=hardware, experts=experts,
                                top_k=top_k))  # fmt: skip
        except ValueError:  # e.g. experts not a multiple of the world size
            continue
    return out


def check_answers(predictor: Any, scenarios: list[Scenario], mode: str) -> dict[str, Any]:
    """The guarantee over ``scenarios`` in ``mode``: counts of answers, of answers predicted slower than
    serial beyond the band, of /hp answers within the band of their twin, the lowest predicted speedup."""
    policy = predictor.policy.of(mode)
    d = predictor.decide(feature_matrix(scenarios), [mode] * len(scenarios))
    rows = np.arange(len(scenarios))
    picked = d.speedups[rows, d.final]
    twin = d.speedups[rows, TWIN_OF[d.final]]
    tied = _HP[d.final] & (twin * (1 + policy.noise_band) >= picked) & (twin >= policy.slowest)
    return {
        "answers": len(scenarios),
        "noise_band": policy.noise_band,
        "below_band": int((picked < policy.slowest).sum()),
        "hp_ties": int(tied.sum()),
        "lowest_speedup": round(float(picked.min()), 4),
        "fallbacks": int(d.fallback.sum()),
        "changed_by_policy": int((d.final != d.raw).sum()),
    }


def check_table(table: ScheduleTableFile, slowest: float) -> dict[str, Any]:
    """Ranges of a schedule table whose lowest predicted speedup is below ``slowest``, ranges, range
    boundaries (where the schedule changes, or whether the range is off the measured map) and the boundaries
    where only the stream priority changes (twin flips)."""
    ranges = boundaries = flips = below = 0
    for entry in table.entries.values():
        for track in entry.tracks:
            names = [r.schedule for r in track.ranges]
            ranges += len(names)
            below += sum(r.min_speedup < slowest - ROUNDING for r in track.ranges)
            for a, b in itertools.pairwise(names):
                boundaries += 1
                flips += int(a != b and TWIN_OF[SCHEDULES.index(a)] == TWIN_OF[SCHEDULES.index(b)])
    return {"entries": len(table.entries), "ranges": ranges, "boundaries": boundaries, "twin_flips": flips,
            "below_band": below}  # fmt: skip


def dataset_scenarios(hardware_id: str) -> dict[str, list[Scenario]]:
    """Every committed dataset of ``hardware_id`` (its manifest's hardware): its distinct scenarios."""
    from ficco.training.dataset_table import load_dataset_table

    out = {}
    for path in sorted((REPO / "datasets").glob("*/manifest.json")):
        hardware = json.loads(path.read_text()).get("hardware", {})
        if (hardware.get("id") if isinstance(hardware, dict) else hardware) != hardware_id:
            continue
        table = load_dataset_table(path.parent).table
        seen = dict.fromkeys(table.scenarios)
        out[str(path.parent.relative_to(REPO))] = list(seen)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every check of the module docstring, for every served model."""
    from ficco.training.export import (
        build_schedule_table,
        dataset_shapes,
        read_grid_table,
        trained_world_sizes,
    )
    from ficco.training.predict.registry import current_version, list_models, load_predictor

    models = {}
    for hw in sorted(list_models(args.model_root)):
        version = current_version(args.model_root, hw)
        if version is None:
            continue
        predictor = load_predictor(args.model_root, hw, version)
        sets = {**dataset_scenarios(predictor.profile.id), "random": random_scenarios(predictor, args.random)}
        answers = {
            name: {mode: check_answers(predictor, s, mode) for mode in MODES} for name, s in sets.items()
        }
        tables = {}
        world_size = trained_world_sizes(predictor.card)[0]
        for mode in MODES:
            slowest = predictor.policy.of(mode).slowest
            shipped = read_grid_table(args.model_root / hw / version, predictor, tp=world_size, mode=mode,
                                      dtype="bf16")  # fmt: skip
            if shipped is not None:
                table = ScheduleTableFile.from_dict(
                    json.loads(gzip.decompress(shipped)), "shipped grid table"
                )
                tables[f"shipped grid, {mode}"] = check_table(table, slowest)
            if args.tables_dataset is not None and predictor.profile.id in str(args.tables_dataset):
                shapes = dataset_shapes([args.tables_dataset], tp=world_size, dtype="bf16")
                start = time.perf_counter()
                table = build_schedule_table(
                    predictor, shapes, world_size=world_size, mode=mode, dtype="bf16", allow_simulated=True
                )
                key = f"{Path(args.tables_dataset).name} shapes, {mode}"
                tables[key] = {
                    **check_table(table, slowest),
                    "build_s": round(time.perf_counter() - start, 1),
                }
        models[f"{hw}/{version}"] = {"answers": answers, "tables": tables}
    return {
        "machine": {"cpus": len(__import__("os").sched_getaffinity(0)), "python": platform.python_version()},
        "random": args.random,
        "models": models,
    }


def render(result: dict[str, Any]) -> str:
    """The results as markdown tables."""
    lines = ["# Answers against their own predictions", ""]
    for model, found in result["models"].items():
        rows = [
            [name, mode, c["answers"], f"{c['noise_band']:.2%}", c["below_band"], c["hp_ties"],
             c["lowest_speedup"], c["fallbacks"], c["changed_by_policy"]]
            for name, modes in found["answers"].items() for mode, c in modes.items()
        ]  # fmt: skip
        lines += [f"Model `{model}`: recommendations (goal: 0 below the band, 0 /hp ties)", ""]
        header = ["set", "mode", "answers", "noise band", "below band", "/hp ties", "lowest speedup",
                  "fallbacks", "changed by the policy"]  # fmt: skip
        lines.append(markdown_table(header, rows))
        rows = [[name, t["entries"], t["ranges"], t["boundaries"], t["twin_flips"], t["below_band"],
                 t.get("build_s", "")] for name, t in found["tables"].items()]  # fmt: skip
        lines += ["", "Schedule tables (goal: 0 ranges below the band)", ""]
        header = ["table", "entries", "ranges", "boundaries", "twin flips", "below band", "build s"]
        lines.append(markdown_table(header, rows))
        lines.append("")
    return "\n".join(lines)


def missed(result: dict[str, Any]) -> list[str]:
    """The goals missed, one line each."""
    out = []
    for model, found in result["models"].items():
        for name, modes in found["answers"].items():
            out += [f"{model} {name} {mode}: {c['below_band']} below the band, {c['hp_ties']} /hp ties"
                    for mode, c in modes.items() if c["below_band"] or c["hp_ties"]]  # fmt: skip
        out += [f"{model} {name}: {t['below_band']} ranges below the band"
                for name, t in found["tables"].items() if t["below_band"]]  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-root", type=Path, default=REPO / "models")
    parser.add_argument("--random", type=int, default=10_000, help="random scenarios per model and mode")
    parser.add_argument("--tables-dataset", type=Path, default=REPO / "datasets" / "h200x2")
    parser.add_argument("--no-tables", dest="tables_dataset", action="store_const", const=None)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "answer-consistency.json"
    )
    args = parser.parse_args()
    result = run(args)
    text = render(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    write_text_atomic(args.out.with_suffix(".md"), text)
    problems = missed(result)
    for line in problems:
        print(f"missed: {line}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
