"""Timing whole steps on a process group: interleaved rounds, ranks aligned, the slowest rank's time.

Used where a runtime compares variants of the same step in place (``runtime.verify``) and by the
end-to-end block benchmark (``benchmarks/block_bench.py``). Collective: every rank of the group calls it with
the same variants in the same order, and every rank gets the same numbers back.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Variant = tuple[Callable[[], None], Callable[[], Any]]
"""``(activate, step)``: ``activate`` puts the variant in place (untimed), ``step`` runs one step."""


def align(device: torch.device, group: dist.ProcessGroup | None = None) -> None:
    """Every rank of ``group`` idle and at the same point (outside any timed region)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=group)
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_interleaved(
    variants: dict[str, Variant],
    *,
    warmup: int,
    rounds: int,
    reps: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Every variant's median step time and median host time to issue a step (ms), each step's time the
    slowest rank's.

    After ``warmup`` untimed steps each, the variants are timed in ``rounds`` rounds of ``reps`` steps, in
    a new order every round (the same order on every rank: the steps are collective), so that drift lands
    on every variant alike. A round starts with the ranks aligned; its steps are queued back to back
    between CUDA events (CPU: ``perf_counter``); host time is the time to queue them, per step (close to
    the step time when the host, not the GPU, is the bottleneck).
    """
    names = list(variants)
    for activate, step in variants.values():
        activate()
        for _ in range(warmup):
            step()
    steps: dict[str, list[float]] = {name: [] for name in names}
    host: dict[str, list[float]] = {name: [] for name in names}
    order = random.Random(len(names) * 1_000 + reps)
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            activate, step = variants[name]
            activate()
            align(device, group)
            ms, issued = _timed_steps(step, reps, device)
            steps[name] += ms
            host[name].append(issued / reps)
    flat = [t for name in names for t in (*steps[name], *host[name])]
    slowest = torch.tensor(flat, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    values, width = slowest.tolist(), rounds * reps + rounds
    times, hosts = {}, {}
    for i, name in enumerate(names):
        mine = values[i * width : (i + 1) * width]
        times[name] = statistics.median(mine[: rounds * reps])
        hosts[name] = statistics.median(mine[rounds * reps :])
    return times, hosts


def _timed_steps(step: Callable[[], Any], reps: int, device: torch.device) -> tuple[list[float], float]:
    """``reps`` steps queued back to back: each one's time (ms) and the host time to queue them all (ms)."""
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t0))
        return times, sum(times)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)
    ]
    t0 = time.perf_counter()
    for start, end in events:
        start.record()
        step()
        end.record()
    issued = 1e3 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events], issued
