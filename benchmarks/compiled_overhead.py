r"""Host time per op: the eager executor's call against the same op as ``torch.ops.ficco`` custom op, eager
and inside a ``torch.compile(fullgraph=True)`` graph.

    # one GPU, no torchrun: rank 0 of a pretend 2-rank world (harness.loopback)
    python3 benchmarks/compiled_overhead.py --out OUT/compiled-overhead.json
    # plumbing check on the CPU (the loopback world's CPU mode; the numbers are the CPU's, not a GPU's)
    python3 benchmarks/compiled_overhead.py --device cpu --batch 20 --rounds 3 --out /tmp/overhead.json

Variants per (op, schedule), all on the same tensors: ``executor`` (``ficco.executor.all_gather_matmul`` /
``matmul_reduce_scatter``), ``custom_op`` (``torch.ops.ficco.*``, eager: the dispatcher, the schedule-string
lookup and the autograd wrapper's bookkeeping on top of the executor) and ``compiled`` (a function calling
the op, compiled with ``torch.compile(fullgraph=True)``; the call time includes the compiled graph's guards).
Tiny shapes keep the GPU from being the bottleneck: each batch of ``--batch`` calls is timed with
``time.perf_counter`` from a device synchronisation to the return of its last call, so it measures how fast
the host issues the work. ``--rounds`` rounds, every (op, schedule, variant) batch once per round in a
shuffled order; the figure is the median over rounds, in microseconds per call. The loopback world's
collectives move nothing (its ``sm`` schedules cost no NCCL host time), so the figures compare the three
paths' own host cost, not a multi-GPU step. Prints a table and writes the rows as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ficco import executor  # noqa: E402
from ficco.harness.loopback import loopback_world  # noqa: E402
from ficco.tables import markdown_table  # noqa: E402

SCHEDULES = ("serial/sm", "shard/dma", "finer/dma/s2/chunk", "finer/sm/s4/shard")
VARIANTS = ("executor", "custom_op", "compiled")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world-size", type=int, default=2, help="ranks of the loopback world")
    p.add_argument("--tokens", type=int, default=256, help="gathered rows m (tiny: host-bound)")
    p.add_argument("--hidden", type=int, default=256, help="k and n")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=100, help="calls per timed batch")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def calls(op: str, schedule: str, a: torch.Tensor, b: torch.Tensor, group_name: str) -> dict:
    """The three variants of one (op, schedule) as callables of no arguments."""
    if op == "ag_gemm":

        def custom():
            return torch.ops.ficco.all_gather_matmul(a, [b], 0, group_name, schedule)

        def eager():
            return executor.all_gather_matmul(a, b, schedule)
    else:

        def custom():
            return torch.ops.ficco.matmul_reduce_scatter(a, b, "sum", 0, group_name, schedule)

        def eager():
            return executor.matmul_reduce_scatter(a, b, schedule)

    compiled = torch.compile(custom, fullgraph=True)
    return {"executor": eager, "custom_op": custom, "compiled": compiled}


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    rows: list[dict] = []
    with loopback_world(args.world_size, args.device) as device:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        group_name = dist.group.WORLD.group_name
        w, m, h = args.world_size, args.tokens, args.hidden
        gen = torch.Generator(device=device).manual_seed(0)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        shard = torch.randn(m // w, h, device=device, generator=gen).to(dtype)
        full = torch.randn(m, h, device=device, generator=gen).to(dtype)
        b = torch.randn(h, h, device=device, generator=gen).to(dtype)
        cases = {}
        for op, a in (("ag_gemm", shard), ("gemm_rs", full)):
            for schedule in SCHEDULES:
                for variant, fn in calls(op, schedule, a, b, group_name).items():
                    for _ in range(args.warmup):  # compiles, plans, allocates
                        fn()
                    cases[(op, schedule, variant)] = fn
        times: dict[tuple, list[float]] = {key: [] for key in cases}
        for _ in range(args.rounds):
            order = list(cases)
            random.shuffle(order)
            for key in order:
                fn = cases[key]
                sync()
                start = time.perf_counter()
                for _ in range(args.batch):
                    fn()
                times[key].append((time.perf_counter() - start) / args.batch * 1e6)
            sync()
    for (op, schedule, variant), us in times.items():
        rows.append(
            {"op": op, "schedule": schedule, "variant": variant, "host_us_per_call": statistics.median(us)}
        )
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": str(device),
        "world_size": args.world_size,
        "tokens": args.tokens,
        "hidden": args.hidden,
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return rows


def print_table(rows: list[dict]) -> None:
    """One line per (op, schedule): each variant's median host microseconds per call, and the ratios."""
    by = {(r["op"], r["schedule"], r["variant"]): r["host_us_per_call"] for r in rows}
    lines = []
    for op, schedule in dict.fromkeys((r["op"], r["schedule"]) for r in rows):
        us = [by[(op, schedule, v)] for v in VARIANTS]
        lines.append([op, schedule, *(f"{u:.1f}" for u in us), f"{us[2] / us[0]:.2f}"])
    print(markdown_table(["op", "schedule", *(f"{v} us" for v in VARIANTS), "compiled / executor"], lines))


if __name__ == "__main__":
    main()
