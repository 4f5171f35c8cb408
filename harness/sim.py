"""The simulated backend: an analytic model of GEMM, transfer, contention and launch times.

``SimBackend`` answers ``Backend.measure`` from the model (rows say ``backend="sim"``), scaled by the hardware
profile; :class:`SimConstants` holds its constants, :func:`calibrate` refits them to a measured dataset and
:func:`agreement` scores the simulator's picks against measured labels. See docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ficco.features import MODES, OP_SPECS, HardwareProfile, Scenario, Schedule
from ficco.features.vector import FP32_SLOWDOWN
from ficco.harness.backend import ROUNDS, Measurement, ScenarioResult

if TYPE_CHECKING:
    import pandas as pd

SIM_MODEL_VERSION = "sim4"
"""Changes whenever a formula of the model changes (part of the sim fingerprint)."""

_TILE_M, _TILE_N = 128, 256
"""Output tile assumed when counting GEMM waves (Hopper bf16 cuBLAS kernels)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimConstants:
    """Calibration constants of the simulator (times in microseconds). Where each default comes from:
    docs/simulator.md; refit them with ``calibrate`` (``ficco bench --backend sim --calibrate-from DIR``)."""

    gemm_eff: float = 0.764
    """Fraction of the bf16 peak a large GEMM reaches."""
    gemm_wave_half: float = 0.0373
    """Waves of 128x256 output tiles over the SMs at which a GEMM reaches half that efficiency."""
    gemm_k_half: float = 256.0
    """K at which the main loop reaches half efficiency (``k / (k + k_half)``)."""
    gemm_launch_us: float = 10.8
    """Fixed GPU cost of one GEMM (or add) kernel."""
    hbm_eff: float = 1.0
    """Fraction of the HBM bandwidth memory-bound kernels reach."""
    split_loss: float = 0.145
    """Extra time of a GEMM split into c row blocks, times (1 - 1/c), on top of the blocks' rooflines."""
    nccl_latency_us: float = 53.3
    """Latency of one NCCL collective, at any world size."""
    nccl_bw_frac: float = 0.513
    """NCCL all-gather / reduce-scatter bandwidth as a fraction of ``link_gbps``."""
    p2p_latency_us: float = 46.2
    """GPU-side latency of one round of NCCL point-to-point transfers in the executor's pipeline."""
    ce_latency_us: float = 32.7
    """GPU-side latency of one copy-engine round with both directions busy."""
    ce_bw_frac: float = 0.877
    """Copy-engine bandwidth per direction, both directions busy, as a fraction of ``link_gbps``."""
    nccl_peer_gain: float = 0.181
    """NCCL bandwidth to ``peers`` peers at once: the 2-rank bandwidth times ``peers ** nccl_peer_gain``."""
    ce_peer_loss: float = 0.569
    """Copy-engine bandwidth to ``peers`` peers at once: the 2-rank one times ``peers ** -ce_peer_loss``."""
    sm_gemm_slowdown: float = 1.02
    """GEMM slowdown while NCCL kernels run beside it."""
    sm_comm_slowdown: float = 0.182
    """NCCL slowdown while a GEMM holds the SMs."""
    dma_gemm_slowdown: float = 0.0233
    """GEMM slowdown while copy engines move data."""
    dma_comm_slowdown: float = 0.151
    """Copy-engine slowdown beside a GEMM (HBM traffic)."""
    hp_comm_relief: float = 0.475
    """Fraction of the transfer slowdown a high-priority communication stream removes."""
    hp_gemm_penalty: float = 0.313
    """Extra GEMM slowdown, relative, when the communication stream has high priority."""
    host_p2p_call_us: float = 167.0
    """CPU time to issue a pipelined NCCL executor call, fixed part."""
    host_p2p_round_us: float = 66.4
    """CPU time per point-to-point round."""
    host_ce_call_us: float = 108.0
    """CPU time to issue a copy-engine executor call, fixed part."""
    host_ce_round_us: float = 41.9
    """CPU time per copy round (copies, barrier and wait of one round)."""
    host_unit_us: float = 37.1
    """CPU time per GEMM unit of a pipelined call."""
    chunk_sync_us: float = 1.97
    """GPU cost of each overlapped GEMM chunk beyond its launch (event wait, stream switch)."""
    async_tp_overhead_us: float = 208.0
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
_UPPER_BOUND = dict.fromkeys(("gemm_eff", "hbm_eff", "nccl_bw_frac", "ce_bw_frac", "hp_comm_relief"), 1.0)
"""Constants that are fractions of a hardware rate (or of a slowdown) and cannot exceed 1."""

# Encoding: one row per (scenario, schedule) as parallel arrays ----------------------------------------

_GRAN_CODE = {"serial": 0, "shard": 1, "finer": 2}


def _encode(pairs: Sequence[tuple[Scenario, Schedule]]) -> dict[str, np.ndarray]:
    """Arrays of shape ``[len(pairs)]`` describing each (scenario, schedule) for the vectorised model
    (``pairs`` non-empty)."""
    rows = []
    for s, sch in pairs:
        hw, spec = s.hardware, OP_SPECS[s.op]
        moe = spec.moe
        rows.append(
            {
                "comm_first": spec.comm_first,
                "reduces": spec.collective == "reduce_scatter",
                # async-TP: PyTorch fuses all-gather and reduce-scatter, not all-to-all
                "async_tp": spec.collective != "all_to_all",
                "rows": s.m * (s.top_k * s.imbalance if moe else 1.0),  # compute rows on the busiest rank
                "n": s.n,
                "k": s.k,
                "b": s.dtype_bytes,
                "peak": hw.peak_bf16_tflops / (FP32_SLOWDOWN if s.dtype == "fp32" else 1.0),
                "hbm": hw.hbm_gbps,
                "link": hw.link_gbps,
                "sm": hw.sm_count,
                "w": s.world_size,
                "groups": s.experts // s.world_size if moe else 1,
                "vol": s.comm_bytes,
                "gran": _GRAN_CODE[sch.granularity],
                "dma": sch.executor == "dma",
                "splits": sch.splits,
                "chunk": sch.grain == "chunk",
                "hp": sch.priority == "high",
            }
        )
    return {key: np.array([row[key] for row in rows], dtype=np.float64) for key in rows[0]}


# Model pieces (all times in microseconds) ---------------------------------------------------------------


def _gemm_us(c: SimConstants, x: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Roofline time of ``rows`` rows of the scenario's GEMM, excluding the launch (grouped over the local
    experts for MoE: each group gets ``rows / groups`` rows and reads its own weights)."""
    g = x["groups"]
    r = np.maximum(rows / g, 1.0)
    waves = np.ceil(r / _TILE_M) * np.ceil(x["n"] / _TILE_N) / x["sm"]
    eff = c.gemm_eff * waves / (waves + c.gemm_wave_half) * x["k"] / (x["k"] + c.gemm_k_half)
    t_compute = 2.0 * r * x["n"] * x["k"] / (x["peak"] * 1e6 * eff)
    t_memory = (r * x["k"] + x["k"] * x["n"] + r * x["n"]) * x["b"] / (x["hbm"] * 1e3 * c.hbm_eff)
    return g * np.maximum(t_compute, t_memory)


def _unit_us(c: SimConstants, x: dict[str, np.ndarray], rows: np.ndarray, units: np.ndarray) -> np.ndarray:
    """One GEMM kernel of ``rows`` rows when the scenario's GEMM is split into ``units`` kernels: roofline
    plus the decomposition loss ``split_loss * (1 - 1/units)``, plus the launch."""
    return _gemm_us(c, x, rows) * (1.0 + c.split_loss * (1.0 - 1.0 / units)) + c.gemm_launch_us


def _bandwidth(c: SimConstants, x: dict[str, np.ndarray], dma: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """Bytes per us one rank receives through NCCL (``dma`` false) or the copy engines (``dma`` true) when a
    transfer reaches ``peers`` peers at once (``nccl_peer_gain``, ``ce_peer_loss``)."""
    frac = np.where(dma, c.ce_bw_frac, c.nccl_bw_frac)
    exponent = np.where(dma, -c.ce_peer_loss, c.nccl_peer_gain)
    return frac * x["link"] * 1e3 * peers**exponent


def _collective_us(c: SimConstants, x: dict[str, np.ndarray]) -> np.ndarray:
    """One NCCL collective (all-gather / reduce-scatter / all-to-all) of the scenario's volume: a latency
    plus the volume at NCCL's bandwidth with every peer reached."""
    nccl = np.zeros_like(x["w"], dtype=bool)
    return c.nccl_latency_us + x["vol"] / _bandwidth(c, x, nccl, x["w"] - 1.0)


def _round_us(
    c: SimConstants, x: dict[str, np.ndarray], dma: np.ndarray, rounds: np.ndarray, peers: np.ndarray
) -> np.ndarray:
    """One of ``rounds`` equal transfer rounds of the executor's pipeline, each reaching ``peers`` peers at
    once: point-to-point NCCL (``sm``) or copy engines (``dma``), a latency plus the round's bytes at the
    transport's bandwidth."""
    latency = np.where(dma, c.ce_latency_us, c.p2p_latency_us)
    return latency + x["vol"] / rounds / _bandwidth(c, x, dma, peers)


def _add_us(c: SimConstants, x: dict[str, np.ndarray]) -> np.ndarray:
    """The owner's add closing a pipelined reduce-scatter: read w row blocks, write one (``[m/w, n]``)."""
    block = x["rows"] / x["w"] * x["n"] * x["b"]
    return c.gemm_launch_us + (x["w"] + 1.0) * block / (x["hbm"] * 1e3 * c.hbm_eff)


def _slowed_finish(
    start: np.ndarray, work: np.ndarray, until: np.ndarray, slowdown: np.ndarray
) -> np.ndarray:
    """Finish time of ``work`` us of GEMM started at ``start`` that runs ``1 + slowdown`` times slower
    before ``until`` (while a transfer is in flight) and at full speed after."""
    slow = 1.0 + slowdown
    done_before = np.maximum(until - start, 0.0) / slow
    return np.where(done_before >= work, start + work * slow, np.maximum(start, until) + work - done_before)


def _host_us(c: SimConstants, dma: np.ndarray, rounds: np.ndarray, units: np.ndarray) -> np.ndarray:
    """CPU time to issue one pipelined executor call: a fixed part, a part per transfer round and a part
    per GEMM unit. Timed back to back, a call takes at least this long (the GPU idles otherwise)."""
    fixed = np.where(dma, c.host_ce_call_us, c.host_p2p_call_us)
    per_round = np.where(dma, c.host_ce_round_us, c.host_p2p_round_us)
    return fixed + per_round * rounds + c.host_unit_us * units


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


def _schedule_us(c: SimConstants, x: dict[str, np.ndarray]) -> np.ndarray:
    """Simulated time of every row's schedule, us: shape ``[N]``. Mirrors ``executor.plan.make_plan``
    (docs/simulator.md, "Pipelines"); a pipelined call takes the longer of its GPU timeline and the CPU time
    to issue it (``_host_us``)."""
    w, splits, hp = x["w"], x["splits"], x["hp"]
    dma = x["dma"].astype(bool)
    gather = x["comm_first"] > 0
    add = np.where(x["reduces"] > 0, _add_us(c, x), 0.0)
    one = np.ones_like(w)
    whole = _unit_us(c, x, x["rows"], one)
    serial_dma = np.maximum(_round_us(c, x, dma, one, w - 1.0) + whole + add, _host_us(c, dma, one, one))
    serial = np.where(dma, serial_dma, _collective_us(c, x) + whole)

    chunk = x["chunk"] > 0
    finer = x["gran"] == 2
    rounds, peer_units, round_peers = plan_counts(w, x["gran"], splits, chunk)
    units = 1.0 + peer_units
    relief = 1.0 - hp * min(c.hp_comm_relief, 1.0)
    comm_slow = np.where(dma, c.dma_comm_slowdown, c.sm_comm_slowdown) * relief
    gemm_slow = np.where(dma, c.dma_gemm_slowdown, c.sm_gemm_slowdown) * (1.0 + hp * c.hp_gemm_penalty)
    round_time = _round_us(c, x, dma, rounds, round_peers) * (1.0 + comm_slow)
    own = _unit_us(c, x, x["rows"] / w, units)
    peer = _unit_us(c, x, x["rows"] / np.where(chunk, w * splits, w), units) + c.chunk_sync_us
    # Rounds a peer unit's pieces take: 1 (shard granularity, finer chunk) or all of them (finer shard).
    rounds_per_unit = np.where(finer & ~chunk, splits, 1.0)
    gpu = np.where(
        gather,
        _gather_us(own, peer, peer_units, round_time, rounds, finer, chunk, w, gemm_slow),
        _scatter_us(own, peer, peer_units, round_time, rounds_per_unit, gemm_slow),
    )
    pipelined = np.maximum(gpu + add, _host_us(c, dma, rounds, units))
    return np.where(x["gran"] == 0, serial, pipelined)


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
) -> np.ndarray:
    """All-gather -> GEMM pipeline: every round is issued at once and lands back to back; the own shard's
    GEMM runs first, then each peer unit once its round(s) landed. All arguments are ``[N]`` arrays."""
    comm_end = rounds * round_time
    t = _slowed_finish(np.zeros_like(own), own, comm_end, gemm_slow)
    for u in range(1, int(peer_units.max()) + 1):
        # Last round unit u needs: u (shard granularity), ceil(u / peers) (finer chunk), all (finer shard).
        needed = np.where(finer, np.where(chunk, np.ceil(u / (w - 1)), rounds), u)
        start = np.maximum(t, needed * round_time)
        t = np.where(u <= peer_units, _slowed_finish(start, peer, comm_end, gemm_slow), t)
    return t


def _scatter_us(
    own: np.ndarray,
    peer: np.ndarray,
    peer_units: np.ndarray,
    round_time: np.ndarray,
    rounds_per_unit: np.ndarray,
    gemm_slow: np.ndarray,
) -> np.ndarray:
    """GEMM -> reduce-scatter pipeline: the peer units run first, each sending its pieces as soon as it
    ends; the own shard's GEMM runs last. The GEMM slowdown window is the transfer span of a first pass
    without contention."""

    def run(window_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.zeros_like(own)
        sent = np.zeros_like(own)
        for u in range(1, int(peer_units.max()) + 1):
            active = u <= peer_units
            end = peer if u == 1 else _slowed_finish(t, peer, window_end, gemm_slow)
            t = np.where(active, end, t)
            sent = np.where(active, np.maximum(sent, t) + rounds_per_unit * round_time, sent)
        return _slowed_finish(t, own, window_end, gemm_slow), sent

    _, first_pass_end = run(np.zeros_like(own))
    gemm_end, comm_end = run(first_pass_end)
    return np.maximum(gemm_end, comm_end)


def _baselines_us(c: SimConstants, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The four baselines of ``features.dataset.BASELINE_KEYS`` for each row's scenario, us."""
    ones = np.ones_like(x["w"])
    copy_engines = ones.astype(bool)
    copy = _round_us(c, x, copy_engines, ones, x["w"] - 1.0) + np.where(x["reduces"] > 0, _add_us(c, x), 0.0)
    dma = np.maximum(copy, _host_us(c, copy_engines, ones, 0 * ones))
    # PyTorch async-TP pulls shards through symmetric memory with copy engines: a shard/dma pipeline.
    shard_dma = {**x, "gran": ones, "dma": ones, "splits": ones, "chunk": 0 * ones, "hp": 0 * ones}
    async_tp = np.where(x["async_tp"] > 0, _schedule_us(c, shard_dma) + c.async_tp_overhead_us, np.nan)
    return {
        "gemm_alone_ms": _unit_us(c, x, x["rows"], ones),
        "nccl_comm_ms": _collective_us(c, x),
        "dma_comm_ms": dma,
        "async_tp_ms": async_tp,
    }


# The backend -------------------------------------------------------------------------------------------


class SimBackend:
    """``Backend`` answering from the analytic model; every row it yields is ``backend="sim"``. ``noise``
    in [0, 1]: each round's time times ``exp(noise * z)``, z standard normal, reproducible per seed,
    scenario, schedule, mode and earlier measurements of the scenario (docs/simulator.md)."""

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

    def schedule_ms(self, scenario: Scenario, schedules: Sequence[Schedule]) -> np.ndarray:
        """Noise-free simulated time of each schedule, ms: shape ``[len(schedules)]``."""
        return _schedule_us(self.constants, _encode([(scenario, s) for s in schedules])) / 1e3

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
            constants = self.constants if mode == "eager" else _graph_constants(self.constants)
            x = _encode([(scenario, schedules[i]) for i in runnable]) if runnable else None
            times = dict(zip(runnable, _schedule_us(constants, x) / 1e3 if x else [], strict=True))
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
            base = _baselines_us(constants, _encode([(scenario, Schedule())]))
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
        return {
            "backend": "sim",
            "sim_model": SIM_MODEL_VERSION,
            "sim_constants": self.constants.digest(),
            "hardware_id": self.hardware.id,
            "world_size": self.world_size,
            "seed": self.seed,
            "noise": self.noise,
        }


def _graph_constants(c: SimConstants) -> SimConstants:
    """``c`` with no host time: calls replayed from a CUDA graph are not issued from Python."""
    host = ("host_ce_call_us", "host_p2p_call_us", "host_ce_round_us", "host_p2p_round_us", "host_unit_us")
    return dataclasses.replace(c, **dict.fromkeys(host, 0.0))


# Calibration --------------------------------------------------------------------------------------------


def calibrate(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    *,
    start: SimConstants = DEFAULT_CONSTANTS,
    fixed: Collection[str] = (),
    baseline_weight: float = 1.0,
    relative_weight: float = 0.5,
    prior_weight: float = 0.02,
    iterations: int = 60,
) -> SimConstants:
    """Refit the constants to the measured times of ``df`` (dataset rows): least squares on log times,
    Levenberg-Marquardt (docs/simulator.md). Baseline observations weigh ``baseline_weight``, the pull
    towards ``start`` ``prior_weight``; constants named in ``fixed`` keep their ``start`` values. Returns the
    fitted constants (4 significant digits)."""
    from ficco.features.dataset import scenario_from_row

    df = df[df["mode"] == "eager"]  # the host terms are fitted to eager calls
    ok = df[df["ok"].astype(bool) & np.isfinite(df["median_ms"].to_numpy(dtype=float))]
    if ok.empty:
        raise ValueError("calibrate needs at least one ok eager row with a finite median_ms; got none")
    names = [f.name for f in dataclasses.fields(SimConstants)]
    unknown = sorted(set(fixed) - set(names))
    if unknown:
        raise ValueError(f"calibrate: fixed names {unknown} are not SimConstants fields; allowed: {names}")
    first = df.drop_duplicates("scenario_id").itertuples()
    scenarios = {row.scenario_id: scenario_from_row(row, hardware) for row in first}
    sched_x = _encode([(scenarios[r.scenario_id], Schedule.parse(r.schedule)) for r in ok.itertuples()])
    sched_y = np.log(ok["median_ms"].to_numpy(dtype=float) * 1e3)
    group = ok["scenario_id"].factorize()[0]
    group_size = np.bincount(group)
    base_obs = []
    for key in ("gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms", "async_tp_ms"):
        sub = df[np.isfinite(df[key].to_numpy(dtype=float))].drop_duplicates(["scenario_id", key])
        if not sub.empty:
            x = _encode([(scenarios[r.scenario_id], Schedule()) for r in sub.itertuples()])
            base_obs.append((key, x, np.log(sub[key].to_numpy(dtype=float) * 1e3)))

    free = [n for n in names if n not in set(fixed)]
    values = start.to_dict()
    theta0 = np.log([values[n] for n in free])
    upper = np.log([_UPPER_BOUND.get(n, np.inf) for n in free])

    def constants(theta: np.ndarray) -> SimConstants:
        return SimConstants(
            **{**values, **dict(zip(free, np.exp(np.minimum(theta, upper)).tolist(), strict=True))}
        )

    def residuals(theta: np.ndarray) -> np.ndarray:
        c = constants(theta)
        r = np.log(_schedule_us(c, sched_x)) - sched_y
        # Ranking depends on times relative to the scenario's other schedules: half the weight goes to
        # residuals with each scenario's mean removed.
        centred = r - (np.bincount(group, r) / group_size)[group]
        parts = [math.sqrt(1.0 - relative_weight) * r, math.sqrt(relative_weight) * centred]
        parts += [
            math.sqrt(baseline_weight) * (np.log(_baselines_us(c, x)[key]) - y) for key, x, y in base_obs
        ]
        parts.append(math.sqrt(prior_weight) * (theta - theta0))
        r = np.concatenate(parts)
        return np.where(np.isfinite(r), r, 0.0)

    from scipy.optimize import least_squares

    # Levenberg-Marquardt with a forward-difference Jacobian: about ``iterations`` steps of len(free) + 1
    # residual evaluations each.
    fit = least_squares(residuals, theta0, method="lm", max_nfev=iterations * (len(free) + 1))
    fitted = constants(fit.x).to_dict()
    return SimConstants(**{name: float(f"{value:.4g}") for name, value in fitted.items()})


def agreement(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    constants: SimConstants = DEFAULT_CONSTANTS,
    *,
    tolerance: float = 0.0,
) -> float:
    """Fraction of ``df``'s labelled scenarios where the simulator's pick (its fastest among the schedules
    measured ok) is the measured best, or with ``tolerance`` > 0 measured within ``1 + tolerance`` of the
    best (near-ties count; both are label times, ``features.dataset.with_label_times``). Eager rows only
    (the simulator's host terms are eager ones). NaN for a dataset without labels."""
    from ficco.features.dataset import scenario_from_row, with_label_times
    from ficco.harness.dataset import label_table

    df = with_label_times(df[df["mode"] == "eager"])
    labels = label_table(df).set_index("scenario_id")
    if labels.empty:
        return float("nan")
    sim = SimBackend(hardware, constants=constants)
    hits = 0
    for sid, group in df[df["ok"].astype(bool)].groupby("scenario_id", sort=False):
        schedules = [Schedule.parse(s) for s in group["schedule"]]
        scenario = scenario_from_row(next(group.itertuples()), hardware)
        pick = int(np.argmin(sim.schedule_ms(scenario, schedules)))
        if tolerance > 0:
            hits += group["time_ms"].iloc[pick] <= labels.at[sid, "best_ms"] * (1.0 + tolerance)
        else:
            hits += str(schedules[pick]) == labels.at[sid, "best_schedule"]
    return hits / len(labels)
