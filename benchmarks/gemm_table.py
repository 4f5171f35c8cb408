r"""The GEMM table of one GPU: every GEMM shape the candidate schedules of the sweep plans produce, timed on
one GPU, for the simulator (``harness.gemm_table``; docs/simulator.md, "GEMM times").

    # one GPU (about 3 minutes on an H200): writes harness/gemm_tables/<gpu>.json (h200.json, h100.json, ...)
    python3 -m benchmarks.gemm_table
    python3 -m benchmarks.gemm_table --out /tmp/tables --budget-s 120
    # plumbing check on the CPU (tiny shapes, host clock): writes /tmp/gemm-dry/<cpu>.json
    python3 -m benchmarks.gemm_table --cpu-dry-run --out /tmp/gemm-dry

Shapes (:func:`planned_shapes`): the scenarios of the default plans at 2, 4 and 8 ranks of the dense, MoE
and unseen model configs (MoE ops included, a grid of ``GRID`` shapes) and of every committed dataset's
plan; for each, every candidate schedule's GEMM units (``harness.sim.unit_shapes``: the whole GEMM, the own
shard, a peer shard or finer piece; the MoE ops' local experts as one grouped GEMM where the executor runs
one, else as a loop of GEMMs of one expert's rows). Shapes are bucketed by half octaves of rows, n and k
(``harness.gemm_table.RESOLUTION``); a bucket is measured once, at its member nearest the bucket's centre.
Buckets are measured coarse first (one per octave bucket, the most used first; then the rest in a seeded
order), so a run cut short by ``--budget-s`` leaves gaps the table's neighbour rule fills.

Timing (/work/.library/device/METHOD.md): seeded random bf16 operands, views into one pool, rotating over
as many input sets as the harness does (``harness.torch_backend``: until 256 MiB of operands, at most 8
sets); each shape's calls run once eagerly, are captured into a CUDA graph of about ``TARGET_US`` of work
(at least one call per set), replayed ``WARMUP`` times, then ``REPS`` times between CUDA events; the time
is the median replay over its calls. Before the first shape, ``WARM_S`` seconds of large GEMMs bring the
clocks up. Re-run on another GPU (an H100, a B200) to make that GPU's table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ficco.features import KNOWN_HARDWARE, candidates, get_hardware
from ficco.features.dataset import PLAN
from ficco.features.hardware import hardware_of
from ficco.files import write_text_atomic
from ficco.harness.gemm_table import RESOLUTION, TABLE_DIR, GemmTable, bucket, gpu_model, grouped
from ficco.harness.sim import _encode, unit_shapes

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZES = (2, 4, 8)
CONFIG_DIRS = ("model_configs", "moe_configs", "unseen_configs")
GRID = 280
"""Grid shapes per plan (the measured 4-rank plan's; the 260 of the default plans are among them)."""
TARGET_US = 500.0
"""Work captured into one graph, us (at least one call per input set)."""
MAX_CALLS = 256
WARMUP, REPS = 2, 7
WARM_S = 2.0
DRY_RUN_SHAPES = ((1, 16, 32, 48, False), (1, 64, 32, 48, False), (8, 4, 32, 48, True), (1, 8, 16, 16, False))
"""``(groups, rows, n, k, grouped kernel)`` of ``--cpu-dry-run``."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=TABLE_DIR,
        help="Folder of the table, <gpu model>.json (default: the shipped ones)",
    )
    parser.add_argument("--budget-s", type=float, default=170.0, help="Seconds of measuring, at most (> 0)")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the operands and of the bucket order")
    parser.add_argument("--cpu-dry-run", action="store_true", help="A few tiny shapes on the CPU (plumbing)")
    args = parser.parse_args(argv)
    if not args.budget_s > 0:
        parser.error(f"--budget-s must be > 0; got {args.budget_s}")
    return args


def plan_scenarios() -> dict[str, object]:
    """Every scenario of the default plans (``WORLD_SIZES`` x ``CONFIG_DIRS``, MoE ops, ``GRID`` grid shapes)
    and of the committed datasets' plans, by scenario id."""
    from ficco.features.model_config import load_model_configs
    from ficco.harness.plan import Plan, plan_scenarios

    out = {}
    for tp in WORLD_SIZES:
        for folder in CONFIG_DIRS:
            configs = load_model_configs(REPO / "datasets" / folder)
            plan = plan_scenarios(
                configs, tp=tp, hardware=get_hardware(f"h200x{tp}"), include_moe=True,
                grid_size=GRID if folder == "model_configs" else 0,
            )  # fmt: skip
            out |= {s.key(): s for _, s in plan}
    for path in sorted((REPO / "datasets").glob(f"*/{PLAN}")):
        out |= {s.key(): s for _, s in Plan.from_json(path.read_text())}
    return out


def planned_shapes(scenarios) -> dict[tuple[int, ...], tuple[tuple[int, int, int, int, bool], int]]:
    """Bucket key -> (the shape measured for it: groups, rows per group, n, k, grouped kernel; how many
    (scenario, schedule, unit) uses fall in the bucket). Loops of expert GEMMs count as their one-expert
    GEMM (one group)."""
    pairs = [(s, schedule) for s in scenarios for schedule in candidates(s)]
    members: dict[tuple[int, ...], Counter] = {}
    for start in range(0, len(pairs), 20_000):
        x = _encode(pairs[start : start + 20_000])
        for groups, rows in unit_shapes(x).values():
            kernel = grouped(groups, x["n"], x["k"], x["b"])
            g = np.where(kernel, groups, 1.0)
            shapes = np.stack([g, np.maximum(np.rint(rows), 1.0), x["n"], x["k"], kernel], axis=1).astype(
                np.int64
            )
            for shape in map(tuple, shapes.tolist()):
                key = (shape[0], *bucket(np.array(shape[1:4])).tolist())
                members.setdefault(key, Counter())[shape] += 1
    out = {}
    for key, counter in members.items():
        centre = np.exp2(np.array(key[1:]) / RESOLUTION)
        best = min(counter, key=lambda s: float(np.sum(np.log2(np.array(s[1:4]) / centre) ** 2)))
        out[key] = ((best[0], best[1], best[2], best[3], bool(best[4])), sum(counter.values()))
    return out


def measure_order(shapes: dict, seed: int) -> list[tuple[int, ...]]:
    """Buckets in measuring order: first the most used bucket of each octave bucket, then the rest in a
    seeded shuffle (a run cut short leaves even gaps)."""
    first: dict[tuple[int, ...], tuple[int, ...]] = {}
    for key, _ in sorted(shapes.items(), key=lambda kv: -kv[1][1]):
        first.setdefault((key[0], *(v // RESOLUTION for v in key[1:])), key)
    rest = [k for k in shapes if k not in set(first.values())]
    np.random.default_rng(seed).shuffle(rest)
    return [*first.values(), *rest]


class Timer:
    """Times one GEMM shape on ``device`` (module docstring): operands are views into one random pool."""

    def __init__(self, device, pool_elements: int, out_elements: int, seed: int) -> None:
        import torch

        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"
        gen = torch.Generator(device=device).manual_seed(seed)
        self.pool = torch.empty(pool_elements, device=device, dtype=torch.bfloat16)
        for chunk in self.pool.split(1 << 28):  # fill in pieces: no kernel indexes past 2**31 elements
            chunk.normal_(generator=gen)
        self.out = torch.empty(out_elements, device=device, dtype=torch.bfloat16)

    def calls(self, groups: int, rows: int, n: int, k: int, kernel: bool, est_us: float):
        """A closure running the shape's calls over its rotating sets, and the number of calls."""
        from ficco.harness.torch_backend import MAX_SETS, ROTATE_BYTES

        torch = self.torch
        a_el, b_el = groups * rows * k, groups * k * n
        sets = int(min(MAX_SETS, max(1, math.ceil(ROTATE_BYTES / (2 * (a_el + b_el + groups * rows * n))))))
        count = int(min(MAX_CALLS, max(sets, round(TARGET_US / max(est_us, 1.0)))))
        count = sets * max(1, round(count / sets))
        span = _aligned(a_el) + _aligned(b_el)
        a = [self.pool[j * span : j * span + a_el].view(groups * rows, k) for j in range(sets)]
        b = [self.pool[j * span + _aligned(a_el) :][:b_el].view(groups, k, n) for j in range(sets)]
        if kernel:
            offs = torch.arange(1, groups + 1, device=self.device, dtype=torch.int32) * rows

            def run() -> None:
                for j in range(count):
                    torch._grouped_mm(a[j % sets], b[j % sets], offs=offs)

        else:
            out_span = _aligned(rows * n)
            c = [self.out[j * out_span :][: rows * n].view(rows, n) for j in range(sets)]

            def run() -> None:
                for j in range(count):
                    torch.mm(a[j % sets], b[j % sets][0], out=c[j % sets])

        return run, count

    def time_us(self, run, count: int) -> float:
        """Median device time of one call, us."""
        torch = self.torch
        run()
        if not self.cuda:
            samples = []
            for _ in range(REPS):
                t0 = time.perf_counter()
                run()
                samples.append((time.perf_counter() - t0) * 1e6 / count)
            return statistics.median(samples)
        from benchmarks.variants import graphed

        replay = graphed(run)
        for _ in range(WARMUP):
            replay()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)
        ]
        for begin, end in events:
            begin.record()
            replay()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(b.elapsed_time(e) for b, e in events) * 1e3 / count


def _aligned(elements: int) -> int:
    """``elements`` rounded up to a multiple of 256 (512-byte aligned views)."""
    return -(-elements // 256) * 256


def pool_sizes(shapes: list[tuple[int, int, int, int, bool]]) -> tuple[int, int]:
    """Elements of the operand pool and of the output pool that every shape's sets fit in."""
    from ficco.harness.torch_backend import MAX_SETS, ROTATE_BYTES

    pool = out = 1 << 20
    for g, r, n, k, _ in shapes:
        a_el, b_el = g * r * k, g * k * n
        sets = min(MAX_SETS, max(1, math.ceil(ROTATE_BYTES / (2 * (a_el + b_el + g * r * n)))))
        pool = max(pool, sets * (_aligned(a_el) + _aligned(b_el)))
        out = max(out, sets * _aligned(r * n))
    return pool, out


def run(args: argparse.Namespace) -> dict:
    """Plan, measure within the budget, write the table; return the run's summary."""
    import torch

    device = torch.device("cpu" if args.cpu_dry_run or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.cpu_dry_run:
        sys.exit("no CUDA GPU found: the table is measured on a GPU (or pass --cpu-dry-run)")
    t0 = time.perf_counter()
    if args.cpu_dry_run:
        shapes = {(s[0], *bucket(np.array(s[1:4])).tolist()): (s, 1) for s in DRY_RUN_SHAPES}
        name, profile = "cpu", {"peak_bf16_tflops": 1.0, "hbm_gbps": 50.0, "sm_count": 8.0}
    else:
        shapes = planned_shapes(plan_scenarios().values())
        name = torch.cuda.get_device_name(device)
        known = hardware_of(name, 8) or next(
            (p for p in KNOWN_HARDWARE.values() if gpu_model(p.gpu_name) == gpu_model(name)), None
        )
        if known is None:
            sys.exit(f"{name}: no built-in hardware profile gives its datasheet rates (features.hardware)")
        profile = {k: float(getattr(known, k)) for k in ("peak_bf16_tflops", "hbm_gbps", "sm_count")}
    order = measure_order(shapes, args.seed)
    planned_s = time.perf_counter() - t0
    print(
        f"{len(shapes)} buckets ({sum(1 for k in shapes if k[0] > 1)} grouped) planned in {planned_s:.0f} s"
    )
    timer = Timer(device, *pool_sizes([shapes[k][0] for k in order]), seed=args.seed)
    from ficco.harness.gemm_table import shape_us

    if device.type == "cuda":  # clocks up
        big = timer.pool[: 8192 * 8192].view(8192, 8192)
        end = time.perf_counter() + WARM_S
        while time.perf_counter() < end:
            torch.mm(big, big)
            torch.cuda.synchronize()
    dense, grouped_rows, failed = [], [], {}
    start = time.perf_counter()
    for i, key in enumerate(order):
        if time.perf_counter() - start > args.budget_s:
            break
        if i and i % 500 == 0:
            print(f"{i} of {len(order)} buckets in {time.perf_counter() - start:.0f} s", flush=True)
        g, r, n, k, kernel = shapes[key][0]
        est = float(shape_us(np.array([g]), np.array([r]), np.array([n]), np.array([k]), profile)[0])
        try:
            us = timer.time_us(*timer.calls(g, r, n, k, kernel, est))
        except Exception as err:  # a shape the library refuses: recorded, the sweep goes on
            failed[str(key)] = f"{type(err).__name__}: {err}"[:200]
            continue
        (grouped_rows if kernel else dense).append([g, r, n, k, us] if kernel else [r, n, k, us])
    seconds = time.perf_counter() - start
    table = GemmTable(
        gpu_name=name,
        profile=profile,
        dense=np.array(dense, dtype=np.float64).reshape(-1, 4),
        grouped=np.array(grouped_rows, dtype=np.float64).reshape(-1, 5),
        source={
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "method": f"CUDA graphs of ~{TARGET_US:g} us, {WARMUP} warm-up and {REPS} timed replays, median",
            "buckets_planned": len(shapes),
            "buckets_measured": len(dense) + len(grouped_rows),
            "failed": failed,
            "measure_s": round(seconds, 1),
        },
    )
    path = args.out / f"{table.model}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, table.to_json() + "\n")
    return {"path": str(path), "table": table, "seconds": seconds, "planned": len(shapes)}


def summary_lines(table: GemmTable) -> list[str]:
    """A short table: measured shapes and their efficiency against the bf16 peak, by size class."""
    lines = [f"{'kind':8} {'size (GFLOP)':>14} {'shapes':>7} {'median us':>10} {'median TFLOP/s':>15}"]
    rows = [("dense", 1.0, r[0], r[1], r[2], r[3]) for r in table.dense.tolist()]
    rows += [("grouped", g, r, n, k, us) for g, r, n, k, us in table.grouped.tolist()]
    for kind in ("dense", "grouped"):
        for lo, hi in ((0, 0.1), (0.1, 10), (10, math.inf)):
            sel = [(2 * g * r * n * k / 1e9, us) for kd, g, r, n, k, us in rows if kd == kind]
            sel = [(f, us) for f, us in sel if lo <= f < hi]
            if sel:
                tflops = statistics.median(f / us * 1e3 for f, us in sel)  # GFLOP/us x 1000 = TFLOP/s
                us = statistics.median(u for _, u in sel)
                lines.append(f"{kind:8} {f'{lo:g}-{hi:g}':>14} {len(sel):>7} {us:>10.1f} {tflops:>15.0f}")
    return lines


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = run(args)
    table = out["table"]
    failed = json.dumps(table.source["failed"])[:300]
    print("\n".join(summary_lines(table)))
    print(
        f"wrote {out['path']}: {len(table.dense)} dense and {len(table.grouped)} grouped shapes of "
        f"{out['planned']} buckets in {out['seconds']:.0f} s; failed: {failed}"
    )
    return out


if __name__ == "__main__":
    main()
    from benchmarks.variants import exit_keeping_failed_captures

    exit_keeping_failed_captures()
