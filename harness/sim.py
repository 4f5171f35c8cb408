"""The simulated backend: GEMM times measured on one GPU, transfers, contention and host time fitted to the
measured datasets.

``SimBackend`` answers ``Backend.measure`` from the model (rows say ``backend="sim"``), scaled by the hardware
profile; :class:`SimConstants` holds its constants (``harness.sim_fit`` fits them, scores the simulator's
picks and breaks its error down by term). See docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ficco.features import MODES, OP_SPECS, HardwareProfile, Scenario, Schedule
from ficco.features.dataset import BASELINE_KEYS
from ficco.features.launch_cost import launch_counts
from ficco.features.vector import FP32_SLOWDOWN
from ficco.harness.backend import ROUNDS, Measurement, ScenarioResult
from ficco.harness.gemm_table import GemmTable, expert_split, grouped, shipped_tables, table_for

SIM_MODEL_VERSION = "sim6"
"""Changes whenever a formula of the model changes (part of the sim fingerprint and of a simulated dataset's
label source, ``features.label_source``)."""

MEASURED_FIDELITY: dict[str, dict] = {
    "held_out_regret": {"2": {"eager": 0.01968, "graph": 0.01741}, "4": {"eager": 0.02231, "graph": 0.01474}},
    "from_two_ranks_at_four": {"eager": 0.03057, "graph": 0.01704},
    "guard_min_gain": {"eager": 0.02, "graph": 0.03},
}
"""How far this simulator is from measurements (``benchmarks/results/sim-fidelity.json``, written by
``python -m benchmarks.sim_fidelity``; a test checks the two agree): per world size and mode, the geometric-
mean regret of its own picks on measured times of model families its fit never saw; at 4 ranks when fitted
at 2 alone (what one doubling of the world size costs it); and per mode the guard (fall back to serial below
this predicted gain) that minimises the serial-safe loss of its held-out picks."""
_TILE_M, _TILE_N = 128, 256
"""Output tile assumed when counting GEMM waves off the table (Hopper bf16 cuBLAS kernels)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimConstants:
    """Constants of the simulator (times in microseconds, bandwidths as fractions of ``link_gbps``). The
    defaults are fitted to the measured datasets (``harness.sim_fit``, ``benchmarks.sim_fidelity``; where
    each comes from: docs/simulator.md)."""

    gemm_scale: float = 0.9369
    """Measured GEMM times (the GEMM table) in a sweep over the table's: clocks and input rotation there."""
    gemm_eff: float = 0.764
    """Off the table: fraction of the bf16 peak a large GEMM reaches."""
    gemm_wave_half: float = 0.0373
    """Off the table: waves of 128x256 output tiles over the SMs at which a GEMM reaches half of it."""
    gemm_k_half: float = 256.0
    """Off the table: K at which the main loop reaches half efficiency (``k / (k + k_half)``)."""
    gemm_launch_us: float = 1.701
    """Off the table: device time of an empty GEMM kernel; also of the other small kernels (add, permute)."""
    split_loss: float = 0.145
    """Off the table: extra time of a GEMM split into c row blocks, times (1 - 1/c)."""
    hbm_eff: float = 1.0
    """Fraction of the HBM bandwidth memory-bound kernels (the reduce-scatter's add, the MoE permutation)
    reach."""
    nccl_latency_us: float = 42.88
    """Latency of one NCCL collective in its large-message regime, 2 ranks."""
    nccl_bw_frac: float = 0.4971
    """NCCL's collective bandwidth in its large-message regime, 2 ranks, as a fraction of ``link_gbps``."""
    nccl_small_latency_us: float = 4.682
    """Latency of one NCCL collective in its small-message regime (NCCL's low-latency protocols), 2 ranks."""
    nccl_small_bw_frac: float = 0.1263
    """NCCL's collective bandwidth in its small-message regime, 2 ranks. A collective takes the faster of
    the two regimes, as NCCL picks its protocol by size."""
    nccl_peer_gain: float = 0.2532
    """NCCL's bandwidth to ``peers`` peers at once: the 2-rank one times ``peers ** nccl_peer_gain``."""
    nccl_peer_latency_us: float = 2.354
    """Latency added per peer beyond the first (collectives and point-to-point rounds)."""
    p2p_latency_us: float = 28.21
    """Latency of one round of NCCL point-to-point transfers in the executor's pipeline (``sm``)."""
    p2p_bw_frac: float = 0.2144
    """Bandwidth of those rounds, 2 ranks, as a fraction of ``link_gbps`` (peers: ``nccl_peer_gain``)."""
    ce_latency_us: float = 14.93
    """Latency of one copy-engine round (``dma``)."""
    ce_bw_frac: float = 0.8817
    """Copy-engine bandwidth per direction with both directions busy, as a fraction of ``link_gbps``."""
    ce_peer_loss: float = 0.3583
    """Copy-engine bandwidth to ``peers`` peers at once: the 2-rank one times ``peers ** -ce_peer_loss``."""
    ce_copy_us: float = 7.0
    """Latency of each copy of a round beyond its first: the executor's copies share one stream (label
    version 3), so a round to ``p`` peers issues ``p`` copies back to back."""
    sm_gemm_slowdown: float = 1.42
    """GEMM slowdown while NCCL kernels run beside it."""
    sm_comm_slowdown: float = 0.2642
    """NCCL slowdown while a GEMM holds the SMs."""
    dma_gemm_slowdown: float = 0.04917
    """GEMM slowdown while copy engines move data."""
    dma_comm_slowdown: float = 0.06649
    """Copy-engine slowdown beside a GEMM (HBM traffic)."""
    hp_comm_relief: float = 0.4591
    """Fraction of the transfer slowdown a high-priority communication stream removes."""
    hp_gemm_penalty: float = 0.5642
    """Extra GEMM slowdown, relative, when the communication stream has high priority."""
    chunk_sync_us: float = 0.4943
    """Device cost of each overlapped GEMM unit beyond its kernel (event wait, stream switch)."""
    graph_call_us: float = 1.88
    """Device time a call replayed from a CUDA graph pays beyond its kernels (the replay's launch)."""
    eager_call_us: float = 40.87
    """Device time an eager call pays beyond its kernels (launch gaps between dependent kernels)."""
    eager_overlap: float = 0.06349
    """Share of an eager call's host time that does not overlap its device work: the call takes the longer
    of the two plus this share of the host time (waits the host issues behind the GPU's work)."""
    eager_overlap_dma: float = 0.2799
    """The same for a copy-engine call (``dma``), whose copies wait on the GEMMs that feed them."""
    host_factor: float = 2.168
    """Eager host time of a call over its launch price at these prices: the host's speed (a machine's, as
    ``features.launch_cost``'s host factor)."""
    host_call_us: float = 22.05
    """Host price of an executor call (argument handling and the Python around its launches)."""
    host_gemm_us: float = 16.08
    """Host price of a GEMM launch."""
    host_kernel_us: float = 18.79
    """Host price of another torch kernel (adds, permutations, local copies)."""
    host_collective_us: float = 14.68
    """Host price of an NCCL collective beyond its call."""
    host_p2p_us: float = 65.63
    """Host price of a coalesced NCCL send/receive group."""
    host_copy_us: float = 5.462
    """Host price of a copy-engine copy into a peer's memory, and of a device barrier."""
    host_sync_us: float = 1.643
    """Host price of a CUDA event record or stream wait."""
    host_collective_peer_us: float = 5.994
    """Host price per NCCL collective and per peer beyond the first."""
    host_p2p_op_us: float = 10.73
    """Host price of each send and each receive of a coalesced NCCL group (``batch_isend_irecv`` issues one
    per piece and direction: two per piece)."""
    async_tp_overhead_us: float = 102.8
    """Extra time of PyTorch async-TP (``torch.ops.symm_mem`` fused ops) over a shard/dma pipeline."""

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> SimConstants:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"SimConstants has no field(s) {unknown}; allowed fields are {sorted(names)}")
        return cls(**data)

    def digest(self) -> str:
        """Short content hash (part of the sim fingerprint)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


DEFAULT_CONSTANTS = SimConstants()
UPPER_BOUND = dict.fromkeys(
    (
        "gemm_eff",
        "hbm_eff",
        "nccl_bw_frac",
        "nccl_small_bw_frac",
        "p2p_bw_frac",
        "ce_bw_frac",
        "hp_comm_relief",
    ),
    1.0,
)
"""Constants that are fractions of a hardware rate (or of a slowdown) and cannot exceed 1."""

# Encoding: one row per (scenario, schedule, mode) as parallel arrays -------------------------------------

_GRAN_CODE = {"serial": 0, "shard": 1, "finer": 2}
UNITS = ("whole", "own", "peer")
"""The GEMM units of a row (:func:`unit_shapes`)."""


def _encode(pairs: Sequence[tuple[Scenario, Schedule]], mode: str = "eager") -> dict[str, np.ndarray]:
    """Arrays of shape ``[len(pairs)]`` describing each (scenario, schedule) in ``mode`` for the vectorised
    model (``pairs`` non-empty): its sizes and plan, the GEMM table's times of its units (NaN off the table)
    and what an eager call launches (:func:`_launches`; ``launch`` ``[N, 10]``, and of the baselines)."""
    rows = []
    for s, sch in pairs:
        hw, spec = s.hardware, OP_SPECS[s.op]
        moe = spec.moe
        e = s.experts // s.world_size if moe else 1
        rows.append(
            {
                "comm_first": spec.comm_first,
                "reduces": spec.collective == "reduce_scatter",
                "moe": moe,
                # async-TP: PyTorch fuses all-gather and reduce-scatter, not all-to-all
                "async_tp": spec.collective != "all_to_all",
                "rows": s.m * (s.top_k * s.imbalance if moe else 1.0),  # compute rows on the busiest rank
                "n": s.n,
                "k": s.k,
                "width": s.comm_width,
                "b": s.dtype_bytes,
                "peak": hw.peak_bf16_tflops / (FP32_SLOWDOWN if s.dtype == "fp32" else 1.0),
                "hbm": hw.hbm_gbps,
                "link": hw.link_gbps,
                "sm": hw.sm_count,
                "w": s.world_size,
                "groups": e,
                "vol": s.comm_bytes,
                "gran": _GRAN_CODE[sch.granularity],
                "dma": sch.executor == "dma",
                "splits": sch.splits,
                "chunk": sch.grain == "chunk",
                "hp": sch.priority == "high",
                "graph": mode == "graph",
                "launch": _launches(s.op, s.world_size, sch, e),
                "launch_gemm": _launches(s.op, s.world_size, None, e),
                "launch_nccl": _launches(s.op, s.world_size, Schedule(), e, comm_only=True),
                "launch_dma": _launches(s.op, s.world_size, Schedule(executor="dma"), e, comm_only=True),
            }
        )
    x = {key: np.array([row[key] for row in rows], dtype=np.float64) for key in rows[0]}
    hardware, dtypes = [s.hardware for s, _ in pairs], [s.dtype for s, _ in pairs]
    for unit, (groups, per_group) in unit_shapes(x).items():
        x[f"g_{unit}"], x[f"r_{unit}"] = groups, per_group
        x[f"t_{unit}"], x[f"kernels_{unit}"] = _table_us(x, groups, per_group, hardware, dtypes)
    x["launch"][:, 1], x["launch_gemm"][:, 1] = _gemm_launches(x), x["kernels_whole"]
    return x


def _gemm_launches(x: dict[str, np.ndarray]) -> np.ndarray:
    """GEMM launches of each row's call, ``[N]``: the kernels of its units (:func:`_table_us`: one per
    unit of the dense ops and of grouped expert GEMMs, one per expert otherwise), so the host launches
    what the device runs."""
    _, peer_units, _ = plan_counts(x["w"], x["gran"], x["splits"], x["chunk"] > 0)
    return np.where(x["gran"] == 0, x["kernels_whole"], x["kernels_own"] + peer_units * x["kernels_peer"])


COPY_STREAMS = 1
"""The copy arrangement the simulator prices: the executor's default
(``executor.context.DEFAULT_COPY_STREAMS``: one side stream the peers' copies share; label version 3)."""
HOST_PRICES = ("host_call_us", "host_gemm_us", "host_kernel_us", "host_collective_us", "host_p2p_us",
               "host_copy_us", "host_copy_us", "host_sync_us", "host_collective_peer_us",
               "host_p2p_op_us")  # fmt: skip
"""The price of each entry of :func:`_launches`, by constant (copies and barriers share one)."""


@cache
def _launches(
    op: str, world_size: int, schedule: Schedule | None, local_experts: int, comm_only: bool = False
) -> tuple[float, ...]:
    """What one eager call launches, by kind (``features.launch_cost.launch_counts`` under the shipped copy
    arrangement: calls, GEMMs, other kernels, collectives, send/receive groups, peer copies, barriers,
    syncs), then the collectives times the peers beyond the first and the sends and receives of the
    send/receive groups (two per piece: ``sm`` moves each of its ``peers x splits`` pieces, ``peers`` at
    shard granularity, in them): priced by :data:`HOST_PRICES`. ``schedule`` None: the GEMM alone (a call,
    a GEMM per local expert); ``comm_only``: the schedule's launches without its GEMMs (the collective
    alone)."""
    if schedule is None:
        return (1.0, float(local_experts), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    counts = launch_counts(op, world_size, schedule, local_experts, COPY_STREAMS)
    gemms = 0 if comm_only else counts.gemms
    more = world_size - 2  # peers beyond the first
    pieces = (world_size - 1) * (schedule.splits if schedule.granularity == "finer" else 1)
    p2p_ops = 2 * pieces if counts.p2p_groups else 0
    return (float(counts.calls), float(gemms), float(counts.kernels), float(counts.collectives),
            float(counts.p2p_groups), float(counts.peer_copies), float(counts.barriers), float(counts.syncs),
            float(counts.collectives * more), float(p2p_ops))  # fmt: skip


def host_price_us(c: SimConstants, launches: np.ndarray) -> np.ndarray:
    """Host time of eager calls at a host factor of 1, us ``[N]``, from :func:`_launches` rows ``[N, 10]``."""
    return launches @ np.array([getattr(c, name) for name in HOST_PRICES])


def unit_shapes(x: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The GEMM units of every row of ``x`` (:func:`_encode`): ``whole`` (``serial``), ``own`` (the own
    shard) and ``peer`` (a peer shard, or a finer piece with grain ``chunk``), each as ``(groups, rows per
    group)`` ``[N]`` (``harness.gemm_table.expert_split``: one group for the dense ops)."""
    w, rows = x["w"], x["rows"]
    chunk = (x["chunk"] > 0) & (x["gran"] == 2)
    sizes = {"whole": rows, "own": rows / w, "peer": rows / np.where(chunk, w * x["splits"], w)}
    return {name: expert_split(r, rows, w, x["groups"]) for name, r in sizes.items()}


@cache
def gemm_table(gpu_name: str, sm_count: int) -> GemmTable | None:
    """The GEMM table the simulator reads for a GPU: its own model's, else a shipped table of a GPU with as
    many SMs (the same architecture, its times carried over by the rates: docs/simulator.md), else None
    (the roofline)."""
    own = table_for(gpu_name)
    if own is not None:
        return own
    return next((t for t in shipped_tables() if int(t.profile["sm_count"]) == sm_count), None)


def _table_us(
    x: dict[str, np.ndarray],
    groups: np.ndarray,
    per_group: np.ndarray,
    hardware: Sequence[HardwareProfile],
    dtypes: Sequence[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Device time of one GEMM unit of every row from the GEMM table (NaN off it: fp32, no table), us, and
    its kernels: one grouped GEMM, or a GEMM per group (the executor's loop, ``harness.gemm_table.grouped``).
    """
    kernel = grouped(groups, x["n"], x["k"], x["b"])
    kernels = np.where(kernel, 1.0, groups)
    rows = zip(hardware, dtypes, groups.tolist(), per_group.tolist(), x["n"].tolist(), x["k"].tolist(),
               kernel.tolist(), strict=True)  # fmt: skip
    out = np.array([
        _kernel_us(hw.gpu_name, hw.sm_count, hw.peak_bf16_tflops, hw.hbm_gbps, d != "fp32", g, r, n, k, grp)
        for hw, d, g, r, n, k, grp in rows
    ])  # fmt: skip
    return np.where(kernel, out, groups * out), kernels


@functools.lru_cache(maxsize=1 << 16)
def _kernel_us(
    gpu_name: str, sm: int, peak: float, hbm: float, half: bool, groups: float, rows: float, n: float,
    k: float,
    grouped_kernel: bool,
) -> float:  # fmt: skip
    """One kernel's time from the GEMM table of the GPU (:func:`gemm_table`), us; NaN off the table. Kept
    per shape: a sweep asks the same few shapes again and again."""
    table = gemm_table(gpu_name, sm) if half else None
    if table is None:
        return float("nan")
    rates = {"peak_bf16_tflops": peak, "hbm_gbps": hbm, "sm_count": sm}
    one = np.ones(1)
    shape = [one * groups, one * rows, one * n, one * k]
    return float(table.lookup(*shape, grouped_kernel=one * grouped_kernel > 0, rates=rates)[0])


# Model pieces (all times in microseconds) ---------------------------------------------------------------


def _roofline_us(
    c: SimConstants, x: dict[str, np.ndarray], groups: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Roofline time of ``groups`` GEMMs of ``rows`` rows each (off the table), excluding launches."""
    r = np.maximum(rows, 1.0)
    waves = groups * np.ceil(r / _TILE_M) * np.ceil(x["n"] / _TILE_N) / x["sm"]
    eff = c.gemm_eff * waves / (waves + c.gemm_wave_half) * x["k"] / (x["k"] + c.gemm_k_half)
    t_compute = 2.0 * groups * r * x["n"] * x["k"] / (x["peak"] * 1e6 * eff)
    t_memory = groups * (r * x["k"] + x["k"] * x["n"] + r * x["n"]) * x["b"] / (x["hbm"] * 1e3 * c.hbm_eff)
    return np.maximum(t_compute, t_memory)


def _unit_us(c: SimConstants, x: dict[str, np.ndarray], unit: str, units: np.ndarray) -> np.ndarray:
    """Device time of one GEMM unit (``whole``, ``own`` or ``peer``) of a call that runs ``units`` of them:
    the GEMM table's time times ``gemm_scale``; off the table, the roofline plus the decomposition loss
    ``split_loss * (1 - 1/units)`` plus a launch per kernel."""
    groups, per_group, kernels = x[f"g_{unit}"], x[f"r_{unit}"], x[f"kernels_{unit}"]
    roofline = _roofline_us(c, x, groups, per_group) * (1.0 + c.split_loss * (1.0 - 1.0 / units))
    measured = x[f"t_{unit}"]
    return np.where(np.isfinite(measured), measured * c.gemm_scale, roofline + kernels * c.gemm_launch_us)


def _bandwidth(c: SimConstants, x: dict[str, np.ndarray], frac: np.ndarray, exponent: np.ndarray,
               peers: np.ndarray) -> np.ndarray:  # fmt: skip
    """Bytes per us one rank receives at ``frac`` of the link when a transfer reaches ``peers`` peers at once:
    the 2-rank rate times ``peers ** exponent``."""
    return frac * x["link"] * 1e3 * peers**exponent


def _collective_us(c: SimConstants, x: dict[str, np.ndarray]) -> np.ndarray:
    """One NCCL collective (all-gather / reduce-scatter / all-to-all) of the scenario's volume with every
    peer reached: the faster of NCCL's small- and large-message regimes (a smooth minimum), each a latency
    plus the volume at its bandwidth; more peers add latency and bandwidth (``nccl_peer_*``)."""
    peers = x["w"] - 1.0
    extra = c.nccl_peer_latency_us * (peers - 1.0)
    large = c.nccl_latency_us + extra + x["vol"] / _bandwidth(c, x, c.nccl_bw_frac, c.nccl_peer_gain, peers)
    small = (
        c.nccl_small_latency_us
        + extra
        + x["vol"] / _bandwidth(c, x, c.nccl_small_bw_frac, c.nccl_peer_gain, peers)
    )
    return (large**-8.0 + small**-8.0) ** (-1.0 / 8.0)


def _round_us(
    c: SimConstants, x: dict[str, np.ndarray], dma: np.ndarray, rounds: np.ndarray, peers: np.ndarray
) -> np.ndarray:
    """One of ``rounds`` equal transfer rounds of the executor's pipeline, each reaching ``peers`` peers at
    once: point-to-point NCCL (``sm``) or copy engines (``dma``), a latency plus the round's bytes at the
    transport's bandwidth."""
    extra = c.nccl_peer_latency_us * (peers - 1.0)
    latency = np.where(dma, c.ce_latency_us + c.ce_copy_us * (peers - 1.0), c.p2p_latency_us + extra)
    frac = np.where(dma, c.ce_bw_frac, c.p2p_bw_frac)
    exponent = np.where(dma, -c.ce_peer_loss, c.nccl_peer_gain)
    return latency + x["vol"] / rounds / _bandwidth(c, x, frac, exponent, peers)


def _memory_us(c: SimConstants, x: dict[str, np.ndarray], bytes_: np.ndarray) -> np.ndarray:
    """A memory-bound kernel moving ``bytes_`` through HBM: a launch plus the bytes at ``hbm_eff`` of it."""
    return c.gemm_launch_us + bytes_ / (x["hbm"] * 1e3 * c.hbm_eff)


def _add_us(c: SimConstants, x: dict[str, np.ndarray]) -> np.ndarray:
    """The owner's add closing a pipelined reduce-scatter: read w row blocks, write one (``[m/w, n]``)."""
    return _memory_us(c, x, (x["w"] + 1.0) * x["rows"] / x["w"] * x["n"] * x["b"])


def _permute_us(c: SimConstants, x: dict[str, np.ndarray]) -> np.ndarray:
    """A serial MoE call's permutation between source- and expert-major rows (read and write every row of
    the communicated width); 0 for the dense ops."""
    return np.where(x["moe"] > 0, _memory_us(c, x, 2.0 * x["rows"] * x["width"] * x["b"]), 0.0)


def _slowed_finish(
    start: np.ndarray, work: np.ndarray, until: np.ndarray, slowdown: np.ndarray
) -> np.ndarray:
    """Finish time of ``work`` us of GEMM started at ``start`` that runs ``1 + slowdown`` times slower
    before ``until`` (while a transfer is in flight) and at full speed after."""
    slow = 1.0 + slowdown
    done_before = np.maximum(until - start, 0.0) / slow
    return np.where(done_before >= work, start + work * slow, np.maximum(start, until) + work - done_before)


def _call_us(
    c: SimConstants,
    x: dict[str, np.ndarray],
    gpu: np.ndarray,
    launches: np.ndarray,
    dma: np.ndarray | None = None,
) -> np.ndarray:
    """A call's time from its device timeline ``gpu``: replayed from a CUDA graph, plus ``graph_call_us``;
    eager, plus ``eager_call_us``, never less than the host time to issue its ``launches``
    (:func:`host_price_us` times ``host_factor``: small calls are host-bound), plus ``eager_overlap`` of that
    host time (``eager_overlap_dma`` for copy-engine calls: ``dma``, default the rows' executors)."""
    graph = x["graph"] > 0
    host = c.host_factor * host_price_us(c, launches)
    overlap = np.where(x["dma"] > 0 if dma is None else dma, c.eager_overlap_dma, c.eager_overlap)
    eager = np.maximum(gpu + c.eager_call_us, host) + overlap * host
    return np.where(graph, gpu + c.graph_call_us, eager)


def plan_counts(
    w: np.ndarray, gran: np.ndarray, splits: np.ndarray, chunk: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Transfer rounds, peer GEMM units and the peers each round reaches of the executor's plan
    (``executor.plan.make_plan``), shape ``[N]`` each, for world sizes ``w``, granularity codes ``gran``
    (0 serial, 1 shard, 2 finer), ``splits`` and ``chunk`` (grain chunk); docs/simulator.md, "Pipelines"."""
    rounds = np.where(gran == 0, 1, np.where(gran == 2, splits, w - 1))
    peer_units = np.where(gran == 0, 0, np.where(chunk & (gran == 2), (w - 1) * splits, w - 1))
    round_peers = np.where(gran == 1, 1, w - 1)
    return rounds, peer_units, round_peers


def _schedule_us(c: SimConstants, x: dict[str, np.ndarray], pushed_at_end: bool = True) -> np.ndarray:
    """Simulated time of every row's schedule, us: shape ``[N]``. Mirrors ``executor.plan.make_plan``
    (docs/simulator.md, "Pipelines"), then :func:`_call_us` (mode, host time). ``pushed_at_end``: a
    copy-engine scatter issues its copies after its GEMMs, as the executor does (:func:`_copies_issued_us`;
    False for PyTorch's async-TP, which issues its own)."""
    w, splits, hp = x["w"], x["splits"], x["hp"]
    dma = x["dma"].astype(bool)
    gather = x["comm_first"] > 0
    add = np.where(x["reduces"] > 0, _add_us(c, x), 0.0)
    one = np.ones_like(w)
    whole = _unit_us(c, x, "whole", one) + _permute_us(c, x)
    serial_dma = _round_us(c, x, dma, one, w - 1.0) + whole + add
    serial = np.where(dma, serial_dma, _collective_us(c, x) + whole)

    chunk = x["chunk"] > 0
    finer = x["gran"] == 2
    rounds, peer_units, round_peers = plan_counts(w, x["gran"], splits, chunk)
    units = 1.0 + peer_units
    relief = 1.0 - hp * min(c.hp_comm_relief, 1.0)
    comm_slow = np.where(dma, c.dma_comm_slowdown, c.sm_comm_slowdown) * relief
    gemm_slow = np.where(dma, c.dma_gemm_slowdown, c.sm_gemm_slowdown) * (1.0 + hp * c.hp_gemm_penalty)
    round_time = _round_us(c, x, dma, rounds, round_peers) * (1.0 + comm_slow)
    own = _unit_us(c, x, "own", units)
    peer = _unit_us(c, x, "peer", units) + c.chunk_sync_us
    # A scatter unit's pieces: 1 (shard granularity, finer chunk) or all of its shard's (finer shard).
    send = _unit_send_us(c, x, dma, peer_units, np.where(finer & ~chunk, splits, 1.0)) * (1.0 + comm_slow)
    issued = _copies_issued_us(c, x, dma & ~gather & pushed_at_end, peer_units)
    gpu = np.zeros_like(w)
    for on, pipeline in ((gather, _gather_us), (~gather, _scatter_us)):  # each on its own rows
        i = np.flatnonzero(on & (x["gran"] > 0))
        if len(i):
            args = (own, peer, peer_units, round_time, rounds, finer, chunk, w, gemm_slow, send, issued)
            gpu[i] = pipeline(*(a[i] for a in args))
    gpu += np.where(~gather & dma, c.ce_latency_us, 0.0)
    return _call_us(c, x, np.where(x["gran"] == 0, serial, gpu + add), x["launch"])


def _gather_us(
    own: np.ndarray,
    peer: np.ndarray,
    peer_units: np.ndarray,
    round_time: np.ndarray,
    rounds: np.ndarray,
    finer: np.ndarray,
    chunk: np.ndarray,
    w: np.ndarray,
    gemm_slow: np.ndarray,
    send: np.ndarray,
    issued: np.ndarray,
) -> np.ndarray:
    """All-gather -> GEMM pipeline: every round is issued at once and lands back to back; the own shard's
    GEMM runs first, then each peer unit once its round(s) landed. All arguments are ``[N]`` arrays
    (``send``, ``issued``: unused, a scatter's)."""
    comm_end = rounds * round_time
    t = _slowed_finish(np.zeros_like(own), own, comm_end, gemm_slow)
    i = np.arange(len(own))
    for u in range(1, int(peer_units.max(initial=0)) + 1):
        i = i[peer_units[i] >= u]  # the rows with a u-th peer unit
        # Last round unit u needs: u (shard granularity), ceil(u / peers) (finer chunk), all (finer shard).
        needed = np.where(finer[i], np.where(chunk[i], np.ceil(u / (w[i] - 1)), rounds[i]), u)
        start = np.maximum(t[i], needed * round_time[i])
        t[i] = _slowed_finish(start, peer[i], comm_end[i], gemm_slow[i])
    return t


def _copies_issued_us(
    c: SimConstants, x: dict[str, np.ndarray], scatter_dma: np.ndarray, peer_units: np.ndarray
) -> np.ndarray:
    """When an eager copy-engine scatter's copies are issued, us from the call's start, ``[N]``: the
    executor pushes them once the call's GEMMs are launched (``executor.transport``, ``_push_produced``),
    so the host first pays the call, its GEMM launches and an event per sending unit (times
    ``host_factor``); 0 for other rows and for graph replays (every copy queued up front)."""
    host = c.host_call_us + x["launch"][:, 1] * c.host_gemm_us + peer_units * c.host_sync_us
    return np.where(scatter_dma & (x["graph"] == 0), c.host_factor * host, 0.0)


def _unit_send_us(
    c: SimConstants, x: dict[str, np.ndarray], dma: np.ndarray, peer_units: np.ndarray, pieces: np.ndarray
) -> np.ndarray:
    """Sending one scatter unit's output (``vol / peer_units`` bytes, in ``pieces`` pieces) to its one
    peer: NCCL, one send/receive group (a point-to-point latency); copy engines, ``ce_copy_us`` per copy
    (the call's closing barrier, ``ce_latency_us``, is paid once); then the bytes at the transport's
    one-peer bandwidth."""
    one = np.ones_like(x["w"])
    frac = np.where(dma, c.ce_bw_frac, c.p2p_bw_frac)
    latency = np.where(dma, c.ce_copy_us * pieces, c.p2p_latency_us)
    return latency + x["vol"] / np.maximum(peer_units, 1.0) / _bandwidth(c, x, frac, 0.0, one)


def _scatter_us(
    own: np.ndarray,
    peer: np.ndarray,
    peer_units: np.ndarray,
    round_time: np.ndarray,
    rounds: np.ndarray,
    finer: np.ndarray,
    chunk: np.ndarray,
    w: np.ndarray,
    gemm_slow: np.ndarray,
    send: np.ndarray,
    issued: np.ndarray,
) -> np.ndarray:
    """GEMM -> reduce-scatter pipeline: the peer units run first, each sending its output (``send`` us, one
    at a time) as soon as it ends and the sends are issued (``issued``, :func:`_copies_issued_us`); the own
    shard's GEMM runs last. The GEMM slowdown window is the transfer span of a first pass without
    contention. All arguments are ``[N]`` arrays (the rounds' are a gather's, unused)."""

    def run(window_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.zeros_like(own)
        sent = issued.copy()
        i = np.arange(len(own))
        for u in range(1, int(peer_units.max(initial=0)) + 1):
            i = i[peer_units[i] >= u]  # the rows with a u-th peer unit
            t[i] = peer[i] if u == 1 else _slowed_finish(t[i], peer[i], window_end[i], gemm_slow[i])
            sent[i] = np.maximum(sent[i], t[i]) + send[i]
        return _slowed_finish(t, own, window_end, gemm_slow), sent

    _, first_pass_end = run(np.zeros_like(own))
    gemm_end, comm_end = run(first_pass_end)
    return np.maximum(gemm_end, comm_end)


def _baselines_us(
    c: SimConstants, x: dict[str, np.ndarray], keys: Sequence[str] = BASELINE_KEYS
) -> dict[str, np.ndarray]:
    """The baselines ``keys`` (of ``features.dataset.BASELINE_KEYS``) of each row's scenario, us."""
    ones = np.ones_like(x["w"])
    out = {}
    if "gemm_alone_ms" in keys:
        out["gemm_alone_ms"] = _call_us(c, x, _unit_us(c, x, "whole", ones), x["launch_gemm"])
    if "nccl_comm_ms" in keys:
        out["nccl_comm_ms"] = _call_us(c, x, _collective_us(c, x), x["launch_nccl"])
    if "dma_comm_ms" in keys:
        add = np.where(x["reduces"] > 0, _add_us(c, x), 0.0)
        copy = _round_us(c, x, ones.astype(bool), ones, x["w"] - 1.0) + add
        out["dma_comm_ms"] = _call_us(c, x, copy, x["launch_dma"], dma=ones > 0)
    if "async_tp_ms" in keys:
        # PyTorch async-TP pulls shards through symmetric memory with copy engines: a shard/dma pipeline.
        shard_dma = {**x, "gran": ones, "dma": ones, "splits": ones, "chunk": 0 * ones, "hp": 0 * ones}
        fused = _schedule_us(c, shard_dma, pushed_at_end=False) + c.async_tp_overhead_us
        out["async_tp_ms"] = np.where(x["async_tp"] > 0, fused, np.nan)
    return out


# The backend -------------------------------------------------------------------------------------------


class SimBackend:
    """``Backend`` answering from the model; every row it yields is ``backend="sim"``. ``noise`` in [0, 1]:
    each round's time times ``exp(noise * z)``, z standard normal, reproducible per seed, scenario,
    schedule, mode and earlier measurements of the scenario (docs/simulator.md)."""

    name = "sim"
    rank = 0

    def __init__(
        self,
        hardware: HardwareProfile,
        seed: int = 0,
        noise: float = 0.0,
        constants: SimConstants = DEFAULT_CONSTANTS,
        modes: tuple[str, ...] = MODES,
        rounds: int = ROUNDS,
    ) -> None:
        if not (isinstance(noise, int | float) and 0.0 <= noise <= 1.0):
            raise ValueError(f"SimBackend.noise must be a number in [0, 1]; got {noise!r}")
        if not modes or any(m not in MODES for m in modes):
            raise ValueError(f"SimBackend.modes must be a non-empty subset of {list(MODES)}; got {modes!r}")
        self.modes = tuple(m for m in MODES if m in modes)
        self.rounds = rounds
        self.hardware = hardware
        self.world_size = hardware.gpu_count
        self.seed = seed
        self.noise = float(noise)
        self.constants = constants
        self._draws: dict[str, int] = {}

    def schedule_ms(
        self, scenario: Scenario, schedules: Sequence[Schedule], mode: str = "eager"
    ) -> np.ndarray:
        """Noise-free simulated time of each schedule in ``mode``, ms: shape ``[len(schedules)]``."""
        return _schedule_us(self.constants, _encode([(scenario, s) for s in schedules], mode)) / 1e3

    def serial_ms(self, scenarios: Sequence[Scenario], mode: str = "eager") -> np.ndarray:
        """Noise-free simulated ``serial/sm`` time of each scenario in ``mode``, ms ``[len(scenarios)]``
        (one vectorised call: what a plan's time cap asks of many scenarios)."""
        return _schedule_us(self.constants, _encode([(s, Schedule()) for s in scenarios], mode)) / 1e3

    def measure(self, scenario: Scenario, schedules: list[Schedule]) -> ScenarioResult:
        """Simulate every schedule in every mode (``graph``: no host time, the calls are replayed); one that
        cannot run ``scenario`` is recorded as failed. With ``noise``, each of the ``rounds`` rounds draws its
        own log-normal factor."""
        runnable, errors = [], {}
        for i, schedule in enumerate(schedules):
            try:
                schedule.check(scenario)
                runnable.append(i)
            except ValueError as err:
                errors[i] = str(err)
        draw = self._draws[scenario.key()] = self._draws.get(scenario.key(), -1) + 1
        out, baselines = [], {}
        for mode in self.modes:
            ms = self.schedule_ms(scenario, [schedules[i] for i in runnable], mode) if runnable else []
            times = dict(zip(runnable, ms, strict=True))
            for i, schedule in enumerate(schedules):
                if i in errors:
                    out.append(Measurement(schedule=str(schedule), mode=mode, ok=False, error=errors[i]))
                    continue
                rounds = np.full(self.rounds, float(times[i]))
                if self.noise:
                    key = zlib.crc32(f"{scenario.key()}|{schedule}|{mode}".encode())
                    rounds *= np.exp(
                        self.noise
                        * np.random.default_rng([self.seed, key, draw]).standard_normal(self.rounds)
                    )
                out.append(Measurement.from_rounds(str(schedule), mode, rounds))
            base = _baselines_us(self.constants, _encode([(scenario, Schedule())], mode))
            baselines[mode] = {key: float(v[0]) / 1e3 for key, v in base.items()}
        return ScenarioResult(measurements=out, baselines=baselines)

    def agree(self, flag: bool) -> bool:
        """One process: ``flag`` itself."""
        return flag

    def warm_up(self, scenario: Scenario, schedules: list[Schedule]) -> None:
        """Nothing is lazy in the simulator."""

    def protocol(self) -> dict:
        """Modes and rounds (each round one noise draw)."""
        return {"modes": list(self.modes), "rounds": self.rounds}

    def fingerprint(self) -> dict:
        table = gemm_table(self.hardware.gpu_name, self.hardware.sm_count)
        return {
            "backend": "sim",
            "sim_model": SIM_MODEL_VERSION,
            "sim_constants": self.constants.digest(),
            "gemm_table": table_source(table, self.hardware),
            "hardware_id": self.hardware.id,
            "world_size": self.world_size,
            "seed": self.seed,
            "noise": self.noise,
        }


def sim_fidelity(world_size: int, sim_model: str = SIM_MODEL_VERSION) -> dict[str, Any]:
    """The fidelity a model trained on this simulator's rows at ``world_size`` carries (its card's
    ``sim_fidelity``, the schema ``service.schemas.SimFidelity``): ``sim_model``, ``held_out_regret`` (world
    size -> mode -> regret, :data:`MEASURED_FIDELITY`), ``measured_world_sizes``, ``world_size_note``
    (measured or extrapolated) and ``guard_min_gain`` (mode -> guard). Rows of another simulator version
    (``sim_model``) have no measured fidelity."""
    regret = MEASURED_FIDELITY["held_out_regret"] if sim_model == SIM_MODEL_VERSION else {}
    measured = sorted(int(k) for k in regret)
    if not measured:
        note = f"rows of simulator {sim_model}, never scored on measurements"
    elif world_size in measured:
        note = f"{world_size} ranks: fitted and scored at this world size"
    else:
        doubling = MEASURED_FIDELITY["from_two_ranks_at_four"]
        at_four = " / ".join(f"{100 * v:.1f}% {m}" for m, v in sorted(doubling.items()))
        note = (
            f"{world_size} ranks: extrapolated from the fit at {measured} ranks (fitted at 2 ranks alone, "
            f"its regret at 4 was {at_four})"
        )
    return {
        "sim_model": sim_model,
        "held_out_regret": regret,
        "measured_world_sizes": measured,
        "world_size_note": note,
        "guard_min_gain": dict(MEASURED_FIDELITY["guard_min_gain"]),
    }


def table_source(table: GemmTable | None, hardware: HardwareProfile) -> str:
    """Where a hardware's simulated GEMM times come from, one line: the table of its GPU (and when it was
    measured), another GPU's carried over by the datasheet rates, or the roofline."""
    if table is None:
        return "roofline (no GEMM table of this GPU)"
    when = str(table.source.get("created", "?"))[:10]
    if table is table_for(hardware.gpu_name):
        return f"{table.model} table ({when})"
    return f"{table.model} table ({when}) carried to {hardware.gpu_name} by the datasheet rates"
