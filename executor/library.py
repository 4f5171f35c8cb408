"""The executor's ops as PyTorch custom ops (``torch.ops.ficco``), with fake kernels and autograd: what
torch.compile, CUDA graphs and DTensor plans call. They mirror PyTorch's
``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, plus the schedule::

    all_gather_matmul(Tensor a_shard, Tensor[] bs, int gather_dim, str group_name, str schedule,
                      bool return_a=False, str backward_schedule="") -> (Tensor, Tensor[])
    matmul_reduce_scatter(Tensor a, Tensor b, str reduce_op, int scatter_dim, str group_name,
                          str schedule, str backward_schedule="") -> Tensor
    matmuls_reduce_scatter(Tensor[] a, Tensor[] b, ...the same...) -> Tensor  # sum_i a[i] @ b[i]
    all_to_all_matmul(Tensor x, Tensor b, int[] counts, str group_name, str schedule,
                      str backward_schedule="") -> Tensor  # dispatch, then expert GEMMs
    matmul_all_to_all(Tensor h, Tensor b, int[] counts, ...the same...) -> Tensor  # expert GEMMs, combine

``schedule`` is a schedule string or a token-range table (``features.ScheduleTable``); ``counts`` is
``features.Routing.counts`` flattened. Each op has a twin without autograd, ``torch.ops.ficco._<name>``. A
schedule that cannot run at a shape runs ``serial/sm`` with one :class:`ScheduleFallbackWarning`;
:func:`run_report` says what ran. Layouts, gradients and the dispatch path: docs/runtimes.md ("The ops")
and docs/executor.md ("Custom ops").
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import _resolve_process_group

from ficco.executor.checks import (
    DENSE_CHECKS,
    DTYPES,
    check_first_argument,
    shape_str,
)
from ficco.executor.context import GroupContext, checked_calls, get_context, remember_checked
from ficco.executor.experts import routed_state
from ficco.executor.ops import OP_FUNCTIONS, rank_major
from ficco.executor.ops import run_all_gather_matmul as _run_all_gather_matmul
from ficco.executor.ops import run_matmul_reduce_scatter as _run_matmul_reduce_scatter
from ficco.features.routing import Routing
from ficco.features.schedule import SERIAL, Schedule, parse_schedule_table

# torch 2.13 renamed the functional collectives; 2.11 (the GPU image) has only the old names.
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor

REDUCE_OPS: tuple[str, ...] = ("sum",)
"""``reduce_op`` values ``matmul_reduce_scatter`` takes (the executor sums)."""


class ScheduleFallbackWarning(RuntimeWarning):
    """A ficco op ran ``serial/sm`` instead of the schedule it was given (the message says why)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpRun:
    """What one op ran at one shape (``features.Scenario`` conventions), against what it was asked."""

    op: str
    """The op's ``features.OP_SPECS`` name (``ag_gemm``, ``gemm_rs``, ``a2a_gemm``, ``gemm_a2a``)."""
    m: int
    """Gathered (ag_gemm) or full (gemm_rs) rows, batch included; the MoE ops: rows routed over the group."""
    n: int
    """Output columns (the weights' together for several weights)."""
    k: int
    dtype: str
    """``bf16``, ``fp16`` or ``fp32``."""
    world_size: int
    asked: str
    """The schedule or table string the op was given."""
    ran: str
    reason: str | None = None
    """Why ``ran`` is not the schedule ``asked`` gives at ``m``; None when it is."""


_runs: dict[tuple, OpRun] = {}
"""(op, m, n, k, dtype, world_size, asked) -> what ran, in first-run order."""


def run_report() -> list[OpRun]:
    """Every (op, shape, schedule asked) run in this process so far, with what ran, in first-run order."""
    return list(_runs.values())


def ran(op: str, m: int, n: int, k: int, dtype: str, world_size: int, asked: str) -> OpRun | None:
    """What ``op`` ran at this shape when asked ``asked``; None when it has not run so."""
    return _runs.get((op, m, n, k, dtype, world_size, asked))


def clear_run_report() -> None:
    """Forget what ran (and the checked call signatures: the next call of each decides again)."""
    _runs.clear()
    checked_calls.clear()


_LIB = torch.library.Library("ficco", "DEF")
"""The ``ficco`` operator namespace: the ops' schemas and kernels, fake kernels and autograd formulas."""


def _define(kernel, name: str | None = None):
    """Define ``ficco::<name>`` (default: the kernel's name) with the schema ``kernel``'s annotations give,
    and register ``kernel``, wrapped in ``torch.compiler.disable``, for every device with ``Library.impl``
    (no ``custom_op`` wrapper per call: docs/executor.md, "Custom ops"). Returns ``torch.ops.ficco.<name>``.
    """
    name = name or kernel.__name__
    schema = torch.library.infer_schema(kernel, mutates_args=())
    _LIB.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    _LIB.impl(name, torch.compiler.disable(kernel), "CompositeExplicitAutograd")
    return getattr(torch.ops.ficco, name)


class _OpFunction(torch.autograd.Function):
    """A ficco op with its gradients: ``apply`` takes ``flatten(*the op's arguments)`` (default: the same
    arguments) and ``unflatten`` gives the op's outputs from its (default: the same outputs)."""

    @staticmethod
    def flatten(*args) -> tuple:
        return args

    @staticmethod
    def unflatten(outputs):
        return outputs


def _define_pair(kernel, fake, function: type[_OpFunction], autocast=None):
    """Define ``ficco::<name>`` (``kernel``'s name) and its twin without autograd ``ficco::_<name>`` with
    :func:`_define`; ``fake`` is the twin's fake kernel. The public op's autograd kernel (also its
    ``CompositeImplicitAutograd`` decomposition) runs ``function`` when a tensor argument requires grad under
    grad mode, else the twin (docs/executor.md, "Custom ops"). Both follow ``torch.autocast``, casting their
    arguments with ``autocast(args, dtype, device_type)`` (default: every floating tensor, :func:`_autocast`).
    Returns the public op."""
    autocast = autocast or _autocast
    name = kernel.__name__
    twin = _define(kernel, "_" + name)
    torch.library.register_fake(f"ficco::_{name}", fake, lib=_LIB)
    public = _define(kernel)
    # the dispatcher leaves out trailing arguments equal to their defaults; the Function takes every one
    defaults = tuple(p.default for p in inspect.signature(kernel).parameters.values())

    def composite(*args):
        if torch.is_grad_enabled():
            flat = function.flatten(*args, *defaults[len(args) :])
            if any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat):
                return function.unflatten(function.apply(*flat))
        return twin(*args)

    for key in ("Autograd", "CompositeImplicitAutograd"):
        _LIB.impl(name, torch.compiler.disable(composite), key)
    for op_name in (name, "_" + name):
        _register_autocast(op_name, autocast)
    return public


AUTOCAST_DEVICES: tuple[str, ...] = ("cpu", "cuda")
"""Device types whose ``torch.autocast`` the ops follow."""


def _register_autocast(name: str, cast) -> None:
    """Run ``ficco::<name>`` under ``torch.autocast`` as ``F.linear`` runs: its floating tensors (but
    fp64) of the region's device cast to the region's dtype by ``cast(args, dtype, device_type)``, then the
    op with autocast off. ``torch.library.register_autocast``'s dispatch (a kernel on the ``Autocast<device>``
    key, and a Python kernel for tracing), with the dtype read from the region
    (``torch.get_autocast_dtype``) rather than fixed at registration."""
    op = getattr(torch.ops.ficco, name).default
    for device_type in AUTOCAST_DEVICES:
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

        def kernel(*args, device_type=device_type, excluded=excluded):
            dtype = torch.get_autocast_dtype(device_type)
            with torch._C._ExcludeDispatchKeyGuard(excluded):
                return op(*cast(args, dtype, device_type))

        op.py_impl(getattr(torch._C.DispatchKey, key))(kernel)
        _LIB.impl(name, lambda _keys, *args, kernel=kernel: kernel(*args), key, with_keyset=True)


def _autocast(x, dtype: torch.dtype, device_type: str):
    """``x`` (a tensor, or a list or tuple of them, or anything else) with every floating tensor of
    ``device_type`` but fp64 cast to ``dtype``: autocast's rule for ``F.linear``'s arguments."""
    if isinstance(x, torch.Tensor):
        eligible = x.is_floating_point() and x.device.type == device_type and x.dtype != torch.float64
        return x.to(dtype) if eligible and x.dtype != dtype else x
    if isinstance(x, list | tuple):
        return type(x)(_autocast(t, dtype, device_type) for t in x)
    return x


def all_gather_matmul(
    a_shard: torch.Tensor,
    bs: list[torch.Tensor],
    gather_dim: int,
    group_name: str,
    schedule: str,
    return_a: bool = False,
    backward_schedule: str = "",
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """See the module docstring; ``a_shard`` gathered along ``gather_dim``, times each of ``bs``."""
    key = ("ag_gemm", group_name, schedule, gather_dim, a_shard.shape, a_shard.dtype, a_shard.device)
    if len(bs) == 1:
        key += (bs[0].shape, bs[0].dtype, bs[0].device)
    else:
        key += tuple((b.shape, b.dtype, b.device) for b in bs)
    hit = checked_calls.get(key)
    if hit is None:
        _check_dim("gather_dim", gather_dim, a_shard.dim())
        hit = _resolve(key, "ag_gemm", _rows(a_shard), tuple(bs), schedule, group_name)
    run, ctx = hit
    rows = _rows(a_shard)
    dim = gather_dim % a_shard.dim()
    batch = math.prod(a_shard.shape[:dim])
    cs, gathered = _run_all_gather_matmul(ctx, rows, bs, run, return_a, batch=batch)
    full = _gathered_shape(a_shard.shape, dim, ctx.world_size)
    cs = [c.view(*full[:-1], c.shape[1]) for c in cs]
    return (gathered.view(full) if return_a else a_shard.new_empty(0)), cs


def _all_gather_matmul_fake(
    a_shard, bs, gather_dim, group_name, schedule, return_a=False, backward_schedule=""
):
    w = _resolve_process_group(group_name).size()
    gather_dim = _check_dim("gather_dim", gather_dim, a_shard.dim())
    full = _gathered_shape(a_shard.shape, gather_dim, w)
    cs = [a_shard.new_empty((*full[:-1], b.shape[1]), dtype=b.dtype) for b in bs]
    a = a_shard.new_empty(full) if return_a else a_shard.new_empty(0)
    return a, cs


class _AllGatherMatmul(_OpFunction):
    """``all_gather_matmul`` with its gradients: ``apply(a_shard, gather_dim, group_name, schedule,
    return_a, backward_schedule, *bs) -> (A, *C)`` (a Function takes and returns tensors, not lists)."""

    @staticmethod
    def flatten(a_shard, bs, gather_dim, group_name, schedule, return_a, backward_schedule) -> tuple:
        return (a_shard, gather_dim, group_name, schedule, return_a, backward_schedule, *bs)

    @staticmethod
    def unflatten(outputs: tuple) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return outputs[0], list(outputs[1:])

    @staticmethod
    def forward(a_shard, gather_dim, group_name, schedule, return_a, backward_schedule, *bs):
        args = (a_shard, list(bs), gather_dim, group_name, schedule, return_a, backward_schedule)
        a, cs = torch.ops.ficco._all_gather_matmul.default(*args)
        return (a, *cs)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        a_shard, gather_dim, group_name, schedule, return_a, backward_schedule, *bs = inputs
        ctx.gather_dim = _check_dim("gather_dim", gather_dim, a_shard.dim())
        ctx.group_name, ctx.return_a = group_name, return_a
        ctx.schedules = (backward_schedule or schedule, schedule)
        # an output nothing used gets None, not zeros: a gathered A kept only for the weights' gradients must
        # not cost a reduce-scatter of zeros
        ctx.set_materialize_grads(False)
        # the weights' gradients multiply the gathered input: kept when the forward returned it, else
        # gathered again in the backward from the shard
        ctx.save_for_backward(output[0] if return_a else a_shard, *bs)

    @staticmethod
    def backward(ctx, grad_a, *grad_cs):
        saved, *bs = ctx.saved_tensors
        dim, group_name = ctx.gather_dim, ctx.group_name
        need_a, need_bs = ctx.needs_input_grad[0], ctx.needs_input_grad[_AG_FIXED_ARGS:]
        need_b = any(need_bs)
        gathered = saved
        if need_b and not ctx.return_a:  # started before the input gradient's op, waited for after it
            gathered = _gather_along(saved, dim, group_name)
        grad_shard = None
        if need_a:  # sum over the weights of grad_C_i @ b_i^T as one op, the GEMMs accumulating in place
            live = [(g, b.t()) for g, b in zip(grad_cs, bs, strict=True) if g is not None]
            scatter = ("sum", dim, group_name, *ctx.schedules)
            parts = []
            if len(live) == 1:
                parts.append(torch.ops.ficco.matmul_reduce_scatter(*live[0], *scatter))
            elif live:
                gs, bts = [g for g, _ in live], [bt for _, bt in live]
                parts.append(torch.ops.ficco.matmuls_reduce_scatter(gs, bts, *scatter))
            if ctx.return_a and grad_a is not None and grad_a.numel():  # the gathered input's own use
                parts.append(_reduce_scatter(grad_a.contiguous(), "sum", dim, group_name))
            grad_shard = sum(parts[1:], parts[0]) if parts else None
        grad_bs = [None] * len(bs)
        if need_b:
            a_rows = _rows(gathered)
            if a_rows.dtype != bs[0].dtype:  # gathered as given, multiplied in the weights' dtype (autocast)
                a_rows = a_rows.to(bs[0].dtype)
            grad_bs = [
                _weight_grad(a_rows, g, b) if g is not None and need else None
                for g, b, need in zip(grad_cs, bs, need_bs, strict=True)
            ]
        return (grad_shard, *(None,) * (_AG_FIXED_ARGS - 1), *grad_bs)


_AG_FIXED_ARGS = 6
"""``_AllGatherMatmul.apply``'s arguments before the weights."""


def _all_gather_autocast(args: tuple, dtype: torch.dtype, device_type: str) -> tuple:
    """``all_gather_matmul``'s arguments under autocast: the weights cast, as ``F.linear`` casts them; the
    shard cast too unless the op returns the gathered input, which is then gathered in its own dtype (as a
    gather beside ``F.linear`` returns it) and cast piece by piece for the GEMMs."""
    a_shard, bs, *rest = args
    return_a = len(rest) > 3 and rest[3]
    a_shard = a_shard if return_a else _autocast(a_shard, dtype, device_type)
    return (a_shard, _autocast(bs, dtype, device_type), *rest)


all_gather_matmul = _define_pair(
    all_gather_matmul, _all_gather_matmul_fake, _AllGatherMatmul, _all_gather_autocast
)


def matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group_name: str,
    schedule: str,
    backward_schedule: str = "",
) -> torch.Tensor:
    """See the module docstring; ``a @ b`` reduce-scattered along ``scatter_dim``."""
    return _reduce_scattered((a,), (b,), reduce_op, scatter_dim, group_name, schedule)


def matmuls_reduce_scatter(
    a: list[torch.Tensor],
    b: list[torch.Tensor],
    reduce_op: str,
    scatter_dim: int,
    group_name: str,
    schedule: str,
    backward_schedule: str = "",
) -> torch.Tensor:
    """See the module docstring; ``sum_i a[i] @ b[i]`` reduce-scattered along ``scatter_dim``."""
    return _reduce_scattered(tuple(a), tuple(b), reduce_op, scatter_dim, group_name, schedule)


def _reduce_scattered(
    a: tuple[torch.Tensor, ...],
    b: tuple[torch.Tensor, ...],
    reduce_op: str,
    scatter_dim: int,
    group_name: str,
    schedule: str,
) -> torch.Tensor:
    """``sum_i a[i] @ b[i]`` (``a[i] [..., k_i]``, ``b[i] [k_i, n]``) reduce-scattered along ``scatter_dim``
    on the executor: the kernel of both reduce-scatter ops."""
    key = ("gemm_rs", group_name, schedule, reduce_op, scatter_dim)
    key += tuple((x.shape, x.dtype, x.device) for x in a) + tuple((y.shape, y.dtype, y.device) for y in b)
    hit = checked_calls.get(key)
    if hit is None:
        _check_reduce_op(reduce_op)
        _check_pairs(a, b)
        _check_scatter_size(a[0], _check_dim("scatter_dim", scatter_dim, a[0].dim()), group_name)
        hit = _resolve(key, "gemm_rs", tuple(map(_rows, a)), b, schedule, group_name)
    run, ctx = hit
    first = a[0]
    dim = scatter_dim % first.dim()
    c = _run_matmul_reduce_scatter(ctx, tuple(map(_rows, a)), b, run, batch=math.prod(first.shape[:dim]))
    return c.view(_scattered_shape(first.shape, dim, ctx.world_size, b[0].shape[1]))


def _matmul_reduce_scatter_fake(a, b, reduce_op, scatter_dim, group_name, schedule, backward_schedule=""):
    _check_reduce_op(reduce_op)
    w = _resolve_process_group(group_name).size()
    scatter_dim = _check_dim("scatter_dim", scatter_dim, a.dim())
    return a.new_empty(_scattered_shape(a.shape, scatter_dim, w, b.shape[1]))


def _matmuls_reduce_scatter_fake(a, b, reduce_op, scatter_dim, group_name, schedule, backward_schedule=""):
    _check_pairs(tuple(a), tuple(b))
    return _matmul_reduce_scatter_fake(a[0], b[0], reduce_op, scatter_dim, group_name, schedule)


class _MatmulReduceScatter(_OpFunction):
    """``matmul_reduce_scatter`` with its gradients (``apply`` takes the op's arguments)."""

    @staticmethod
    def forward(*args):
        return torch.ops.ficco._matmul_reduce_scatter.default(*args)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        a, b, _reduce_op, scatter_dim, group_name, schedule, backward_schedule = inputs
        _keep_scatter(ctx, a, scatter_dim, group_name, schedule, backward_schedule)
        ctx.save_for_backward(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        (grad_a,), (grad_b,) = _scatter_grads(ctx, grad, (a,), (b,), ctx.needs_input_grad[:2])
        return _grads(ctx, grad_a, grad_b)


class _MatmulsReduceScatter(_OpFunction):
    """``matmuls_reduce_scatter`` with its gradients: ``apply(reduce_op, scatter_dim, group_name, schedule,
    backward_schedule, *a, *b)`` (a Function takes tensors, not lists)."""

    @staticmethod
    def flatten(a, b, reduce_op, scatter_dim, group_name, schedule, backward_schedule) -> tuple:
        return (reduce_op, scatter_dim, group_name, schedule, backward_schedule, *a, *b)

    @staticmethod
    def forward(reduce_op, scatter_dim, group_name, schedule, backward_schedule, *ab):
        a, b = list(ab[: len(ab) // 2]), list(ab[len(ab) // 2 :])
        args = (a, b, reduce_op, scatter_dim, group_name, schedule, backward_schedule)
        return torch.ops.ficco._matmuls_reduce_scatter.default(*args)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _reduce_op, scatter_dim, group_name, schedule, backward_schedule, *ab = inputs
        _keep_scatter(ctx, ab[0], scatter_dim, group_name, schedule, backward_schedule)
        ctx.save_for_backward(*ab)

    @staticmethod
    def backward(ctx, grad):
        ab = ctx.saved_tensors
        half = len(ab) // 2
        grads_a, grads_b = _scatter_grads(
            ctx, grad, ab[:half], ab[half:], ctx.needs_input_grad[_RS_FIXED_ARGS:]
        )
        return (*(None,) * _RS_FIXED_ARGS, *grads_a, *grads_b)


_RS_FIXED_ARGS = 5
"""``_MatmulsReduceScatter.apply``'s arguments before the tensors."""


def _keep_scatter(ctx, a: torch.Tensor, scatter_dim: int, group_name: str, schedule: str, backward: str):
    """What a reduce-scatter op's backward needs besides its tensors."""
    ctx.scatter_dim = _check_dim("scatter_dim", scatter_dim, a.dim())
    ctx.group_name = group_name
    ctx.schedules = (backward or schedule, schedule)


def _scatter_grads(
    ctx, grad: torch.Tensor, a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], needs: tuple[bool, ...]
) -> tuple[list, list]:
    """The gradients of ``sum_i a[i] @ b[i]`` reduce-scattered, given this rank's output gradient ``grad``
    (``needs``: which of ``*a, *b`` need one): ``grad_a[i]`` from one ``all_gather_matmul`` of ``grad``
    against every ``b[i]^T``, whose gathered gradient gives ``grad_b[i] = a[i]^T @ grad``."""
    need_a, need_b = needs[: len(a)], needs[len(a) :]
    if not (any(need_a) or any(need_b)):
        return [None] * len(a), [None] * len(b)
    gathered, grads_a = torch.ops.ficco.all_gather_matmul(
        grad.contiguous(), [y.t() for y in b], ctx.scatter_dim, ctx.group_name, ctx.schedules[0], any(need_b),
        ctx.schedules[1],
    )  # fmt: skip
    grads_a = [g if need else None for g, need in zip(grads_a, need_a, strict=True)]
    grads_b = [
        _weight_grad(_rows(x), gathered, y) if need else None for x, y, need in zip(a, b, need_b, strict=True)
    ]
    return grads_a, grads_b


matmul_reduce_scatter = _define_pair(matmul_reduce_scatter, _matmul_reduce_scatter_fake, _MatmulReduceScatter)
matmuls_reduce_scatter = _define_pair(
    matmuls_reduce_scatter, _matmuls_reduce_scatter_fake, _MatmulsReduceScatter
)


def all_to_all_matmul(
    x: torch.Tensor,
    b: torch.Tensor,
    counts: list[int],
    group_name: str,
    schedule: str,
    backward_schedule: str = "",
) -> torch.Tensor:
    """``executor.all_to_all_matmul``: the rows of ``x`` sent to their experts' ranks, times each local
    expert's ``b[e]`` (``b [experts/w, k, n]``); ``counts`` is ``features.Routing.counts`` flattened
    (``[w * w * experts/w]``: rows rank ``src`` routes to local expert ``e`` of rank ``dst``)."""
    return _run_routed("a2a_gemm", x, b, counts, group_name, schedule)


def matmul_all_to_all(
    h: torch.Tensor,
    b: torch.Tensor,
    counts: list[int],
    group_name: str,
    schedule: str,
    backward_schedule: str = "",
) -> torch.Tensor:
    """``executor.matmul_all_to_all``: each local expert's GEMM on its rows of ``h`` (in
    ``all_to_all_matmul``'s output order), every row sent back to the rank that routed it."""
    return _run_routed("gemm_a2a", h, b, counts, group_name, schedule)


def _run_routed(
    op: str, a: torch.Tensor, b: torch.Tensor, counts: list[int], group_name: str, schedule: str
) -> torch.Tensor:
    """The MoE op ``op`` (``a2a_gemm``: dispatch then experts; ``gemm_a2a``: experts then combine) on the
    executor, under ``schedule``'s pick at this routing."""
    group, routing = _group_routing(counts, group_name)
    run = _resolve_routed(op, routing, a, b, schedule)
    return OP_FUNCTIONS[op](a, b, routing, run, group)


def _routed_fake(op: str):
    """The fake kernel of the MoE op ``op``: ``[rows, n]`` without data, the rows this rank receives
    (``a2a_gemm``) or sent (``gemm_a2a``)."""

    def fake(a, b, counts, group_name, schedule, backward_schedule=""):
        group, routing = _group_routing(counts, group_name)
        rows = routing.received if op == "a2a_gemm" else routing.sent
        return a.new_empty((sum(rows(group.rank())), b.shape[2]))

    return fake


class _Routed(_OpFunction):
    """An MoE op with its gradients (``apply`` takes the op's arguments): the subclass names its twin
    (``forward``) and the other op of the pair (``backward``)."""

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        a, b, counts, group_name, schedule, backward_schedule = inputs
        ctx.counts, ctx.group_name = counts, group_name
        ctx.schedules = (backward_schedule or schedule, schedule)
        ctx.save_for_backward(a, b)


class _AllToAllMatmul(_Routed):
    """``Y = experts(dispatch(x))``: ``grad_x`` is the combine of ``grad @ b[e]^T`` (the other op);
    ``grad_b[e]`` is the dispatched rows of expert ``e``, transposed, times their gradient."""

    @staticmethod
    def forward(*args):
        return torch.ops.ficco._all_to_all_matmul.default(*args)

    @staticmethod
    def backward(ctx, grad):
        return _routed_backward(ctx, grad, torch.ops.ficco.matmul_all_to_all, dispatch_input=True)


class _MatmulAllToAll(_Routed):
    """``Z = combine(experts(h))``: ``grad_h`` is the dispatch of ``grad`` times ``b[e]^T`` (the other op);
    ``grad_b[e]`` is ``h``'s rows of expert ``e``, transposed, times the dispatched gradient's."""

    @staticmethod
    def forward(*args):
        return torch.ops.ficco._matmul_all_to_all.default(*args)

    @staticmethod
    def backward(ctx, grad):
        return _routed_backward(ctx, grad, torch.ops.ficco.all_to_all_matmul, dispatch_input=False)


def _routed_backward(ctx, grad: torch.Tensor, other, *, dispatch_input: bool) -> tuple:
    """The gradients of an MoE op's ``(a, b)``: ``grad_a`` is the ``other`` op of the pair on ``grad`` and
    the transposed weights; ``grad_b[e]`` is expert ``e``'s rows of ``a`` times its rows of ``grad``, once
    the dispatch brought the one on the routing ranks to the experts (``dispatch_input``: ``a``, else
    ``grad``)."""
    a, b = ctx.saved_tensors
    grad = grad.contiguous()
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        b_t = b.transpose(1, 2).contiguous()
        grad_a = other(grad, b_t, ctx.counts, ctx.group_name, *ctx.schedules)
    if ctx.needs_input_grad[1]:
        if dispatch_input:
            a = _dispatched(a, ctx.counts, ctx.group_name)
        else:
            grad = _dispatched(grad, ctx.counts, ctx.group_name)
        group, routing = _group_routing(ctx.counts, ctx.group_name)
        sizes = routing.expert_rows(group.rank())  # consecutive row ranges, one per local expert
        grad_b = torch.stack([x.t() @ g for x, g in zip(a.split(sizes), grad.split(sizes), strict=True)])
    return _grads(ctx, grad_a, grad_b)


all_to_all_matmul = _define_pair(all_to_all_matmul, _routed_fake("a2a_gemm"), _AllToAllMatmul)
matmul_all_to_all = _define_pair(matmul_all_to_all, _routed_fake("gemm_a2a"), _MatmulAllToAll)


def _group_routing(counts: list[int], group_name: str) -> tuple[torch.distributed.ProcessGroup, Routing]:
    """The group ``group_name`` names and the ``features.Routing`` of the flattened ``counts`` over it."""
    group = _resolve_process_group(group_name)
    return group, _routing(tuple(counts), group.size())


@functools.lru_cache(maxsize=256)
def _routing(counts: tuple[int, ...], world_size: int) -> Routing:
    """The ``features.Routing`` of flattened counts (ValueError naming the length when it is no
    ``[w, w, experts/w]``)."""
    per_pair, rest = divmod(len(counts), world_size * world_size)
    if rest or not per_pair:
        raise ValueError(
            f"counts must hold world_size * world_size * experts/world_size ints (Routing.counts flattened); "
            f"got {len(counts)} for world_size={world_size}"
        )
    pairs = [counts[i : i + per_pair] for i in range(0, len(counts), per_pair)]  # by (src, dst)
    return Routing(counts=[pairs[src * world_size : (src + 1) * world_size] for src in range(world_size)])


def _resolve_routed(op: str, routing: Routing, a: torch.Tensor, b: torch.Tensor, asked: str) -> Schedule:
    """The schedule an MoE op runs: the table's pick at ``m``, the rows routed over the whole group (every
    schedule runs every routing, so there is no fallback to take), recorded in :func:`run_report`."""
    m = sum(sum(routing.moved[src]) for src in range(routing.world_size))
    n, k, w = b.shape[2], b.shape[1], routing.world_size
    key = (op, m, n, k, DTYPES.get(a.dtype, str(a.dtype)), w, asked)
    run = _runs.get(key)
    if run is None:
        pick = parse_schedule_table(asked).at(m)
        run = _runs[key] = OpRun(op=op, m=m, n=n, k=k, dtype=key[4], world_size=w, asked=asked, ran=str(pick))
    return parse_schedule_table(run.ran).schedules[0]


def _dispatched(x: torch.Tensor, counts: list[int], group_name: str) -> torch.Tensor:
    """The rows the dispatch of ``x`` brings to this rank's experts, by local expert then source rank
    (``all_to_all_matmul``'s output order): an all-to-all, then the routing's permutation."""
    group, routing = _group_routing(counts, group_name)
    ctx = get_context(group, x.device)
    state = routed_state(ctx.routed, routing, ctx.rank)
    layout = state.layout("gather", 1)
    received = funcol.all_to_all_single(x, list(layout.recv_rows), list(layout.send_rows), group_name)
    return received.index_select(0, state.permutation(x.device)[0])


def _grads(ctx, grad_a, grad_b) -> tuple:
    """The gradients of an op's two tensor arguments, then None for each other argument of its Function."""
    return (grad_a, grad_b) + (None,) * (len(ctx.needs_input_grad) - 2)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., k]`` as rows ``[-1, k]`` in its own order (a view of a contiguous ``x``)."""
    return x.reshape(-1, x.shape[-1])


def _gathered_shape(shape: torch.Size, dim: int, world_size: int) -> tuple[int, ...]:
    """The shape of a shard ``shape`` gathered along ``dim`` over ``world_size`` ranks."""
    return (*shape[:dim], shape[dim] * world_size, *shape[dim + 1 :])


def _scattered_shape(shape: torch.Size, dim: int, world_size: int, n: int) -> tuple[int, ...]:
    """The shape of this rank's part of ``a [..., k] @ b [k, n]`` (``a``'s ``shape``) scattered along
    ``dim`` over ``world_size`` ranks."""
    return (*shape[:dim], shape[dim] // world_size, *shape[dim + 1 : -1], n)


def _check_pairs(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    """ValueError naming the pair unless ``a`` and ``b`` are as many (at least one) and every pair has the
    first's rows, dtype and output columns (the shapes of each pair the executor's checks see)."""
    if not a or len(a) != len(b):
        raise ValueError(
            f"matmuls_reduce_scatter takes as many a as b, at least one; got {len(a)} and {len(b)}"
        )
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.shape[:-1] != a[0].shape[:-1] or x.dtype != a[0].dtype or y.shape[-1] != b[0].shape[-1]:
            raise ValueError(
                f"matmuls_reduce_scatter: pair {i} (a {shape_str(x.shape)} {x.dtype}, b "
                f"{shape_str(y.shape)}) does not match pair 0 (a {shape_str(a[0].shape)} {a[0].dtype}, b "
                f"{shape_str(b[0].shape)}): "
                "every a needs pair 0's rows and dtype, every b its columns"
            )


def _check_scatter_size(a: torch.Tensor, dim: int, group_name: str) -> None:
    """ValueError naming the size when dim ``dim`` of ``a`` does not split evenly over the group."""
    w = _resolve_process_group(group_name).size()
    if a.shape[dim] % w:
        raise ValueError(
            f"matmul_reduce_scatter: a has shape {shape_str(a.shape)}; its scatter_dim ({dim}) must be a "
            f"multiple of the group's {w} ranks"
        )


def _gather_along(shard: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """``shard`` all-gathered along ``dim`` (the functional collective): rank-major rows put in place with
    one copy where ``dim`` has dims before it of more than one element, as PyTorch's gather along a dim
    makes one."""
    flat = _all_gather(_rows(shard).contiguous(), 0, group_name)  # [w * rows, k], rank-major
    w = _resolve_process_group(group_name).size()
    batch = math.prod(shard.shape[:dim])
    full = _gathered_shape(shard.shape, dim, w)
    if batch == 1:
        return flat.view(full)
    return rank_major(flat, batch, w).reshape(full)


def _weight_grad(a_rows: torch.Tensor, grad: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a_rows^T @ grad`` (``[k, n]``, ``grad``'s rows flattened) in ``b``'s layout: ``b`` transposed
    (``nn.Linear.weight.t()``) gets ``(grad^T @ a_rows)^T``, so that the parameter's gradient is contiguous
    as PyTorch's is (autograd's accumulation copies any other layout into the parameter's)."""
    g_rows = _rows(grad)
    if b.dim() == 2 and b.stride(0) == 1 and b.stride(1) != 1:
        return (g_rows.t() @ a_rows).t()
    return a_rows.t() @ g_rows


def _resolve(
    key: tuple,
    op: str,
    rows: torch.Tensor | tuple[torch.Tensor, ...],
    b: tuple[torch.Tensor, ...],
    asked: str,
    group_name: str,
) -> tuple[Schedule, GroupContext]:
    """The schedule a call signature runs, and its executor context, kept under ``key``: the table's pick at
    this row count, or ``serial/sm`` with one warning when the executor's checks refuse it (every rank alike);
    errors serial would raise too are raised. ``ag_gemm``: ``rows`` the shard's, ``b`` every weight;
    ``gemm_rs``: the rows of each ``a`` and its weight (``n`` their common columns, ``k`` the sum of theirs).
    """
    group = _resolve_process_group(group_name)
    w = group.size()
    gather = op == "ag_gemm"
    pairs = [(rows, b)] if gather else list(zip(rows, b, strict=True))
    first = pairs[0][0]
    m = first.shape[0] * w if gather else first.shape[0]
    pick = parse_schedule_table(asked).at(m)
    # an all-gather's weights may have a dtype of their own (autocast: the input gathered as given)
    check = functools.partial(DENSE_CHECKS[op], mixed=True) if gather else DENSE_CHECKS[op]
    for a, bb in pairs:
        check_first_argument(op, a)
        check(a, bb, SERIAL, w, None)  # the caller's mistakes: raised, whatever the schedule
    reason = None
    try:
        for a, bb in pairs:
            check(a, bb, pick, w, None)
    except ValueError as err:
        reason = str(err)
    run = pick if reason is None else SERIAL
    n = sum(t.shape[1] for t in b) if gather else b[0].shape[1]
    k = first.shape[1] if gather else sum(a.shape[1] for a, _ in pairs)
    dtype = DTYPES[b[0].dtype]  # the GEMMs' (an all-gather's input may be wider: autocast)
    if reason is not None:
        name = "all_gather_matmul" if gather else "matmul_reduce_scatter"
        warnings.warn(
            f"ficco.{name} ({op} m={m} n={n} k={k} {dtype}, world_size={w}, input {shape_str(first.shape)}): "
            f"schedule {pick} cannot run at this shape, running {SERIAL} instead: {reason}",
            ScheduleFallbackWarning,
            stacklevel=3,
        )
    _runs.setdefault(
        (op, m, n, k, dtype, w, asked),
        OpRun(op=op, m=m, n=n, k=k, dtype=dtype, world_size=w, asked=asked, ran=str(run), reason=reason),
    )
    return remember_checked(key, (run, get_context(group, first.device)))


def _check_dim(name: str, dim: int, ndim: int) -> int:
    """``dim`` normalised to ``[0, ndim)``; ValueError naming it and the allowed range otherwise."""
    if not (isinstance(dim, int) and -ndim <= dim < ndim) or ndim < 2:
        raise ValueError(f"{name} must be an int in [{-ndim}, {ndim}) of a tensor of >= 2 dims; got {dim!r}")
    return dim % ndim


def _check_reduce_op(reduce_op: str) -> None:
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"reduce_op must be one of {list(REDUCE_OPS)}; got {reduce_op!r}")


__all__ = [
    "REDUCE_OPS",
    "OpRun",
    "ScheduleFallbackWarning",
    "all_gather_matmul",
    "all_to_all_matmul",
    "clear_run_report",
    "matmul_all_to_all",
    "matmul_reduce_scatter",
    "matmuls_reduce_scatter",
    "ran",
    "run_report",
]
