"""The SM resource knobs of a schedule (``features.Schedule.ctas`` and ``.carveout``), on CUDA.

- ``ctas``: the ``sm`` pieces go through a twin NCCL communicator created with ``max_ctas = ctas``
  (:func:`nccl_options`), so NCCL's kernels occupy at most that many SMs beside the GEMMs.
- ``carveout``: the GEMMs a call issues target ``SMs - carveout`` SMs (:class:`SMCarveout`), leaving the rest
  to the communication kernels, instead of being scheduled in a second wave behind them.

On the CPU (gloo) neither has anything to act on; the executor runs those schedules like their plain twins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist


def nccl_options(high_priority: bool, ctas: int | None) -> dist.ProcessGroup.Options:
    """``ProcessGroupNCCL.Options`` of a twin communicator: a high-priority internal stream and/or at most
    ``ctas`` CTAs per NCCL kernel (None: NCCL's own choice)."""
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = high_priority
    if ctas is not None:
        options.config.max_ctas = ctas
    return options


@contextlib.contextmanager
def blas_library(name: str) -> Iterator[None]:
    """``with blas_library("cublaslt"):`` the GEMMs issued inside prefer that BLAS library
    (``torch.backends.cuda.preferred_blas_library``); the previous preference is restored on exit."""
    saved = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(saved)


class SMCarveout:
    """``with carveout:`` the GEMMs issued inside target ``SMs - sms`` SMs of ``device``.

    torch sets its SM carve-out (``torch._C._set_sm_carveout_experimental``) as the SM-count target of the
    cuBLASLt matmul descriptor (and of its CUTLASS grouped GEMMs); its cuBLAS path does not read it. Inside
    the block cuBLASLt is therefore also the preferred BLAS library; both settings are restored on exit.
    They are read when a GEMM is issued, so a GEMM captured into a CUDA graph keeps the carve-out it was
    captured with. Reusable, not reentrant.
    """

    def __init__(self, device: torch.device, sms: int) -> None:
        count = torch.cuda.get_device_properties(device).multi_processor_count
        if not 0 < sms < count:
            raise ValueError(
                f"an SM carve-out must leave the GEMMs at least one of the {count} SMs of {device}: "
                f"0 < carveout < {count}; got {sms}"
            )
        self.sms = sms
        self._saved: tuple = ()

    def __enter__(self) -> SMCarveout:
        self._saved = (torch._C._get_sm_carveout_experimental(), torch.backends.cuda.preferred_blas_library())
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch._C._set_sm_carveout_experimental(self.sms)
        return self

    def __exit__(self, *exc) -> None:
        carveout, library = self._saved
        torch._C._set_sm_carveout_experimental(carveout)
        torch.backends.cuda.preferred_blas_library(library)
