"""The two overlapped ops the layers call, behind one small interface.

``PlannedOps`` runs them with ficco's executor under the planner's schedule; a benchmark or a runtime can
pass anything else with the same methods (``OverlapOps``), e.g. PyTorch's async-TP ops, and the layers and
their autograd stay the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from ficco import executor
from ficco.executor.checks import DTYPES
from ficco.executor.ops import all_gather_single
from ficco.runtime.planner import Direction, OpRequest, Planner


class OverlapOps(Protocol):
    """all-gather -> GEMM and GEMM -> reduce-scatter over one tensor-parallel group."""

    world_size: int
    """Ranks in the group."""
    rank: int
    """This process's rank in the group."""

    def all_gather_matmul(
        self, a_shard: torch.Tensor, b: torch.Tensor, request: OpRequest, *, return_gathered: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``A @ b`` with ``A [m, k]`` gathered from the row shards ``a_shard [m/w, k]``; with
        ``return_gathered`` also ``A``."""
        ...

    def matmul_reduce_scatter(self, a: torch.Tensor, b: torch.Tensor, request: OpRequest) -> torch.Tensor:
        """This rank's rows ``[m/w, n]`` of the sum over ranks of ``a [m, k] @ b [k, n]``."""
        ...

    def start_all_gather(self, a_shard: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """Start gathering the row shards ``a_shard [m/w, k]`` into ``[m, k]`` (plain collective); returns
        the destination and ``wait()``, after which the caller's stream sees it (no host wait on GPUs)."""
        ...

    def note(self, layer: str, direction: Direction, what: str) -> None:
        """Record a step that is not an overlapped op (for a decision table); may do nothing."""
        ...


class PlannedOps:
    """The executor's ops under the schedules ``planner`` decides.

    Parameters
    ----------
    planner : Planner
        Decides each op's schedule (its mode says whether the layers run eagerly or in CUDA graphs).
    group : ProcessGroup, optional
        The tensor-parallel group (default: the world); the planner's ranks agree over the same group.
    """

    def __init__(self, planner: Planner, group: dist.ProcessGroup | None = None) -> None:
        if planner.group is not None and group is not None and planner.group is not group:
            raise ValueError("PlannedOps: the planner agrees over another group than the one given")
        self.planner = planner
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_gather_matmul(
        self, a_shard: torch.Tensor, b: torch.Tensor, request: OpRequest, *, return_gathered: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        schedule = self.planner.schedule(request)
        return executor.all_gather_matmul(a_shard, b, schedule, self.group, return_gathered=return_gathered)

    def matmul_reduce_scatter(self, a: torch.Tensor, b: torch.Tensor, request: OpRequest) -> torch.Tensor:
        return executor.matmul_reduce_scatter(a, b, self.planner.schedule(request), self.group)

    def start_all_gather(self, a_shard: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        return start_all_gather_rows(a_shard, self.group, self.world_size)

    def note(self, layer: str, direction: Direction, what: str) -> None:
        self.planner.note(layer, direction, what)

    def prepare(self, requests: list[OpRequest]) -> None:
        """Decide ``requests`` in one batch (a layer's first call at a shape)."""
        self.planner.prepare(requests)


def start_all_gather_rows(
    a_shard: torch.Tensor, group: dist.ProcessGroup | None, world_size: int
) -> tuple[torch.Tensor, Callable[[], None]]:
    """Start ``[m/w, k]`` row shards -> ``[m, k]`` (rank order) with the group's all-gather collective, as
    async work: returns the destination and the work's ``wait`` (on GPUs it makes the caller's stream wait,
    so work issued in between overlaps the gather)."""
    a_shard = a_shard.contiguous()
    out = a_shard.new_empty((a_shard.shape[0] * world_size, a_shard.shape[1]))
    work = all_gather_single(out, a_shard, group=group, async_op=True)
    return out, work.wait


def dtype_name(dtype: torch.dtype) -> str:
    """``features`` name of a torch dtype (``bf16``, ``fp16``, ``fp32``)."""
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported; expected one of {list(DTYPES)}") from None
