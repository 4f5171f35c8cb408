"""Timing whole steps on a process group: interleaved rounds, ranks aligned, the slowest rank's time.

Used by ``runtime.verify`` and ``benchmarks/block_bench.py``; the rounds are
:func:`ficco.rounds.interleaved_rounds`'s. Collective: every rank calls it with the same variants in the same
order, and gets the same numbers back.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ficco.rounds import interleaved_rounds

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
    timed_ms: float = 0.0,
    max_rounds: int | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Every variant's median step time and median host time to issue a step (ms), each step's time the
    slowest rank's.

    After ``warmup`` untimed steps each, the variants are timed in at least ``rounds`` rounds of ``reps``
    steps, in a new order every round (the same order on every rank: the steps are collective), so that
    drift lands on every variant alike. A round starts with the ranks aligned; its steps are queued back to
    back between CUDA events (CPU: ``perf_counter``); host time is the time to queue them, per step (close to
    the step time when the host, not the GPU, is the bottleneck).

    ``timed_ms`` > 0: short steps get more rounds, so that every variant is timed for about ``timed_ms`` in
    all (short, host-bound steps vary most from round to round): after the first round, the fastest
    variant's step time (slowest rank) sets the count, at most ``max_rounds`` (default: ``rounds``).
    """
    names = list(variants)
    for activate, step in variants.values():
        activate()
        for _ in range(warmup):
            step()
    steps: dict[str, list[float]] = {name: [] for name in names}
    host: dict[str, list[float]] = {name: [] for name in names}

    def run_round(order: list[str]) -> None:
        for name in order:
            activate, step = variants[name]
            activate()
            align(device, group)
            ms, issued = _timed_steps(step, reps, device)
            steps[name] += ms
            host[name].append(issued / reps)

    def more_rounds() -> int:
        fastest = min(_slowest([statistics.median(ms) for ms in steps.values()], device, group))
        return max(rounds, min(max_rounds or rounds, math.ceil(timed_ms / (reps * max(fastest, 1e-6)))))

    done = interleaved_rounds(
        names,
        run_round,
        rounds=rounds,
        seed=[len(names), reps],
        more_rounds=more_rounds if timed_ms > 0 else None,
    )
    flat = [t for name in names for t in (*steps[name], *host[name])]
    values, width = _slowest(flat, device, group), done * reps + done
    times, hosts = {}, {}
    for i, name in enumerate(names):
        mine = values[i * width : (i + 1) * width]
        times[name] = statistics.median(mine[: done * reps])
        hosts[name] = statistics.median(mine[done * reps :])
    return times, hosts


def _slowest(values: list[float], device: torch.device, group: dist.ProcessGroup | None) -> list[float]:
    """``values`` element-wise, the maximum over the ranks of ``group``."""
    slowest = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.tolist()


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
