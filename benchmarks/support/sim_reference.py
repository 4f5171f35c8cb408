"""The reference measurements the simulator's default constants are fitted to, as dataset rows.

Transcribed from ``shared/reference/h200x2-measurements.md`` (2 x H200, NV18 NVLink, PyTorch 2.11 + CUDA 13,
NCCL 2.28.9; bf16; medians in ms). Shapes are ``(M, K, N)`` as the tables print them; the reduce-scatter
tables run ``A[M, K/2] @ B[K/2, N]`` on each rank, i.e. a ``gemm_rs`` scenario with ``k = K / 2``.
Rows of different tables may share a scenario id: the frame is for ``sim.calibrate``, not for labels. The
'Decomposition loss' table enters as GEMM-only rows (``ok=False``, only ``gemm_alone_ms`` set): a GEMM
split into c row blocks is c GEMMs of ``m / c`` rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ficco.features import Scenario, get_hardware
from ficco.features.dataset import rows_frame
from ficco.harness.backend import Measurement, ScenarioResult
from ficco.harness.dataset import result_rows

if TYPE_CHECKING:
    import pandas as pd

AG_TABLE = {  # 'All-gather of the A shard': GEMM, NCCL AG, serial (NCCL AG then GEMM)
    (8192, 8192, 8192): (1.29, 0.33, 1.75),
    (16384, 8192, 14336): (4.85, 0.62, 6.08),
    (16384, 4096, 2048): (0.50, 0.35, 0.78),
    (2048, 8192, 8192): (0.40, 0.12, 0.48),
    (65536, 4096, 1024): (0.71, 1.09, 1.78),
    (1024, 4096, 4096): (0.10, 0.06, 0.13),
}
ASYNC_TP_TABLE = {  # 'PyTorch async tensor parallel': AG+GEMM serial, async-TP, GEMM+RS serial, async-TP
    (8192, 8192, 8192): (1.76, 1.77, 1.07, 1.11),
    (16384, 8192, 14336): (5.97, 5.96, 3.64, 3.34),
    (16384, 4096, 2048): (0.77, 0.78, 0.43, 0.52),
    (2048, 8192, 8192): (0.48, 0.64, 0.31, 0.40),
    (65536, 4096, 1024): (1.87, 1.62, 0.82, 0.80),
    (4096, 8192, 28672): (2.90, 3.17, 1.96, 1.83),
    (1024, 4096, 4096): (0.12, 0.49, 0.12, 0.37),
}
CE_PULL_TABLE = {  # 'copy-engine pulls': GEMM, NCCL AG, CE pull, serial, shard, shard hp, finer s2, finer s4
    (8192, 8192, 8192): (1.33, 0.32, 0.21, 1.84, 1.48, 1.65, 1.67, 1.70),
    (16384, 8192, 14336): (4.94, 0.66, 0.42, 6.31, 5.84, 5.85, 5.91, 6.16),
    (16384, 4096, 2048): (0.48, 0.36, 0.23, 0.77, 0.47, 0.47, 0.48, 0.53),
    (2048, 8192, 8192): (0.36, 0.13, 0.08, 0.49, 0.43, 0.43, 0.49, 0.53),
    (65536, 4096, 1024): (0.71, 1.18, 0.78, 1.90, 1.14, 1.15, 0.97, 0.95),
    (4096, 8192, 28672): (2.49, 0.20, 0.14, 3.00, 2.85, 2.91, 2.98, 3.37),
}
DECOMPOSITION_TABLE = {  # 'Decomposition loss': whole GEMM TFLOP/s, time of c = 2, 4, 8, 16 blocks / whole
    (8192, 8192, 8192): (792, 1.04, 1.11, 1.11, 1.15),
    (4096, 8192, 14336): (702, 1.01, 1.12, 1.16, 1.15),
    (16384, 4096, 2048): (675, 1.04, 1.06, 1.08, 1.16),
    (2048, 8192, 8192): (677, 0.98, 1.01, 1.07, 1.52),
    (1024, 4096, 4096): (461, 1.13, 1.26, 1.93, 3.46),
}
RS_TABLE = {  # 'GEMM -> reduce-scatter': GEMM, NCCL RS, CE push alone, serial, async-TP, CE shard
    (8192, 8192, 8192): (0.73, 0.35, 0.23, 1.08, 1.12, 0.83),
    (16384, 14336, 8192): (2.77, 0.70, 0.41, 3.24, 3.19, 2.97),
    (16384, 2048, 4096): (0.27, 0.36, 0.23, 0.60, 0.65, 0.38),
    (2048, 8192, 8192): (0.20, 0.13, 0.09, 0.30, 0.39, 0.24),
    (65536, 1024, 4096): (0.46, 1.20, 0.80, 1.61, 1.78, 1.21),
    (4096, 28672, 8192): (1.25, 0.23, 0.14, 1.52, 1.66, 1.35),
    (1024, 4096, 4096): (0.05, 0.08, 0.08, 0.10, 0.45, 0.18),
}

WORLD_SIZE_TABLE = {  # all-gather alone, (ranks, MiB received per GPU): (NCCL ms, copy engines ms)
    (2, 64): (0.294, 0.199),
    (2, 256): (1.048, 0.705),
    (4, 64): (0.247, 0.356),
    (4, 256): (0.874, 1.249),
}
"""The one benchmark run at two world sizes: ``benchmarks/executor_bench.py --quick``, NCCL's all-gather
against the executor's copy-engine all-gather (``serial/dma``'s transfer: every peer at once). 2 ranks:
``benchmarks/results/executor-h200x2-quick.json``; 4 ranks: the 4 x H200 section of the reference file (a
different machine). ``sim.SimConstants.nccl_peer_gain`` and ``ce_peer_loss`` are fitted to the ratios of
its 4-rank to its 2-rank times; the smaller sizes of that run are host-bound and left out."""


def _rows(table: str, op: str, shape: tuple[int, int, int], times: dict[str, float], baselines: dict) -> list:
    """Rows of one measured shape; with no ``times`` a single GEMM-only row (``ok=False``: no schedule)."""
    m, k, n = shape
    scenario = Scenario(op=op, m=m, n=n, k=k // 2 if op == "gemm_rs" else k, hardware=get_hardware("h200x2"))
    measurements = [
        Measurement(schedule=s, median_ms=t, p10_ms=t, p90_ms=t, round_ms=(t,)) for s, t in times.items()
    ]
    if not times:
        measurements = [Measurement(schedule="serial/sm", ok=False, error="reference row: GEMM alone only")]
    result = ScenarioResult(measurements=measurements, baselines={"eager": baselines})
    return result_rows(f"reference-{table}", scenario, result, "gpu")


def reference_frame() -> pd.DataFrame:
    """Every reference measurement as dataset rows (``features.dataset.COLUMNS``), hardware ``h200x2``."""
    rows = []
    for shape, (gemm, nccl, serial) in AG_TABLE.items():
        rows += _rows(
            "ag", "ag_gemm", shape, {"serial/sm": serial}, {"gemm_alone_ms": gemm, "nccl_comm_ms": nccl}
        )
    for shape, (ag_serial, ag_async, rs_serial, rs_async) in ASYNC_TP_TABLE.items():
        rows += _rows("async-tp", "ag_gemm", shape, {"serial/sm": ag_serial}, {"async_tp_ms": ag_async})
        rows += _rows("async-tp", "gemm_rs", shape, {"serial/sm": rs_serial}, {"async_tp_ms": rs_async})
    for shape, (gemm, nccl, ce, serial, shard, shard_hp, s2, s4) in CE_PULL_TABLE.items():
        times = {
            "serial/sm": serial,
            "shard/dma": shard,
            "shard/dma/hp": shard_hp,
            "finer/dma/s2/chunk": s2,
            "finer/dma/s4/chunk": s4,
        }
        rows += _rows(
            "ce-pull",
            "ag_gemm",
            shape,
            times,
            {"gemm_alone_ms": gemm, "nccl_comm_ms": nccl, "dma_comm_ms": ce},
        )
    for (m, k, n), (tflops, *ratios) in DECOMPOSITION_TABLE.items():
        whole_ms = 2.0 * m * n * k / (tflops * 1e9)
        rows += _rows("decomposition", "ag_gemm", (m, k, n), {}, {"gemm_alone_ms": whole_ms})
        for pieces, ratio in zip((2, 4, 8, 16), ratios, strict=True):
            # One of `pieces` row blocks run back to back: a GEMM of m / pieces rows.
            block = {"gemm_alone_ms": whole_ms * ratio / pieces}
            rows += _rows("decomposition", "ag_gemm", (m // pieces, k, n), {}, block)
    for shape, (gemm, nccl, ce, serial, async_tp, ce_shard) in RS_TABLE.items():
        baselines = {"gemm_alone_ms": gemm, "nccl_comm_ms": nccl, "dma_comm_ms": ce, "async_tp_ms": async_tp}
        rows += _rows("rs", "gemm_rs", shape, {"serial/sm": serial, "shard/dma": ce_shard}, baselines)
    return rows_frame(rows)
