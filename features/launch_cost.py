"""The executor's host time per call: launch counts of a schedule, priced per kind, over the GPU work.

:func:`launch_counts` (launches of one eager call, by kind) priced by :data:`HOST_COSTS` (us per launch,
fitted to measured host times) gives :func:`host_us`; :func:`host_over_gpu` divides it by the roofline GPU
work (the pair feature ``eager_host_over_gpu``), scaled by the machine's host factor. Needs only numpy. See
docs/executor.md, "Host time per call".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache

import numpy as np

from ficco.features.ops import OP_SPECS
from ficco.features.scenario import OPS
from ficco.features.schedule import Schedule, all_schedules
from ficco.features.vector import FEATURE_NAMES


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchCounts:
    """What one eager executor call launches from the host on one rank, by kind."""

    calls: int = 1
    """Executor calls: argument lookup, output allocation and the Python around the launches (always 1)."""
    gemms: int = 0
    """GEMM launches (``torch.mm``): one per GEMM unit of the plan, per local expert its rows touch (MoE: the
    executor's loop, which measured every committed MoE row, not its grouped GEMM, ``expert_gemms``)."""
    kernels: int = 0
    """Other torch kernels on the caller's stream: the reduce-scatter's adds, the MoE permutation, local
    copies of the own rows."""
    collectives: int = 0
    """NCCL collectives (all-gather, reduce-scatter, all-to-all): ``serial/sm`` only."""
    p2p_groups: int = 0
    """Coalesced NCCL send/receive groups (``sm`` overlap: one per transfer batch)."""
    peer_copies: int = 0
    """Copies into a peer's memory on the copy engines (``dma``: one per piece)."""
    barriers: int = 0
    """Device barriers publishing landed pieces (``dma``)."""
    syncs: int = 0
    """Stream synchronisations: CUDA event records and stream waits (fork, join, landed pieces)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCosts:
    """Host microseconds per launch of each :class:`LaunchCounts` kind (eager, one rank)."""

    calls: float = 30.0
    """Per executor call (the reference's and the overlap engine's Python around the launches)."""
    gemms: float = 14.5
    """Per GEMM."""
    kernels: float = 14.5
    """Per other torch kernel (tied to the GEMM's price: a torch op launch each)."""
    collectives: float = 3.0
    """Per NCCL collective, beyond its call."""
    p2p_groups: float = 38.5
    """Per coalesced NCCL send/receive group."""
    peer_copies: float = 4.5
    """Per peer copy."""
    barriers: float = 4.5
    """Per device barrier (tied to the peer copy's price: on the measured schedules the two counts nearly
    move together, so a fit cannot tell them apart)."""
    syncs: float = 2.0
    """Per event record or stream wait."""


HOST_COSTS = HostCosts()
"""Prices fitted to ``benchmarks/results/executor-overhead-h200x2.json`` (docs/executor.md)."""
FIT_TOLERANCE = 0.10
"""Largest relative error of :data:`HOST_COSTS` on a measured (op, schedule) the tests accept."""


def sub_block_gemms(experts: int, splits: int) -> int:
    """GEMMs over the ``splits`` sub-chunks of one block of rows spread evenly over ``experts`` local
    experts: cutting the block at both sets of boundaries gives ``experts + splits - gcd(experts, splits)``
    pieces (uneven blocks, rounding and empty experts aside)."""
    return experts + splits - math.gcd(experts, splits)


@lru_cache(maxsize=4096)
def launch_counts(
    op: str, world_size: int, schedule: Schedule, local_experts: int = 1, copy_streams: int | None = None
) -> LaunchCounts:
    """Launches of one eager call of ``schedule`` on ``op`` on the busiest rank (rank 0), following the
    executor's plans and transports. ``local_experts`` (MoE ops: ``experts / world_size``) is the GEMMs a
    whole block of rows needs. ``copy_streams``: the copy arrangement's side streams at most (the executor's
    ``FICCO_COPY_STREAMS``; a copy-engine call with one lane and no GEMM to overlap then runs inline, on the
    caller's stream, with no events); None: one per peer, the arrangement :data:`HOST_COSTS` was fitted
    on."""
    spec = OP_SPECS[op]
    w, peers = world_size, world_size - 1
    e = local_experts if spec.moe else 1
    gran, splits, chunk = schedule.granularity, schedule.splits, schedule.grain == "chunk"
    gather = spec.direction == "gather"
    permute = int(spec.moe and gran == "serial")  # every row between source- and expert-major order at once
    if gran == "serial" and schedule.executor == "sm":  # the reference: the collective, a GEMM per expert
        return LaunchCounts(gemms=e, kernels=permute, collectives=1)
    # 1. the plan (executor.plan.make_plan): rounds of pieces, GEMM units, copy lanes
    if gran == "serial":
        rounds, lanes, gemms = 1, peers, e
    elif gran == "shard":
        rounds, lanes, gemms = peers, 1, w * e
    else:
        rounds, lanes, gemms = splits, peers, e + peers * (sub_block_gemms(e, splits) if chunk else e)
    pieces = peers * (splits if gran == "finer" else 1)
    waits = pieces if gran == "finer" else rounds  # (GEMM unit, round) pairs a gather waits for
    sent = pieces if gran == "finer" and chunk else peers if gran != "serial" else 1  # scatter: units sending
    kernels = permute + (peers if spec.collective == "reduce_scatter" else 0)  # the owner's adds
    # 2. the transport (executor.transport)
    if schedule.executor == "sm":
        # a group per gather round or scatter unit, each waited for once; gather forks and joins a lane
        groups = rounds if gather else sent
        return LaunchCounts(gemms=gemms, kernels=kernels, p2p_groups=groups, syncs=groups + 4 * gather)
    lanes = lanes if copy_streams is None else min(lanes, copy_streams)
    # executor.lanes.copy_lanes: one lane and no GEMM to overlap runs inline, with no fork, join or events
    inline = copy_streams is not None and lanes == 1 and gran == "serial"
    if gather:
        on_copy_lane = rounds == 1 and lanes == 1  # its one barrier behind the copies, no signal lane
        # fork (a record, a wait per lane), per round a copied record and a signal wait per lane it uses and
        # a landed record, a wait per (unit, round); an eager call skips the join (the last wait orders it)
        per_round = 0 if on_copy_lane else 2 * (1 if gran == "shard" else lanes)
        syncs = 0 if inline else 1 + lanes + (not on_copy_lane) + rounds * (per_round + 1) + waits
        kernels += int(gran == "serial")  # the own rows copied into their slot of the gathered rows
        barriers = rounds
    else:
        # fork, a produced record per sending unit and a wait per lane it uses, join (a record and a wait
        # per lane), one barrier
        syncs = 0 if inline else (1 + lanes) + sent * (1 + (peers if gran == "serial" else 1)) + 2 * lanes
        kernels += int(spec.moe) * (1 + int(gran == "serial"))  # peers' rows out of peer memory, own rows
        barriers = 1
    return LaunchCounts(gemms=gemms, kernels=kernels, peer_copies=pieces, barriers=barriers, syncs=syncs)


def host_us(
    op: str, world_size: int, schedule: Schedule, local_experts: int = 1, costs: HostCosts = HOST_COSTS
) -> float:
    """Host microseconds of one eager call: :func:`launch_counts` priced by ``costs``."""
    counts = launch_counts(op, world_size, schedule, local_experts)
    return float(sum(getattr(counts, f.name) * getattr(costs, f.name) for f in fields(LaunchCounts)))


_SCHEDULES: tuple[Schedule, ...] = tuple(all_schedules())
"""Every schedule in canonical order: the columns of :func:`host_over_gpu`."""
_NORMAL = [replace(s, priority="normal") for s in _SCHEDULES]
TWIN_OF: np.ndarray = np.array([_NORMAL.index(s) for s in _NORMAL])
"""For each schedule in canonical order, the first one that launches the same (:func:`launch_counts` does
not depend on the stream priority: a ``/hp`` schedule's twin is its normal-priority one), int ``[S]``:
twins have equal :func:`host_over_gpu` columns, so a fast path may read one column for both."""
_OP_COLUMNS = [FEATURE_NAMES.index(f"op_{op}") for op in OPS]
_WORLD_SIZE, _EXPERTS = FEATURE_NAMES.index("world_size"), FEATURE_NAMES.index("experts")
_T_GEMM, _T_COMM = FEATURE_NAMES.index("log2_t_gemm_us"), FEATURE_NAMES.index("log2_t_comm_us")


@lru_cache(maxsize=256)
def _host_row(op: str, world_size: int, local_experts: int) -> np.ndarray:
    """:func:`host_us` of every schedule in canonical order, float64 ``[S]`` (read-only, cached)."""
    row = np.array([host_us(op, world_size, s, local_experts) for s in _SCHEDULES])
    row.flags.writeable = False
    return row


def op_prices(op: str, world_size: int, experts: int = 0) -> np.ndarray:
    """:func:`host_us` of every schedule in canonical order for ``op`` on ``world_size`` ranks with
    ``experts`` experts in all (MoE ops; each rank's share is the GEMMs a whole block of rows needs), float64
    ``[S]`` (read-only, cached)."""
    return _host_row(op, world_size, max(experts // world_size, 1))


def host_prices(X: np.ndarray) -> np.ndarray:
    """:func:`host_us` of every schedule (canonical order, runnable or not) for each feature row of ``X``
    ``[n, len(FEATURE_NAMES)]`` (op, world size and experts read from their columns): us float64 ``[n, S]``.
    """
    X = np.asarray(X, dtype=np.float64)
    if len(X) == 0:
        return np.empty((0, len(_SCHEDULES)))
    ops = np.argmax(X[:, _OP_COLUMNS], axis=1)
    world = X[:, _WORLD_SIZE].astype(np.int64)
    experts = X[:, _EXPERTS].astype(np.int64)
    if len(X) == 1:  # one decision: skip the grouping
        return op_prices(OPS[ops[0]], int(world[0]), int(experts[0]))[None, :]
    keys, inverse = np.unique(np.stack([ops, world, experts], axis=1), axis=0, return_inverse=True)
    rows = np.stack([op_prices(OPS[o], int(w), int(e)) for o, w, e in keys.tolist()])
    return rows[inverse.reshape(-1)]


def host_over_gpu(X: np.ndarray, host_factor: float | np.ndarray = 1.0) -> np.ndarray:
    """Eager host time of every schedule over the scenario's GPU work, float64 ``[n, S]``: :func:`host_prices`
    times the host factor over the roofline GEMM and communication time read from ``X``'s columns;
    ``host_factor`` is one machine's, or each row's ``[n]`` (rows measured on several machines)."""
    X = np.asarray(X, dtype=np.float64)
    gpu_us = np.exp2(X[:, _T_GEMM]) + np.exp2(X[:, _T_COMM])
    factor = np.asarray(host_factor, dtype=np.float64)
    return host_prices(X) * ((factor[:, None] if factor.ndim else factor) / gpu_us[:, None])


HOST_FACTOR_RANGE = (0.25, 8.0)
"""Allowed host factors: a host 4x faster to 8x slower than the one the prices were fitted on."""
HOST_BOUND_SHARE = 0.5
"""An eager time counts as host-bound when the same schedule replayed from a CUDA graph (GPU work only)
takes less than this share of it."""


def check_host_factor(host_factor: float) -> float:
    """``host_factor`` as a float; ValueError naming it when it is not a finite number in
    :data:`HOST_FACTOR_RANGE`."""
    lo, hi = HOST_FACTOR_RANGE
    value = float(host_factor)
    if not lo <= value <= hi:  # NaN fails too
        raise ValueError(
            f"host_factor must be in [{lo:g}, {hi:g}] (the host's time per launch over "
            f"features.launch_cost.HOST_COSTS' prices; 1 = the machine they were fitted on); "
            f"got {host_factor!r}"
        )
    return value


def estimate_host_factor(eager_ms: np.ndarray, graph_ms: np.ndarray, prices_us: np.ndarray) -> float:
    """A machine's host factor from a sweep: the median of eager time over :func:`host_prices` across the
    (scenario, schedule) pairs whose graph time is below :data:`HOST_BOUND_SHARE` of the eager time. Arrays
    ``[n, S]`` (times in ms, prices in us; NaN where unmeasured); NaN when no pair is host-bound."""
    eager_us, graph_us = np.asarray(eager_ms) * 1e3, np.asarray(graph_ms) * 1e3
    prices_us = np.asarray(prices_us)
    with np.errstate(invalid="ignore"):
        bound = (graph_us < HOST_BOUND_SHARE * eager_us) & np.isfinite(eager_us) & (prices_us > 0)
    return float(np.median(eager_us[bound] / prices_us[bound])) if bound.any() else float("nan")
