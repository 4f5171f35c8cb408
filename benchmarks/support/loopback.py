"""A loopback world: one process, on one GPU (or the CPU), plays rank 0 of a world of several ranks.

For what needs the executor's real code paths but not its peers: its host time
(``benchmarks/executor_overhead.py --loopback``) and its CUDA stream, event and graph-capture code at world
sizes the machine has no GPUs for (``tests/gpu/test_gpu_loopback.py``). Inside :func:`loopback_world`:

- the default process group is torch's fake one (``torch.testing._internal.distributed.fake_pg``): every
  collective and point-to-point call returns at once and moves nothing;
- the copy-engine executor's peer memory is :class:`LoopbackPeerMemory`: one local, zeroed buffer per rank,
  so this rank's pushes land in buffers nobody reads and what it receives stays zero;
- the high-priority twin NCCL group of ``/hp`` schedules is the fake group itself (it has no NCCL stream
  whose priority could differ).

Nothing computed there is a multi-GPU result: every peer's contribution is missing (zero on the copy
engines, whatever the receive buffer held under the fake NCCL calls).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from unittest import mock

import torch
import torch.distributed as dist

from ficco.executor import context
from ficco.executor.allocation import persistent
from ficco.executor.peer_memory import byte_view


class LoopbackPeerMemory:
    """Peer memory (``executor.peer_memory.PeerMemory``) of a loopback world: a zeroed local buffer of
    ``nbytes`` per rank on ``device``, so a copy "into a peer" is a copy on this GPU; the barrier is one add
    on a one-element tensor, a kernel launch on the current stream as symmetric memory's barrier is."""

    def __init__(self, nbytes: int, world_size: int, device: torch.device) -> None:
        # outside any CUDA graph pool the caller allocates to, as symmetric memory is (executor.allocation)
        self._buffers, self._flag = persistent(
            device,
            lambda: (
                [torch.zeros(nbytes, dtype=torch.uint8, device=device) for _ in range(world_size)],
                torch.zeros(1, dtype=torch.int32, device=device),
            ),
        )

    def view(self, peer: int, shape: Sequence[int], dtype: torch.dtype, byte_offset: int) -> torch.Tensor:
        return byte_view(self._buffers[peer], shape, dtype, byte_offset)

    def barrier(self) -> None:
        self._flag.add_(1)

    def local_bytes(self) -> torch.Tensor:
        return self._buffers[0]


@contextlib.contextmanager
def loopback_world(world_size: int, device_type: str = "cuda") -> Iterator[torch.device]:
    """This process as rank 0 of ``world_size`` ranks (module docstring), on GPU 0 (``device_type``
    "cuda") or the CPU; yields the device. ValueError if a process group is already initialised."""
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"loopback_world's device_type must be 'cuda' or 'cpu'; got {device_type!r}")
    if dist.is_initialized():
        raise ValueError("loopback_world needs no process group initialised; one is (destroy it first)")
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)

    def peer_memory(ctx: context.GroupContext, nbytes: int) -> LoopbackPeerMemory:
        return LoopbackPeerMemory(nbytes, ctx.world_size, ctx.device)

    def twin_group(ctx: context.GroupContext, *args, **kwargs) -> dist.ProcessGroup:
        return ctx.group

    try:
        with (
            mock.patch.object(context.GroupContext, "_make_peer_memory", peer_memory),
            mock.patch.object(context.GroupContext, "p2p_group", twin_group),
        ):
            yield device
    finally:
        context.reset()
        dist.destroy_process_group()
