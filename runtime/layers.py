"""Tensor-parallel linear layers with sequence parallelism, overlapped by ficco (the Megatron-LM pair)::

    column:  x_shard [T/w, in] --all-gather--> x [T, in] @ W_r [in, out/w] = y [T, out/w]
    row:     x [T, in/w] @ W_r [in/w, out] = P_r [T, out] --reduce-scatter--> y_shard [T/w, out]

Each layer's input gradient runs the other layer's op on the transposed weight (Megatron-LM's "sequence
parallel" derivation, registered as the ``torch.ops.ficco`` ops' autograd: the layers hold none of their
own); each of the four ops asks the planner for its own schedule. Weights are stored ``[in, out]`` (the
executor's ``b``), not ``nn.Linear``'s ``[out, in]``; no bias; inputs are 2-D (tokens, features). The
gradients' shapes, and CUDA graphs: docs/planner.md.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from ficco.runtime.overlap import OverlapOps, PlannedOps, backward_follows, dtype_name, request_pair
from ficco.runtime.planner import OpRequest, Schedules


class _TensorParallelLinear(nn.Module):
    """Shared parts: the weight shard, the ops, the per-token-count requests."""

    _fwd_op: ClassVar[str]
    """The forward's overlapped op; the input gradient runs the other one, on the transposed weight."""
    _sharded: ClassVar[int]
    """The dim of the full weight ``[in, out]`` split over the ranks: 1 (columns) or 0 (rows)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        schedules: Schedules = None,
        ops: OverlapOps | None = None,
        name: str = "",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if ops is not None and schedules is not None:
            raise ValueError(
                f"{type(self).__name__}: give schedules= (ficco's ops under those schedules) or ops= "
                "(another implementation), not both"
            )
        ops = ops if ops is not None else PlannedOps(schedules)
        shape = [in_features, out_features]
        size, w = shape[self._sharded], ops.world_size
        if not (isinstance(size, int) and size > 0 and size % w == 0):
            what = f"{type(self).__name__}.{('in_features', 'out_features')[self._sharded]}"
            raise ValueError(f"{what} must be a positive multiple of the group size {w}; got {size!r}")
        shape[self._sharded] //= w
        self.in_features, self.out_features = in_features, out_features
        self.ops = ops
        self.name = name
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight.T, a=math.sqrt(5))  # nn.Linear's init, on [out, in]
        self._requests: dict[tuple[int, str, int], tuple[OpRequest, OpRequest]] = {}
        self._prepared: set[tuple[int, bool]] = set()

    def requests(self, tokens: int, *, backward: bool = True) -> list[OpRequest]:
        """The overlapped ops of one call at ``tokens`` (T, all ranks together), forward and backward."""
        fwd, bwd_input = self._requests_at(tokens)
        return [fwd, bwd_input] if backward else [fwd]

    def _requests_at(self, tokens: int) -> tuple[OpRequest, OpRequest]:
        """The forward's op at ``tokens`` (by the weight shard ``[k, n]``) and the input gradient's (by its
        transpose), kept per (tokens, dtype, group size)."""
        key = (tokens, dtype_name(self.weight.dtype), self.ops.world_size)
        pair = self._requests.get(key)
        if pair is None:
            k, n = self.weight.shape
            pair = self._requests[key] = request_pair(
                self._fwd_op, m=tokens, n=n, k=k, dtype=key[1], world_size=key[2], layer=self.name
            )
        return pair

    def _planned(self, tokens: int, backward: bool) -> tuple[OpRequest, OpRequest]:
        """The ops of a call at ``tokens``; the first such call has the ops' planner decide them (forward,
        and with ``backward`` the input gradient's op too) in one batch."""
        pair = self._requests_at(tokens)
        # keyed by the forward's OpRequest: torch.compile traces id() of an object made outside the
        # compiled region, not of a tuple
        if (id(pair[0]), backward) not in self._prepared:
            prepare = getattr(self.ops, "prepare", None)
            if prepare is not None:
                prepare(list(pair) if backward else [pair[0]])
            if backward:
                self.ops.note(self.name, "bwd-weight", self._weight_gemm(tokens))
            self._prepared.add((id(pair[0]), backward))
        return pair

    def _weight_gemm(self, tokens: int) -> str:
        """The weight gradient's GEMM at ``tokens`` (a plain GEMM, shown in the decision table)."""
        raise NotImplementedError

    def load_full_weight(self, full: torch.Tensor) -> None:
        """Copy this rank's block of the full weight ``[in, out]`` (its columns or rows, as the layer splits
        it)."""
        size = self.weight.shape[self._sharded]
        with torch.no_grad():
            self.weight.copy_(full.narrow(self._sharded, self.ops.rank * size, size))


class ColumnParallelLinear(_TensorParallelLinear):
    """all-gather -> GEMM: ``x_shard [T/w, in] -> y [T, out/w]`` (docs/planner.md).

    Parameters
    ----------
    in_features, out_features : int
        The full layer's sizes; ``out_features`` must divide by the group size.
    schedules : Planner, ScheduleSource, Schedule, str, callable or None, default=None
        Where the ops' schedules come from, as ``runtime.as_planner`` takes it (ficco's ops over the world
        group: ``PlannedOps(schedules)``; None: this machine's measured model).
    ops : OverlapOps, optional
        Runs the overlapped ops instead (another group: ``PlannedOps(schedules, group)``; another
        differentiable implementation of ``runtime.overlap.OverlapOps``); not with ``schedules``.
    name : str, default=""
        Shown in the planner's decision table (``runtime.apply_ops`` fills in the module path).
    keep_gathered : bool, default=True
        Keep the gathered input from the forward for the weight gradient (T x in elements per layer held
        until backward), or gather it again in the backward (an extra all-gather, less memory).
    device, dtype : optional
        Of the weight shard ``[in, out/w]``.
    """

    _fwd_op, _sharded = "ag_gemm", 1

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        schedules: Schedules = None,
        ops: OverlapOps | None = None,
        name: str = "",
        keep_gathered: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            in_features, out_features, schedules=schedules, ops=ops, name=name, device=device, dtype=dtype
        )
        self.keep_gathered = keep_gathered

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        _check_input("ColumnParallelLinear", x_shard, self.in_features, "[T/w, in]")
        backward = backward_follows(x_shard, self.weight)
        fwd, bwd_input = self._planned(x_shard.shape[0] * self.ops.world_size, backward)
        # keep_gathered: the op returns the gathered input, which its autograd keeps for the weight
        # gradient; otherwise the backward gathers it again beside the input gradient's op
        _, (y,) = self.ops.all_gather_matmul(
            x_shard,
            [self.weight],
            fwd,
            bwd_input if backward else None,
            return_gathered=backward and self.keep_gathered,
        )
        return y

    def _weight_gemm(self, tokens: int) -> str:
        how = "kept gathered input" if self.keep_gathered else "input gathered again (all-gather)"
        return f"gemm [{self.in_features}, {tokens}] @ [{tokens}, {self.weight.shape[1]}], {how}"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, keep_gathered={self.keep_gathered}"


class RowParallelLinear(_TensorParallelLinear):
    """GEMM -> reduce-scatter: ``x [T, in/w] -> y_shard [T/w, out]`` (docs/planner.md). Parameters as
    :class:`ColumnParallelLinear`'s, without ``keep_gathered``; ``in_features`` must divide by the group
    size, and the weight shard is ``[in/w, out]``."""

    _fwd_op, _sharded = "gemm_rs", 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("RowParallelLinear", x, self.weight.shape[0], "[T, in/w]")
        backward = backward_follows(x, self.weight)
        fwd, bwd_input = self._planned(x.shape[0], backward)
        return self.ops.matmul_reduce_scatter(x, self.weight, fwd, bwd_input if backward else None)

    def _weight_gemm(self, tokens: int) -> str:
        k = self.weight.shape[0]
        return f"gemm [{k}, {tokens}] @ gathered grad [{tokens}, {self.out_features}] of bwd-input"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"


def apply_ops(module: nn.Module, ops: OverlapOps) -> None:
    """Give every tensor-parallel layer under ``module`` the ops ``ops`` (e.g. another planner, or another
    implementation such as PyTorch async-TP), and name unnamed layers by their module path."""
    for path, child in module.named_modules():
        if isinstance(child, _TensorParallelLinear):
            child.ops = ops
            child.name = child.name or path
            child._requests.clear()
            child._prepared.clear()


def _check_input(layer: str, x: torch.Tensor, features: int, expected: str) -> None:
    if x.dim() != 2 or x.shape[1] != features:
        raise ValueError(
            f"{layer} input has shape {list(x.shape)}; expected a 2-D tensor {expected} with "
            f"{features} features"
        )
