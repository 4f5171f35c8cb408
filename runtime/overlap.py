"""The two overlapped ops the layers call, behind one small interface.

``PlannedOps`` runs them as ``torch.ops.ficco`` custom ops under the planner's schedules (their autograd is
registered on the ops, so a layer's forward and backward trace into one ``torch.compile`` graph); any other
differentiable implementation of ``OverlapOps`` may stand in.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

from ficco.executor import library  # noqa: F401 (registers torch.ops.ficco)
from ficco.executor.checks import DTYPES
from ficco.runtime.planner import Direction, OpRequest, Schedules, as_planner


class OverlapOps(Protocol):
    """all-gather -> GEMM and GEMM -> reduce-scatter over one tensor-parallel group, differentiable (their
    backward runs the other op of the pair under ``backward_request``'s schedule)."""

    world_size: int
    """Ranks in the group."""
    rank: int
    """This process's rank in the group."""

    def all_gather_matmul(
        self,
        a_shard: torch.Tensor,
        bs: list[torch.Tensor],
        request: OpRequest,
        backward_request: OpRequest | None,
        *,
        return_gathered: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(A, [A @ b for b in bs])`` with ``A [m, k]`` gathered from the row shards ``a_shard [m/w, k]``
        (``A`` an empty tensor unless ``return_gathered``)."""
        ...

    def matmul_reduce_scatter(
        self, a: torch.Tensor, b: torch.Tensor, request: OpRequest, backward_request: OpRequest | None
    ) -> torch.Tensor:
        """This rank's rows ``[m/w, n]`` of the sum over ranks of ``a [m, k] @ b [k, n]``."""
        ...

    def note(self, layer: str, direction: Direction, what: str) -> None:
        """Record a step that is not an overlapped op (for a decision table); may do nothing."""
        ...


class PlannedOps(OverlapOps):
    """The ficco ops under the schedules a planner decides (the methods' types are :class:`OverlapOps`'s).

    Parameters
    ----------
    schedules : Planner, ScheduleSource, Schedule, str, callable or None, default=None
        Where each op's schedule comes from, as ``runtime.as_planner`` takes it (a planner's mode says
        whether the layers run eagerly or in CUDA graphs; None: this machine's measured model).
    group : ProcessGroup, optional
        The tensor-parallel group (default: the world); the planner's ranks agree over the same group.
    """

    def __init__(self, schedules: Schedules = None, group: dist.ProcessGroup | None = None) -> None:
        planner = as_planner(schedules, group=group)
        if planner.group is not None and group is not None and planner.group is not group:
            raise ValueError("PlannedOps: the planner agrees over another group than the one given")
        self.planner = planner
        self.group = group
        self.group_name = (group if group is not None else dist.group.WORLD).group_name
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_gather_matmul(self, a_shard, bs, request, backward_request, *, return_gathered):
        schedule, backward = self.schedules(request, backward_request)
        return torch.ops.ficco.all_gather_matmul(
            a_shard, bs, 0, self.group_name, schedule, return_gathered, backward
        )

    def matmul_reduce_scatter(self, a, b, request, backward_request):
        schedule, backward = self.schedules(request, backward_request)
        return torch.ops.ficco.matmul_reduce_scatter(a, b, "sum", 0, self.group_name, schedule, backward)

    def schedules(self, request: OpRequest, backward_request: OpRequest | None) -> tuple[str, str]:
        """The schedule strings of an op and of its backward's op ("" when it has none)."""
        backward = "" if backward_request is None else str(self.planner.schedule(backward_request))
        return str(self.planner.schedule(request)), backward

    def note(self, layer: str, direction: Direction, what: str) -> None:
        self.planner.note(layer, direction, what)

    def prepare(self, requests: list[OpRequest]) -> None:
        """Decide ``requests`` in one batch (a layer's first call at a shape)."""
        self.planner.prepare(requests)


def gemm_dtype(*tensors: torch.Tensor) -> torch.dtype | None:
    """The dtype ``F.linear`` multiplies ``tensors`` in: under ``torch.autocast`` of their device the
    region's for every floating tensor but fp64 (autocast's rule), else their own; None where they differ
    (``F.linear`` refuses them)."""
    device = tensors[0].device.type
    cast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    dtypes = {
        cast if cast is not None and t.is_floating_point() and t.dtype != torch.float64 else t.dtype
        for t in tensors
    }
    return dtypes.pop() if len(dtypes) == 1 else None


def dtype_name(dtype: torch.dtype) -> str:
    """``features`` name of a torch dtype (``bf16``, ``fp16``, ``fp32``)."""
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported; expected one of {list(DTYPES)}") from None


def request_pair(
    op: str, *, m: int, n: int, k: int, dtype: str, world_size: int, layer: str, batch: int = 1
) -> tuple[OpRequest, OpRequest]:
    """The requests of ``op`` (``ag_gemm`` or ``gemm_rs``) on ``[m, k] @ [k, n]`` (rows of ``batch``
    sequences) and of its input gradient's op: the other op of the pair, on the transposed weight (``n``
    and ``k`` swapped)."""
    back = "gemm_rs" if op == "ag_gemm" else "ag_gemm"
    common = {"layer": layer, "m": m, "dtype": dtype, "world_size": world_size, "batch": batch}
    return (
        OpRequest(direction="fwd", op=op, n=n, k=k, **common),
        OpRequest(direction="bwd-input", op=back, n=k, k=n, **common),
    )


def backward_follows(*tensors: torch.Tensor) -> bool:
    """Whether autograd records a call on ``tensors`` for a backward (then the gradient's op is planned
    too)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
