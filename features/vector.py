"""The feature vector: a deterministic, named description of a scenario on its hardware.

The predictor sees only these numbers. ``FEATURE_SCHEMA_VERSION`` changes whenever a name, the order
or a formula changes; models record it and refuse to load under a different one
(``tests/features/test_vector.py`` pins the values of a reference scenario to the version).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ficco.features.scenario import OPS, Scenario
from ficco.features.schedule import FINER_SPLITS, max_splits

FEATURE_SCHEMA_VERSION = "fv4"
"""The schema new models are trained on (what each version changed: docs/training.md)."""
FEATURE_SCHEMAS: tuple[str, ...] = ("fv2", "fv3", "fv4")
"""The schemas this code computes, oldest first: a model of any of them loads (its pairs are built the way it
was trained); a model of any other is refused."""

_TILE = 128
"""Output tile edge (rows and columns) assumed when counting GEMM waves; Hopper bf16 kernels use 128-256."""
_WAVE_TILE = (128, 256)
"""Output tile (rows, columns) of Hopper's large bf16 GEMM kernels, for the wave fill of a chunk's GEMM."""
FP32_SLOWDOWN = 14.8
"""Plain fp32 GEMM rate below the bf16 tensor-core rate (H100/H200 datasheets: 67 vs 989 TFLOP/s)."""


def _log2(x: float) -> float:
    return math.log2(max(x, 1e-12))


def roofline_gemm_us(scenario: Scenario) -> float:
    """Roofline time of the rank's GEMM work, microseconds: max(FLOPs / peak, bytes / HBM bandwidth)."""
    hw = scenario.hardware
    peak = hw.peak_bf16_tflops * 1e12 / (FP32_SLOWDOWN if scenario.dtype == "fp32" else 1.0)
    return 1e6 * max(scenario.gemm_flops / peak, scenario.gemm_bytes / (hw.hbm_gbps * 1e9))


def roofline_comm_us(scenario: Scenario) -> float:
    """Bandwidth-bound time of the rank's communication, microseconds: received bytes / link bandwidth."""
    return 1e6 * scenario.comm_bytes / (scenario.hardware.link_gbps * 1e9)


def gemm_waves(rows: int, n: int, sm_count: int) -> float:
    """Waves of 128x128 output tiles over the SMs for a ``[rows, n]`` output (fractional: tail effects)."""
    return math.ceil(rows / _TILE) * math.ceil(n / _TILE) / sm_count


def wave_fill(rows: float, n: int, sm_count: int) -> float:
    """Busy share of the last wave of ``_WAVE_TILE`` output tiles for a ``[rows, n]`` GEMM, in (0, 1].

    A chunk whose tiles fill 1.02 waves costs nearly two: splitting a shard helps or hurts by this.
    """
    tiles = math.ceil(rows / _WAVE_TILE[0]) * math.ceil(n / _WAVE_TILE[1])
    waves = tiles / sm_count
    return waves / math.ceil(waves)


def feature_dict(scenario: Scenario) -> dict[str, float]:
    """Named features of ``scenario`` in schema order. Sizes enter as log2, times in microseconds."""
    s, hw, w = scenario, scenario.hardware, scenario.world_size
    t_gemm, t_comm = roofline_gemm_us(s), roofline_comm_us(s)
    shard_rows = s.rows // w
    width = s.comm_width
    out = {f"op_{op}": float(s.op == op) for op in OPS}
    out |= {
        "log2_m": _log2(s.m),
        "log2_n": _log2(s.n),
        "log2_k": _log2(s.k),
        "log2_rows": _log2(s.rows),
        "world_size": float(w),
        "dtype_bytes": float(s.dtype_bytes),
        "log2_gemm_flops": _log2(s.gemm_flops),
        "log2_gemm_bytes": _log2(s.gemm_bytes),
        "log2_comm_bytes": _log2(s.comm_bytes),
        "log2_arith_intensity": _log2(s.gemm_flops / s.gemm_bytes),
        "log2_t_gemm_us": _log2(t_gemm),
        "log2_t_comm_us": _log2(t_comm),
        "log2_comm_over_gemm": _log2(t_comm / t_gemm),
        "log2_shard_rows": _log2(shard_rows),
        "log2_shard_bytes": _log2(shard_rows * width * s.dtype_bytes),
        "gemm_waves": gemm_waves(s.rows, s.n, hw.sm_count),
        "shard_gemm_waves": gemm_waves(shard_rows, s.n, hw.sm_count),
        "max_finer_splits": float(max_splits(s.rows, s.world_size)),
        "experts": float(s.experts),
        "top_k": float(s.top_k),
        "imbalance": float(s.imbalance),
    }
    out |= {f"chunk_wave_fill_s{k}": wave_fill(shard_rows / k, s.n, hw.sm_count) for k in (1, 2, 4, 8)}
    return out


FEATURE_NAMES: tuple[str, ...] = tuple(feature_dict(Scenario()).keys())
"""Column names of :func:`feature_matrix`, in order."""


def feature_vector(scenario: Scenario) -> np.ndarray:
    """Features of one scenario: float64 array of shape ``[len(FEATURE_NAMES)]``."""
    return np.fromiter(feature_dict(scenario).values(), dtype=np.float64, count=len(FEATURE_NAMES))


COLUMNWISE_MIN = 32
"""From this many scenarios on, :func:`feature_matrix` computes column by column with numpy (10,000 scenarios:
about 0.03 s instead of 0.14 s on one core); below it, scenario by scenario (one: about 15 us instead of 80).
Both give the same numbers to rounding (``tests/features/test_vector.py``)."""


def feature_matrix(scenarios: Iterable[Scenario]) -> np.ndarray:
    """Features of many scenarios: float64 array of shape ``[n_scenarios, len(FEATURE_NAMES)]``."""
    scenarios = list(scenarios)
    if len(scenarios) >= COLUMNWISE_MIN:
        return _feature_columns(scenarios)
    if len(scenarios) == 1:  # one decision: no stacking
        return feature_vector(scenarios[0])[None, :]
    if not scenarios:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float64)
    return np.stack([feature_vector(s) for s in scenarios])


def _feature_columns(scenarios: list[Scenario]) -> np.ndarray:
    """:func:`feature_dict` of every scenario, computed column-wise (the same formulas over arrays, the sizes
    from the scenarios' own properties): float64 ``[n, len(FEATURE_NAMES)]``."""
    raw = np.array(
        [
            (
                s.m, s.n, s.k, s.rows, s.world_size, s.dtype_bytes, s.gemm_flops, s.gemm_bytes, s.comm_bytes,
                s.experts, s.top_k, s.imbalance, s.hardware.sm_count,
                s.hardware.peak_bf16_tflops / (FP32_SLOWDOWN if s.dtype == "fp32" else 1.0),
                s.hardware.hbm_gbps, s.hardware.link_gbps, s.comm_width,
            )
            for s in scenarios
        ],
        dtype=np.float64,
    )  # fmt: skip
    m, n, k, rows, w, dtype_bytes, flops, gemm_bytes, comm_bytes = raw[:, :9].T
    experts, top_k, imbalance, sm_count, peak_tflops, hbm_gbps, link_gbps, width = raw[:, 9:].T
    ops = np.array([s.op for s in scenarios])
    t_gemm = 1e6 * np.maximum(flops / (peak_tflops * 1e12), gemm_bytes / (hbm_gbps * 1e9))
    t_comm = 1e6 * comm_bytes / (link_gbps * 1e9)
    shard_rows = np.floor(rows / w)

    def waves(r: np.ndarray) -> np.ndarray:
        return np.ceil(r / _TILE) * np.ceil(n / _TILE) / sm_count

    def fill(r: np.ndarray) -> np.ndarray:
        full = np.ceil(r / _WAVE_TILE[0]) * np.ceil(n / _WAVE_TILE[1]) / sm_count
        return full / np.ceil(full)

    finer = np.ones_like(rows)
    for splits in FINER_SPLITS:
        finer = np.where(np.mod(rows, w * splits) == 0, np.maximum(finer, splits), finer)
    columns = [(ops == op).astype(np.float64) for op in OPS]
    columns += [_log2s(m), _log2s(n), _log2s(k), _log2s(rows), w, dtype_bytes]
    columns += [_log2s(flops), _log2s(gemm_bytes), _log2s(comm_bytes), _log2s(flops / gemm_bytes)]
    columns += [_log2s(t_gemm), _log2s(t_comm), _log2s(t_comm / t_gemm)]
    columns += [_log2s(shard_rows), _log2s(shard_rows * width * dtype_bytes), waves(rows), waves(shard_rows)]
    columns += [finer, experts, top_k, imbalance, *(fill(shard_rows / c) for c in (1, 2, 4, 8))]
    return np.column_stack(columns)


def _log2s(x: np.ndarray) -> np.ndarray:
    """:func:`_log2` over an array."""
    return np.log2(np.maximum(x, 1e-12))
