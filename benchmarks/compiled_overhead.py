r"""Host time per op: the eager executor's call against the same op as ``torch.ops.ficco`` custom op, eager
and inside a ``torch.compile(fullgraph=True)`` graph.

    # one GPU, no torchrun: rank 0 of a pretend 2-rank world (benchmarks.support.loopback)
    python3 -m benchmarks.compiled_overhead --out OUT/compiled-overhead.json
    # plumbing check on the CPU (the loopback world's CPU mode; the numbers are the CPU's, not a GPU's)
    python3 -m benchmarks.compiled_overhead --device cpu --batch 20 --rounds 3 --out /tmp/overhead.json
    # the CPU's host time (tiny shapes: at the default ones the CPU's own GEMMs dominate every call)
    python3 -m benchmarks.compiled_overhead --device cpu --tokens 16 --hidden 16 --batch 50 --rounds 7 \
        --out /tmp/overhead-host.json

Variants per (op, schedule), all on the same tensors:

- ``executor``: ``ficco.executor.all_gather_matmul`` / ``matmul_reduce_scatter``;
  ``executor_per_op``: the same called on the ``--ops-per-graph`` distinct inputs of ``compiled_per_op``
  in turn (each call binds a new input, as each op of a model does), per op: the reference of the per-op
  ratios;
- ``custom_op``: ``torch.ops.ficco.*`` eagerly (the dispatcher, the op's autograd-level kernel, which
  calls its twin without autograd, and the schedule-string lookup on top of the executor);
  ``custom_op_inference``: the same under ``torch.inference_mode()`` (no autograd key: the dispatcher
  calls the kernel directly, what a serving loop pays);
- ``compiled``: a function calling the op once, compiled with ``torch.compile(fullgraph=True)``: the call
  includes the whole compiled graph's fixed cost (Dynamo's guards, AOTAutograd's runtime wrappers,
  Inductor's output asserts); ``compiled_inference``: the same function compiled and called under
  ``torch.inference_mode()``;
- ``compiled_per_op``: a compiled function calling the op ``--ops-per-graph`` times on distinct inputs,
  its call time divided by that count: the per-op host cost inside a model's graph, where the graph's fixed
  cost is shared by every op in it (the graph holds the ops' twins without autograd);
- ``graphed_per_op`` (CUDA only): that compiled function captured into CUDA graphs by
  ``runtime.GraphedCall``, a replay's host time divided by the op count: what a runtime that replays its
  compiled step (decode under CUDA graphs) pays per op.

Tiny shapes keep the device from being the bottleneck: each batch of ``--batch`` calls is timed from a
device synchronisation to the return of its last call, so it measures how fast the host issues the work
(``--clock``: ``wall``, ``time.perf_counter``, the default on CUDA; ``thread``, ``time.thread_time``, the
calling thread's CPU time, the default on the CPU, where other processes share the cores). ``--rounds``
rounds, every (op, schedule, variant) batch once per round in a shuffled order; the figure is the median
over rounds, in microseconds per call (per op for ``compiled_per_op``). The compiled variants must not
recompile while timed (counted by Dynamo's frame counters; the JSON's ``meta.recompiles_while_timed``).
The loopback world's collectives move nothing (its ``sm`` schedules cost no NCCL host time), so the figures
compare the paths' own host cost, not a multi-GPU step. Prints a table and writes the rows as JSON to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._inductor import config as inductor_config

from benchmarks.support.loopback import loopback_world
from ficco import executor
from ficco.tables import markdown_table

SCHEDULES = ("serial/sm", "shard/dma", "finer/dma/s2/chunk", "finer/sm/s4/shard")
VARIANTS = (
    "executor",
    "executor_per_op",
    "custom_op",
    "custom_op_inference",
    "compiled",
    "compiled_inference",
    "compiled_per_op",
    "graphed_per_op",
)
PER_OP = ("executor_per_op", "compiled_per_op", "graphed_per_op")
"""Variants whose call runs ``--ops-per-graph`` ops: their time is divided by that count."""
REFERENCE = "executor_per_op"
"""The variant the table divides the other per-op variants by."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world-size", type=int, default=2, help="ranks of the loopback world")
    p.add_argument("--tokens", type=int, default=256, help="gathered rows m (tiny: host-bound)")
    p.add_argument("--hidden", type=int, default=256, help="k and n")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=100, help="calls per timed batch")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--ops-per-graph", type=int, default=8, help="ops in the compiled_per_op graph")
    p.add_argument("--clock", choices=("wall", "thread"), help="default: wall on cuda, thread on cpu")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def calls(
    op: str, schedule: str, a: torch.Tensor, b: torch.Tensor, group_name: str, per_graph: int, skipped: dict
) -> dict:
    """The variants of one (op, schedule) as callables of no arguments (module docstring); a variant that
    cannot be built is left out, with the reason under ``skipped``."""
    if op == "ag_gemm":

        def custom(a=a):
            return torch.ops.ficco.all_gather_matmul(a, [b], 0, group_name, schedule)

        def eager(a=a):
            return executor.all_gather_matmul(a, b, schedule)
    else:

        def custom(a=a):
            return torch.ops.ficco.matmul_reduce_scatter(a, b, "sum", 0, group_name, schedule)

        def eager(a=a):
            return executor.matmul_reduce_scatter(a, b, schedule)

    inputs = [a.clone() for _ in range(per_graph)]  # distinct: no common-subexpression elimination

    def many(*xs):
        return [custom(x) for x in xs]

    compiled = torch.compile(custom, fullgraph=True)
    compiled_inference = torch.compile(custom, fullgraph=True)
    compiled_many = torch.compile(many, fullgraph=True)

    def custom_inference():
        with torch.inference_mode():
            return custom()

    def inference():
        with torch.inference_mode():
            return compiled_inference()

    variants = {
        "executor": eager,
        "executor_per_op": lambda: [eager(x) for x in inputs],
        "custom_op": custom,
        "custom_op_inference": custom_inference,
        "compiled": compiled,
        "compiled_inference": inference,
        "compiled_per_op": lambda: compiled_many(*inputs),
    }
    if a.is_cuda:
        from ficco.runtime.graphs import GraphedCall

        try:
            variants["graphed_per_op"] = GraphedCall(lambda: compiled_many(*inputs))
        except RuntimeError as err:  # a schedule whose calls the loopback world cannot capture
            skipped[f"{op} {schedule} graphed_per_op"] = str(err).splitlines()[0]
    return variants


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    rows: list[dict] = []
    # this checkout's graphs, never a graph Inductor cached for an older ficco (its op kernels are not in
    # the cache key)
    with (
        loopback_world(args.world_size, args.device) as device,
        inductor_config.patch(force_disable_caches=True),
    ):
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        clock = args.clock or ("wall" if device.type == "cuda" else "thread")
        now = time.perf_counter if clock == "wall" else time.thread_time
        group_name = dist.group.WORLD.group_name
        w, m, h = args.world_size, args.tokens, args.hidden
        gen = torch.Generator(device=device).manual_seed(0)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        shard = torch.randn(m // w, h, device=device, generator=gen).to(dtype)
        full = torch.randn(m, h, device=device, generator=gen).to(dtype)
        b = torch.randn(h, h, device=device, generator=gen).to(dtype)
        cases, skipped = {}, {}
        for op, a in (("ag_gemm", shard), ("gemm_rs", full)):
            for schedule in SCHEDULES:
                for variant, fn in calls(op, schedule, a, b, group_name, args.ops_per_graph, skipped).items():
                    for _ in range(args.warmup):  # compiles, plans, allocates
                        fn()
                    cases[(op, schedule, variant)] = fn
        times: dict[tuple, list[float]] = {key: [] for key in cases}
        frames = _frames_compiled()
        for _ in range(args.rounds):
            order = list(cases)
            random.shuffle(order)
            for key in order:
                fn = cases[key]
                sync()
                start = now()
                for _ in range(args.batch):
                    fn()
                per_call = (now() - start) / args.batch * 1e6
                times[key].append(per_call / (args.ops_per_graph if key[2] in PER_OP else 1))
            sync()
        recompiles = _frames_compiled() - frames
    for (op, schedule, variant), us in times.items():
        rows.append(
            {"op": op, "schedule": schedule, "variant": variant, "host_us_per_call": statistics.median(us)}
        )
    print_table(rows)
    for what, why in skipped.items():
        print(f"skipped {what}: {why}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": str(device),
        "world_size": args.world_size,
        "tokens": args.tokens,
        "hidden": args.hidden,
        "ops_per_graph": args.ops_per_graph,
        "clock": clock,
        "recompiles_while_timed": recompiles,
        "skipped": skipped,
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return rows


def _frames_compiled() -> int:
    """Frames Dynamo has compiled so far in this process (each recompile adds one)."""
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


def print_table(rows: list[dict]) -> None:
    """One line per (op, schedule): each variant's median host microseconds per call, and the ratio of each
    other per-op variant's cost to the executor's on the same inputs (:data:`REFERENCE`)."""
    by = {(r["op"], r["schedule"], r["variant"]): r["host_us_per_call"] for r in rows}
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    per_op = [v for v in PER_OP if v in variants and v != REFERENCE]
    lines = []
    for op, schedule in dict.fromkeys((r["op"], r["schedule"]) for r in rows):
        us = {v: by.get((op, schedule, v)) for v in variants}
        ratios = (f"{us[v] / us[REFERENCE]:.2f}" if us[v] else "-" for v in per_op)
        lines.append([op, schedule, *(f"{u:.1f}" if u else "-" for u in us.values()), *ratios])
    header = ["op", "schedule", *(f"{v} us" for v in variants), *(f"{v} / {REFERENCE}" for v in per_op)]
    print(markdown_table(header, lines))


if __name__ == "__main__":
    main()
