"""How a batched call lays out its GEMMs, and what each layout costs the GPU.

A batched call runs on ``[batch, seq/w, k]`` shards (sequence parallel with ``batch`` sequences): the
executor moves rows in rank-major order (rank, sequence, row), while its inputs and outputs are batch-major
(sequence, rank, row), as PyTorch's gather and scatter along the sequence lay them out. Three layouts:

- ``permuted`` (``serial`` schedules): the rows are moved to the other order once, then one GEMM per weight
  over every row: PyTorch's own path (its gather along the sequence concatenates the ranks' blocks of the
  gathered input, with the same kernel; the partial product of a reduce-scatter is put in rank-major order
  by one concatenation of each sequence's contiguous block, where PyTorch's concatenates strided pieces).
- ``segmented`` (overlapped schedules): one GEMM per unit of the plan and sequence, reading and writing the
  rows where they lie: no copy, but a GEMM of few rows is bound by reading its weight, so every segment
  reads it again.
- ``rank_major`` (overlapped schedules): one GEMM per unit over its rank-major rows, and one concatenation:
  of each output at the end (gather), of the input before the first GEMM (reduce-scatter).

:func:`choose` picks the cheaper of ``segmented`` and ``rank_major`` for an overlapped schedule by
:func:`layout_us`, a roofline of each GEMM and copy (FLOPs at the GEMM rate this GPU reaches, bytes at the
bandwidth its copies reach, plus a floor per kernel) whose rates come from GEMMs measured on an
H200 (:data:`GEMM_EFFICIENCY`, :data:`COPY_EFFICIENCY`, :data:`KERNEL_FLOOR_US`, :data:`ROOFLINE_NORM`,
:data:`TILE_FILL_EXPONENT`); the loopback runs of
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
from ficco.features.vector import FP32_SLOWDOWN, gemm_waves

LayoutName = Literal["whole", "permuted", "segmented", "rank_major"]
"""``whole``: one sequence (no layout to choose); the others: the module docstring's."""
OVERLAPPED_LAYOUTS: tuple[LayoutName, ...] = ("segmented", "rank_major")
"""The layouts an overlapped (``shard``, ``finer``) schedule chooses between."""

GEMM_EFFICIENCY = 0.80
"""Share of the dense bf16 peak (``HardwareProfile.peak_bf16_tflops``) a GEMM that fills the GPU reaches:
one H200, torch 2.11, cuBLAS, the GEMMs of Llama-3.1-8B's and 70B's layers at 4096-32768 rows (790 TFLOP/s
on average; the per-op GEMM times of ``benchmarks/results/runtimes-loopback-h200.json``)."""
COPY_EFFICIENCY = 0.80
"""Share of the HBM bandwidth (``hbm_gbps``) a weight-bound GEMM or a device copy reaches: the same run's
GEMMs of 16-64 rows read their weights at 3.0-4.0 TB/s."""
KERNEL_FLOOR_US = 2.0
"""GPU time every GEMM or copy kernel adds, microseconds (its launch and tail): fitted with
:data:`ROOFLINE_NORM` and :data:`TILE_FILL_EXPONENT` to the same run's GEMM times of every op, whole and
split into the pieces of each schedule and layout (433 timings of 16-32768 rows): a GEMM's time within 6%
on average (the roofline at the former 0.67 of the peak with a 4 us floor: 17%), and the 2-way splits of
70B's GEMMs at 1024 rows 1.18-1.19x the whole GEMM (measured 1.15-1.17x; the former model: 1.03x, which let
the planner keep splits whose extra GEMM time the overlap could not pay)."""
ROOFLINE_NORM = 3.0
"""A GEMM's compute and memory times combine as their ``ROOFLINE_NORM``-norm: between their maximum (a
GEMM far from the ridge pays one) and their sum (near the ridge it pays some of both)."""
TILE_FILL_EXPONENT = 0.3
"""A GEMM of fewer 128 x 128 output tiles than the GPU has SMs (``features.vector.gemm_waves`` < 1) keeps
part of the GPU idle even with split-K: its compute time is divided by ``waves ** TILE_FILL_EXPONENT``. This
is what makes a 2-way split of a few hundred rows cost more than its FLOPs say."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """What the cost model charges: FLOPs and bytes per microsecond, a floor per kernel, and the SMs a
    GEMM's output tiles fill."""

    flops_per_us: float
    bytes_per_us: float
    floor_us: float
    sm_count: int

    @classmethod
    def of(cls, hardware: HardwareProfile, itemsize: int) -> Rates:
        """The rates of ``hardware``'s GPUs for elements of ``itemsize`` bytes (4: fp32, at the plain fp32
        rate)."""
        slowdown = FP32_SLOWDOWN if itemsize == 4 else 1.0
        return cls(
            flops_per_us=hardware.peak_bf16_tflops * 1e6 * GEMM_EFFICIENCY / slowdown,
            bytes_per_us=hardware.hbm_gbps * 1e3 * COPY_EFFICIENCY,
            floor_us=KERNEL_FLOOR_US,
            sm_count=hardware.sm_count,
        )


def gemm_us(rows: int, n: int, k: int, itemsize: int, rates: Rates) -> float:
    """One ``[rows, k] @ [k, n]`` GEMM, microseconds: its compute time (FLOPs at ``rates``, slower where its
    output tiles cannot fill the SMs) and memory time (the bytes it reads and writes, the weight once)
    combined as their :data:`ROOFLINE_NORM`-norm, plus the floor."""
    fill = min(1.0, gemm_waves(rows, n, rates.sm_count))
    compute = 2.0 * rows * n * k / rates.flops_per_us / fill**TILE_FILL_EXPONENT
    moved = (rows * k + k * n + rows * n) * itemsize / rates.bytes_per_us
    return (compute**ROOFLINE_NORM + moved**ROOFLINE_NORM) ** (1.0 / ROOFLINE_NORM) + rates.floor_us


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


def weight_columns(op: str, n: int, ns: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The columns of each GEMM a call of ``op`` runs over its rows: ``ns`` for an ``ag_gemm`` whose gathered
    input feeds several weights, else ``(n,)``."""
    return ns if op == "ag_gemm" and ns else (n,)


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
    ns: tuple[int, ...] = (),
) -> float:
    """The GPU time of the GEMMs and layout copies of a call of ``op`` (``ag_gemm``: ``m`` gathered rows
    against ``[k, n]``, or against each weight's ``[k, ns[i]]`` where it feeds several; ``gemm_rs``:
    ``[m, k] @ [k, n]`` scattered) under ``schedule`` on ``batch`` sequences, in its cheapest layout (the
    transfers not counted)."""
    direction = "gather" if op == "ag_gemm" else "scatter"
    plan = make_plan(direction, world_size, schedule.granularity, schedule.splits, schedule.grain)
    rates = Rates.of(hardware, itemsize)
    shape = {"shard_rows": m // world_size, "ns": weight_columns(op, n, ns), "k": k, "itemsize": itemsize,
             "rates": rates}  # fmt: skip
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
