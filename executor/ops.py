"""The public operations: all-gather -> GEMM, GEMM -> reduce-scatter, and the MoE all-to-all -> expert GEMMs
and expert GEMMs -> all-to-all, under any schedule.

Each op validates its arguments (``executor.checks``), then either runs the reference (``serial/sm``: the
collective, then the GEMMs) or builds the schedule's plan and hands the pipeline engine a
transport and a short GEMM closure. ``OP_FUNCTIONS`` maps the names of ``features.OP_SPECS`` to the ops;
``run_op`` and ``communicate`` take an op by name.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.distributed as dist

from ficco.executor.checks import (
    DENSE_CHECKS,
    FIRST_ARGUMENTS,
    as_schedule,
    call_key,
    check_first_argument,
    check_matrix,
    check_routed_matmul,
    check_routing,
    check_world_size,
    shape_str,
)
from ficco.executor.context import (
    GroupContext,
    checked_calls,
    copy_streams,
    get_context,
    refuse_capture,
    remember_checked,
)
from ficco.executor.experts import ExpertGemms, RoutedState, grouped_matmul, routed_state
from ficco.executor.lanes import copy_lanes
from ficco.executor.layout import choose
from ficco.executor.pipeline import run_pipeline
from ficco.executor.plan import Layout, Plan, Unit, make_plan
from ficco.executor.transport import PeerCopyTransport, PointToPointTransport
from ficco.features.ops import OP_SPECS
from ficco.features.routing import Routing
from ficco.features.schedule import Schedule

# torch 2.13 renamed the tensor collectives; 2.11 (the GPU image) has only the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor | Sequence[torch.Tensor],
    schedule: Schedule | str,
    group: dist.ProcessGroup | None = None,
    *,
    return_gathered: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """All-gather the row shards of A, then ``C = A @ b`` (the ``ag_gemm`` op), as ``schedule`` says.

    Parameters
    ----------
    a_shard : Tensor, shape [m / w, k]
        This rank's rows of A (rank ``r`` holds rows ``[r*m/w, (r+1)*m/w)``); bf16, fp16 or fp32.
    b : Tensor, shape [k, n], or a sequence of them
        This rank's weight; same dtype and device as ``a_shard``. A sequence (q/k/v, gate/up): one gather,
        and each piece of A that arrives is multiplied by every weight (each its own ``n``).
    schedule : Schedule or str
        Any schedule of ``features.candidates()`` for the scenario; ``m / w`` must divide by its splits.
    group : ProcessGroup, optional
        The tensor-parallel group (default: the world). NCCL for CUDA tensors, gloo for CPU tensors.
    return_gathered : bool, default=False
        Also return the gathered ``A [m, k]`` (a new tensor).
    out : Tensor, shape [m, n], optional
        Where to write C (a single ``b`` only); a new tensor when omitted.

    Returns
    -------
    C [m, n] (a list of them for a sequence of weights), or (C, A) when ``return_gathered``.
    """
    schedule = as_schedule(schedule)
    bs = (b,) if isinstance(b, torch.Tensor) else tuple(b)
    ctx = _checked_context("ag_gemm", a_shard, bs if len(bs) > 1 else b, out, schedule, group)
    cs, gathered = run_all_gather_matmul(ctx, a_shard, bs, schedule, return_gathered, out)
    c = cs[0] if isinstance(b, torch.Tensor) else cs
    return (c, gathered) if return_gathered else c


def run_all_gather_matmul(
    ctx: GroupContext,
    a_shard: torch.Tensor,
    bs: tuple[torch.Tensor, ...],
    schedule: Schedule,
    return_gathered: bool = False,
    out: torch.Tensor | None = None,
    batch: int = 1,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """:func:`all_gather_matmul` of arguments that passed its checks on ``ctx``: ``([C_i [m, n_i] per weight],
    A [m, k] or None)``. ``batch``: the shards' rows are ``batch`` groups (``[batch, rows/batch, k]``, a
    sequence-parallel shard) and ``C`` and ``A`` come batch-major (``[batch, w * rows/batch, n]``, the gather
    along the sequence), in the layout ``executor.layout.choose`` picks (docs/executor.md, "Batched calls").
    The weights may be of a narrower dtype than ``a_shard`` (what autocast runs): ``A`` is gathered as given
    and each piece of it cast to the weights' dtype before its GEMMs, which write ``C`` in that dtype."""
    a_shard = a_shard.contiguous()
    shard_rows, k = a_shard.shape
    w, m = ctx.world_size, shard_rows * ctx.world_size
    compute = bs[0].dtype
    cs = [out] if out is not None else [a_shard.new_empty((m, one.shape[1]), dtype=compute) for one in bs]
    gathered = a_shard.new_empty((m, k)) if return_gathered else None
    if schedule.granularity == "serial" and schedule.executor == "sm":
        whole = gathered is not None and batch == 1
        dest = gathered if whole else ctx.buffer("gathered", (w, shard_rows, k), a_shard.dtype).view(m, k)
        all_gather_single(dest, a_shard, group=ctx.group)
        _gathered_gemms(ctx, dest, bs, cs, gathered, batch)
        return cs, gathered
    plan = make_plan("gather", w, schedule.granularity, schedule.splits, schedule.grain)
    ns = tuple(b.shape[1] for b in bs)
    layout = "whole" if batch == 1 else choose(plan, shard_rows, batch, ns, k, compute.itemsize, ctx.gpu)
    mixed = a_shard.dtype != compute
    dest = gathered.view(w, shard_rows, k) if gathered is not None and layout == "whole" else None
    transport = _transport(ctx, plan, schedule, source=a_shard, dest_shape=(w, shard_rows, k), dest=dest)
    targets = cs
    if layout == "rank_major":  # the GEMMs write rank-major rows, moved into batch-major order at the end
        targets = [ctx.buffer(f"rank_major_{i}", c.shape, compute) for i, c in enumerate(cs)]

    def consume(rows: torch.Tensor, unit: Unit) -> None:
        if layout == "permuted":  # a serial plan's one unit: every row, rank-major
            _gathered_gemms(ctx, rows, bs, cs, gathered, batch)
            return
        if mixed:
            rows = rows.to(compute)
        block = transport.split_rows(unit)
        if layout == "segmented":
            for piece, place in _batch_segments(block.start, block.stop, shard_rows, w, batch):
                for one, c in zip(bs, cs, strict=True):
                    torch.mm(rows[piece], one, out=c[place])
            return
        for one, c in zip(bs, targets, strict=True):
            torch.mm(rows, one, out=c[block])

    run_pipeline(plan, transport, consume)
    if layout == "rank_major":
        for c, target in zip(cs, targets, strict=True):
            to_batch_major(target, batch, w, out=c)
    if gathered is None or layout == "permuted":
        return cs, gathered
    if batch > 1:  # each rank's contiguous rows to their places along the sequence, in one concatenation
        sources = [a_shard if q == ctx.rank else transport.dest[q] for q in range(w)]
        torch.cat([x.view(batch, -1, k) for x in sources], dim=1, out=gathered.view(batch, -1, k))
        return cs, gathered
    slots = gathered.view(w, shard_rows, k)
    if transport.dest.data_ptr() != slots.data_ptr():  # dma: pieces landed in peer memory
        for q in range(w):
            slots[q].copy_(transport.dest[q])
    slots[ctx.rank].copy_(a_shard)
    return cs, gathered


def _gathered_gemms(
    ctx: GroupContext,
    rows: torch.Tensor,
    bs: tuple[torch.Tensor, ...],
    cs: list[torch.Tensor],
    gathered: torch.Tensor | None,
    batch: int,
) -> None:
    """A serial schedule's GEMMs over the gathered ``rows [m, k]`` (rank-major): with ``batch`` > 1 the rows
    are put in batch-major order first (:func:`to_batch_major`, into ``gathered`` when it is returned: the
    concatenation PyTorch's gather along the sequence makes), then one GEMM per weight over every row, cast
    to the weights' dtype first when it differs (as ``F.linear`` under autocast casts its input)."""
    compute = bs[0].dtype
    a = rows
    if batch > 1:
        a = gathered if gathered is not None else ctx.buffer("permuted", rows.shape, rows.dtype)
        to_batch_major(rows, batch, ctx.world_size, out=a)
    elif gathered is not None and gathered.data_ptr() != rows.data_ptr():
        gathered.copy_(rows)
    if a.dtype != compute:
        a = a.to(compute)
    for one, c in zip(bs, cs, strict=True):
        torch.mm(a, one, out=c)


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
    ctx = _checked_context("gemm_rs", a, b, out, schedule, group)
    return run_matmul_reduce_scatter(ctx, a, b, schedule, out)


def run_matmul_reduce_scatter(
    ctx: GroupContext,
    a: torch.Tensor | tuple[torch.Tensor, ...],
    b: torch.Tensor | tuple[torch.Tensor, ...],
    schedule: Schedule,
    out: torch.Tensor | None = None,
    batch: int = 1,
) -> torch.Tensor:
    """:func:`matmul_reduce_scatter` of arguments that passed its checks on ``ctx``: ``[m / w, n]``. ``a`` and
    ``b`` may be tuples (``a[i] [m, k_i]``, ``b[i] [k_i, n]``): ``sum_i a[i] @ b[i]`` is scattered, the GEMMs
    accumulating in place. ``batch``: ``a [batch, m / batch, k]`` is scattered along the sequence, to this
    rank's ``[batch, m / (w batch), n]``, in the layout ``executor.layout.choose`` picks (docs/executor.md,
    "Batched calls")."""
    a, b = ((a,), (b,)) if isinstance(a, torch.Tensor) else (a, b)
    m, n, w = a[0].shape[0], b[0].shape[1], ctx.world_size
    shard_rows = m // w
    serial = schedule.granularity == "serial"
    layout = "whole" if batch == 1 else "permuted" if serial else "segmented"
    if layout == "segmented":
        plan = make_plan("scatter", w, schedule.granularity, schedule.splits, schedule.grain)
        k = sum(x.shape[1] for x in a)
        layout = choose(plan, shard_rows, batch, (n,), k, a[0].dtype.itemsize, ctx.gpu)
    if layout == "rank_major":  # the rows of each a in rank-major order: one copy, then GEMMs in place
        a = tuple(to_rank_major(x.contiguous(), batch, w) for x in a)
    else:
        a = tuple(x.contiguous() for x in a)
    c = out if out is not None else a[0].new_empty((shard_rows, n))
    partial = ctx.buffer("partial", (m, n), a[0].dtype)

    def produce(rows: torch.Tensor, unit: Unit) -> None:
        if layout == "permuted":  # a serial plan's one unit: the partial of every row, put rank-major
            product = ctx.buffer("partial_batch_major", (m, n), a[0].dtype)
            _matmuls(a, b, slice(None), product)
            to_rank_major(product, batch, w, out=rows)
            return
        block = transport.split_rows(unit) if unit.offset is not None else slice(None)
        if layout == "segmented":
            for piece, place in _batch_segments(block.start, block.stop, shard_rows, w, batch):
                _matmuls(a, b, place, rows[piece])
            return
        _matmuls(a, b, block, rows)

    if serial and schedule.executor == "sm":  # the GEMMs, then the collective
        produce(partial, _EVERY_ROW)
        reduce_scatter_single(c, partial, group=ctx.group)
        return c
    plan = make_plan("scatter", w, schedule.granularity, schedule.splits, schedule.grain)
    transport = _transport(ctx, plan, schedule, source=partial, dest_shape=(w, shard_rows, n))
    run_pipeline(plan, transport, produce)
    _reduce_into(c, transport.own_rows(), transport.received())
    return c


_EVERY_ROW = Unit(offset=None)
"""The unit of a serial plan: every row."""


def _matmuls(
    a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], rows: slice, out: torch.Tensor
) -> None:
    """``out = sum_i a[i][rows] @ b[i]``: one GEMM, the others accumulating into ``out`` (beta 1)."""
    torch.mm(a[0][rows], b[0], out=out)
    for x, y in zip(a[1:], b[1:], strict=True):
        out.addmm_(x[rows], y)


@functools.lru_cache(maxsize=1024)
def _batch_segments(
    start: int, stop: int, shard_rows: int, world_size: int, batch: int
) -> tuple[tuple[slice, slice], ...]:
    """The rows ``[start, stop)`` of a rank-major ``[w, shard_rows]`` block (the executor's order: rank,
    batch, row) as ``(piece, place)`` pairs: ``piece`` relative to ``start``, ``place`` the same rows in the
    batch-major order (batch, rank, row) of ``batch`` groups of ``shard_rows / batch`` rows per rank."""
    per = shard_rows // batch
    out, row = [], start
    while row < stop:
        q, within = divmod(row, shard_rows)
        group, j = divmod(within, per)
        size = min(per - j, stop - row)
        place = (group * world_size + q) * per + j
        out.append((slice(row - start, row - start + size), slice(place, place + size)))
        row += size
    return tuple(out)


def to_batch_major(
    rows: torch.Tensor, batch: int, world_size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``rows [m, k]`` in rank-major order (rank, sequence, row) put in batch-major order (sequence, rank,
    row) into ``out [m, k]`` (a new tensor when omitted): one ``torch.cat`` along the sequence of each
    rank's contiguous ``[batch, m / (w batch), k]`` block, PyTorch's gather along the sequence (the
    functional collective's ``cat(chunk(gathered, w), dim=1)``) with the same kernel."""
    return _swap_blocks(rows, world_size, batch, out)


def to_rank_major(
    rows: torch.Tensor, batch: int, world_size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`to_batch_major`'s inverse: batch-major ``rows [m, k]`` into rank-major ``out [m, k]`` (new when
    omitted), one ``torch.cat`` along the rank's rows of each sequence's contiguous ``[w, m / (w batch), k]``
    block (a concatenation of contiguous pieces, as fast as the gather's, where PyTorch's reduce-scatter
    along the sequence concatenates strided ones)."""
    return _swap_blocks(rows, batch, world_size, out)


def _swap_blocks(rows: torch.Tensor, outer: int, inner: int, out: torch.Tensor | None) -> torch.Tensor:
    """``rows [m, k]`` ordered (outer, inner, row) into ``out [m, k]`` (new when omitted) ordered (inner,
    outer, row): one ``torch.cat`` of the ``outer`` contiguous ``[inner, m / (outer inner), k]`` blocks."""
    m, k = rows.shape
    out = rows.new_empty((m, k)) if out is None else out
    torch.cat(rows.view(outer * inner, -1, k).chunk(outer), dim=1, out=out.view(inner, -1, k))
    return out


def all_to_all_matmul(
    x: torch.Tensor,
    b: torch.Tensor,
    routing: Routing,
    schedule: Schedule | str,
    group: dist.ProcessGroup | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Send the routed rows of ``x`` to their experts' ranks (the MoE dispatch, an all-to-all), then run
    each local expert's GEMM on its rows (the ``a2a_gemm`` op), as ``schedule`` says.

    Parameters
    ----------
    x : Tensor, shape [sum(routing.sent(rank)), k]
        The rows this rank routes (a token once per expert it goes to), by destination rank, then by the
        destination's local expert: ``routing.counts[rank][p][e]`` rows for expert ``e`` of rank ``p``.
        bf16, fp16 or fp32.
    b : Tensor, shape [experts / w, k, n]
        This rank's experts' weights (expert ``e``: ``b[e]``); same dtype and device as ``x``.
    routing : features.Routing
        Rows per (source rank, destination rank, local expert); the same on every rank; blocks may be empty.
    schedule : Schedule or str
        Any schedule (docs/executor.md, "The MoE pair", says what each granularity overlaps).
    group : ProcessGroup, optional
        The expert-parallel group (default: the world). NCCL for CUDA tensors, gloo for CPU tensors.
    out : Tensor, shape [sum(routing.received(rank)), n], optional
        Where to write the result; a new tensor when omitted.

    Returns
    -------
    Tensor [sum(routing.received(rank)), n]: by local expert, then by source rank (each expert's rows
    contiguous); the rows from rank ``q`` for expert ``e`` are ``x_q``'s rows for (this rank, ``e``), in
    ``x_q``'s order, times ``b[e]``.
    """
    schedule = as_schedule(schedule)
    ctx = _checked_context("a2a_gemm", x, b, out, schedule, group, routing)
    x = x.contiguous()
    state = routed_state(ctx.routed, routing, ctx.rank)
    k, received = x.shape[1], sum(routing.received(ctx.rank))
    experts = state.expert_rows
    if schedule.granularity == "serial" and schedule.executor == "sm":
        perm = _permutation(ctx, state, schedule)[0]
        _expert_gemms(ctx, state, schedule, x, b)
        rows = state.cut(ctx.rows_buffer("received", k, x.dtype, received), received)
        expert_major = state.cut(ctx.rows_buffer("expert_rows", k, x.dtype, received), received)
        _all_to_all(rows, x, state.layout("gather", 1), ctx.group)  # by source rank
        torch.index_select(rows, 0, perm, out=expert_major)  # by local expert
        return grouped_matmul(expert_major, b, experts, out)
    y = out if out is not None else x.new_empty((received, b.shape[2]))
    plan = make_plan("gather", ctx.world_size, schedule.granularity, schedule.splits, schedule.grain)
    layout = state.layout("gather", plan.splits)
    transport = _transport(
        ctx, plan, schedule, source=x, dest_shape=(received, k), layout=layout, routed=state
    )
    gemms = _expert_gemms(ctx, state, schedule, x, b, plan, layout)
    weights = _loop_weights(gemms, b, ctx.device)

    def consume(rows: torch.Tensor, unit: Unit) -> None:
        if unit.offset is None:  # every row, source-major: permute, then the experts' GEMMs
            expert_major = state.cut(ctx.rows_buffer("expert_rows", k, x.dtype, received), received)
            torch.index_select(rows, 0, _permutation(ctx, state, schedule)[0], out=expert_major)
            rows = expert_major
        gemms[id(unit)].dispatch(rows, b, y, weights)

    run_pipeline(plan, transport, consume)
    return y


def matmul_all_to_all(
    h: torch.Tensor,
    b: torch.Tensor,
    routing: Routing,
    schedule: Schedule | str,
    group: dist.ProcessGroup | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run each local expert's GEMM on its rows, then send every row back to the rank that routed it (the
    MoE combine, an all-to-all): the ``gemm_a2a`` op, as ``schedule`` says.

    Parameters
    ----------
    h : Tensor, shape [sum(routing.received(rank)), k]
        The rows routed to this rank's experts, in :func:`all_to_all_matmul`'s output order (by local expert,
        then by source rank). bf16, fp16 or fp32.
    b : Tensor, shape [experts / w, k, n]
        This rank's experts' weights; same dtype and device as ``h``.
    routing : features.Routing
        The dispatch's routing (the combine sends its rows back the other way).
    schedule : Schedule or str
        Any schedule (docs/executor.md, "The MoE pair").
    group : ProcessGroup, optional
        The expert-parallel group (default: the world).
    out : Tensor, shape [sum(routing.sent(rank)), n], optional
        Where to write the result; a new tensor when omitted.

    Returns
    -------
    Tensor [sum(routing.sent(rank)), n]: row ``i`` is the expert output of the dispatch's ``x[i]`` on this
    rank (by destination rank, then its local expert, as ``x`` was).
    """
    schedule = as_schedule(schedule)
    ctx = _checked_context("gemm_a2a", h, b, out, schedule, group, routing)
    h = h.contiguous()
    state = routed_state(ctx.routed, routing, ctx.rank)
    received, n = h.shape[0], b.shape[2]
    y = out if out is not None else h.new_empty((sum(routing.sent(ctx.rank)), n))
    experts = state.expert_rows
    # what the all-to-all sends, by destination
    staging = state.cut(ctx.rows_buffer("produced", n, h.dtype, received), received)
    if schedule.granularity == "serial" and schedule.executor == "sm":
        inverse = _permutation(ctx, state, schedule)[1]
        _expert_gemms(ctx, state, schedule, h, b)
        expert_major = grouped_matmul(h, b, experts)
        torch.index_select(expert_major, 0, inverse, out=staging)  # by the rank each row goes back to
        _all_to_all(y, staging, state.layout("scatter", 1), ctx.group)
        return y
    plan = make_plan("scatter", ctx.world_size, schedule.granularity, schedule.splits, schedule.grain)
    layout = state.layout("scatter", plan.splits)
    dma = schedule.executor == "dma"
    transport = _transport(
        ctx,
        plan,
        schedule,
        source=staging,
        dest_shape=(y.shape[0], n),
        dest=None if dma else y,  # sm: receive straight into the result
        bind_dest=not dma,
        layout=layout,
        routed=state,
    )
    gemms = _expert_gemms(ctx, state, schedule, h, b, plan, layout)
    weights = _loop_weights(gemms, b, ctx.device)
    own_source, own_dest = layout.own_block()
    own_out = y[own_dest]  # the own unit covers the whole own block: its GEMMs write here, not to staging

    def produce(rows: torch.Tensor, unit: Unit) -> None:
        if unit.offset is None:  # every row: the experts' GEMMs, then permute to source-major
            expert_major = grouped_matmul(h, b, experts)
            torch.index_select(expert_major, 0, _permutation(ctx, state, schedule)[1], out=rows)
            return
        gemms[id(unit)].combine(h, b, own_out if unit.offset == 0 else rows, weights)

    run_pipeline(plan, transport, produce)
    if plan.units[-1].offset is None:  # serial: the own block is in staging
        own_out.copy_(staging[own_source])
    if dma:  # the peers' blocks landed in peer memory
        for part in (slice(0, own_dest.start), slice(own_dest.stop, y.shape[0])):
            if part.stop > part.start:
                y[part].copy_(transport.flat[part])
    return y


def run_op(
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    schedule: Schedule | str,
    group: dist.ProcessGroup | None = None,
    *,
    routing: Routing | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The op named ``op`` (``features.OP_SPECS``: its shapes and whether it takes a ``routing``)."""
    fn = OP_FUNCTIONS.get(op)
    if fn is None:
        raise ValueError(f"op must be one of {list(OP_FUNCTIONS)}; got {op!r}")
    if OP_SPECS[op].moe:
        return fn(a, b, routing, schedule, group, out=out)
    if routing is not None:
        raise ValueError(f"routing applies only to the MoE ops; op {op!r} takes none")
    return fn(a, b, schedule, group, out=out)


def communicate(
    op: str,
    x: torch.Tensor,
    executor: Literal["sm", "dma"],
    group: dist.ProcessGroup | None = None,
    *,
    routing: Routing | None = None,
    streams: Literal["auto", "current", "per_peer"] = "auto",
) -> None:
    """Run only the collective of ``op`` (to time communication alone); the result stays internal.

    ``ag_gemm``: all-gather of ``x = A_shard [m/w, k]``. ``gemm_rs``: reduce-scatter of ``x = P [m, n]``
    (the copy-engine version includes the owner's add, as NCCL's reduce-scatter does). ``a2a_gemm``: the
    dispatch of ``x [sum(routing.sent(rank)), k]``; ``gemm_a2a``: the combine of ``x [sum(routing.received(
    rank)), n]`` (the copy-engine versions include the copy of the rows a rank keeps, as NCCL's
    ``all_to_all_single`` does).

    ``streams`` (copy engines): ``auto``, as a ``serial/dma`` schedule moves them (``executor.copy_streams``);
    ``per_peer``, one side stream per peer; ``current``, every copy and the barrier on the caller's stream.
    """
    spec = OP_SPECS.get(op)
    if spec is None or executor not in ("sm", "dma") or streams not in ("auto", "current", "per_peer"):
        raise ValueError(
            f"communicate needs op in {list(OP_SPECS)}, executor in ['sm', 'dma'] and streams in ['auto', "
            f"'current', 'per_peer']; got op={op!r}, executor={executor!r}, streams={streams!r}"
        )
    check_matrix("x", x, "[rows, width]")
    ctx = get_context(group, x.device)
    check_world_size(ctx.world_size)
    x = x.contiguous()
    if spec.collective == "all_to_all":
        _communicate_all_to_all(ctx, spec.direction, x, executor, routing, streams)
        return
    if routing is not None:
        raise ValueError(f"routing applies only to the all-to-all ops; op {op!r} takes none")
    rows, width, w = x.shape[0], x.shape[1], ctx.world_size
    reduces = spec.collective == "reduce_scatter"
    if reduces and (rows == 0 or rows % w):
        raise ValueError(
            f"x has shape {shape_str(x.shape)}; expected [m, n] with m a positive multiple of {w}"
        )
    scattered = ctx.buffer("scattered", (rows // w, width), x.dtype) if reduces else None
    if executor == "sm":
        if scattered is None:
            gathered = ctx.buffer("gathered", (w, rows, width), x.dtype)
            all_gather_single(gathered.view(w * rows, width), x, group=ctx.group)
        else:
            reduce_scatter_single(scattered, x, group=ctx.group)
        return
    dest_shape = (w, rows // w, width) if reduces else (w, rows, width)
    plan = make_plan(spec.direction, w, "serial", 1, "whole")
    lanes = _streams_lanes(streams, plan)
    transport = _transport(ctx, plan, _SERIAL_DMA, source=x, dest_shape=dest_shape, lanes=lanes)
    run_pipeline(plan, transport, None)
    if scattered is not None:
        _reduce_into(scattered, x.view(dest_shape)[ctx.rank], transport.received())


def _communicate_all_to_all(
    ctx: GroupContext,
    direction: Literal["gather", "scatter"],
    x: torch.Tensor,
    executor: str,
    routing: object,
    streams: str,
) -> None:
    """:func:`communicate` of the dispatch (``gather``) or the combine (``scatter``) under ``routing``."""
    check_routing(routing, ctx.world_size)
    state = routed_state(ctx.routed, routing, ctx.rank)
    layout = state.layout(direction, 1)
    rows, width = sum(layout.send_rows), x.shape[1]
    if x.shape[0] != rows:
        raise ValueError(
            f"x has shape {shape_str(x.shape)}; the routing has rank {ctx.rank} send {rows} rows in this "
            f"all-to-all: expected [{rows}, width]"
        )
    dest_shape = (sum(layout.recv_rows), width)
    if executor == "sm":
        received = state.cut(ctx.rows_buffer("received", width, x.dtype, dest_shape[0]), dest_shape[0])
        _all_to_all(received, x, layout, ctx.group)
        return
    plan = make_plan(direction, ctx.world_size, "serial", 1, "whole")
    lanes = _streams_lanes(streams, plan)
    transport = _transport(
        ctx, plan, _SERIAL_DMA, source=x, dest_shape=dest_shape, layout=layout, lanes=lanes, routed=state
    )
    transport.keep_own()  # on the caller's stream, beside the copy lanes when there are any
    run_pipeline(plan, transport, None)


def _streams_lanes(streams: str, plan: Plan) -> int | None:
    """The copy lanes of ``communicate``'s ``streams`` (None: the executor's copy arrangement decides)."""
    return {"auto": None, "current": 0, "per_peer": plan.lanes}[streams]


def _checked_context(
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    schedule: Schedule,
    group: dist.ProcessGroup | None,
    routing: Routing | None = None,
) -> GroupContext:
    """The call's group context; its arguments are checked (:func:`_check_call`) only the first time this
    call signature is seen (``executor.checks.call_key``; the MoE ops' routing is part of it)."""
    key = call_key(op, a, b, out, schedule, group, routing)
    ctx = checked_calls.get(key)
    if ctx is None:
        ctx = remember_checked(key, _check_call(op, a, b, out, schedule, group, routing))
    return ctx


def _check_call(
    op: str,
    a: object,
    b: object,
    out: object,
    schedule: Schedule,
    group: dist.ProcessGroup | None,
    routing: object,
) -> GroupContext:
    """Every check of one call of ``op`` (the first argument's first: its device names the context)."""
    check_first_argument(op, a)
    ctx = get_context(group, a.device)
    if op in DENSE_CHECKS:
        DENSE_CHECKS[op](a, b, schedule, ctx.world_size, out)
    else:
        dispatch = op == "a2a_gemm"
        check_routed_matmul(
            FIRST_ARGUMENTS[op][0], a, b, routing, ctx.rank, ctx.world_size, out, dispatch=dispatch
        )
    return ctx


def _all_to_all(out: torch.Tensor, x: torch.Tensor, layout: Layout, group: dist.ProcessGroup) -> None:
    """The collective all-to-all of ``x``'s blocks (one per receiver) into ``out`` (one per sender)."""
    dist.all_to_all_single(out, x, list(layout.recv_rows), list(layout.send_rows), group=group)


def _expert_gemms(
    ctx: GroupContext,
    state: RoutedState,
    schedule: Schedule,
    a: torch.Tensor,
    b: torch.Tensor,
    plan: Plan | None = None,
    layout: Layout | None = None,
) -> dict[int, ExpertGemms]:
    """Each unit's expert GEMMs of ``plan`` over ``layout`` (none without a plan: the reference), with the
    grouped ones' tensors on this device, the whole buffer's included (:class:`CaptureError` naming
    ``schedule`` if they must be made inside CUDA graph capture: a host-to-device copy)."""
    units = state.unit_gemms(plan, layout) if plan is not None else {}
    for gemms in (*units.values(), ExpertGemms.whole(state.expert_rows)):
        if not gemms.ready(ctx.device) and gemms.grouped(a, b):  # once made, no check on the hot path
            refuse_capture(
                ctx.device, f"schedule {schedule}", "copies the expert GEMMs' row offsets to the device"
            )
            gemms.tensors(ctx.device)
    return units


def _loop_weights(
    gemms: dict[int, ExpertGemms], b: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, ...] | None:
    """``b.unbind(0)`` once per call for the blocks that loop over their experts, or None when every block
    has its grouped tensors (unbinding a hundred experts costs tens of microseconds of host time)."""
    return None if all(unit.ready(device) for unit in gemms.values()) else b.unbind(0)


def _permutation(
    ctx: GroupContext, state: RoutedState, schedule: Schedule
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing's row permutation on this device (:class:`CaptureError` if it must be made inside CUDA
    graph capture: it is a host-to-device copy)."""
    if ctx.device not in state.permutations:
        refuse_capture(
            ctx.device, f"schedule {schedule}", "copies the routing's row permutation to the device"
        )
    return state.permutation(ctx.device)


def _transport(
    ctx: GroupContext,
    plan: Plan,
    schedule: Schedule,
    *,
    source: torch.Tensor,
    dest_shape: tuple[int, ...],
    dest: torch.Tensor | None = None,
    bind_dest: bool = False,
    layout: Layout | None = None,
    lanes: int | None = None,
    routed: RoutedState | None = None,
) -> PeerCopyTransport | PointToPointTransport:
    """The schedule's transport, bound to ``source``, kept in ``ctx.transports`` (or the MoE ops' ``routed``
    state) for later calls (docs/executor.md, "Transports": the key). ``dest`` (sm): receive into it instead
    of a cached buffer; with ``bind_dest`` the transport is kept and bound to each call's ``dest``, without
    it built for this call only. ``layout``: where each peer's block lies (default: the shards of
    ``dest_shape = [w, R, width]``); a routed layout's destination is a grow-only buffer of rows (dma: this
    half of the peer memory) cut to ``dest_shape`` by ``routed.cut`` (the same view every call with the
    routing). ``lanes``: copy lanes (dma; default: ``lanes.copy_lanes`` of the copy arrangement; 0:
    everything on the caller's stream)."""
    high_priority = schedule.priority == "high"
    rows, width = dest_shape[0], dest_shape[-1]
    arrangement = copy_streams() if schedule.executor == "dma" and lanes is None else None
    if schedule.executor == "dma":
        needed = (max(layout.dest_rows), width) if layout is not None else dest_shape
        workspace = ctx.get_workspace(math.prod(needed) * source.dtype.itemsize, what=f"schedule {schedule}")
        if layout is None:
            dest = workspace.slots(ctx.rank, dest_shape, source.dtype)
        else:
            dest = routed.cut(workspace.rows(ctx.rank, width, source.dtype), rows)
        keep = True
    else:
        keep = dest is None or bind_dest
        if dest is None and layout is None:
            dest = ctx.buffer("received", dest_shape, source.dtype)
        elif dest is None:
            dest = routed.cut(ctx.rows_buffer("received", width, source.dtype, rows), rows)
    cache = ctx.transports if routed is None else routed.transports
    # By identity: a kept transport holds its plan, layout and dest, so these ids name live objects only
    # (and hashing a plan's nested tuples on every call would cost more than the lookup saves). A
    # destination bound anew every call is not part of the key.
    key = (
        schedule.executor,
        high_priority,
        id(plan),
        "bound" if bind_dest else id(dest),
        id(layout),
        lanes,
        arrangement,
    )
    transport = cache.get(key) if keep else None
    if transport is not None:
        transport.bind(source, dest if bind_dest else None)
        return transport
    common = {"plan": plan, "rank": ctx.rank, "source": source, "dest": dest, "layout": layout}
    if schedule.executor == "dma":
        if lanes is None:
            piece = _piece_bytes(plan, dest_shape, layout, source.dtype)
            lanes = copy_lanes(arrangement, plan.lanes, piece, overlaps=len(plan.units) > 1)
        lanes_of_call = ctx.get_lanes(lanes, high_priority)
        transport = PeerCopyTransport(workspace=workspace, lanes=lanes_of_call, **common)
    else:
        transport = PointToPointTransport(
            group=ctx.p2p_group(high_priority, what=f"schedule {schedule}"),
            global_ranks=ctx.global_ranks,
            lanes=ctx.get_lanes(1, False),  # only issues NCCL work; NCCL's own stream carries the priority
            **common,
        )
    if keep:
        cache[key] = transport
    return transport


def _piece_bytes(plan: Plan, dest_shape: tuple[int, ...], layout: Layout | None, dtype: torch.dtype) -> int:
    """Bytes of the largest piece a call of ``plan`` moves: a sub-chunk of a shard (``dest_shape`` ``[w, R,
    width]``) or of the largest block a routed ``layout`` sends."""
    block = max(layout.send_rows) if layout is not None else dest_shape[1]
    return -(-block // plan.splits) * dest_shape[-1] * dtype.itemsize


def _reduce_into(out: torch.Tensor, own: torch.Tensor, received: list[torch.Tensor]) -> None:
    """``out = own + sum(received)``: one kernel on two ranks."""
    torch.add(own, received[0], out=out)
    for part in received[1:]:
        out.add_(part)


_SERIAL_DMA = Schedule(granularity="serial", executor="dma")

OP_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "ag_gemm": all_gather_matmul,
    "gemm_rs": matmul_reduce_scatter,
    "a2a_gemm": all_to_all_matmul,
    "gemm_a2a": matmul_all_to_all,
}
"""The op of each name of ``features.OP_SPECS`` (its ``executor_fn``)."""
