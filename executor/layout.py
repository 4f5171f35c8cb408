"""How a batched call lays out its GEMMs, and what each layout costs the GPU.

A batched call runs on ``[batch, seq/w, k]`` shards (sequence parallel with ``batch`` sequences): the
executor moves rows in rank-major order (rank, sequence, row), while its inputs and outputs are batch-major
(sequence, rank, row), as PyTorch's gather and scatter along the sequence lay them out. Three layouts:

- ``permuted`` (``serial`` schedules): the rows are moved to the other order once, then one GEMM per weight
  over every row: PyTorch's own path (its gather along the sequence copies the gathered input into place,
  its reduce-scatter copies the partial product), with the same kernels.
- ``segmented`` (overlapped schedules): one GEMM per unit of the plan and sequence, reading and writing the
  rows where they lie: no copy, but a GEMM of few rows is bound by reading its weight, so every segment
  reads it again.
- ``rank_major`` (overlapped schedules): one GEMM per unit over its rank-major rows, and one copy: of each
  output at the end (gather), of the input before the first GEMM (reduce-scatter).

:func:`choose` picks the cheaper of ``segmented`` and ``rank_major`` for an overlapped schedule by
:func:`layout_us`, a roofline of each GEMM and copy (FLOPs at the GEMM rate this GPU reaches, bytes at the
bandwidth its copies reach, plus a floor per kernel) whose rates come from GEMMs measured on an
H200 (:data:`GEMM_EFFICIENCY`, :data:`COPY_EFFICIENCY`, :data:`KERNEL_FLOOR_US`); the loopback runs of
``benchmarks/runtimes.py`` time both layouts of each op beside the one chosen (docs/executor.md, "Batched
calls"). :func:`batch_extra_us` is what the planner prices: the GPU time a batched call of a schedule spends
beyond the same call at one sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from ficco.executor.plan import Plan, make_plan
from ficco.features.hardware import KNOWN_HARDWARE, HardwareProfile, hardware_of
from ficco.features.schedule import Schedule
from ficco.features.vector import FP32_SLOWDOWN

LayoutName = Literal["whole", "permuted", "segmented", "rank_major"]
"""``whole``: one sequence (no layout to choose); the others: the module docstring's."""
OVERLAPPED_LAYOUTS: tuple[LayoutName, ...] = ("segmented", "rank_major")
"""The layouts an overlapped (``shard``, ``finer``) schedule chooses between."""

GEMM_EFFICIENCY = 0.67
"""Share of the dense bf16 peak (``HardwareProfile.peak_bf16_tflops``) a compute-bound GEMM reaches: one
H200, torch 2.11, cuBLAS, Mixtral-8x7B's expert GEMMs, 16384 routed rows over 4 local experts against
[4096, 28672] each (CUDA graph: 666 TFLOP/s; ``benchmarks/results/grouped-gemm-h200.json``)."""
COPY_EFFICIENCY = 0.82
"""Share of the HBM bandwidth (``hbm_gbps``) a weight-bound GEMM or a device copy reaches: the same run's
expert GEMMs of 256 routed rows over 4 experts read their weights at 3.9 TB/s."""
KERNEL_FLOOR_US = 4.0
"""GPU time of the smallest GEMM or copy kernel, microseconds: a kernel's launch and tail, not fitted (the
loopback runs of ``benchmarks/runtimes.py`` time each layout beside the one chosen)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """What the cost model charges: FLOPs and bytes per microsecond, and a floor per kernel."""

    flops_per_us: float
    bytes_per_us: float
    floor_us: float

    @classmethod
    def of(cls, hardware: HardwareProfile, itemsize: int) -> Rates:
        """The rates of ``hardware``'s GPUs for elements of ``itemsize`` bytes (4: fp32, at the plain fp32
        rate)."""
        slowdown = FP32_SLOWDOWN if itemsize == 4 else 1.0
        return cls(
            flops_per_us=hardware.peak_bf16_tflops * 1e6 * GEMM_EFFICIENCY / slowdown,
            bytes_per_us=hardware.hbm_gbps * 1e3 * COPY_EFFICIENCY,
            floor_us=KERNEL_FLOOR_US,
        )


def gemm_us(rows: int, n: int, k: int, itemsize: int, rates: Rates) -> float:
    """One ``[rows, k] @ [k, n]`` GEMM: the larger of its FLOPs and the bytes it reads and writes (the
    weight once), at ``rates``, plus the floor."""
    flops = 2.0 * rows * n * k / rates.flops_per_us
    moved = (rows * k + k * n + rows * n) * itemsize / rates.bytes_per_us
    return max(flops, moved) + rates.floor_us


def copy_us(elements: int, itemsize: int, rates: Rates) -> float:
    """One device copy of ``elements`` (read and written once), plus the floor."""
    return 2.0 * elements * itemsize / rates.bytes_per_us + rates.floor_us


def _unit_rows(plan: Plan, shard_rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` within its shard of each unit's rows (``whole`` units: every row of every shard,
    as ``(0, w * shard_rows)``)."""
    out = []
    for unit in plan.units:
        if unit.offset is None:
            out.append((0, plan.world_size * shard_rows))
            continue
        lo = unit.first_sub * shard_rows // plan.splits
        out.append((lo, (unit.first_sub + unit.n_subs) * shard_rows // plan.splits))
    return out


def segment_sizes(start: int, stop: int, shard_rows: int, batch: int) -> list[int]:
    """The sizes of the pieces rows ``[start, stop)`` of rank-major shards of ``shard_rows`` rows (each
    ``batch`` sequences of ``shard_rows / batch`` rows) fall into, one per (shard, sequence)."""
    per = shard_rows // batch
    out, row = [], start
    while row < stop:
        size = min(per - row % shard_rows % per, stop - row)
        out.append(size)
        row += size
    return out


def layout_us(
    layout: LayoutName,
    plan: Plan,
    *,
    shard_rows: int,
    batch: int,
    ns: tuple[int, ...],
    k: int,
    itemsize: int,
    rates: Rates,
) -> float:
    """The GPU time of ``plan``'s GEMMs and layout copies for one call whose shards hold ``shard_rows`` rows
    (``batch`` sequences), ``ns`` the weights' columns (gather) or the output's (scatter, one entry) and
    ``k`` the inner size (scatter: all the summed pairs' together). The transfers are not counted."""
    units = _unit_rows(plan, shard_rows)
    m = plan.world_size * shard_rows
    gemms = 0.0
    for lo, hi in units:
        pieces = segment_sizes(lo, hi, shard_rows, batch) if layout == "segmented" else [hi - lo]
        gemms += sum(gemm_us(r, n, k, itemsize, rates) for r in pieces for n in ns)
    if layout in ("whole", "segmented"):
        return gemms
    moved = m * k if plan.direction == "scatter" and layout == "rank_major" else m * sum(ns)
    if plan.direction == "gather" and layout == "permuted":
        moved = m * k  # the gathered input put in place once, before the GEMMs
    copies = len(ns) if plan.direction == "gather" and layout == "rank_major" else 1
    return gemms + 2.0 * moved * itemsize / rates.bytes_per_us + copies * rates.floor_us


_forced: list[LayoutName] = []
"""A layout every overlapped batched call runs (:func:`forced`), innermost last."""


@contextlib.contextmanager
def forced(layout: LayoutName) -> Iterator[None]:
    """Every overlapped batched call inside the block runs ``layout`` (``segmented`` or ``rank_major``)
    instead of the cheaper one: how the benchmarks and tests measure and check each layout."""
    if layout not in OVERLAPPED_LAYOUTS:
        raise ValueError(f"layout must be one of {list(OVERLAPPED_LAYOUTS)}; got {layout!r}")
    _forced.append(layout)
    try:
        yield
    finally:
        _forced.pop()


def choose(
    plan: Plan, shard_rows: int, batch: int, ns: tuple[int, ...], k: int, itemsize: int, gpu: str
) -> LayoutName:
    """The layout a call of ``plan`` runs: ``whole`` for one sequence, ``permuted`` for a ``serial`` plan,
    else the one :func:`layout_us` prices lower on ``gpu`` (a GPU name, ``""`` for the CPU: the H200's
    rates) unless :func:`forced`."""
    if batch == 1:
        return "whole"
    if len(plan.units) == 1:
        return "permuted"
    if _forced:
        return _forced[-1]
    return _cheaper(plan, shard_rows, batch, ns, k, itemsize, gpu)


@lru_cache(maxsize=1024)
def _cheaper(
    plan: Plan, shard_rows: int, batch: int, ns: tuple[int, ...], k: int, itemsize: int, gpu: str
) -> LayoutName:
    rates = Rates.of(_hardware(gpu, plan.world_size), itemsize)
    shape = {"shard_rows": shard_rows, "batch": batch, "ns": ns, "k": k, "itemsize": itemsize}
    return min(OVERLAPPED_LAYOUTS, key=lambda name: layout_us(name, plan, rates=rates, **shape))


def _hardware(gpu: str, world_size: int) -> HardwareProfile:
    """The profile of ``world_size`` GPUs named ``gpu``; an H200's where none is known (the CPU)."""
    return hardware_of(gpu, world_size) or KNOWN_HARDWARE["h200x2"]


def call_us(
    op: str,
    schedule: Schedule,
    *,
    m: int,
    n: int,
    k: int,
    batch: int,
    world_size: int,
    itemsize: int,
    hardware: HardwareProfile,
) -> float:
    """The GPU time of the GEMMs and layout copies of a call of ``op`` (``ag_gemm``: ``m`` gathered rows
    against ``[k, n]``; ``gemm_rs``: ``[m, k] @ [k, n]`` scattered) under ``schedule`` on ``batch``
    sequences, in its cheapest layout (the transfers not counted)."""
    direction = "gather" if op == "ag_gemm" else "scatter"
    plan = make_plan(direction, world_size, schedule.granularity, schedule.splits, schedule.grain)
    rates = Rates.of(hardware, itemsize)
    shape = {"shard_rows": m // world_size, "ns": (n,), "k": k, "itemsize": itemsize, "rates": rates}
    if batch <= 1:
        return layout_us("whole", plan, batch=1, **shape)
    layouts = ("permuted",) if len(plan.units) == 1 else OVERLAPPED_LAYOUTS
    return min(layout_us(name, plan, batch=batch, **shape) for name in layouts)


def batch_extra_us(op: str, schedule: Schedule, *, batch: int, **shape) -> float:
    """The GPU time a call of ``op`` under ``schedule`` (:func:`call_us`'s ``shape``) spends on ``batch``
    sequences beyond the same call on one: the layout's copies and the GEMMs' weight reads per segment (0 at
    ``batch`` 1)."""
    if batch <= 1:
        return 0.0
    return call_us(op, schedule, batch=batch, **shape) - call_us(op, schedule, batch=1, **shape)
