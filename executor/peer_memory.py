"""Memory every rank of a group can write into: the copy-engine (``dma``) executor's receive buffers.

CUDA: PyTorch symmetric memory (a ``tensor.copy_`` into a peer's buffer is a peer-to-peer copy over NVLink
that uses no SM). CPU: files in ``/dev/shm`` that every rank maps, with a gloo barrier, so CI checks the
buffer layout and the double buffering without a GPU. ``Workspace`` owns one such memory per (group,
device): two halves used by alternate calls, grown on demand, never allocated on the hot path once large
enough. See docs/executor.md ("Peer memory").
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.distributed as dist


class PeerMemory(Protocol):
    """A buffer of ``nbytes`` on every rank, each rank's addressable by all."""

    def view(self, peer: int, shape: Sequence[int], dtype: torch.dtype, byte_offset: int) -> torch.Tensor:
        """A ``shape``/``dtype`` view of group rank ``peer``'s buffer, starting at ``byte_offset``."""

    def barrier(self) -> None:
        """Every rank's writes issued before this call are visible to every rank after it."""

    def local_bytes(self) -> torch.Tensor:
        """This rank's whole buffer as uint8 (for poisoning in tests)."""


class SymmetricPeerMemory:
    """CUDA: a ``torch.distributed._symmetric_memory`` buffer; ``barrier`` runs a kernel on the current
    stream."""

    def __init__(self, nbytes: int, group: dist.ProcessGroup, device: torch.device, timeout_ms: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        maybe_register_symm_mem_group(group)
        self._buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        self._handle = symm_mem.rendezvous(self._buffer, group.group_name)
        self._timeout_ms = timeout_ms

    def view(self, peer: int, shape: Sequence[int], dtype: torch.dtype, byte_offset: int) -> torch.Tensor:
        if 0 in shape:  # addresses nothing (an all-to-all block of no rows): no peer pointer needed
            return torch.empty(tuple(shape), dtype=dtype, device=self._buffer.device)
        return self._handle.get_buffer(peer, tuple(shape), dtype, byte_offset // dtype.itemsize)

    def barrier(self) -> None:
        self._handle.barrier(channel=0, timeout_ms=self._timeout_ms)

    def local_bytes(self) -> torch.Tensor:
        return self._buffer


class HostPeerMemory:
    """CPU: one shared file per rank, mapped by every rank; ``barrier`` is a gloo barrier."""

    def __init__(self, nbytes: int, group: dist.ProcessGroup, global_ranks: Sequence[int], rank: int) -> None:
        token = [uuid.uuid4().hex]
        dist.broadcast_object_list(token, src=global_ranks[0], group=group)
        folder = _shared_folder(nbytes * len(global_ranks))
        paths = [os.path.join(folder, f"ficco-{token[0]}-{q}") for q in range(len(global_ranks))]
        with open(paths[rank], "wb") as f:
            f.truncate(nbytes)
        self._group = group
        try:
            dist.barrier(group=group)
            self._maps = [torch.from_file(p, shared=True, size=nbytes, dtype=torch.uint8) for p in paths]
            dist.barrier(group=group)
        finally:
            os.unlink(paths[rank])  # the mappings outlive the name

    def view(self, peer: int, shape: Sequence[int], dtype: torch.dtype, byte_offset: int) -> torch.Tensor:
        return byte_view(self._maps[peer], shape, dtype, byte_offset)

    def barrier(self) -> None:
        dist.barrier(group=self._group)

    def local_bytes(self) -> torch.Tensor:
        return self._maps[dist.get_rank(self._group)]


def byte_view(
    buffer: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, byte_offset: int
) -> torch.Tensor:
    """A ``shape``/``dtype`` view of the uint8 ``buffer`` starting at ``byte_offset`` (the peer memories that
    are plain byte tensors: :class:`HostPeerMemory`, ``benchmarks.support.loopback.LoopbackPeerMemory``)."""
    raw = buffer[byte_offset : byte_offset + math.prod(shape) * dtype.itemsize]
    return raw.view(dtype).view(tuple(shape))


def _shared_folder(nbytes: int) -> str:
    """``/dev/shm`` when it has room for ``nbytes`` (a full tmpfs would kill the process with SIGBUS on
    first touch of a mapped page), else the temporary folder."""
    try:
        stat = os.statvfs("/dev/shm")
        if stat.f_bavail * stat.f_frsize >= 2 * nbytes:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


def maybe_register_symm_mem_group(group: dist.ProcessGroup) -> None:
    """Register ``group`` with symmetric memory on torch < 2.11, which needs it before a rendezvous (2.11
    resolves the group by name inside ``rendezvous`` and deprecates the registration call)."""
    if _torch_version() >= (2, 11):
        return
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.enable_symm_mem_for_group(group.group_name)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


class Workspace:
    """Double-buffered peer memory of one (group, device): call ``n`` uses half ``n % 2``.

    Why two halves and one barrier per call are enough: a rank writes into a peer's half ``h`` in call
    ``n + 2`` only after passing a barrier of call ``n + 1``, which every rank reaches only after finishing
    call ``n`` (each call's lanes are joined into the caller's stream before the next call forks them).
    So nobody still reads half ``h`` from call ``n`` when it is overwritten.
    """

    def __init__(self, make: Callable[[int], PeerMemory], quiesce: Callable[[], None]) -> None:
        self._make = make
        self._quiesce = quiesce
        self._memory: PeerMemory | None = None
        self._views: dict[tuple, torch.Tensor] = {}
        self.half_bytes = 0
        """Bytes of one half (a power of two, at least ``MIN_HALF_BYTES``)."""
        self.parity = 0
        """The half the current call uses."""

    def fits(self, half_bytes: int) -> bool:
        """Whether the memory exists and each half holds ``half_bytes`` (``ensure`` would do nothing)."""
        return self._memory is not None and half_bytes <= self.half_bytes

    def ensure(self, half_bytes: int) -> None:
        """Grow to at least ``half_bytes`` per half (collective: every rank calls it with the same size)."""
        if self.fits(half_bytes):
            return
        size = max(MIN_HALF_BYTES, 1 << (half_bytes - 1).bit_length())  # a power of two
        if self._memory is not None:
            self._quiesce()  # no rank may still touch the old buffer when it is freed
        self._memory, self._views = None, {}
        self._memory = self._make(2 * size)
        self.half_bytes, self.parity = size, 0

    def slots(self, peer: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """``peer``'s current half as a ``shape``/``dtype`` tensor (cached view)."""
        key = (peer, tuple(shape), dtype, self.parity)
        view = self._views.get(key)
        if view is None:
            assert self._memory is not None, "Workspace.ensure() must run before slots()"
            view = self._views[key] = self._memory.view(peer, shape, dtype, self.parity * self.half_bytes)
        return view

    def rows(self, peer: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """``peer``'s whole current half as rows of ``width`` ``dtype`` values (cached view): one view per
        width whatever the blocks in it, for layouts that change from call to call (all-to-all routings)."""
        return self.slots(peer, (self.half_bytes // (width * dtype.itemsize), width), dtype)

    def barrier(self) -> None:
        """A device (CUDA) or gloo (CPU) barrier over the group, on the current stream."""
        assert self._memory is not None
        self._memory.barrier()

    def advance(self) -> None:
        """Switch halves: the next call uses the other one."""
        self.parity ^= 1

    def poison(self) -> None:
        """Fill this rank's buffer with 0xFF bytes (NaN in bf16, fp16 and fp32)."""
        if self._memory is not None:
            self._memory.local_bytes().fill_(0xFF)


MIN_HALF_BYTES = 1 << 20
"""Smallest half allocated (1 MiB), so small shapes do not re-rendezvous as they grow."""
