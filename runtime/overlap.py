"""The two overlapped ops the layers call, behind one small interface.

``PlannedOps`` runs them as ``torch.ops.ficco`` custom ops (``executor.library``) under the planner's
schedules: their autograd is registered on the ops, so the layers' forward and backward trace into one
graph under ``torch.compile``. Any other implementation with the same methods (``OverlapOps``) may stand in;
one that computes only the forward values (``ForwardOps``, e.g. PyTorch's async-TP ops, which have no
autograd) gets the same backward derivation through :class:`DifferentiableOps`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from ficco.executor import library  # noqa: F401 (registers torch.ops.ficco)
from ficco.executor.checks import DTYPES
from ficco.executor.ops import all_gather_single
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


class ForwardOps(Protocol):
    """The forward values of the pair alone, on 2-D row shards (no autograd): what :class:`DifferentiableOps`
    wraps."""

    world_size: int
    rank: int

    def all_gather_matmul(
        self, a_shard: torch.Tensor, b: torch.Tensor, request: OpRequest | None, *, return_gathered: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``A @ b`` with ``A [m, k]`` gathered from ``a_shard [m/w, k]``; with ``return_gathered`` also A."""
        ...

    def matmul_reduce_scatter(
        self, a: torch.Tensor, b: torch.Tensor, request: OpRequest | None
    ) -> torch.Tensor:
        """This rank's rows ``[m/w, n]`` of the sum over ranks of ``a [m, k] @ b [k, n]``."""
        ...

    def start_all_gather(self, a_shard: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """Start gathering ``a_shard [m/w, k]`` into ``[m, k]``; returns it and ``wait()``."""
        ...


class DifferentiableOps(OverlapOps):
    """:class:`OverlapOps` over forward-only ops (``ForwardOps``), with the backward the ficco ops register
    (``executor.library``: each op's input gradient is the other op on the transposed weight; the weight
    gradient multiplies the gathered input, kept or gathered again beside that op). For implementations
    other than ficco's, such as PyTorch's async-TP ops in ``benchmarks/block_bench.py``."""

    def __init__(self, ops: ForwardOps) -> None:
        self.ops = ops
        self.world_size, self.rank = ops.world_size, ops.rank

    def all_gather_matmul(self, a_shard, bs, request, backward_request, *, return_gathered):
        (b,) = bs
        if not (torch.is_grad_enabled() and (a_shard.requires_grad or b.requires_grad)):
            out = self.ops.all_gather_matmul(a_shard, b, request, return_gathered=return_gathered)
            return (out[1], [out[0]]) if return_gathered else (a_shard.new_empty(0), [out])
        y, a = _ColumnFn.apply(a_shard, b, self.ops, request, backward_request, return_gathered)
        return a, [y]

    def matmul_reduce_scatter(self, a, b, request, backward_request):
        if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
            return self.ops.matmul_reduce_scatter(a, b, request)
        return _RowFn.apply(a, b, self.ops, request, backward_request)

    def note(self, layer: str, direction: Direction, what: str) -> None:
        note = getattr(self.ops, "note", None)
        if note is not None:
            note(layer, direction, what)


class _ColumnFn(torch.autograd.Function):
    """all-gather -> GEMM forward; backward GEMM -> reduce-scatter (input) and a GEMM (weight)."""

    @staticmethod
    def forward(ctx, a_shard, b, ops, request, backward_request, keep):
        if keep:
            y, a = ops.all_gather_matmul(a_shard, b, request, return_gathered=True)
        else:
            y, a = ops.all_gather_matmul(a_shard, b, request, return_gathered=False), a_shard.new_empty(0)
        ctx.save_for_backward(a if keep else a_shard, b)
        ctx.ops, ctx.backward_request, ctx.keep = ops, backward_request, keep
        ctx.mark_non_differentiable(a)
        return y, a

    @staticmethod
    def backward(ctx, grad_y, _grad_a):
        saved, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        grad_y = grad_y.contiguous()
        a, wait = saved, None
        if need_b and not ctx.keep:  # started before the input gradient's op, waited for after it
            a, wait = ctx.ops.start_all_gather(saved)
        grad_a = ctx.ops.matmul_reduce_scatter(grad_y, b.t(), ctx.backward_request) if need_a else None
        grad_b = None
        if need_b:
            if wait is not None:
                wait()
            grad_b = a.t() @ grad_y
        return grad_a, grad_b, None, None, None, None


class _RowFn(torch.autograd.Function):
    """GEMM -> reduce-scatter forward; backward all-gather -> GEMM (input), whose gathered gradient also
    feeds the weight's GEMM."""

    @staticmethod
    def forward(ctx, a, b, ops, request, backward_request):
        ctx.save_for_backward(a, b)
        ctx.ops, ctx.backward_request = ops, backward_request
        return ops.matmul_reduce_scatter(a, b, request)

    @staticmethod
    def backward(ctx, grad_shard):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        grad_shard = grad_shard.contiguous()
        if not need_b:
            grad_a = ctx.ops.all_gather_matmul(grad_shard, b.t(), ctx.backward_request, return_gathered=False)
            return (grad_a if need_a else None), None, None, None, None
        grad_a, grad = ctx.ops.all_gather_matmul(
            grad_shard, b.t(), ctx.backward_request, return_gathered=True
        )
        return (grad_a if need_a else None), a.t() @ grad, None, None, None


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


def request_pair(
    op: str, *, m: int, n: int, k: int, dtype: str, world_size: int, layer: str
) -> tuple[OpRequest, OpRequest]:
    """The requests of ``op`` (``ag_gemm`` or ``gemm_rs``) on ``[m, k] @ [k, n]`` and of its input
    gradient's op: the other op of the pair, on the transposed weight (``n`` and ``k`` swapped)."""
    back = "gemm_rs" if op == "ag_gemm" else "ag_gemm"
    common = {"layer": layer, "m": m, "dtype": dtype, "world_size": world_size}
    return (
        OpRequest(direction="fwd", op=op, n=n, k=k, **common),
        OpRequest(direction="bwd-input", op=back, n=k, k=n, **common),
    )


def backward_follows(*tensors: torch.Tensor) -> bool:
    """Whether autograd records a call on ``tensors`` for a backward (then the gradient's op is planned
    too)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
