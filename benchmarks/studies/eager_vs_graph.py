r"""Does an eager executor call cost the larger of its host time and its device time, or their sum?

    python3 -m benchmarks.studies.eager_vs_graph --out OUT/eager-vs-graph-loopback-h200.json      # one GPU

In an eager call the host issues the work while the GPU runs what it already has, so a call should take about
the larger of the two; anything in the executor that makes the host wait for the device (a synchronisation, a
blocking copy) would turn that into their sum. On one GPU, as rank 0 of a loopback world of two
(``benchmarks.support.loopback``: no peer, copies into local buffers, NCCL calls that return at once), for
each op, shape of :data:`CASES` and schedule of ``--schedules``: ``eager_us``, a block of ``--calls`` calls
timed between CUDA events from an idle device; ``host_us``, the host's time to issue that block; ``graph_us``,
the same calls captured into one CUDA graph and replayed (device time alone). Rounds (``--rounds``) interleave
the three; each is the median over rounds, per call. The results committed beside it were measured with the
main thread kept off CPUs in their slow state (a placement policy the harness no longer has; see
``docs/protocol.md``); this runs under ``share``. Prints a table with ``max(host, graph)`` and ``host +
graph`` beside ``eager`` and writes the rows to ``--out``."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ficco.files import write_text_atomic
from ficco.harness.cpu_placement import placement_for_rank
from ficco.tables import text_table

CASES: tuple[tuple[str, int, int, int], ...] = (
    ("gemm_rs", 768, 23936, 768),
    ("gemm_rs", 4096, 8192, 14336),
    ("ag_gemm", 1024, 4096, 6144),
    ("ag_gemm", 8192, 8192, 4096),
)
"""(op, m, n, k): a host-bound and a device-bound shape of each op (``datasets/h200x2`` sizes)."""
SCHEDULES = ("serial/sm", "serial/dma", "shard/dma", "shard/sm", "finer/dma/s2/chunk", "finer/dma/s4/chunk")


def operands(op: str, m: int, n: int, k: int, device):
    """The call of ``op`` on seeded bf16 operands of rank 0 of 2: a function of the schedule."""
    import torch

    from ficco import executor

    gen = torch.Generator(device=device).manual_seed(0)
    rows = m // 2 if op == "ag_gemm" else m
    a = torch.randn(rows, k, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16, generator=gen)
    out = torch.empty(m if op == "ag_gemm" else m // 2, n, device=device, dtype=torch.bfloat16)
    if op == "ag_gemm":
        return lambda schedule: executor.all_gather_matmul(a, b, schedule, out=out)
    return lambda schedule: executor.matmul_reduce_scatter(a, b, schedule, out=out)


def time_case(call, calls: int, rounds: int) -> dict[str, float]:
    """Median eager, host and graph microseconds per call over ``rounds`` (module docstring)."""
    import torch

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    eager, host, replay = [], [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        torch.cuda.synchronize()
        start.record()
        begun = time.perf_counter()
        for _ in range(calls):
            call()
        host.append((time.perf_counter() - begun) / calls * 1e6)
        end.record()
        end.synchronize()
        eager.append(start.elapsed_time(end) / calls * 1e3)
        torch.cuda._sleep(1_000_000)  # the device busy while the replay is queued
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replay.append(start.elapsed_time(end) / calls * 1e3)
    del graph
    per_round = {"eager_us": eager, "host_us": host, "graph_us": replay}
    return {name: round(statistics.median(v), 1) for name, v in per_round.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), help="schedules per shape")
    parser.add_argument("--calls", type=int, default=10, help="calls per timed block and per graph")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per (shape, schedule)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    if not (1 <= args.calls <= 1000 and 1 <= args.rounds <= 1000):
        parser.error(f"--calls and --rounds must be 1-1000; got {args.calls}, {args.rounds}")

    import torch

    from benchmarks.support.loopback import loopback_world
    from ficco import executor

    if not torch.cuda.is_available():
        sys.exit("error: this needs a CUDA GPU")
    placement = placement_for_rank("share", 0, 1, 0)
    placement.confine()
    rows = []
    with loopback_world(2) as device:
        for op, m, n, k in CASES:
            call = operands(op, m, n, k, device)
            for schedule in args.schedules:
                got = time_case(lambda c=call, s=schedule: c(s), args.calls, args.rounds)
                rows.append({"op": op, "shape": [m, n, k], "schedule": schedule, **got})
                executor.clear_buffers()
    body = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": args.calls,
            "rounds": args.rounds, "placement": placement.describe(), "rows": rows}  # fmt: skip
    write_text_atomic(args.out, json.dumps(body, indent=1) + "\n")
    cells = []
    for r in rows:
        us = [
            r["eager_us"],
            r["host_us"],
            r["graph_us"],
            max(r["host_us"], r["graph_us"]),
            r["host_us"] + r["graph_us"],
        ]
        cells.append([r["op"], "x".join(map(str, r["shape"])), r["schedule"], *(f"{x:.1f}" for x in us)])
    head = ["op", "shape", "schedule", "eager us", "host us", "graph us", "max(host, graph)", "host + graph"]
    print(text_table(head, cells, align="<<<>>>>>"))


if __name__ == "__main__":
    main()
