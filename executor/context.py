"""Per-(group, device) state cached across calls: ranks, buffers, lanes, peer memory, the high-priority twin
NCCL group, and the transports built over them.

Everything here is made on the first call that needs it (outside CUDA graph memory pools:
``executor.allocation``); a call on the hot path only looks things up. ``clear_buffers`` drops the per-shape
buffers (a sweep calls it between shapes); ``poison_buffers`` fills them with NaN for correctness checks.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ficco.executor.allocation import persistent
from ficco.executor.capture import CaptureError as CaptureError  # re-exported: ficco.executor.CaptureError
from ficco.executor.capture import refuse_capture as refuse_capture
from ficco.executor.experts import RoutedState
from ficco.executor.lanes import CopyStreams, DeviceLanes, InlineLanes
from ficco.executor.peer_memory import HostPeerMemory, SymmetricPeerMemory, Workspace
from ficco.executor.transport import PeerCopyTransport, PointToPointTransport
from ficco.features.routing import Routing

log = logging.getLogger(__name__)

BARRIER_TIMEOUT_MS = 120_000
"""Device barriers of the copy-engine executor give up (and trap, ending the process loudly instead of
hanging) after this long; ``set_barrier_timeout`` changes it for workspaces created afterwards."""


@dataclass(kw_only=True, slots=True)
class GroupContext:
    """What one process knows about one group on one device."""

    group: dist.ProcessGroup
    device: torch.device
    """Where the tensors live (``cuda:<current>`` or ``cpu``)."""
    rank: int
    world_size: int
    global_ranks: list[int]
    """Global rank of each group rank (point-to-point ops address global ranks)."""
    gpu: str = ""
    """The device's name (``torch.cuda.get_device_name``; "" on the CPU): whose rates price a batched call's
    layout (``executor.layout``)."""
    buffers: dict[tuple, torch.Tensor] = field(default_factory=dict)
    """Per-shape scratch buffers, keyed by (name, shape, dtype)."""
    lanes: dict[tuple[int, bool], DeviceLanes | InlineLanes] = field(default_factory=dict)
    """Side streams, keyed by (count, high priority)."""
    workspace: Workspace | None = None
    """Peer memory for the copy-engine executor (created on first use)."""
    p2p_high: dist.ProcessGroup | None = None
    """The twin NCCL group whose internal stream runs at high priority (created on first use)."""
    transports: dict[tuple, PeerCopyTransport | PointToPointTransport] = field(default_factory=dict)
    """Transports over these buffers and peer memory (keyed by ``executor.ops``); dropped with the buffers
    and when the peer memory grows."""
    routed: OrderedDict[Routing, RoutedState] = field(default_factory=OrderedDict)
    """What the MoE ops derived from their last ``ROUTED_MAX`` routings; dropped with the buffers, its
    transports when the peer memory grows."""

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def buffer(self, name: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A cached uninitialised tensor; the same one for the same (name, shape, dtype)."""
        key = (name, tuple(shape), dtype)
        out = self.buffers.get(key)
        if out is None:
            out = self.buffers[key] = persistent(
                self.device, lambda: torch.empty(tuple(shape), dtype=dtype, device=self.device)
            )
            log.debug("buffer %s allocated: shape %s, %s on %s", name, tuple(shape), dtype, self.device)
        return out

    def rows_buffer(self, name: str, width: int, dtype: torch.dtype, rows: int) -> torch.Tensor:
        """A cached uninitialised ``[capacity, width]`` tensor, ``capacity >= rows`` a power of two (grown
        when a call needs more): one per (name, width, dtype) for row counts that change from call to call
        (an all-to-all's), so they do not pile up buffers; callers cut it (``RoutedState.cut``)."""
        key = (name, width, dtype)
        out = self.buffers.get(key)
        if out is None or out.shape[0] < rows:
            capacity = 1 << max(rows - 1, 0).bit_length()
            out = self.buffers[key] = persistent(
                self.device, lambda: torch.empty((capacity, width), dtype=dtype, device=self.device)
            )
            log.debug(
                "buffer %s allocated: %d rows of %d, %s on %s", name, capacity, width, dtype, self.device
            )
        return out

    def get_lanes(self, count: int, high_priority: bool) -> DeviceLanes | InlineLanes:
        """``count`` copy lanes plus a signal lane at the given priority (cached); ``count=0``, and every
        count on the CPU: no side lanes, everything on the caller's stream."""
        key = (count, high_priority and self.is_cuda)
        lanes = self.lanes.get(key)
        if lanes is None:
            lanes = self.lanes[key] = (
                DeviceLanes(self.device, count, high_priority) if self.is_cuda and count else InlineLanes()
            )
        return lanes

    def get_workspace(self, half_bytes: int, what: str = "this call") -> Workspace:
        """This group's peer memory, grown to ``half_bytes`` per half (collective when created or grown;
        :class:`CaptureError` naming ``what`` if that would happen inside CUDA graph capture)."""
        if self.workspace is None:
            self.workspace = Workspace(self._make_peer_memory, self.quiesce)
        if not self.workspace.fits(half_bytes):
            needs = f"grows the peer memory to {half_bytes / 2**20:.1f} MiB per half (a rendezvous)"
            refuse_capture(self.device, what, needs)
            self.transports.clear()  # they view the peer memory that ensure() is about to free
            for state in self.routed.values():
                state.transports.clear()
            self.workspace.ensure(half_bytes)
            log.info("peer memory grown to %.1f MiB per half on %s", half_bytes / 2**20, self.device)
        return self.workspace

    def p2p_group(self, high_priority: bool, what: str = "this call") -> dist.ProcessGroup:
        """The group point-to-point pieces use: on CUDA, ``/hp`` schedules use a twin NCCL group whose
        internal stream runs at high priority, created on first use (:class:`CaptureError` naming ``what`` if
        that first use is inside CUDA graph capture); otherwise ``group`` itself."""
        if not (self.is_cuda and high_priority):
            return self.group
        if self.p2p_high is None:
            refuse_capture(self.device, what, "creates the high-priority NCCL group")
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = True
            self.p2p_high = dist.new_group(
                ranks=self.global_ranks, backend="nccl", pg_options=options, use_local_synchronization=True
            )
            log.info("created the high-priority NCCL group on %s", self.device)
        return self.p2p_high

    def quiesce(self) -> None:
        """Host-side: wait until every rank's device work is done (used off the hot path only)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            dist.barrier(group=self.group, device_ids=[self.device.index])
            torch.cuda.synchronize(self.device)
        else:
            dist.barrier(group=self.group)

    def _make_peer_memory(self, nbytes: int) -> SymmetricPeerMemory | HostPeerMemory:
        if self.is_cuda:
            return SymmetricPeerMemory(nbytes, self.group, self.device, _barrier_timeout_ms)
        return HostPeerMemory(nbytes, self.group, self.global_ranks, self.rank)


_contexts: dict[tuple[str, str], GroupContext] = {}
checked_calls: dict[tuple, object] = {}
"""What each call signature whose checks passed resolved to (``executor.ops``: its group context;
``executor.library``: the schedule it runs and that context), so that a repeated call skips the checks and
lookups. Keys hold everything the checks look at (``executor.ops``: the group; ``library``: its name)."""
CHECKED_MAX = 4096
"""Call signatures remembered at most (a sweep over many shapes starts over when it is full)."""
_barrier_timeout_ms = BARRIER_TIMEOUT_MS
COPY_STREAMS_ENV = "FICCO_COPY_STREAMS"
"""Environment variable naming the copy arrangement (``CopyStreams`` string form) a process starts with."""
DEFAULT_COPY_STREAMS = "1"
"""The copy arrangement when ``FICCO_COPY_STREAMS`` is not set: one side stream that the peers' copies share
in ring order (the fastest at 4 ranks: docs/executor.md, "Copy arrangement")."""


def _copy_streams_from_env() -> CopyStreams:
    text = os.environ.get(COPY_STREAMS_ENV, DEFAULT_COPY_STREAMS)
    try:
        return CopyStreams.parse(text)
    except ValueError as err:
        raise ValueError(f"{COPY_STREAMS_ENV}: {err}") from None


_copy_streams = _copy_streams_from_env()


def set_barrier_timeout(seconds: float) -> None:
    """Device-barrier timeout of the copy-engine executor for workspaces created from now on (0: none)."""
    global _barrier_timeout_ms
    if not seconds >= 0:
        raise ValueError(f"barrier timeout must be a number of seconds >= 0; got {seconds!r}")
    _barrier_timeout_ms = int(seconds * 1000)


def set_copy_streams(streams: CopyStreams | str) -> None:
    """The copy arrangement of copy-engine calls from now on (``CopyStreams`` or its string form, e.g.
    ``"1"``, ``"per_peer"``, ``"0:1;16:per_peer"``); transports built before keep theirs."""
    global _copy_streams
    _copy_streams = streams if isinstance(streams, CopyStreams) else CopyStreams.parse(streams)


def copy_streams() -> CopyStreams:
    """The copy arrangement of copy-engine calls (``set_copy_streams``; at start ``FICCO_COPY_STREAMS``)."""
    return _copy_streams


def get_context(group: dist.ProcessGroup | None, device: torch.device) -> GroupContext:
    """The cached context of ``group`` (None: the default group) on ``device``."""
    if not dist.is_initialized():
        raise ValueError(
            "the executor needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group); none is initialised"
        )
    group = group if group is not None else dist.group.WORLD
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (group.group_name, str(device))
    ctx = _contexts.get(key)
    if ctx is None:
        world_size = dist.get_world_size(group)
        ctx = _contexts[key] = GroupContext(
            group=group,
            device=device,
            rank=dist.get_rank(group),
            world_size=world_size,
            global_ranks=[dist.get_global_rank(group, q) for q in range(world_size)],
            gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        )
    return ctx


def clear_buffers() -> None:
    """Drop every cached per-shape buffer and transport (lanes, groups and peer memory stay)."""
    for ctx in _contexts.values():
        ctx.buffers.clear()
        ctx.transports.clear()
        ctx.routed.clear()


def poison_buffers() -> None:
    """Fill every cached buffer and this rank's peer memory with NaN, for correctness checks (collective
    over each group: quiesces it before and after, so no peer is still reading or writing)."""
    for ctx in _contexts.values():
        ctx.quiesce()
        for buf in ctx.buffers.values():
            buf.fill_(float("nan"))
        if ctx.workspace is not None:
            ctx.workspace.poison()
        ctx.quiesce()


def remember_checked(key: tuple | None, value):
    """Keep ``value`` in :data:`checked_calls` as what the call signature ``key`` resolved to (None: a call
    only the full checks can explain, nothing kept); returns ``value``."""
    if key is not None:
        if len(checked_calls) >= CHECKED_MAX:
            checked_calls.clear()
        checked_calls[key] = value
    return value


def reset() -> None:
    """Forget every context and every checked call signature (after ``destroy_process_group``; tests start a
    new group per world size)."""
    _contexts.clear()
    checked_calls.clear()


@contextlib.contextmanager
def process_group(device: str = "cuda", timeout: timedelta | None = None) -> Iterator[torch.device]:
    """This torchrun rank's default process group and its device, for the ``with`` block.

    ``device="cuda"``: NCCL bound to GPU ``LOCAL_RANK`` (made the current device); ``"cpu"``: gloo.
    ``timeout``: how long a collective waits (torch's default when None). A group that already exists is
    used and left up; one made here is destroyed on exit.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    here = torch.device("cpu")
    if device == "cuda":
        here = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(here)
    if dist.is_initialized():
        yield here
        return
    options = {} if timeout is None else {"timeout": timeout}
    if device == "cuda":
        dist.init_process_group("nccl", device_id=here, **options)
    else:
        dist.init_process_group("gloo", **options)
    try:
        yield here
    finally:
        # drop the contexts (they hold the group and its peer memory) first: left to interpreter exit, gloo's
        # still-joinable threads abort the process ("terminate called without an active exception")
        reset()
        gc.collect()
        dist.destroy_process_group()
