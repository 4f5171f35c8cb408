"""The executor: all-gather -> GEMM, GEMM -> reduce-scatter and the MoE all-to-alls beside the expert GEMMs,
under any ``features.Schedule``.

One process per GPU (torchrun). ``sm`` schedules move data with NCCL kernels; ``dma`` schedules with the
copy engines (peer copies into PyTorch symmetric memory). On CPU tensors the same decompositions run over
gloo: ``sm`` with gloo point-to-point ops, ``dma`` with copies into shared-memory files every rank maps, so
on the CPU the executor choice changes only the transport (CI checks every schedule's logic without GPUs).

    C = all_gather_matmul(a_shard, b, "finer/dma/s4/chunk")           # a_shard [m/w, k], b [k, n] -> [m, n]
    C_shard = matmul_reduce_scatter(a, b, "shard/sm/hp")              # a [m, k], b [k, n] -> [m/w, n]
    # MoE: x [rows routed from this rank, k], b [experts/w, k, n] -> Y [rows routed to this rank, n]
    Y = all_to_all_matmul(x, b, routing, "shard/dma")
    Z = matmul_all_to_all(Y, b2, routing, "finer/sm/s2/chunk")        # b2 [experts/w, n, d] -> [rows of x, d]

All four are PyTorch custom ops too (``executor.library``, registered on import):
``torch.ops.ficco.all_gather_matmul``, ``matmul_reduce_scatter``, ``all_to_all_matmul`` and
``matmul_all_to_all``, with fake implementations and autograd, for torch.compile, CUDA graphs and DTensor
plans.
"""

from ficco.executor import library
from ficco.executor.context import (
    CaptureError,
    clear_buffers,
    copy_streams,
    poison_buffers,
    process_group,
    reset,
    set_barrier_timeout,
    set_copy_streams,
)
from ficco.executor.experts import grouped_matmul
from ficco.executor.ops import (
    OP_FUNCTIONS,
    all_gather_matmul,
    all_to_all_matmul,
    communicate,
    matmul_all_to_all,
    matmul_reduce_scatter,
    run_op,
)

__all__ = [
    "OP_FUNCTIONS",
    "CaptureError",
    "all_gather_matmul",
    "all_to_all_matmul",
    "clear_buffers",
    "communicate",
    "copy_streams",
    "grouped_matmul",
    "library",
    "matmul_all_to_all",
    "matmul_reduce_scatter",
    "poison_buffers",
    "process_group",
    "reset",
    "run_op",
    "set_barrier_timeout",
    "set_copy_streams",
]
