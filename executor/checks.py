"""Argument checks, run on every rank before any communication: they look only at the calling rank's tensors
and the schedule, so every rank raises the same ``ValueError`` together instead of hanging in a collective
(shapes that differ between ranks are the caller's to keep equal).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ficco.features.routing import Routing
from ficco.features.schedule import Schedule

DTYPES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
"""Element types the executor runs, with their ``features`` names."""


def as_schedule(schedule: Schedule | str) -> Schedule:
    """Accept a ``Schedule`` or its canonical string (``Schedule.parse`` names the allowed forms; parsed
    strings are cached, schedules are immutable)."""
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, str):
        return _parse_schedule(schedule)
    raise ValueError(
        f"schedule must be a features.Schedule or its string form; got {type(schedule).__name__}"
    )


_parse_schedule = lru_cache(maxsize=256)(Schedule.parse)


def call_key(
    op: str, a: object, b: object, out: object, schedule: Schedule, group: object, routing: object = None
) -> tuple | None:
    """Everything the checks of one call look at (None when ``a``, ``b`` or ``out`` is not a tensor, or a
    MoE op's ``routing`` no ``Routing``, which only the full checks can explain; ``b`` may be a tuple of
    tensors, the weights of one all-gather): calls with equal keys pass or fail the checks alike."""
    if not isinstance(a, torch.Tensor):
        return None
    if isinstance(b, torch.Tensor):
        key = (op, group, schedule, a.shape, a.dtype, a.device, b.shape, b.dtype, b.device)
    elif isinstance(b, tuple) and b and all(isinstance(t, torch.Tensor) for t in b):
        key = (op, group, schedule, a.shape, a.dtype, a.device, *((t.shape, t.dtype, t.device) for t in b))
    else:
        return None
    if a.is_cuda:
        key += (torch.cuda.current_device(),)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            return None
        key += (out.shape, out.dtype, out.device, out.is_contiguous())
    if routing is not None:
        if not isinstance(routing, Routing):
            return None
        key += (routing,)
    return key


def shape_str(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_matrix(name: str, t: object, expected: str, dim: int = 2) -> None:
    """``t`` must be a ``dim``-D (default 2-D) floating tensor of a supported dtype on CPU or CUDA."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {expected}; got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} has shape {shape_str(t.shape)}; expected a {dim}-D tensor {expected}")
    if t.dtype not in DTYPES:
        raise ValueError(
            f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in DTYPES]} "
            f"({', '.join(DTYPES.values())})"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {t.device}; expected a CPU or CUDA tensor")
    if t.device.type == "cuda" and t.device.index != torch.cuda.current_device():
        raise ValueError(
            f"{name} is on {t.device} but the current CUDA device is cuda:{torch.cuda.current_device()}; "
            "call torch.cuda.set_device(local_rank) before using the executor"
        )


def check_like(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``t`` must have ``ref``'s dtype and device."""
    if t.dtype != ref.dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; expected {ref.dtype} (the dtype of {ref_name})")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device}; expected {ref.device} (the device of {ref_name})")


def check_out(
    out: torch.Tensor | None, expected_shape: tuple[int, ...], what: str, ref: torch.Tensor
) -> None:
    """An optional output must be contiguous, shaped ``expected_shape``, with ``ref``'s dtype and device."""
    if out is None:
        return
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected_shape:
        got = shape_str(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out has shape {got}; expected {what} = {shape_str(expected_shape)}")
    check_like("out", out, "the inputs", ref)
    if not out.is_contiguous():
        raise ValueError(f"out (shape {shape_str(out.shape)}) must be contiguous")


def check_world_size(world_size: int) -> None:
    if world_size < 2:
        raise ValueError(f"the executor needs a group of at least 2 ranks; got world_size={world_size}")


def _check_b(b: torch.Tensor, a_name: str, a: torch.Tensor, *, same_dtype: bool = True) -> None:
    """``b [k, n]``: a matrix on ``a``'s device (of ``a``'s dtype unless not ``same_dtype``) whose rows
    match ``a``'s columns (``k``)."""
    check_matrix("b", b, "[k, n]")
    if same_dtype:
        check_like("b", b, a_name, a)
    elif b.device != a.device:
        raise ValueError(f"b is on {b.device}; expected {a.device} (the device of {a_name})")
    k = a.shape[1]
    if b.shape[0] != k:
        raise ValueError(
            f"b has shape {shape_str(b.shape)}; expected [k, n] = [{k}, n] (k = {a_name}.shape[1])"
        )


def check_all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor | tuple[torch.Tensor, ...],
    schedule: Schedule,
    world_size: int,
    out: torch.Tensor | None,
    *,
    mixed: bool = False,
) -> None:
    """ag_gemm: ``a_shard [m/w, k]``, ``b [k, n]`` (or a non-empty tuple of them, each its own ``n``, of
    ``a_shard``'s dtype, or with ``mixed`` of one dtype of their own: the GEMMs', what autocast runs),
    ``out [m, n]`` (a single ``b`` only, of its dtype); ``m/w`` divisible by the splits."""
    check_world_size(world_size)
    bs = b if isinstance(b, tuple) else (b,)
    if not bs:
        raise ValueError("b must be a tensor [k, n] or a non-empty tuple of them; got an empty tuple")
    if out is not None and len(bs) > 1:
        raise ValueError(f"out applies to a single b; got {len(bs)} weights (each gets a new output)")
    for one in bs:
        _check_b(one, "a_shard", a_shard, same_dtype=not mixed)
        check_like("b", one, "the first b", bs[0])
    b = bs[0]
    rows = a_shard.shape[0]
    if rows == 0 or rows % schedule.splits:
        raise ValueError(
            f"a_shard has shape {shape_str(a_shard.shape)}; schedule {schedule} needs [m/world_size, k] "
            f"with m/world_size a positive multiple of splits={schedule.splits}"
        )
    check_out(out, (rows * world_size, b.shape[1]), "[m, n]", b)


def check_matmul_reduce_scatter(
    a: torch.Tensor, b: torch.Tensor, schedule: Schedule, world_size: int, out: torch.Tensor | None
) -> None:
    """gemm_rs: ``a [m, k]``, ``b [k, n]``, ``out [m/w, n]``; ``m`` divisible by world_size * splits."""
    check_world_size(world_size)
    _check_b(b, "a", a)
    m = a.shape[0]
    pieces = world_size * schedule.splits
    if m == 0 or m % pieces:
        raise ValueError(
            f"a has shape {shape_str(a.shape)}; schedule {schedule} needs [m, k] with m a positive multiple "
            f"of world_size * splits = {world_size} * {schedule.splits} = {pieces}"
        )
    check_out(out, (m // world_size, b.shape[1]), "[m/world_size, n]", a)


FIRST_ARGUMENTS = {
    "ag_gemm": ("a_shard", "[m/world_size, k]"),
    "gemm_rs": ("a", "[m, k]"),
    "a2a_gemm": ("x", "[rows, k]"),
    "gemm_a2a": ("h", "[rows, k]"),
}
"""The name and shape of each op's first argument, as its errors give them."""
DENSE_CHECKS = {"ag_gemm": check_all_gather_matmul, "gemm_rs": check_matmul_reduce_scatter}
"""The checks of a dense op's call, ``(a, b, schedule, world_size, out)``, once ``a`` passed
:func:`check_first_argument`."""


def check_first_argument(op: str, a: object) -> None:
    """:func:`check_matrix` of ``op``'s first argument, named and shaped as :data:`FIRST_ARGUMENTS` says."""
    name, shape = FIRST_ARGUMENTS[op]
    check_matrix(name, a, shape)


def check_routing(routing: object, world_size: int) -> Routing:
    """``routing`` must be a ``features.Routing`` for ``world_size`` ranks."""
    if not isinstance(routing, Routing):
        raise ValueError(
            "routing must be a features.Routing (Routing(counts), counts[src][dst][e] of shape "
            f"[w, w, experts/w]); got {type(routing).__name__}"
        )
    if routing.world_size != world_size:
        raise ValueError(
            f"routing has counts for {routing.world_size} ranks; expected the group's world_size={world_size}"
        )
    return routing


def check_routed_matmul(
    a_name: str,
    a: torch.Tensor,
    b: torch.Tensor,
    routing: object,
    rank: int,
    world_size: int,
    out: torch.Tensor | None,
    *,
    dispatch: bool,
) -> None:
    """a2a_gemm (``dispatch``): ``x [rows routed from this rank, k]``, ``b [experts/w, k, n]``, ``out [rows
    routed to this rank, n]``; gemm_a2a: ``h [rows routed to this rank, k]``, ``b`` alike, ``out [rows routed
    from this rank, n]``. Any schedule runs any routing (blocks split into near-equal sub-chunks)."""
    check_world_size(world_size)
    routing = check_routing(routing, world_size)
    check_matrix("b", b, "[experts/world_size, k, n]", dim=3)
    check_like("b", b, a_name, a)
    experts, k = routing.local_experts, a.shape[1]
    if tuple(b.shape[:2]) != (experts, k):
        raise ValueError(
            f"b has shape {shape_str(b.shape)}; expected [experts/world_size, k, n] = [{experts}, {k}, n] "
            f"(routing.local_experts = {experts}, k = {a_name}.shape[1])"
        )
    sent, received = sum(routing.sent(rank)), sum(routing.received(rank))
    rows, out_rows = (sent, received) if dispatch else (received, sent)
    if a.shape[0] != rows:
        what = "route" if dispatch else "have its experts receive"
        total = "routing.sent" if dispatch else "routing.received"
        raise ValueError(
            f"{a_name} has shape {shape_str(a.shape)}; the routing has rank {rank} {what} {rows} rows "
            f"({total}({rank})): expected [{rows}, k]"
        )
    check_out(out, (out_rows, b.shape[2]), "[rows, n]", a)
