"""The executor: all-gather -> GEMM, GEMM -> reduce-scatter and the MoE all-to-alls beside the expert GEMMs,
under any ``features.Schedule``, one process per GPU (torchrun).

``sm`` schedules move data with NCCL kernels, ``dma`` schedules with the copy engines (peer copies into
PyTorch symmetric memory); CPU tensors run the same decompositions over gloo and shared-memory files, so CI
checks every schedule without GPUs. The four ops are PyTorch custom ops too (``torch.ops.ficco``, registered
by ``executor.library`` on import). Usage and design: docs/executor.md.
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
