"""The next scenarios to measure: where the shipped model has the fewest measured neighbours and its bagged
regressors disagree most, measured with the harness into a dataset of their own.

    python -m benchmarks.coverage_plan plan                                  # CPU: choose, write the plan
    python -m benchmarks.coverage_plan measure --minutes 8.5                 # GPU: sweep it (resumes)
    python -m benchmarks.coverage_plan measure --backend sim --out /tmp/cov  # CPU: with the simulator

``plan`` (training extra; a few CPU minutes):

1. Candidates: dense ``ag_gemm``/``gemm_rs`` at log-uniform token counts (every multiple of the world size:
   every split class, where the committed grid holds multiples of 128 only), n and k (multiples of 128,
   from the grid's range and down to 128: tiny GEMMs, narrow and deep reduce-scatters), and every layer of
   ``datasets/model_configs`` at token counts the datasets lack; MoE dispatch and combine of
   ``datasets/moe_configs`` at those token counts and a log-uniform grid of experts (8-256), top_k (1-8),
   n and k. Held-out model families (``unseen_configs``) are never candidates; neither are scenarios a
   committed dataset holds, nor ones whose simulated serial time exceeds ``--max-serial-ms``.
2. Scores of each candidate, with the shipped model (``models/``, current ``--hardware``): its measured
   neighbours in each mode (``training.predict.coverage``), and the spread (standard deviation over ``--bags``
   time-ratio regressors fitted on bootstrap samples of its training datasets' scenarios) of the predicted
   ``log(t_pick / t_serial)`` of the model's own pick, the larger over the modes.
3. Greedy choice, ``--dense`` dense and ``--moe`` MoE scenarios: each time the candidate of fewest
   neighbours (the fewer of its two modes), the largest spread among equals; a chosen scenario then counts
   as a neighbour of the candidates near it, so the choice spreads over the empty regions instead of
   filling one.

It writes the plan (``harness.plan.Plan``'s JSON, ``--plan``, committed: ``benchmarks/results/
coverage-plan-h200x2.json``) with every choice's scores in its settings, prints the neighbour counts before
and after, and the simulator's estimate of the GPU time (``harness.plan.estimate_sweep``; the committed
``datasets/h200x2`` took 23.0 min measuring against an estimate of 22.9) and how many scenarios one device
call of ``--call-minutes`` measures.

``measure`` sweeps the plan into ``--out`` (default ``datasets/h200x2-coverage``) with the dataset protocol
(both modes, ``harness.launch.WorkerSettings`` defaults), starting no scenario after ``--minutes``; run it
again to go on (finished scenarios are skipped), then it writes the dataset card. A dataset of its own
rather than rows appended to ``datasets/h200x2``: the harness refuses to resume a dataset on a machine of
another driver, CUDA, NCCL or torch version, and training reads several datasets of one machine as one
(``ficco train --dataset datasets/h200x2 --dataset datasets/h200x2-moe --dataset
datasets/h200x2-coverage``). On a GPU machine: ``benchmarks/coverage_sweep.sh``; what follows the sweep:
``benchmarks/coverage_after.sh``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from benchmarks import REPO

TRAINING = ("datasets/h200x2", "datasets/h200x2-moe")
"""The shipped model's training datasets (its card names them)."""
DEFAULT_PLAN = REPO / "benchmarks" / "results" / "coverage-plan-h200x2.json"
DEFAULT_OUT = REPO / "datasets" / "h200x2-coverage"
EXTRA_TOKENS: tuple[int, ...] = (16, 32, 48, 64, 96, 192, 384, 768, 1536, 3072, 6144, 12288, 24576, 49152)
"""Token counts of the model-config candidates: between and below the datasets' powers of two."""
TOKENS = (16, 65536)
"""Range of the synthetic candidates' token counts, log-uniform."""
DENSE_NK = (128, 57344)
"""Range of the synthetic dense candidates' n and k, log-uniform (the grid's upper end, down to tiny)."""
MOE_NK = (256, 8192)
"""Range of the synthetic MoE candidates' n and k (per expert), log-uniform."""
MOE_EXPERTS = (8, 16, 32, 64, 128, 256)
MOE_TOP_K = (1, 2, 4, 8)


def candidates(hw, *, tp: int, count: int, seed: int, max_serial_ms: float) -> list[tuple[str, object]]:
    """``(family, Scenario)`` candidates (module docstring, step 1), none a committed dataset holds."""
    from ficco.features import SERIAL, Scenario
    from ficco.features.dataset import GRID_FAMILY, load_dataset
    from ficco.features.model_config import layer_pairs, load_model_configs
    from ficco.harness.sim import SimBackend

    rng = np.random.default_rng(seed)
    sim = SimBackend(hw)
    taken = set()
    for path in sorted((REPO / "datasets").glob("h200x2*")):
        if (path / "manifest.json").exists():
            taken |= set(load_dataset(path)["scenario_id"])
    out: dict[str, tuple[str, object]] = {}

    def add(family: str, s) -> None:
        if s.key() not in taken and s.key() not in out and sim.schedule_ms(s, [SERIAL])[0] <= max_serial_ms:
            out[s.key()] = (family, s)

    def log_int(lo: int, hi: int, multiple: int) -> int:
        return max(multiple, round(math.exp(rng.uniform(math.log(lo), math.log(hi))) / multiple) * multiple)

    for folder, moe in (("model_configs", False), ("moe_configs", True)):
        for config in load_model_configs(REPO / "datasets" / folder):
            for tokens in EXTRA_TOKENS:
                try:
                    pairs = layer_pairs(config, tp=tp, tokens=tokens * tp, dtype="bf16", hardware=hw)
                except ValueError:
                    continue
                for pair in pairs:
                    if (pair.scenario.op in ("a2a_gemm", "gemm_a2a")) == moe:
                        add(config.name, pair.scenario)
    for _ in range(count):
        op = str(rng.choice(["ag_gemm", "gemm_rs"]))
        add(GRID_FAMILY, Scenario(op=op, m=log_int(*TOKENS, tp), n=log_int(*DENSE_NK, 128),
                                      k=log_int(*DENSE_NK, 128), world_size=tp, hardware=hw))  # fmt: skip
    for _ in range(count // 4):
        experts, top_k = int(rng.choice(MOE_EXPERTS)), int(rng.choice(MOE_TOP_K))
        op = str(rng.choice(["a2a_gemm", "gemm_a2a"]))
        add(GRID_FAMILY, Scenario(op=op, m=log_int(TOKENS[0], 16384, tp), n=log_int(*MOE_NK, 128),
                                      k=log_int(*MOE_NK, 128), world_size=tp, hardware=hw, experts=experts,
                                      top_k=top_k))  # fmt: skip
    return list(out.values())


def bagged_spread(scenarios: list, picks: dict[str, np.ndarray], *, bags: int, seed: int) -> np.ndarray:
    """Per scenario, the largest over the modes of the standard deviation over ``bags`` time-ratio
    regressors (bootstrap samples of the training datasets' scenarios) of the predicted
    ``log(t_pick / t_serial)`` of ``picks[mode]`` (columns), float ``[n]``."""
    from ficco.features import feature_matrix
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.fit import RATIO_CONFIG, fit_pair_model
    from ficco.training.model import pair_costs

    table = load_dataset_table(*(REPO / p for p in TRAINING)).table
    ids = np.unique(table.scenario_ids)
    rng = np.random.default_rng(seed)
    X = feature_matrix(scenarios)
    rows = np.arange(len(scenarios))
    predicted = {mode: [] for mode in picks}
    for b in range(bags):
        chosen = set(rng.choice(ids, size=len(ids), replace=True).tolist())
        sample = np.flatnonzero([sid in chosen for sid in table.scenario_ids])
        model = fit_pair_model(table.subset(sample), RATIO_CONFIG, seed=seed + b, n_jobs=1)
        for mode, pick in picks.items():
            cost = pair_costs(model, X, np.full(len(X), mode, dtype=object), table.host_factor)
            predicted[mode].append(cost[rows, pick])
        print(f"bag {b + 1}/{bags} fitted", flush=True)
    return np.max([np.std(np.stack(v), axis=0) for v in predicted.values()], axis=0)


def choose(scenarios: list, near: dict[str, np.ndarray], spread: np.ndarray, index: np.ndarray,
           count: int) -> list[int]:  # fmt: skip
    """``count`` of the candidates ``index`` (module docstring, step 3): fewest neighbours first, the
    largest spread among equals, each choice a neighbour of the candidates near it from then on."""
    from ficco.training.predict.coverage import NEIGHBOUR_FACTOR

    counts = np.minimum(*near.values()).astype(np.int64)[index]
    shape = np.array([(s.m, s.n, s.k) for s in (scenarios[i] for i in index)], dtype=np.int64)
    group = np.array([(s.op, s.world_size, s.dtype) for s in (scenarios[i] for i in index)], dtype=object)
    free = np.ones(len(index), dtype=bool)
    chosen = []
    for _ in range(min(count, len(index))):
        order = np.lexsort((-spread[index], counts))  # fewest neighbours, then the largest spread
        best = next(i for i in order if free[i])
        chosen.append(int(index[best]))
        free[best] = False
        same = (group == group[best]).all(axis=1)
        f = NEIGHBOUR_FACTOR
        close = ((shape <= f * shape[best]) & (shape[best] <= f * shape)).all(axis=1)
        counts[same & close] += 1
    return chosen


def make_plan(args: argparse.Namespace) -> None:
    """``plan``: choose the scenarios and write the plan (module docstring)."""
    from ficco.features import MODES, feature_matrix
    from ficco.features.dataset import GRID_FAMILY
    from ficco.harness.plan import Plan, estimate_sweep
    from ficco.tables import text_table
    from ficco.training.predict.coverage import Coverage
    from ficco.training.predict.registry import load_predictor

    predictor = load_predictor(args.models, args.hardware)
    hw = predictor.profile
    pool = candidates(hw, tp=args.tp, count=args.candidates, seed=args.seed, max_serial_ms=args.max_serial_ms)
    scenarios = [s for _, s in pool]
    print(f"{len(pool)} candidates", flush=True)
    X = feature_matrix(scenarios)
    picks = {mode: predictor.decide(X, [mode] * len(X)).final for mode in MODES}
    near = {mode: predictor.coverage.count(scenarios, mode) for mode in MODES}
    spread = (
        bagged_spread(scenarios, picks, bags=args.bags, seed=args.seed) if args.bags else np.zeros(len(X))
    )
    moe = np.array([s.op in ("a2a_gemm", "gemm_a2a") for s in scenarios])
    chosen = choose(scenarios, near, spread, np.flatnonzero(~moe), args.dense)
    chosen += choose(scenarios, near, spread, np.flatnonzero(moe), args.moe)
    entries = tuple(pool[i] for i in chosen)
    estimate = estimate_sweep(entries, hw)
    per_call = _per_call(entries, hw, args.call_minutes)
    before = {m: _buckets(near[m][chosen]) for m in MODES}
    measured = Coverage(
        np.vstack(
            [
                predictor.coverage.rows,
                Coverage.of([s for _, s in entries] * 2, [m for m in MODES for _ in entries]).rows,
            ]
        )
    )
    after = {m: measured.count(scenarios, m) for m in MODES}
    pool_empty = {
        m: {"before": int((near[m] == 0).sum()), "after": int((after[m] == 0).sum())} for m in MODES
    }
    families = sorted({f for f, _ in entries} - {GRID_FAMILY})
    settings = {
        "tp": args.tp, "dtype": "bf16", "tokens": sorted({s.m for _, s in entries}), "configs": families,
        "grid_size": sum(f == GRID_FAMILY for f, _ in entries), "seed": args.seed,
        "max_serial_ms": args.max_serial_ms, "include_moe": True, "ops": sorted({s.op for _, s in entries}),
        "hardware_id": hw.id, "skipped_configs": {}, "estimated_minutes": round(estimate.seconds / 60, 2),
        "selection": {
            "model": f"{predictor.hardware_id}/{predictor.version}", "candidates": len(pool),
            "bags": args.bags,
            "rule": "fewest measured neighbours (the fewer of eager and graph), then the largest bagged "
            "spread of the pick's predicted log(t / t_serial); each choice a neighbour of later candidates",
            "scores": [{"id": pool[i][1].key(), "neighbours": {m: int(near[m][i]) for m in MODES},
                        "spread": round(float(spread[i]), 4)} for i in chosen],
            "neighbours_before": before, "candidates_without_neighbours": pool_empty,
            "scenarios_per_call": per_call, "call_minutes": args.call_minutes,
        },
    }  # fmt: skip
    plan = Plan(entries=entries, settings=settings)
    args.plan.parent.mkdir(parents=True, exist_ok=True)
    args.plan.write_text(json.dumps(json.loads(plan.to_json()), indent=1) + "\n")
    rows = [[m, *(str(before[m][k]) for k in before[m])] for m in MODES]
    print("the chosen scenarios' measured neighbours before they are measured:")
    print(text_table(["mode", *before["eager"]], rows, align="<" + ">" * len(before["eager"])))
    for mode, counts in pool_empty.items():
        print(
            f"{mode}: candidates without a measured neighbour {counts['before']} of {len(pool)} before, "
            f"{counts['after']} once the plan is measured"
        )
    print(f"{len(entries)} scenarios ({int(moe[chosen].sum())} MoE) from {len(pool)} candidates; GPU sweep "
          f"estimate: {estimate.summary()}; about {per_call} scenarios per {args.call_minutes} min call; "
          f"wrote {args.plan}")  # fmt: skip


def _buckets(counts: np.ndarray) -> dict[str, int]:
    """How many of ``counts`` fall in each neighbour bucket of ``benchmarks.studies.off_map``."""
    from benchmarks.studies.off_map import BUCKETS

    return {f"{lo}-{hi}" if hi < 1 << 30 else f">={lo}": int(((counts >= lo) & (counts <= hi)).sum())
            for lo, hi in BUCKETS}  # fmt: skip


def _per_call(entries: tuple, hw, minutes: float) -> int:
    """Scenarios of ``entries``, in order, whose simulated GPU time fits ``minutes`` of measuring."""
    from ficco.harness.plan import scenario_seconds

    seconds = np.cumsum(scenario_seconds(entries, hw))
    return int(np.searchsorted(seconds, 60 * minutes, side="right"))


def measure(args: argparse.Namespace) -> None:
    """``measure``: sweep the plan into ``--out`` within ``--minutes`` (resumes), then write the card."""
    import time

    from ficco.features import MODES
    from ficco.harness.card import write_card
    from ficco.harness.launch import BenchBackend, WorkerSettings, run_torchrun
    from ficco.harness.plan import Plan

    plan = Plan.from_json(args.plan.read_text())
    deadline = time.time() + 60 * args.minutes if args.minutes else None
    if args.backend == "sim":
        from ficco.harness.sim import SimBackend
        from ficco.harness.sweep import run_sweep

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(plan.to_json())
        run_sweep(plan, SimBackend(plan[0][1].hardware, modes=MODES), args.out, deadline=deadline)
    else:
        settings = WorkerSettings(modes=MODES, deadline=deadline, flush_seconds=30.0)
        run_torchrun(plan, args.out, backend=BenchBackend.gpu, tp=plan.settings["tp"], nproc=None,
                     settings=settings)  # fmt: skip
    finished = len(json.loads((args.out / "manifest.json").read_text())["finished"])
    print(f"{finished} of {len(plan)} scenarios measured in {args.out}; card: {write_card(args.out)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="Choose the scenarios and write the plan (CPU).")
    p.add_argument("--models", type=Path, default=REPO / "models")
    p.add_argument("--hardware", default="h200x2")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dense", type=int, default=224, help="Dense (ag_gemm, gemm_rs) scenarios to choose.")
    p.add_argument("--moe", type=int, default=96, help="MoE (a2a_gemm, gemm_a2a) scenarios to choose.")
    p.add_argument(
        "--candidates", type=int, default=8000, help="Synthetic dense candidates (MoE: a quarter)."
    )
    p.add_argument("--bags", type=int, default=4, help="Bootstrap regressors of the spread (0: no spread).")
    p.add_argument("--max-serial-ms", type=float, default=20.0)
    p.add_argument("--call-minutes", type=float, default=8.0, help="Measuring minutes of one device call.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", type=Path, default=DEFAULT_PLAN)
    m = sub.add_parser("measure", help="Sweep the plan (GPU, or the simulator); resumes.")
    m.add_argument("--plan", type=Path, default=DEFAULT_PLAN)
    m.add_argument("--out", type=Path, default=DEFAULT_OUT)
    m.add_argument("--backend", choices=["gpu", "sim"], default="gpu")
    m.add_argument("--minutes", type=float, default=0.0, help="Start no scenario after this (0: no limit).")
    args = parser.parse_args()
    make_plan(args) if args.command == "plan" else measure(args)


if __name__ == "__main__":
    main()
