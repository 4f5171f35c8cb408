"""Drop-ins for PyTorch's tensor-parallel styles that run ficco's overlapped ops: a plan written for
``torch.distributed.tensor.parallel.parallelize_module`` (torchtitan's Llama plan, ``apply_tp``) switches to
ficco by changing its imports::

    # from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel
    from ficco.runtime.tp import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    ficco.runtime.tp.set_default_schedules(Planner(PredictorSource.load(hardware_id="h200x2")))
    apply_tp(model, tp_mesh, ...)            # the plan itself is unchanged
    ficco.runtime.tp.name_modules(model)     # optional: module paths in the planner's table

What each style runs (sequence parallel, ``Shard(1)`` on ``[batch, seq, hidden]``, as torchtitan lays out
its activations):

- ``PrepareModuleInput`` with an input ``Shard(d) -> Replicate()`` (the gather in front of ``attention`` and
  ``feed_forward``) gathers nothing itself: the module receives a stand-in of the gathered shape, and the
  first of its ficco ``ColwiseParallel`` children to run issues ONE ``torch.ops.ficco.all_gather_matmul`` of
  the shard against every such child's weight (q/k/v; w1/w3), which the others then take their output from.
  A module with another consumer of that input (a linear layer of PyTorch's styles) gets PyTorch's gather.
- ``ColwiseParallel`` (``nn.Linear``): a ``Shard(d)`` input (torchtitan's ``output`` layer) runs
  ``all_gather_matmul`` on its own; a replicated input, the local GEMM. Output ``Shard(-1)``, redistributed
  to ``output_layouts`` as PyTorch's style does.
- ``RowwiseParallel`` (``nn.Linear`` with ``output_layouts=Shard(d)``): ``matmul_reduce_scatter``.
- Anything else (``nn.Embedding``, a rowwise output ``Replicate()``: an all-reduce) and ``SequenceParallel``:
  PyTorch's own style, unchanged.

Parameters are sharded exactly as PyTorch's styles shard them (DTensors, same placements), so optimizers,
checkpoints and FSDP see the same model. Schedules come from ``schedules=`` on each style, else the process
default (:func:`set_default_schedules`): a ``runtime.Planner`` (a local model, a table, the service, a
fixed schedule; asked once per shape, ranks agreeing), or a schedule or token-range table string
(``executor.library``). With neither, the styles run ``serial/sm`` and say so once.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import PrepareModuleInput as _TorchPrepareModuleInput
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise
from torch.distributed.tensor.parallel import SequenceParallel

from ficco.executor import library  # noqa: F401 (registers torch.ops.ficco)
from ficco.features import SERIAL
from ficco.runtime.overlap import backward_follows, dtype_name, request_pair
from ficco.runtime.planner import OpRequest, Planner

log = logging.getLogger(__name__)

Schedules = Planner | str
"""Where a style's schedules come from: a planner, or a schedule / token-range table string."""

_default: list[Schedules | None] = [None]


def set_default_schedules(schedules: Schedules | None) -> None:
    """The schedule source of every ficco style built without ``schedules=`` (None: ``serial/sm``)."""
    if schedules is not None and not isinstance(schedules, Planner | str):
        raise ValueError(
            "schedules must be a runtime.Planner or a schedule / token-range table string; got "
            f"{type(schedules).__name__}"
        )
    _default[0] = schedules


def name_modules(model: nn.Module) -> None:
    """Name every ficco-parallelized module under ``model`` by its path (the planner's ``layer`` column)."""
    for path, module in model.named_modules():
        state = getattr(module, "_ficco_tp", None)
        if state is not None:
            state.name = path


@dataclass(kw_only=True, slots=True)
class _State:
    """What a ficco-parallelized ``nn.Linear`` keeps: its style's arguments and its group."""

    kind: str
    """``colwise`` or ``rowwise``."""
    mesh: DeviceMesh
    """The tensor-parallel mesh (one dimension)."""
    group_name: str
    """Its c10d group's name, as the ficco ops take it."""
    world_size: int
    input_layout: Placement
    output_layout: Placement
    use_local_output: bool
    schedules: Schedules | None
    """The style's schedule source; None: the process default."""
    name: str = ""
    """The module's path (``name_modules``), shown in the planner's table."""
    requests: dict[tuple, tuple[OpRequest, OpRequest]] = field(default_factory=dict)
    """(op, m, n, k, dtype) -> the op's request and its backward's (a planner's)."""
    prepared: set[tuple] = field(default_factory=set)
    """(request key, backward) pairs the planner has decided."""

    def schedule_strings(
        self, op: str, m: int, n: int, k: int, dtype: torch.dtype, backward: bool
    ) -> tuple[str, str]:
        """The schedule strings of an op at this shape and, with ``backward``, of its backward's op (the
        other of the pair; "" without)."""
        source = self.schedules if self.schedules is not None else _default[0]
        if source is None:
            _warn_serial_once()
            return str(SERIAL), ""
        if isinstance(source, str):
            return source, ""
        key = (op, m, n, k, dtype)
        pair = self.requests.get(key)
        if pair is None:
            pair = self.requests[key] = request_pair(
                op, m=m, n=n, k=k, dtype=dtype_name(dtype), world_size=self.world_size, layer=self.name
            )
        if (key, backward) not in self.prepared:  # decided in one batch once, a lookup afterwards
            source.prepare(list(pair) if backward else pair[:1])
            self.prepared.add((key, backward))
        return str(source.schedule(pair[0])), str(source.schedule(pair[1])) if backward else ""


_warned: list[bool] = [False]


def _warn_serial_once() -> None:
    if not _warned[0]:
        _warned[0] = True
        log.warning(
            "ficco.runtime.tp: no schedule source (pass schedules= to the styles or call "
            "set_default_schedules); every ficco op runs serial/sm"
        )


class _LinearStyle:
    """The ficco column and row styles' part: PyTorch's arguments plus ``schedules``, and ficco's forward on
    the modules :meth:`_runs_ficco` accepts (PyTorch's style on the rest)."""

    _kind: str
    """``colwise`` or ``rowwise``."""

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        schedules: Schedules | None = None,
    ) -> None:
        super().__init__(
            input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output
        )
        self.schedules = schedules

    def _runs_ficco(self, module: nn.Module) -> bool:
        """Whether ``module`` gets ficco's forward (else PyTorch's style applies)."""
        return isinstance(module, nn.Linear)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not self._runs_ficco(module):
            return super()._apply(module, device_mesh)
        distribute_module(module, device_mesh, self._partition_linear_fn)
        _attach(module, device_mesh, self._kind, self)
        return module


class ColwiseParallel(_LinearStyle, _TorchColwise):
    """PyTorch's ``ColwiseParallel`` (same arguments) running ficco's all-gather -> GEMM; ``schedules``:
    where its schedules come from (module docstring)."""

    _kind = "colwise"


class RowwiseParallel(_LinearStyle, _TorchRowwise):
    """PyTorch's ``RowwiseParallel`` (same arguments) running ficco's GEMM -> reduce-scatter when its output
    is ``Shard(d)``; ``schedules``: where its schedules come from (module docstring)."""

    _kind = "rowwise"

    def _runs_ficco(self, module: nn.Module) -> bool:
        # otherwise an embedding, or an all-reduce: PyTorch's
        return isinstance(module, nn.Linear) and isinstance(self.output_layouts[0], Shard)


class PrepareModuleInput(_TorchPrepareModuleInput):
    """PyTorch's ``PrepareModuleInput`` (same arguments) whose ``Shard(d) -> Replicate()`` inputs feed the
    module's ficco ``ColwiseParallel`` children as one ``all_gather_matmul`` (module docstring)."""

    def _prepare_input_arg(self, input, mesh, input_layout, desired_layout):
        if not (
            isinstance(input_layout, Shard)
            and isinstance(desired_layout, Replicate)
            and not self.use_local_output
            and isinstance(input, torch.Tensor)
            and self._fused is not None
        ):
            return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)
        shard = input.to_local() if isinstance(input, DTensor) else input
        dim = input_layout.dim % shard.dim()
        full = list(shard.shape)
        full[dim] *= mesh.size()
        # a stand-in of the gathered shape (no memory): the module reads its shape and hands it to its
        # column-parallel children, which find the shard through it
        stand_in = shard.new_zeros(()).expand(full)
        stand_in._ficco_gather = _Gather(shard=shard, dim=dim, consumers=self._fused)
        return stand_in

    _fused: list[nn.Module] | None = None
    """The consumers of the module being called (set by the pre-hook that runs before PyTorch's)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.register_forward_pre_hook(self._select_consumers, prepend=True)
        return super()._apply(module, device_mesh)

    def _select_consumers(self, module: nn.Module, _inputs) -> None:
        if not hasattr(module, "_ficco_consumers"):
            module._ficco_consumers = _consumers(module)
        self._fused = module._ficco_consumers


def _consumers(module: nn.Module) -> list[nn.Module] | None:
    """The children a prepared module's gathered input feeds as one op (its ficco column-parallel linears),
    or None where a linear child of PyTorch's styles could read that input too."""
    linears = [c for c in module.children() if isinstance(c, nn.Linear)]
    ficco = [c for c in linears if getattr(c, "_ficco_tp", None) is not None]
    fused = [c for c in ficco if c._ficco_tp.kind == "colwise"]
    torch_styles = [c for c in linears if c not in ficco and isinstance(c.weight, DTensor)]
    if fused and torch_styles:
        log.warning(
            "ficco.runtime.tp.PrepareModuleInput on %s: linear children of PyTorch's styles read its "
            "input too, so it is gathered as PyTorch gathers it",
            type(module).__name__,
        )
        return None
    return fused or None


@dataclass(kw_only=True, slots=True)
class _Gather:
    """One gathered input's shard and, once the first consumer ran, every consumer's output."""

    shard: torch.Tensor
    dim: int
    consumers: list[nn.Module]
    outputs: dict[int, torch.Tensor] | None = None


def _attach(module: nn.Module, mesh: DeviceMesh, kind: str, style: _LinearStyle) -> None:
    module._ficco_tp = _State(
        kind=kind,
        mesh=mesh,
        group_name=mesh.get_group().group_name,
        world_size=mesh.size(),
        input_layout=style.input_layouts[0],
        output_layout=style.output_layouts[0],
        use_local_output=style.use_local_output,
        schedules=style.schedules,
        name=type(module).__name__,
    )
    forward = _colwise_forward if kind == "colwise" else _rowwise_forward
    module.forward = types.MethodType(forward, module)


def _colwise_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    state: _State = self._ficco_tp
    gather = getattr(x, "_ficco_gather", None)
    if gather is not None and self in gather.consumers:
        if gather.outputs is None:
            gather.outputs = _fused_all_gather_matmul(gather)
        y = gather.outputs[id(self)]
    else:
        layout = x.placements[0] if isinstance(x, DTensor) else state.input_layout
        local = x.to_local() if isinstance(x, DTensor) else x
        weight = self.weight.to_local()
        if isinstance(layout, Shard):  # sequence-parallel input: gathered by the op itself
            dim = layout.dim % local.dim()
            m = local.numel() // local.shape[-1] * state.world_size
            backward = backward_follows(local, weight)
            fwd, bwd = state.schedule_strings("ag_gemm", m, *weight.shape, local.dtype, backward)
            _, (y,) = torch.ops.ficco.all_gather_matmul(
                local, [weight.t()], dim, state.group_name, fwd, False, bwd
            )
        else:
            y = F.linear(local, weight)
    if self.bias is not None:
        y = y + self.bias.to_local()
    return _output(state, y, Shard(-1))


def _fused_all_gather_matmul(gather: _Gather) -> dict[int, torch.Tensor]:
    """Every consumer's output of one gathered input: one op over all their weights (the first consumer's
    schedules)."""
    state: _State = gather.consumers[0]._ficco_tp
    weights = [c.weight.to_local().t() for c in gather.consumers]  # [k, n_i]
    shard = gather.shard
    m = shard.numel() // shard.shape[-1] * state.world_size
    n = sum(w.shape[1] for w in weights)
    keep = backward_follows(shard, *weights)
    fwd, bwd = state.schedule_strings("ag_gemm", m, n, shard.shape[-1], shard.dtype, keep)
    _, outs = torch.ops.ficco.all_gather_matmul(shard, weights, gather.dim, state.group_name, fwd, keep, bwd)
    return {id(c): y for c, y in zip(gather.consumers, outs, strict=True)}


def _rowwise_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    state: _State = self._ficco_tp
    local = x.to_local() if isinstance(x, DTensor) else x
    weight = self.weight.to_local()  # [out, in/w]
    dim = state.output_layout.dim % local.dim()
    m = local.numel() // local.shape[-1]
    backward = backward_follows(local, weight)
    fwd, bwd = state.schedule_strings("gemm_rs", m, *weight.shape, local.dtype, backward)
    y = torch.ops.ficco.matmul_reduce_scatter(local, weight.t(), "sum", dim, state.group_name, fwd, bwd)
    if self.bias is not None:
        y = y + self.bias.to_local()
    return _output(state, y, Shard(dim))


def _output(state: _State, y: torch.Tensor, layout: Placement) -> torch.Tensor:
    """``y`` (this rank's part, laid out as ``layout``) as the style's ``output_layouts`` and
    ``use_local_output`` say, as PyTorch's styles return it."""
    out_layout = state.output_layout
    if _same_layout(layout, out_layout, y.dim()) and state.use_local_output:
        return y
    dt = DTensor.from_local(y, state.mesh, [layout], run_check=False)
    if not _same_layout(layout, out_layout, y.dim()):
        dt = dt.redistribute(placements=[out_layout])
    return dt.to_local() if state.use_local_output else dt


def _same_layout(a: Placement, b: Placement, ndim: int) -> bool:
    if isinstance(a, Shard) and isinstance(b, Shard):
        return a.dim % ndim == b.dim % ndim
    return a == b


__all__ = [
    "ColwiseParallel",
    "PrepareModuleInput",
    "RowwiseParallel",
    "Schedules",
    "SequenceParallel",
    "name_modules",
    "set_default_schedules",
]
