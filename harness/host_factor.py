r"""This machine's host speed, measured within seconds: the executor's host time per eager call over its price
(a host factor, no unit): the median over :data:`CASES` of the slowest rank's microseconds per call of tiny
shapes (:func:`time_host_calls`) over :func:`features.launch_cost.host_us`. See docs/protocol.md, "The host".

    torchrun --standalone --nproc-per-node 2 -m ficco.harness.host_factor --out host.json   # or:
    ficco host-factor                                                                      # all local GPUs

Inside a running job (a process group already up), :func:`measure_host_factor` does the same in about a
second.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ficco.dataclass_options import add_arguments, from_arguments, option
from ficco.features import Schedule
from ficco.features.launch_cost import HOST_FACTOR_RANGE, host_us
from ficco.files import write_text_atomic
from ficco.rounds import interleaved_rounds

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


SCHEDULES = ("serial/sm", "serial/dma", "shard/sm", "shard/dma", "finer/dma/s4/chunk", "finer/dma/s4/shard")
CASES: tuple[tuple[str, str], ...] = tuple((op, s) for op in ("ag_gemm", "gemm_rs") for s in SCHEDULES)
"""(op, schedule) pairs timed: the launches the eager labels of small shapes are made of."""
CPU_DEVICE = "CPU (gloo)"
"""``HostSpeed.device`` of a gloo measurement."""
ROWS, WIDTH = 64, 64
"""Tiny GEMMs: ``A [ROWS, WIDTH]`` gathered or reduced, ``B [WIDTH, WIDTH]``: microseconds of GPU work."""


def time_host_calls(
    calls: dict[Hashable, Callable[[], object]],
    *,
    rounds: int,
    batch: int,
    warmup: int,
    seed: int,
    sync: Callable[[], None],
    clocks: Sequence[Callable[[], float]] = (time.perf_counter,),
    after_warmup: Callable[[], object] | None = None,
    around: Callable[[Hashable], contextlib.AbstractContextManager] | None = None,
) -> list[dict[Hashable, list[float]]]:
    """Microseconds per call of each of ``calls``, per round, by each of ``clocks`` (functions of seconds):
    one ``{case: [us per call, per round]}`` per clock.

    ``warmup`` untimed calls of each, then ``rounds`` interleaved rounds (shuffled by ``seed``) that each
    time one batch of ``batch`` calls of every case, from ``sync()`` until its last call returns (on CUDA:
    how fast the host issues work). ``after_warmup`` runs once before the rounds (e.g. ``Placement.confine``);
    ``around(case)`` is a context each of the case's batches runs in, ``sync()`` included."""
    cases = list(calls)
    around = around or (lambda case: contextlib.nullcontext())
    for case in cases:
        with around(case):
            for _ in range(warmup):
                calls[case]()
    if after_warmup is not None:
        after_warmup()
    out: list[dict[Hashable, list[float]]] = [{case: [] for case in cases} for _ in clocks]

    def run_round(order: list[Hashable]) -> None:
        for case in order:
            call = calls[case]
            with around(case):
                sync()
                start = [clock() for clock in clocks]
                for _ in range(batch):
                    call()
                for times, clock, begun in zip(out, clocks, start, strict=True):
                    times[case].append((clock() - begun) / batch * 1e6)

    interleaved_rounds(cases, run_round, rounds=rounds, seed=seed)
    sync()
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class HostTiming:
    """How ``ficco host-factor`` times the cases; its fields are the command's options."""

    rounds: int = option(10, "Shuffled rounds, a batch of every case each.", min=3, max=1000)
    batch: int = option(50, "Calls per timed batch.", min=1, max=10_000)


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCase:
    """One timed (op, schedule): its host microseconds per call and its price."""

    op: str
    schedule: str
    measured_us: float
    """Median over rounds of the slowest rank's microseconds per call."""
    priced_us: float
    """``features.launch_cost.host_us`` of the call."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostSpeed:
    """A machine's measured host speed."""

    factor: float
    """Median over cases of ``measured_us / priced_us``: the host factor to give the predictor."""
    world_size: int
    device: str
    cases: tuple[HostCase, ...]

    def to_dict(self) -> dict:
        """The fields, the cases as dicts (the ``--out`` JSON)."""
        return asdict(self)

    def summary(self) -> str:
        """Lines for a terminal: every case, then the factor and how to use it."""
        from ficco.tables import text_table

        cells = [
            [
                c.op,
                c.schedule,
                f"{c.measured_us:.1f}",
                f"{c.priced_us:.1f}",
                f"{c.measured_us / c.priced_us:.2f}",
            ]
            for c in self.cases
        ]
        table = text_table(["op", "schedule", "host us/call", "priced us", "ratio"], cells, align="<<>>>")
        head = f"{table}\nhost factor {self.factor:.2f} on {self.world_size} x {self.device}"
        if self.device == CPU_DEVICE:
            return f"{head}: the CPU transfers' time, not a GPU machine's host speed (a check of the command)"
        lo, hi = HOST_FACTOR_RANGE
        if not lo <= self.factor <= hi:
            return f"{head}: outside the range {lo}-{hi} the predictor accepts (eager answers do not hold)"
        return (
            f"{head}: pass --host-factor {self.factor:.2f} to `ficco recommend` / `ficco score`, "
            f"host_factor={self.factor:.2f} to the service or runtime.PredictorSource"
        )


def tiny_operands(
    rows: int, width: int, group: dist.ProcessGroup | None = None, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's ``A_shard [rows / w, width]``, ``A [rows, width]`` and ``B [width, width]``
    (``seeded_randn``), on ``device`` (default: the group's: the current GPU for NCCL, else the CPU)."""
    import torch
    import torch.distributed as dist

    w, rank = dist.get_world_size(group), dist.get_rank(group)
    if device is None:
        cuda = dist.get_backend(group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    randn = seeded_randn(rank, device)
    return randn(rows // w, width), randn(rows, width), randn(width, width)


def seeded_randn(rank: int, device: torch.device) -> Callable[..., torch.Tensor]:
    """``randn(*shape)``: random tensors from a generator seeded by ``rank``, on ``device``, bf16 on CUDA and
    fp32 on the CPU (the operands of the host-time cases)."""
    import torch

    gen = torch.Generator().manual_seed(rank)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)


def executor_calls(
    cases: Sequence[tuple[str, str]],
    shard: torch.Tensor,
    full: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> dict[tuple[str, str], Callable[[], object]]:
    """One executor call per (op, schedule) of ``cases`` (``ag_gemm`` gathers ``shard``, ``gemm_rs``
    reduces ``full @ b``), keyed by the case."""
    from ficco import executor

    ops = {
        "ag_gemm": lambda s: executor.all_gather_matmul(shard, b, s, group),
        "gemm_rs": lambda s: executor.matmul_reduce_scatter(full, b, s, group),
    }
    return {(op, s): functools.partial(ops[op], s) for op, s in cases}


def measure_host_factor(
    group: dist.ProcessGroup | None = None,
    *,
    rounds: int = 10,
    batch: int = 50,
    warmup: int = 20,
    seed: int = 0,
    after_warmup: Callable[[], object] | None = None,
) -> HostSpeed:
    """Time :data:`CASES` on this process group's devices (collective; >= 2 ranks) and return the host
    factor (``after_warmup``: see :func:`time_host_calls`). On gloo it measures the CPU transfers instead."""
    import torch
    import torch.distributed as dist

    w = dist.get_world_size(group)
    operands = tiny_operands(ROWS, WIDTH, group)
    device = operands[0].device  # the group's, as tiny_operands chose it
    cuda = device.type == "cuda"
    calls = executor_calls(CASES, *operands, group)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier(group)

    (times,) = time_host_calls(
        calls, rounds=rounds, batch=batch, warmup=warmup, seed=seed, sync=sync, after_warmup=after_warmup
    )
    slowest = torch.tensor([statistics.median(times[case]) for case in CASES], dtype=torch.float64).to(device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    cases = tuple(
        HostCase(op=op, schedule=s, measured_us=round(us, 2), priced_us=host_us(op, w, Schedule.parse(s)))
        for (op, s), us in zip(CASES, slowest.cpu().tolist(), strict=True)
    )
    factor = statistics.median(c.measured_us / c.priced_us for c in cases)
    name = torch.cuda.get_device_name(device) if cuda else CPU_DEVICE
    return HostSpeed(factor=round(factor, 3), cases=cases, world_size=w, device=name)


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point: measure on every rank, rank 0 prints the summary and writes ``--out``."""
    from ficco.harness.cpu_placement import DEFAULT_PIN, PIN_POLICIES, placement_from_env
    from ficco.harness.worker import SAFE_ENV

    p = argparse.ArgumentParser(
        prog="python -m ficco.harness.host_factor", description=__doc__.splitlines()[0]
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (NCCL) or cpu (gloo)")
    add_arguments(p, HostTiming)
    p.add_argument("--pin", choices=PIN_POLICIES, default=DEFAULT_PIN, help="where the rank's threads run")
    p.add_argument("--out", type=Path, help="JSON file to write (rank 0)")
    args = p.parse_args(argv)
    timing = from_arguments(HostTiming, args, p)
    os.environ.update(SAFE_ENV)
    import torch.distributed as dist

    from ficco import executor

    placement = placement_from_env(args.pin, cuda=args.device == "cuda")
    placement.confine()
    with executor.process_group(args.device):
        speed = measure_host_factor(**asdict(timing), after_warmup=placement.confine)
        if dist.get_rank() == 0:
            print(speed.summary(), flush=True)
            if args.out is not None:
                write_text_atomic(args.out, json.dumps(speed.to_dict(), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
