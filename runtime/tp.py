"""Drop-ins for PyTorch's tensor-parallel styles that run ficco's overlapped ops: a plan written for
``torch.distributed.tensor.parallel.parallelize_module`` (torchtitan's Llama plan, ``apply_tp``) switches to
ficco by changing its imports; schedules are given the way torchtitan swaps its float8 styles in
(``functools.partial(ColwiseParallel, schedules=planner)``).

Outputs and gradients are those of the same plan under PyTorch's styles; where ficco's ops cannot reproduce
PyTorch's semantics, the module runs PyTorch's own style, and the log and the planner's table say so once
per module and reason. Parameters are sharded as PyTorch's styles shard them. What each style runs, and
when PyTorch's runs instead: docs/runtimes.md ("Use with torchtitan").
"""

from __future__ import annotations

import itertools
import logging
import types
import warnings
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import PrepareModuleInput as _TorchPrepareModuleInput
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise
from torch.distributed.tensor.parallel import SequenceParallel
from torch.fx.experimental.symbolic_shapes import has_static_value

from ficco.executor import library  # noqa: F401 (registers torch.ops.ficco)
from ficco.executor.checks import DTYPES
from ficco.features.scenario import MAX_WORLD_SIZE, MIN_WORLD_SIZE
from ficco.features.schedule import Schedule
from ficco.runtime.overlap import backward_follows, dtype_name, gemm_dtype, request_pair
from ficco.runtime.planner import DEFAULT_TOKEN_POINTS, OpRequest, Planner, Schedules, as_planner, token_table

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Default:
    """The deprecated process-wide schedule source (:func:`set_default_schedules`) and its generation."""

    schedules: Schedules = None
    generation: int = 0


_default = _Default()


def set_default_schedules(schedules: Schedules) -> None:
    """Deprecated (pass ``schedules=`` to the styles, e.g. ``functools.partial(ColwiseParallel,
    schedules=planner)``): the schedule source of every ficco style built without one."""
    warnings.warn(
        "ficco.runtime.tp.set_default_schedules is deprecated: pass schedules= to the styles, e.g. "
        "functools.partial(ColwiseParallel, schedules=planner) in the plan",
        DeprecationWarning,
        stacklevel=2,
    )
    if schedules is not None:
        as_planner(schedules)  # a bad value is the caller's mistake: raised now
    _default.schedules = schedules
    _default.generation += 1


def name_modules(model: nn.Module) -> None:
    """Name every module under ``model`` that a ficco linear style parallelized by its path (the planner's
    ``layer`` column and the log)."""
    for path, module in model.named_modules():
        state = getattr(module, "_ficco_tp", None)
        if state is not None:
            state.name = path


@dataclass(kw_only=True, slots=True, weakref_slot=True)
class _State:
    """What a module a ficco linear style parallelized keeps: its style, its group, its decisions."""

    style: _LinearStyle
    """The style (PyTorch's arguments, ``schedules``), also what runs PyTorch's forward where ficco's
    ops cannot."""
    mesh: DeviceMesh
    """The tensor-parallel mesh (one dimension where ficco's ops run)."""
    name: str
    """The module's path (``name_modules``), else its type: the planner's ``layer`` column."""
    runs_ficco: bool = True
    """False: the whole module runs PyTorch's style."""
    group_name: str = ""
    """Its c10d group's name, as the ficco ops take it."""
    world_size: int = 0
    handoff: _HandOff | None = None
    """While its parent's forward runs: the prepared input and the outputs of the op it was part of."""
    said: set[str] = field(default_factory=set)
    """The reasons for PyTorch's style already logged for this module."""
    requests: dict[tuple, tuple[OpRequest, OpRequest]] = field(default_factory=dict)
    """(op, m, n, k, dtype) -> the op's request and its backward's."""
    prepared: set[tuple] = field(default_factory=set)
    """(request key, backward) pairs the planner has decided."""
    _planner: tuple[int, Planner] | None = None
    """(the default's generation, the planner) once resolved."""
    index: int = field(default_factory=lambda: next(_indices))
    """Its key in :data:`_STATES`: how a compiled forward names it to :func:`_traced_schedules`."""

    def __post_init__(self) -> None:
        _STATES[self.index] = self

    def planner(self) -> Planner:
        """The style's planner: ``runtime.as_planner`` of its ``schedules``, agreeing over its mesh."""
        if self._planner is None or self._planner[0] != _default.generation:
            given = self.style.schedules if self.style.schedules is not None else _default.schedules
            self._planner = (_default.generation, as_planner(given, group=self.mesh.get_group()))
        return self._planner[1]

    def schedule_strings(
        self, op: str, m: int, n: int, k: int, dtype: torch.dtype, backward: bool, batch: int
    ) -> tuple[str, str]:
        """The schedule strings of an op at this shape (rows of ``batch`` sequences) and, with ``backward``,
        of its backward's op (the other of the pair; "" without). Inside ``torch.compile`` the planner is
        asked when the forward is traced, outside the traced code, and the strings enter the graph as
        constants (:func:`_traced_schedules`)."""
        if torch.compiler.is_compiling():
            static = has_static_value(m) and has_static_value(batch)
            return _traced_schedules(
                self.index, op, m if static else None, n, k, dtype, backward, batch if static else 1
            )
        return self.decided(op, m, n, k, dtype, backward, batch)

    def decided(
        self, op: str, m: int, n: int, k: int, dtype: torch.dtype, backward: bool, batch: int
    ) -> tuple[str, str]:
        """:meth:`schedule_strings`, asked of the planner now."""
        planner = self.planner()
        key = (op, m, n, k, dtype, batch)
        pair = self.requests.get(key)
        if pair is None:
            pair = self.requests[key] = request_pair(
                op, m=m, n=n, k=k, dtype=dtype_name(dtype), world_size=self.world_size, layer=self.name,
                batch=batch,
            )  # fmt: skip
        if (key, backward) not in self.prepared:  # decided in one batch once, a lookup afterwards
            planner.prepare(list(pair) if backward else pair[:1])
            self.prepared.add((key, backward))
        return str(planner.schedule(pair[0])), str(planner.schedule(pair[1])) if backward else ""

    def say(self, why: str, *, expected: bool = False) -> None:
        """Log once per reason that this module runs PyTorch's style, and note it in the planner's table
        (``expected``: a layer ficco has no op for, logged at info level; otherwise a warning); inside
        ``torch.compile`` when the forward is traced, outside the traced code (:func:`_traced_say`)."""
        if torch.compiler.is_compiling():
            _traced_say(self.index, why, expected)
        else:
            self.said_now(why, expected)

    def said_now(self, why: str, expected: bool) -> None:
        """:meth:`say`, now."""
        if why in self.said:
            return
        self.said.add(why)
        what = f"PyTorch's {type(self.style).__name__}: {why}"
        log.log(
            logging.INFO if expected else logging.WARNING, "ficco.runtime.tp: %s runs %s", self.name, what
        )
        self.planner().note(self.name, "fwd", what)


_indices = itertools.count()
_STATES: weakref.WeakValueDictionary[int, _State] = weakref.WeakValueDictionary()
"""Every module state by its index, for :func:`_traced_schedules`."""


@torch.compiler.assume_constant_result
def _traced_schedules(
    index: int, op: str, m: int | None, n: int, k: int, dtype: torch.dtype, backward: bool, batch: int
) -> tuple[str, str]:
    """:meth:`_State.schedule_strings` of the state ``index`` while ``torch.compile`` traces a forward: run
    by Dynamo at trace time, its result a constant of the graph (the planner's state stays outside the
    traced code; a later pin reaches a compiled graph when it is compiled again). A dynamic token count
    (``m`` None) gets token-range tables decided at :data:`~ficco.runtime.planner.DEFAULT_TOKEN_POINTS`
    (as the compile pass decides one)."""
    state = _STATES[index]
    if m is not None:
        return state.decided(op, m, n, k, dtype, backward, batch)
    w = state.world_size
    points = sorted({-(-p // w) * w for p in DEFAULT_TOKEN_POINTS})
    pairs = [state.decided(op, p, n, k, dtype, backward, batch) for p in points]
    forward = token_table(points, [Schedule.parse(f) for f, _ in pairs])
    return forward, token_table(points, [Schedule.parse(b) for _, b in pairs]) if backward else ""


@torch.compiler.assume_constant_result
def _traced_say(index: int, why: str, expected: bool) -> bool:
    """:meth:`_State.say` of the state ``index`` while ``torch.compile`` traces a forward (at trace time)."""
    _STATES[index].said_now(why, expected)
    return True


class _LinearStyle:
    """The ficco column and row styles' part: PyTorch's arguments plus ``schedules``, and ficco's forward on
    the modules whose plan its ops can run (PyTorch's style on the rest)."""

    _kind: str
    """``colwise`` or ``rowwise``."""

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        schedules: Schedules = None,
    ) -> None:
        super().__init__(
            input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output
        )
        if schedules is not None:
            as_planner(schedules)  # a bad value is the caller's mistake: raised now
        self.schedules = schedules

    def _pytorchs(self, module: nn.Module, mesh: DeviceMesh) -> tuple[str, bool] | None:
        """Why ``module`` runs PyTorch's style under this plan, and whether that is expected (no ficco op
        exists for it); None when ficco's forward runs."""
        if not isinstance(module, nn.Linear):
            return f"no ficco op for {type(module).__name__}", True
        if type(module).forward is not nn.Linear.forward or "forward" in vars(module):
            return f"{type(module).__name__} has a forward of its own, which ficco's would replace", False
        if mesh.ndim != 1:
            return f"a {mesh.ndim}-D mesh; ficco's ops run on one group", False
        if not MIN_WORLD_SIZE <= mesh.size() <= MAX_WORLD_SIZE:
            return f"{mesh.size()} ranks; ficco's ops run on {MIN_WORLD_SIZE} to {MAX_WORLD_SIZE}", False
        dim = 0 if self._kind == "colwise" else 1
        if module.weight.shape[dim] % mesh.size():
            which = ("out_features", "in_features")[dim]
            return f"{which}={module.weight.shape[dim]} does not divide by {mesh.size()} ranks", False
        return None

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        why = self._pytorchs(module, device_mesh)
        if why is not None:
            super()._apply(module, device_mesh)
            _attach_pytorchs(module, device_mesh, self, *why)
            return module
        if self._kind == "rowwise":
            self.desired_input_layouts = (Shard(-1),)  # as PyTorch's style sets it for a Linear
        distribute_module(module, device_mesh, self._partition_linear_fn)
        module._ficco_tp = _State(
            style=self,
            mesh=device_mesh,
            name=type(module).__name__,
            group_name=device_mesh.get_group().group_name,
            world_size=device_mesh.size(),
        )
        forward = _colwise_forward if self._kind == "colwise" else _rowwise_forward
        module.forward = types.MethodType(forward, module)
        return module


class ColwiseParallel(_LinearStyle, _TorchColwise):
    """PyTorch's ``ColwiseParallel`` (same arguments) running ficco's all-gather -> GEMM; ``schedules``:
    where its schedules come from (``runtime.as_planner``'s forms; None: this machine's measured model)."""

    _kind = "colwise"


class RowwiseParallel(_LinearStyle, _TorchRowwise):
    """PyTorch's ``RowwiseParallel`` (same arguments) running ficco's GEMM -> reduce-scatter when its output
    is ``Shard(d)``; ``schedules``: where its schedules come from (``runtime.as_planner``'s forms)."""

    _kind = "rowwise"

    def _pytorchs(self, module: nn.Module, mesh: DeviceMesh) -> tuple[str, bool] | None:
        if isinstance(module, nn.Linear) and not isinstance(self.output_layouts[0], Shard):
            return f"output_layouts={self.output_layouts[0]!r} (an all-reduce; ficco has no op for it)", True
        if isinstance(module, nn.Linear) and not isinstance(self.input_layouts[0], Shard):
            return f"input_layouts={self.input_layouts[0]!r}; ficco's op takes Shard(-1)", False
        return super()._pytorchs(module, mesh)


def _attach_pytorchs(module: nn.Module, mesh: DeviceMesh, style: _LinearStyle, why: str, expected: bool):
    """Mark a module that runs PyTorch's style: on its first call the log and the planner's table say why;
    where it hands out local shards of its output, every call first checks that they are even."""
    state = module._ficco_tp = _State(style=style, mesh=mesh, name=type(module).__name__, runs_ficco=False)
    checks = _splits_output(style)
    handle = None

    def first_and_checks(mod: nn.Module, args: tuple) -> None:
        state.say(why, expected=expected)
        if checks and args:
            _check_even_output(mod, state, args[0])
        elif handle is not None:
            handle.remove()

    handle = module.register_forward_pre_hook(first_and_checks, prepend=True)
    if isinstance(module, nn.Embedding) and style.use_local_output:
        module.register_forward_hook(lambda _mod, _args, out: _own_tensor(out))


def _own_tensor(y: object) -> object:
    """A token embedding's local output ``y`` (PyTorch's style hands out a view of its DTensor's local
    tensor) as a tensor of its own (one copy, in training only): a block compiled with ``torch.compile``
    takes it as its input and gets its gradient, where AOTAutograd (torch 2.13) fails on such a view under
    PyTorch's own styles (torchtitan's token embeddings before its compiled blocks; an alias that is no
    view loses the gradient)."""
    if isinstance(y, torch.Tensor) and not isinstance(y, DTensor) and y.requires_grad and y._is_view():
        return y.clone()
    return y


# ficco's forwards -------------------------------------------------------------------------------------------


def _colwise_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    state: _State = self._ficco_tp
    handoff = state.handoff
    if handoff is not None and x is handoff.input:
        y = handoff.outputs.pop(id(self), None)
        if y is not None:  # computed by the prepared input's op
            return _colwise_output(self, state, y)
    layout = _layout_of(x, state)
    if isinstance(layout, Shard):  # sequence-parallel input: gathered by the op itself
        dim = layout.dim % x.dim()
        if dim == x.dim() - 1:
            return _pytorchs_forward(self, x, f"its input is Shard({layout.dim}), its features")
        if isinstance(x, DTensor) and x.shape[dim] % state.world_size:
            return _pytorchs_forward(self, x, f"an uneven input (dim {dim} of size {x.shape[dim]})")
        dtype = _gemm_dtype(self, x)
        if dtype not in DTYPES:
            return _pytorchs_forward(self, x, _dtype_reason(self, x))
        _check_even_output(self, state, x)
        local = x.to_local() if isinstance(x, DTensor) else x
        weights = [self.weight.to_local().t()]
        _, (y,) = _all_gather_matmul(state, local, weights, dim, dtype, return_a=False)
        return _colwise_output(self, state, y)
    if isinstance(layout, Replicate):  # every rank holds the input: the local GEMM under Megatron's f
        _check_even_output(self, state, x)
        bias = None if self.bias is None else self.bias.to_local()
        return _output(state, F.linear(_replicated(x, state), self.weight.to_local(), bias), Shard(-1))
    why = f"its input is laid out as {layout!r}"
    if layout is None:
        why = "its input is a DTensor of another layout than input_layouts"
    return _pytorchs_forward(self, x, why)


def _all_gather_matmul(
    state: _State,
    shard: torch.Tensor,
    weights: list[torch.Tensor],
    dim: int,
    dtype: torch.dtype,
    *,
    return_a: bool,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``torch.ops.ficco.all_gather_matmul`` of ``shard [..., k]`` gathered along ``dim`` against each
    ``weights[i] [k, n_i]``, its GEMMs in ``dtype`` (autocast's, where a region casts), under the schedules
    ``state``'s planner decides for the shape."""
    m = shard.numel() // shard.shape[-1] * state.world_size
    n = sum(w.shape[1] for w in weights)
    backward = backward_follows(shard, *weights)
    batch = shard.numel() // (shard.shape[dim] * shard.shape[-1]) if dim < shard.dim() - 1 else 1
    fwd, bwd = state.schedule_strings("ag_gemm", m, n, shard.shape[-1], dtype, backward, batch)
    return torch.ops.ficco.all_gather_matmul(shard, weights, dim, state.group_name, fwd, return_a, bwd)


def _colwise_output(self: nn.Linear, state: _State, y: torch.Tensor) -> torch.Tensor:
    """A column-parallel layer's local output ``y`` (every row, this rank's columns) with its bias shard (a
    complete gradient: every row is here) as the style's output."""
    if self.bias is not None:
        y = _biased(y, self.bias.to_local())
    return _output(state, y, Shard(-1))


def _biased(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y + bias``; under autocast (``y`` narrower than ``bias``) added in ``bias``'s dtype and rounded to
    ``y``'s once, as ``F.linear``'s GEMM adds its bias before it rounds."""
    return y + bias if y.dtype == bias.dtype else (y + bias).to(y.dtype)


def _gemm_dtype(module: nn.Linear, x: torch.Tensor) -> torch.dtype | None:
    """The dtype ``F.linear`` would multiply ``x`` by ``module``'s weight (and bias) in (autocast's where a
    region casts); None where it would refuse them."""
    return gemm_dtype(x, module.weight, *([] if module.bias is None else [module.bias]))


def _dtype_reason(module: nn.Linear, x: torch.Tensor) -> str:
    """Why a call of ``module`` on ``x`` runs PyTorch's style: a dtype ficco's ops do not run, or dtypes
    ``F.linear`` refuses together (PyTorch's style then raises its own error)."""
    dtype = _gemm_dtype(module, x)
    if dtype is None:
        return (
            f"its input is {x.dtype} and its weight {module.weight.dtype}, which F.linear does not multiply"
        )
    return f"{dtype}; ficco's ops run {', '.join(map(str, DTYPES))}"


def _rowwise_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    state: _State = self._ficco_tp
    layout = _layout_of(x, state)
    out: Shard = state.style.output_layouts[0]
    if layout is None or not _same(layout, Shard(-1), x.dim()):
        return _pytorchs_forward(self, x, "its input is a DTensor of another layout than input_layouts")
    dim = out.dim % x.dim()
    if dim == x.dim() - 1:
        return _pytorchs_forward(self, x, f"output_layouts=Shard({out.dim}) scatters its features")
    if x.shape[dim] % state.world_size:
        _check_even_output(self, state, x)  # raises where the output is handed out as local shards
        return _pytorchs_forward(self, x, f"an uneven output (dim {dim} of size {x.shape[dim]})")
    dtype = _gemm_dtype(self, x)
    if dtype not in DTYPES:
        return _pytorchs_forward(self, x, _dtype_reason(self, x))
    local = x.to_local() if isinstance(x, DTensor) else x
    weight = self.weight.to_local()  # [out, in/w]
    m = local.numel() // local.shape[-1]
    backward = backward_follows(local, weight)
    batch = local.numel() // (local.shape[dim] * local.shape[-1])
    fwd, bwd = state.schedule_strings("gemm_rs", m, *weight.shape, dtype, backward, batch)
    y = torch.ops.ficco.matmul_reduce_scatter(local, weight.t(), "sum", dim, state.group_name, fwd, bwd)
    if self.bias is not None:  # on this rank's rows: its gradient is a partial sum, all-reduced as PyTorch's
        y = _biased(y, _replicated(self.bias.to_local(), state))
    return _output(state, y, Shard(dim))


def _pytorchs_forward(self: nn.Linear, x: torch.Tensor, why: str) -> torch.Tensor:
    """This call as PyTorch's style runs it (the module's parameters are PyTorch's DTensors already), said
    once per reason."""
    state: _State = self._ficco_tp
    state.say(why)
    style, mesh = state.style, state.mesh
    dt = style._prepare_input_fn(style.input_layouts, style.desired_input_layouts, self, (x,), mesh)
    y = F.linear(dt, self.weight, self.bias)
    return style._prepare_output_fn(style.output_layouts, style.use_local_output, self, y, mesh)


def _layout_of(x: torch.Tensor, state: _State) -> Placement | None:
    """The layout ``x`` arrives in: the style's ``input_layouts`` for a plain tensor (PyTorch's styles
    assume it too), a DTensor's own placement where it is that layout; None for a DTensor of another one
    (PyTorch's style then runs, whatever it makes of it)."""
    expected = state.style.input_layouts[0]
    if not isinstance(x, DTensor):
        return expected
    (placement,) = x.placements if len(x.placements) == 1 else (None,)
    return placement if placement is not None and _same(placement, expected, x.dim()) else None


def _replicated(x: torch.Tensor, state: _State) -> torch.Tensor:
    """The local tensor of a replicated ``x`` (plain or a ``Replicate()`` DTensor) whose gradient, a partial
    sum on each rank, is all-reduced in the backward (Megatron's ``f``: identity forward): PyTorch's own
    ``to_local(grad_placements=[Partial()])``. Without a backward to come, ``x``'s local tensor as is."""
    if not isinstance(x, DTensor):
        if not backward_follows(x):
            return x
        x = DTensor.from_local(x, state.mesh, [Replicate()], run_check=False)
    return x.to_local(grad_placements=[Partial()])


def _output(state: _State, y: torch.Tensor, layout: Placement) -> torch.Tensor:
    """``y`` (this rank's part, laid out as ``layout``) as the style's ``output_layouts`` and
    ``use_local_output`` say, as PyTorch's styles return it."""
    style = state.style
    out_layout = style.output_layouts[0]
    same = _same(layout, out_layout, y.dim())
    if same and style.use_local_output:
        return y
    dt = DTensor.from_local(y, state.mesh, [layout], run_check=False)
    if not same:
        dt = dt.redistribute(placements=[out_layout])
    return dt.to_local() if style.use_local_output else dt


def _same(a: Placement, b: Placement, ndim: int) -> bool:
    if isinstance(a, Shard) and isinstance(b, Shard):
        return a.dim % ndim == b.dim % ndim
    return a == b


# Even shards ------------------------------------------------------------------------------------------------


def _splits_output(style: _LinearStyle) -> bool:
    """Whether the style hands out local shards of its output's rows (``Shard(d)``, ``use_local_output``):
    uneven ones cannot be put together again (``DTensor.from_local`` assumes even shards)."""
    return style.use_local_output and isinstance(style.output_layouts[0], Shard)


def _check_even_output(module: nn.Module, state: _State, x: torch.Tensor) -> None:
    """ValueError, on every rank alike and before any collective, when the style would hand out uneven local
    shards of the output of ``module`` (``nn.Linear``, ``nn.Embedding``) called on ``x``."""
    if not _splits_output(state.style) or not isinstance(x, torch.Tensor):
        return
    embedding = isinstance(module, nn.Embedding)  # [..., ] -> [..., dim]; a linear keeps x's dims
    dim = state.style.output_layouts[0].dim % (x.dim() + embedding)
    if dim >= x.dim() - (not embedding):  # the output's features: the weight's shard, even
        return
    layout = _layout_of(x, state)
    plain_shard = not isinstance(x, DTensor) and isinstance(layout, Shard) and layout.dim % x.dim() == dim
    size = x.shape[dim] * (state.mesh.size() if plain_shard else 1)
    if size % state.mesh.size():
        raise _uneven(f"the output of {state.name}", f"output_layouts=Shard({dim})", dim, size, state.mesh)


def _uneven(what: str, how: str, dim: int, size: int, mesh: DeviceMesh) -> ValueError:
    w = mesh.size()
    return ValueError(
        f"ficco.runtime.tp: {what} ({how}) would split dim {dim} of size {size} over the {w} ranks of the "
        f"tensor-parallel mesh, which do not divide it: the ranks' local shards would differ in size, and "
        f"the plan's next layers cannot put them together (DTensor.from_local assumes even shards). Make "
        f"dim {dim} a multiple of {w} (pad the sequence or the batch)."
    )


# The prepared input ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _HandOff:
    """What a prepared module received, and the outputs the op made for its column-parallel children."""

    input: torch.Tensor
    outputs: dict[int, torch.Tensor]
    """id(child) -> its output, until the child takes it."""
    consumers: list[nn.Module]


class PrepareModuleInput(_TorchPrepareModuleInput):
    """PyTorch's ``PrepareModuleInput`` (same arguments) whose ``Shard(d) -> Replicate()`` input feeds the
    module's ficco ``ColwiseParallel`` children as one ``all_gather_matmul`` (docs/runtimes.md)."""

    _module: nn.Module | None = None
    """The module whose inputs PyTorch's pre-hook is preparing (set by the pre-hook that runs before it),
    until one of them became its hand-off."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.register_forward_pre_hook(self._enter, prepend=True)
        module.register_forward_hook(_leave, always_call=True)
        return super()._apply(module, device_mesh)

    def _enter(self, module: nn.Module, _args) -> None:
        self._module = module

    def _prepare_input_arg(self, input, mesh, input_layout, desired_layout):
        if isinstance(desired_layout, Shard) and self.use_local_output and isinstance(input, torch.Tensor):
            _check_even_input(self._module, input, mesh, input_layout, desired_layout)
        consumers = self._consumers_of(input, mesh, input_layout, desired_layout)
        if not consumers:
            return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)
        module, self._module = self._module, None
        return _hand_off(module, consumers, input, mesh, input_layout.dim, self.use_local_output)

    def _consumers_of(self, input, mesh, input_layout, desired_layout) -> list[nn.Module]:
        """The children of the module being called that one op over ``input`` feeds; none where the input
        is not a row shard to replicate over a group ficco runs, or the module has no such child."""
        if (
            self._module is None
            or not (isinstance(input_layout, Shard) and isinstance(desired_layout, Replicate))
            or not isinstance(input, torch.Tensor)
            or input.dim() < 2
            or input_layout.dim % input.dim() == input.dim() - 1
        ):
            return []
        if isinstance(input, DTensor) and not (
            input.placements == (input_layout,) and input.shape[input_layout.dim] % mesh.size() == 0
        ):
            return []
        group = mesh.get_group().group_name if mesh.ndim == 1 else None
        consumers = getattr(self._module, "_ficco_consumers", None)
        if consumers is None:
            consumers = self._module._ficco_consumers = _consumers(self._module)
        consumers = [c for c in consumers if c._ficco_tp.group_name == group]
        dtypes = [_gemm_dtype(c, input) for c in consumers]  # one op: one dtype its GEMMs run in
        return [c for c, d in zip(consumers, dtypes, strict=True) if d in DTYPES and d == dtypes[0]]


def _consumers(module: nn.Module) -> list[nn.Module]:
    """The children a prepared module's gathered input may feed as one op: its linears under ficco's
    ``ColwiseParallel`` that take a replicated input."""
    out = []
    for child in module.children():
        state = getattr(child, "_ficco_tp", None)
        colwise = state is not None and state.runs_ficco and isinstance(state.style, ColwiseParallel)
        if colwise and isinstance(state.style.input_layouts[0], Replicate):
            out.append(child)
    return out


def _hand_off(
    module: nn.Module,
    consumers: list[nn.Module],
    input: torch.Tensor,
    mesh: DeviceMesh,
    dim: int,
    local: bool,
) -> torch.Tensor:
    """The gathered ``input`` the module receives, and every consumer's output, from one
    ``all_gather_matmul`` (the first consumer's schedules); ``local``: the local tensor (``use_local_output``)
    rather than a ``Replicate()`` DTensor."""
    shard = input.to_local() if isinstance(input, DTensor) else input
    dim %= shard.dim()
    weights = [c.weight.to_local().t() for c in consumers]
    dtype = _gemm_dtype(consumers[0], input)
    gathered, outs = _all_gather_matmul(consumers[0]._ficco_tp, shard, weights, dim, dtype, return_a=True)
    # contiguous, as PyTorch's gather returns it (the op put the rank-major rows in place, the one copy
    # PyTorch's all-gather along the sequence makes too)
    gathered = gathered.detach()
    handed = _GatheredInput.apply(shard, dim, mesh.get_local_rank(), None if local else mesh, (gathered,))
    record = _HandOff(
        input=handed, outputs={id(c): y for c, y in zip(consumers, outs, strict=True)}, consumers=consumers
    )
    module._ficco_handoff = record
    for c in consumers:
        c._ficco_tp.handoff = record
    return handed


class _GatheredInput(torch.autograd.Function):
    """The gathered input (computed by the op, handed in a tuple) as a function of this rank's shard: a
    ``Replicate()`` DTensor on ``mesh``, or the local tensor (``mesh`` None). Its backward is PyTorch's
    ``Shard(d) -> Replicate()`` gather's: a DTensor gradient redistributed to ``Shard(dim)``, a local one
    (complete on every rank) sliced to this rank's rows."""

    @staticmethod
    def forward(ctx, shard, dim, rank, mesh, gathered):
        (gathered,) = gathered
        ctx.dim, ctx.mesh, ctx.start, ctx.size = dim, mesh, rank * shard.shape[dim], shard.shape[dim]
        if mesh is None:
            return gathered
        return DTensor.from_local(
            gathered, mesh, [Replicate()], run_check=False, shape=gathered.shape, stride=gathered.stride()
        )

    @staticmethod
    def backward(ctx, grad):
        if isinstance(grad, DTensor):
            shard = grad.redistribute(ctx.mesh, [Shard(ctx.dim)]).to_local()
        else:
            shard = grad.narrow(ctx.dim, ctx.start, ctx.size)
        return shard, None, None, None, None


def _leave(module: nn.Module, _args, _output) -> None:
    """After a prepared module ran: the children that did not take the op's output for them (they got
    another input) are left out of the op from now on, and the log says so once."""
    record: _HandOff | None = getattr(module, "_ficco_handoff", None)
    if record is None:
        return
    module._ficco_handoff = None
    for c in record.consumers:
        c._ficco_tp.handoff = None
    missed = [c for c in record.consumers if id(c) in record.outputs]
    if missed:
        module._ficco_consumers = [c for c in module._ficco_consumers if c not in missed]
        child_names = {id(c): name for name, c in module.named_children()}
        names = ", ".join(child_names[id(c)] for c in missed)
        _warn(
            f"ficco.runtime.tp.PrepareModuleInput on {type(module).__name__}: {names} did not get the "
            "prepared input as it was (the module viewed, cast or normalised it first); they compute from "
            "what they get, as PyTorch's styles do, and are left out of the gathered op from now on"
        )


def _warn(message: str) -> None:
    """``log.warning(message)``; inside ``torch.compile`` when the forward is traced, outside the traced
    code (:func:`_traced_warning`)."""
    if torch.compiler.is_compiling():
        _traced_warning(message)
    else:
        log.warning(message)


@torch.compiler.assume_constant_result
def _traced_warning(message: str) -> bool:
    """``log.warning(message)`` while ``torch.compile`` traces a forward (at trace time)."""
    log.warning(message)
    return True


def _check_even_input(
    module: nn.Module | None, x: torch.Tensor, mesh: DeviceMesh, layout: Placement | None, desired: Shard
) -> None:
    """ValueError before any collective when a prepared input handed out as local shards would be uneven."""
    if layout is None or (isinstance(layout, Shard) and _same(layout, desired, x.dim())):
        return
    dim = desired.dim % x.dim()
    size = x.shape[dim] if isinstance(x, DTensor) or not isinstance(layout, Shard) else None
    if size is not None and size % mesh.size():
        what = f"the input of {type(module).__name__ if module is not None else 'a prepared module'}"
        raise _uneven(what, f"desired_input_layouts=Shard({desired.dim})", dim, size, mesh)


__all__ = [
    "ColwiseParallel",
    "PrepareModuleInput",
    "RowwiseParallel",
    "SequenceParallel",
    "name_modules",
    "set_default_schedules",
]
