"""The executor: all-gather -> GEMM and GEMM -> reduce-scatter under any ``features.Schedule``.

One process per GPU (torchrun). ``sm`` schedules move data with NCCL kernels; ``dma`` schedules with the
copy engines (peer copies into PyTorch symmetric memory). On CPU tensors the same decompositions run over
gloo: ``sm`` with gloo point-to-point ops, ``dma`` with copies into shared-memory files every rank maps, so
on the CPU the executor choice changes only the transport (CI checks every schedule's logic without GPUs).

    C = all_gather_matmul(a_shard, b, "finer/dma/s4/chunk")           # a_shard [m/w, k], b [k, n] -> [m, n]
    C_shard = matmul_reduce_scatter(a, b, "shard/sm/hp")              # a [m, k], b [k, n] -> [m/w, n]
"""

from ficco.executor.context import CaptureError, clear_buffers, poison_buffers, reset, set_barrier_timeout
from ficco.executor.ops import all_gather_matmul, communicate, matmul_reduce_scatter

__all__ = [
    "CaptureError",
    "all_gather_matmul",
    "clear_buffers",
    "communicate",
    "matmul_reduce_scatter",
    "poison_buffers",
    "reset",
    "set_barrier_timeout",
]
