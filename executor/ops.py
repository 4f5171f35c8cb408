"""The public operations: all-gather -> GEMM and GEMM -> reduce-scatter under any schedule.

Each op validates its arguments (``executor.checks``), then either runs the reference (``serial/sm``:
the collective, then one GEMM: ``_..._fallback``) or builds the schedule's plan and hands the pipeline
engine a transport and a one-line GEMM closure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist

from ficco.executor.checks import (
    as_schedule,
    call_key,
    check_all_gather_matmul,
    check_matmul_reduce_scatter,
    check_matrix,
    check_world_size,
    shape_str,
)
from ficco.executor.context import GroupContext, checked_context, get_context, remember_checked
from ficco.executor.pipeline import run_pipeline
from ficco.executor.plan import Plan, Unit, make_plan
from ficco.executor.transport import PeerCopyTransport, PointToPointTransport
from ficco.features.schedule import Schedule

# torch 2.13 renamed the tensor collectives; 2.11 (the GPU image) has only the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    schedule: Schedule | str,
    group: dist.ProcessGroup | None = None,
    *,
    return_gathered: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """All-gather the row shards of A, then ``C = A @ b`` (the ``ag_gemm`` op), as ``schedule`` says.

    Parameters
    ----------
    a_shard : Tensor, shape [m / w, k]
        This rank's rows of A (rank ``r`` holds rows ``[r*m/w, (r+1)*m/w)``); bf16, fp16 or fp32.
    b : Tensor, shape [k, n]
        This rank's weight; same dtype and device as ``a_shard``.
    schedule : Schedule or str
        Any schedule of ``features.candidates()`` for the scenario; ``m / w`` must divide by its splits.
    group : ProcessGroup, optional
        The tensor-parallel group (default: the world). NCCL for CUDA tensors, gloo for CPU tensors.
    return_gathered : bool, default=False
        Also return the gathered ``A [m, k]`` (a new tensor).
    out : Tensor, shape [m, n], optional
        Where to write C; a new tensor when omitted.

    Returns
    -------
    C [m, n], or (C, A) when ``return_gathered``.
    """
    schedule = as_schedule(schedule)
    ctx = _checked_context(
        "ag_gemm", a_shard, b, out, schedule, group, ("a_shard", "[m/world_size, k]"), check_all_gather_matmul
    )
    a_shard = a_shard.contiguous()
    shard_rows, k = a_shard.shape
    w, m = ctx.world_size, shard_rows * ctx.world_size
    c = out if out is not None else a_shard.new_empty((m, b.shape[1]))
    gathered = a_shard.new_empty((m, k)) if return_gathered else None
    if schedule.granularity == "serial" and schedule.executor == "sm":
        dest = gathered if gathered is not None else ctx.buffer("gathered", (w, shard_rows, k), a_shard.dtype)
        _all_gather_matmul_fallback(a_shard, b, ctx.group, dest.view(m, k), c)
    else:
        plan = make_plan("gather", w, schedule.granularity, schedule.splits, schedule.grain)
        dest = gathered.view(w, shard_rows, k) if gathered is not None else None
        transport = _transport(ctx, plan, schedule, source=a_shard, dest_shape=(w, shard_rows, k), dest=dest)

        def consume(rows: torch.Tensor, unit: Unit) -> None:
            torch.mm(rows, b, out=c[transport.split_rows(unit)])

        run_pipeline(plan, transport, consume)
        if gathered is not None:
            slots = gathered.view(w, shard_rows, k)
            if transport.dest.data_ptr() != slots.data_ptr():  # dma: pieces landed in peer memory
                for q in range(w):
                    slots[q].copy_(transport.dest[q])
            slots[ctx.rank].copy_(a_shard)
    return (c, gathered) if return_gathered else c


def matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    schedule: Schedule | str,
    group: dist.ProcessGroup | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``P = a @ b`` on every rank, then the sum over ranks of P's row block of this rank (``gemm_rs``).

    Parameters
    ----------
    a : Tensor, shape [m, k]
        This rank's A (``k`` is its slice of the reduction dimension); bf16, fp16 or fp32.
    b : Tensor, shape [k, n]
        This rank's weight; same dtype and device as ``a``.
    schedule : Schedule or str
        Any schedule of ``features.candidates()``; ``m`` must divide by ``world_size * splits``.
    group : ProcessGroup, optional
        The tensor-parallel group (default: the world).
    out : Tensor, shape [m / w, n], optional
        Where to write the result; a new tensor when omitted.

    Returns
    -------
    Tensor [m / w, n]: rank ``r`` gets ``sum over ranks of P[r*m/w : (r+1)*m/w]``.
    """
    schedule = as_schedule(schedule)
    ctx = _checked_context(
        "gemm_rs", a, b, out, schedule, group, ("a", "[m, k]"), check_matmul_reduce_scatter
    )
    a = a.contiguous()
    m, n, w = a.shape[0], b.shape[1], ctx.world_size
    shard_rows = m // w
    c = out if out is not None else a.new_empty((shard_rows, n))
    partial = ctx.buffer("partial", (m, n), a.dtype)
    if schedule.granularity == "serial" and schedule.executor == "sm":
        _matmul_reduce_scatter_fallback(a, b, ctx.group, partial, c)
        return c
    plan = make_plan("scatter", w, schedule.granularity, schedule.splits, schedule.grain)
    transport = _transport(ctx, plan, schedule, source=partial, dest_shape=(w, shard_rows, n))

    def produce(rows: torch.Tensor, unit: Unit) -> None:
        torch.mm(a[transport.split_rows(unit)], b, out=rows)

    run_pipeline(plan, transport, produce)
    _reduce_into(c, partial.view(w, shard_rows, n)[ctx.rank], transport.received())
    return c


def communicate(
    op: Literal["ag_gemm", "gemm_rs"],
    x: torch.Tensor,
    executor: Literal["sm", "dma"],
    group: dist.ProcessGroup | None = None,
) -> None:
    """Run only the collective of ``op`` (to time communication alone); the result stays internal.

    ``ag_gemm``: all-gather of ``x = A_shard [m/w, k]``. ``gemm_rs``: reduce-scatter of ``x = P [m, n]``
    (the copy-engine version includes the owner's add, as NCCL's reduce-scatter does).
    """
    check_matrix("x", x, "[rows, width]")
    ctx = get_context(group, x.device)
    check_world_size(ctx.world_size)
    if op not in ("ag_gemm", "gemm_rs") or executor not in ("sm", "dma"):
        raise ValueError(
            "communicate needs op in ['ag_gemm', 'gemm_rs'] and executor in ['sm', 'dma']; "
            f"got op={op!r}, executor={executor!r}"
        )
    x = x.contiguous()
    rows, width, w = x.shape[0], x.shape[1], ctx.world_size
    if op == "gemm_rs" and (rows == 0 or rows % w):
        raise ValueError(
            f"x has shape {shape_str(x.shape)}; expected [m, n] with m a positive multiple of {w}"
        )
    scattered = ctx.buffer("scattered", (rows // w, width), x.dtype) if op == "gemm_rs" else None
    if executor == "sm":
        if op == "ag_gemm":
            gathered = ctx.buffer("gathered", (w, rows, width), x.dtype)
            _all_gather_single(gathered.view(w * rows, width), x, group=ctx.group)
        else:
            _reduce_scatter_single(scattered, x, group=ctx.group)
        return
    direction, dest_shape = (
        ("gather", (w, rows, width)) if op == "ag_gemm" else ("scatter", (w, rows // w, width))
    )
    plan = make_plan(direction, w, "serial", 1, "whole")
    transport = _transport(ctx, plan, _SERIAL_DMA, source=x, dest_shape=dest_shape)
    run_pipeline(plan, transport, None)
    if scattered is not None:
        _reduce_into(scattered, x.view(dest_shape)[ctx.rank], transport.received())


def _checked_context(
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    schedule: Schedule,
    group: dist.ProcessGroup | None,
    a_spec: tuple[str, str],
    check: Callable[..., None],
) -> GroupContext:
    """The call's group context; its arguments are checked (``a`` named and shaped as ``a_spec`` says, then
    ``check``) only the first time this call signature is seen (``executor.checks.call_key``)."""
    key = call_key(op, a, b, out, schedule, group)
    ctx = checked_context(key)
    if ctx is None:
        check_matrix(a_spec[0], a, a_spec[1])
        ctx = get_context(group, a.device)
        check(a, b, schedule, ctx.world_size, out)
        remember_checked(key, ctx)
    return ctx


def _all_gather_matmul_fallback(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group: dist.ProcessGroup,
    gathered: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """The reference: the collective all-gather into ``gathered [m, k]``, then one GEMM into ``out``."""
    _all_gather_single(gathered, a_shard, group=group)
    torch.mm(gathered, b, out=out)


def _matmul_reduce_scatter_fallback(
    a: torch.Tensor, b: torch.Tensor, group: dist.ProcessGroup, partial: torch.Tensor, out: torch.Tensor
) -> None:
    """The reference: one GEMM into ``partial [m, n]``, then the collective reduce-scatter into ``out``."""
    torch.mm(a, b, out=partial)
    _reduce_scatter_single(out, partial, group=group)


def _transport(
    ctx: GroupContext,
    plan: Plan,
    schedule: Schedule,
    *,
    source: torch.Tensor,
    dest_shape: tuple[int, int, int],
    dest: torch.Tensor | None = None,
) -> PeerCopyTransport | PointToPointTransport:
    """The schedule's transport, bound to ``source``; ``dest`` (gather, p2p) receives the pieces instead of
    a cached buffer.

    Built once per (executor, priority, plan, destination buffer) and kept in ``ctx.transports``, so a call
    reuses its views and row ranges; the destination is this call's half of the peer memory (dma) or the
    cached ``received`` buffer (sm), so the two halves of the double buffering get one transport each. A
    caller's ``dest`` is new every call: that transport is built for the call and not kept.
    """
    high_priority = schedule.priority == "high"
    if schedule.executor == "dma":
        workspace = ctx.get_workspace(_nbytes(dest_shape, source.dtype), what=f"schedule {schedule}")
        dest = workspace.slots(ctx.rank, dest_shape, source.dtype)
        keep = True
    else:
        keep = dest is None
        if dest is None:
            dest = ctx.buffer("received", dest_shape, source.dtype)
    # By identity: a kept transport holds its plan and dest, so these ids name live objects only (and
    # hashing a plan's nested tuples on every call would cost more than the lookup saves).
    key = (schedule.executor, high_priority, id(plan), id(dest))
    transport = ctx.transports.get(key) if keep else None
    if transport is not None:
        transport.bind(source)
        return transport
    common = {"plan": plan, "rank": ctx.rank, "source": source, "dest": dest}
    if schedule.executor == "dma":
        transport = PeerCopyTransport(
            workspace=workspace, lanes=ctx.get_lanes(plan.lanes, high_priority), **common
        )
    else:
        transport = PointToPointTransport(
            group=ctx.p2p_group(high_priority, what=f"schedule {schedule}"),
            global_ranks=ctx.global_ranks,
            lanes=ctx.get_lanes(1, False),  # only issues NCCL work; NCCL's own stream carries the priority
            **common,
        )
    if keep:
        ctx.transports[key] = transport
    return transport


def _reduce_into(out: torch.Tensor, own: torch.Tensor, received: list[torch.Tensor]) -> None:
    """``out = own + sum(received)``: one kernel on two ranks."""
    torch.add(own, received[0], out=out)
    for part in received[1:]:
        out.add_(part)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel * dtype.itemsize


_SERIAL_DMA = Schedule(granularity="serial", executor="dma")
