r"""How far the simulator is from the measured datasets, term by term, before and after fitting it, and how
well its own picks do on model families the fit never saw (``harness.sim_fit``; docs/simulator.md).

    # fit and cross-validate: writes benchmarks/results/sim-fidelity.{json,md}
    python -m benchmarks.sim_fidelity
    python -m benchmarks.sim_fidelity --folds 3 --regret-iterations 8      # quicker
    python -m benchmarks.sim_fidelity --render                             # the markdown again

What it does (CPU only, about an hour on 2 busy cores):

1. reads the measured datasets of :data:`DATASETS` as ``harness.sim_fit.observations`` (rows an earlier
   executor measured differently are left out: ``sim_fit.current_rows``);
2. the error by term (``sim_fit.term_errors``) and the simulator's own picks with the constants the fit
   starts from (``before``, :data:`harness.sim_fit.START`) and fitted on every dataset (``after``);
3. holds model families out: the families in ``--folds`` folds (``sim_fit.family_folds``, the same family
   out at every world size), a fit on the other folds' rows, the held-out scenarios' picks scored on their
   measured times: the simulator's **held-out regret** per world size and mode (the fidelity simulated
   models carry, ``harness.sim.MEASURED_FIDELITY``);
4. world sizes: fitted on the 2-rank datasets alone, scored at 4 ranks: what one doubling of the world size
   costs the simulator, the bound the docs give for 8 ranks.

Prints the fitted constants (``harness.sim.SimConstants``' defaults come from them) and a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from benchmarks import REPO, rerender
from ficco.files import write_text_atomic
from ficco.harness import sim_fit
from ficco.harness.sim import SIM_MODEL_VERSION, SimConstants, gemm_table
from ficco.tables import markdown_table

DATASETS = ("h200x2", "h200x2-unseen-v3", "h200x2-heldout-v3", "h200x2-coverage", "h200x4")
"""The measured datasets the simulator is fitted to and scored on: 2 x H200 (label version 2: dense ops,
``serial/dma`` and the copy-engine baseline left out; the coverage sweep, version 3, whole) and 4 x H200
(version 3). Left out: ``h200x2-moe`` (version 1: the MoE ops before grouped expert GEMMs) and the sweeps
that repeat ``h200x2``'s scenarios under other protocols."""
BENCHMARKS = {
    "executor-h200x2.json": ("h200x2", 2),
    "executor-h200x4.json": ("h200x4", 3),
    "copy-arrangements-h200x4.json": ("h200x4", 3),
    "a2a-h200x4.json": ("h200x4", 3),
}
"""The executor benchmarks fitted beside the datasets: file -> (the dataset measured on the same machine,
whose hardware and host factor they share; label version). ``executor-*``: every schedule of the layers of
a few models, eager, and the all-gather alone from 1 MiB to 1 GiB received per GPU; ``copy-arrangements``:
the all-gather alone, NCCL and the shipped copy arrangement (one stream), eager and graph; ``a2a``: the
all-to-all alone, NCCL and the executor's copy engines, eager and graph."""
SHIPPED_MACHINE = "h200x4"
"""The dataset whose machine the shipped constants answer for (its host factor and eager call time): the
machine of the current executor's label version at the most ranks."""
OUT = REPO / "benchmarks" / "results" / "sim-fidelity"
TRANSFERS = "transfers alone"
"""The family of a benchmark's collective-alone rows."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, default=OUT, help="Output path without suffix (.json, .md)")
    parser.add_argument("--folds", type=int, default=5, help="Family folds of the held-out score (>= 2)")
    parser.add_argument("--lsq-iterations", type=int, default=8, help="Stage 1 iterations of each fit")
    parser.add_argument("--regret-iterations", type=int, default=15, help="Stage 2 iterations of each fit")
    parser.add_argument("--every", type=int, default=2, help="Fit on every N-th scenario of 2-rank datasets")
    parser.add_argument("--workers", type=int, default=3, help="Fits run at once (processes)")
    parser.add_argument("--render", action="store_true", help="Only write the markdown from the JSON")
    args = parser.parse_args(argv)
    if args.folds < 2:
        parser.error(f"--folds must be >= 2; got {args.folds}")
    return args


def benchmark_rows(data: dict, hardware, version: int) -> list[dict]:
    """Dataset rows (``features.dataset.COLUMNS``, label times in ``p10_ms`` / ``median_ms``) of one executor
    benchmark's JSON: schedule rows of its ``records`` (eager; family: the record's first model), and rows
    whose baselines hold its collective-alone sizes (``nccl_comm_ms``, ``dma_comm_ms``; no schedule)."""
    from ficco.features import Scenario

    w, rows = hardware.gpu_count, []

    def row(s: Scenario, family: str, mode: str, schedule: str, ms: float | None, **base: float) -> dict:
        ok = ms is not None and ms > 0
        return {"scenario_id": s.key(), "family": family, **{k: getattr(s, k) for k in ("op", "m", "n", "k",
                "dtype", "world_size", "experts", "top_k", "imbalance")}, "hardware_id": hardware.id,
                "schedule": schedule, "mode": mode, "median_ms": ms if ok else float("nan"),
                "p10_ms": ms if ok else float("nan"), "p90_ms": float("nan"), "round_ms": [], "ok": ok,
                "error": "", "in_best_set": False, "backend": "gpu", "gemm_alone_ms": float("nan"),
                "nccl_comm_ms": float("nan"), "dma_comm_ms": float("nan"), "async_tp_ms": float("nan"),
                **{k: float(v) for k, v in base.items() if v}}  # fmt: skip

    for r in data.get("records", []):
        s = Scenario(op=r["op"], m=r["m"], n=r["n"], k=r["k"], world_size=w, hardware=hardware)
        family = (r.get("layers") or ["executor-bench:"])[0].split(":")[0]
        base = {"gemm_alone_ms": r["gemm_alone_ms"], "nccl_comm_ms": r["comm_alone_ms"],
                "dma_comm_ms": r["dma_comm_alone_ms"], "async_tp_ms": r["async_tp_ms"]}  # fmt: skip
        rows.append(row(s, family, "eager", r["schedule"], r["p10_ms"] if r["ok"] else None, **base))
    sizes = [
        (p["mbytes"], "eager", p.get("nccl_ms"), p.get("dma_ms")) for p in data.get("allgather_bandwidth", [])
    ]
    for p in data.get("allgather", []):
        ms = p["ms"]
        sizes += [(p["mbytes"], "eager", ms.get("nccl"), ms.get("dma:1")),
                  (p["mbytes"], "graph", ms.get("nccl@graph"), ms.get("dma:1@graph"))]  # fmt: skip
    for mib, mode, nccl, dma in sizes:
        m = max(w, round(mib * 2**20 / ((w - 1) * 4096 * 2)) * w)  # (w - 1) / w * m rows received
        s = Scenario(op="ag_gemm", m=m, n=4096, k=4096, world_size=w, hardware=hardware)
        rows.append(row(s, TRANSFERS, mode, "serial/sm", None, nccl_comm_ms=nccl, dma_comm_ms=dma))
    for p in data.get("sizes", []):
        m = max(w, p["bytes_per_rank"] // (2 * data["meta"]["width"]) // w * w)
        s = Scenario(op="a2a_gemm", m=m, n=1024, k=data["meta"]["width"], world_size=w, experts=w, top_k=1,
                     hardware=hardware)  # fmt: skip
        for mode, suffix in (("eager", ""), ("graph", "_graph")):
            rows.append(row(s, TRANSFERS, mode, "serial/sm", None, nccl_comm_ms=p.get(f"nccl{suffix}_ms"),
                            dma_comm_ms=p.get(f"dma{suffix}_ms")))  # fmt: skip
    return rows


def benchmark_observations(by_name: dict) -> list:
    """:data:`BENCHMARKS` as ``harness.sim_fit.Observations``, each with its machine's dataset's hardware
    and host factor (``by_name``: dataset name -> its observations)."""
    out = []
    for file, (dataset, version) in BENCHMARKS.items():
        like = by_name[dataset]
        data = json.loads((REPO / "benchmarks" / "results" / file).read_text())
        frame = pd.DataFrame(benchmark_rows(data, like.hardware, version))
        name = file.removesuffix(".json")
        out.append(sim_fit.frame_observations(
            frame, like.hardware, version, name=name, host_factor=like.host_factor, machine=like.machine
        ))  # fmt: skip
    return out


def _round(constants: SimConstants) -> dict[str, float]:
    return {k: float(f"{v:.4g}") for k, v in constants.to_dict().items()}


def run(args: argparse.Namespace) -> dict:
    """Everything of the module docstring, as the JSON written."""
    t0 = time.perf_counter()
    data = [sim_fit.observations(REPO / "datasets" / name) for name in DATASETS]
    data += benchmark_observations({o.name: o for o in data})
    options = {"lsq_iterations": args.lsq_iterations, "regret_iterations": args.regret_iterations}
    print(f"read {len(data)} datasets in {time.perf_counter() - t0:.0f} s; fitting on all", flush=True)
    thin = {o.name: args.every for o in data if o.world_size == 2}
    folds = sim_fit.family_folds(data, args.folds)
    two = [o for o in data if o.world_size == 2]
    with ProcessPoolExecutor(args.workers) as pool:  # the fits are independent: all at once
        fit = functools.partial(sim_fit.fit, start=sim_fit.START, **options)
        on_all = pool.submit(fit, [o.every(thin.get(o.name, 1)) for o in data])
        on_two = pool.submit(fit, [o.every(thin[o.name]) for o in two])
        held_all, fold_fits = sim_fit.cross_validate(
            data, folds, thin, pool.map, start=sim_fit.START, **options
        )
        fitted, from_two = on_all.result(), on_two.result()
    print(f"fitted {len(folds) + 2} times in {time.perf_counter() - t0:.0f} s", flush=True)
    held = held_all[held_all["dataset"].isin(DATASETS)]  # the measured datasets: the stated fidelity
    guard = sim_fit.choose_guard(held)
    before = sim_fit.Fit(constants=sim_fit.START, per_dataset={}, cost=float("nan"))
    stages = {}
    for name, f in (("before", before), ("after", fitted)):
        scored = [o for o in data if len(o.log_us)]
        picks = pd.concat([sim_fit.pick_table(o, f.for_dataset(o)).assign(dataset=o.name) for o in scored])
        terms = [row for o in data for row in sim_fit.term_errors(o, f.for_dataset(o))]
        stages[name] = {
            "picks": sim_fit.regret_summary(picks),
            "picks_by_op": sim_fit.regret_summary(picks, ("world_size", "mode", "op")),
            "terms": terms,
        }
    four = [o for o in data if o.world_size == 4 and len(o.log_us)]
    extrapolated = pd.concat(
        [
            sim_fit.pick_table(o, dataclasses.replace(from_two.constants, host_factor=o.host_factor))
            for o in four
        ]
    )
    return {
        "sim_model": SIM_MODEL_VERSION,
        "gemm_table": gemm_table("NVIDIA H200", 132).source,
        "datasets": [
            {
                "name": o.name,
                "label_version": o.label_version,
                "world_size": o.world_size,
                "rows": len(o.log_us),
                "scenarios": int(o.frame["scenario_id"].nunique()),
                "host_factor": round(o.host_factor, 3),
            }
            for o in data
        ],
        "excluded": (
            f"rows of label version < 3: {', '.join(sim_fit.CHANGED_IN_V3)} and the MoE ops "
            "(sim_fit.current_rows); datasets: h200x2-moe (version 1) and the repeats of h200x2's scenarios"
        ),
        "start": _round(sim_fit.START),
        "constants": _round(fitted.constants),
        "per_dataset": fitted.per_dataset,
        "shipped_constants": {**_round(fitted.constants), **fitted.per_dataset[SHIPPED_MACHINE]},
        "before": stages["before"],
        "after": stages["after"],
        "folds": [list(f) for f in folds],
        "held_out": sim_fit.regret_summary(held),
        "held_out_by_op": sim_fit.regret_summary(held, ("world_size", "mode", "op")),
        "held_out_with_benchmarks": sim_fit.regret_summary(held_all),
        "guard_min_gain": guard,
        "held_out_guarded": [
            {**r, "guard": guard[r["mode"]]}
            for mode in guard
            for r in sim_fit.regret_summary(sim_fit.guarded(held[held["mode"] == mode], guard[mode]))
        ],
        "held_out_constants": [_round(f.constants) for f in fold_fits],
        "from_two_ranks_at_four": sim_fit.regret_summary(extrapolated),
        "from_two_ranks_constants": _round(from_two.constants),
        "options": {**options, "fit_every_2_rank_scenario": args.every},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def render(data: dict) -> str:
    """The markdown report of :func:`run`'s JSON."""

    def pick_rows(rows: list[dict]) -> list[list[str]]:
        return [[str(r["world_size"]), r["mode"], _pct(r["geomean_regret"]), f"{r['top1']:.0%}",
                 str(r["n_scenarios"]), str(r["n_slower_than_serial_2pct"])] for r in rows]  # fmt: skip

    head = ["ranks", "mode", "regret", "top-1", "scenarios", "slower than serial"]
    lines = [
        f"# Simulator fidelity ({data['sim_model']})",
        "",
        "Written by `python -m benchmarks.sim_fidelity` (docs/simulator.md). Regret: the measured time of "
        "the simulator's own pick over the measured best, geometric mean over (scenario, mode); every "
        "schedule measured ok is a candidate. Datasets and executor benchmarks:",
        "",
        markdown_table(
            ["dataset", "label version", "ranks", "scenarios", "rows", "host factor"],
            [
                [
                    d["name"],
                    str(d["label_version"]),
                    str(d["world_size"]),
                    str(d["scenarios"]),
                    str(d["rows"]),
                    f"{d['host_factor']:.2f}",
                ]
                for d in data["datasets"]
            ],
        ),
        "",
        f"Left out: {data['excluded']}.",
        "",
        f"## Held out: model families the fit never saw ({len(data['folds'])} folds)",
        "",
        "The measured datasets' scenarios (the fidelity simulated models carry):",
        "",
        markdown_table(head, pick_rows(data["held_out"])),
        "",
        "With the executor benchmarks' schedules (eager) beside them:",
        "",
        markdown_table(head, pick_rows(data["held_out_with_benchmarks"])),
        "",
        "By op:",
        "",
        markdown_table(
            ["ranks", "mode", "op", "regret", "scenarios", "slower than serial"],
            [
                [
                    str(r["world_size"]),
                    r["mode"],
                    r["op"],
                    _pct(r["geomean_regret"]),
                    str(r["n_scenarios"]),
                    str(r["n_slower_than_serial_2pct"]),
                ]
                for r in data["held_out_by_op"]
            ],
        ),
        "",
        f"With the guard the simulated models answer with (fall back to serial below a predicted gain of "
        f"{data['guard_min_gain']}, chosen on these picks by the serial-safe loss):",
        "",
        markdown_table(head, pick_rows(data["held_out_guarded"])),
        "",
        "## Before and after the fit (in sample)",
        "",
        "Before: the constants the fit starts from (`harness.sim_fit.START`); after: fitted on all of it.",
        "",
        markdown_table(
            ["", *head],
            [["before", *r] for r in pick_rows(data["before"]["picks"])]
            + [["after", *r] for r in pick_rows(data["after"]["picks"])],
        ),
        "",
        "## World size: fitted at 2 ranks, scored at 4",
        "",
        markdown_table(head, pick_rows(data["from_two_ranks_at_four"])),
        "",
        "## Error by term",
        "",
        "Log error of the simulated time against the measured one, as a ratio: `bias` the median, then the "
        "median and 90th percentile of its size. Terms: the baselines every row records (`gemm_alone`: the "
        "GEMM table; `nccl_comm`, `dma_comm`: the transports; `async_tp`), `host` (eager calls the simulator "
        "finds host-bound) and each schedule family's time, and `/relative` with each scenario's mean error "
        "removed (what the ranking sees).",
        "",
    ]
    for stage in ("before", "after"):
        rows = sorted(data[stage]["terms"], key=lambda r: (r["world_size"], r["term"], r["op"], r["mode"]))
        table = [[str(r["world_size"]), r["dataset"], r["term"], r["op"], r["mode"], str(r["n"]),
                  _pct(r.get("bias", 0.0)), _pct(r.get("median_abs", 0.0)), _pct(r.get("p90_abs", 0.0))]
                 for r in rows if r["n"]]  # fmt: skip
        lines += [
            f"### {stage}",
            "",
            markdown_table(
                ["ranks", "dataset", "term", "op", "mode", "n", "bias", "median |err|", "p90 |err|"], table
            ),
            "",
        ]
    lines += ["## Fitted constants", "", "```json", json.dumps(data["constants"], indent=1), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    json_path = args.out.with_suffix(".json")
    if not args.render:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(json_path, json.dumps(run(args), indent=1) + "\n")
    rerender(json_path, render)
    data = json.loads(json_path.read_text())
    print("fitted constants:", json.dumps(data["constants"]))
    for label, key in (("held out", "held_out"), ("2 -> 4 ranks", "from_two_ranks_at_four")):
        for r in data[key]:
            print(f"{label:14} {r['world_size']} ranks {r['mode']:5} regret {_pct(r['geomean_regret']):>7} "
                  f"slow picks {r['n_slower_than_serial_2pct']:>3} of {r['n_scenarios']}")  # fmt: skip
    return data


if __name__ == "__main__":
    main()
