"""``serial/sm`` on sequence-parallel shards runs PyTorch's own path: the aten ops ficco's ops launch (outside
the collectives) are those of DTensor's gather along the sequence beside ``F.linear`` (the functional
collective, its concatenation, one GEMM per weight), and for the reduce-scatter the GEMMs, the input
gradients' sum accumulating in the GEMMs (``addmm_`` where autograd runs ``mm`` then ``add_``) and one
concatenation; no copy of a strided view, no GEMM split. One process plays rank 0 of a pretend world
(``benchmarks.support.loopback``: the collectives move nothing), at 2 and 4 ranks, 2 and 3 sequences, one
and three weights."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from benchmarks.support.loopback import loopback_world
from ficco.executor import library  # noqa: F401 (registers torch.ops.ficco)

LAUNCHING = frozenset({"mm", "addmm", "addmm_", "add", "add_", "cat", "copy_", "_to_copy", "clone"})
"""Aten ops that run a kernel of their own (the others here are views, allocations or their parents)."""


def launched(call) -> list[str]:
    """The :data:`LAUNCHING` ops one ``call`` runs, in order, but those inside a collective (the pretend
    group's own copies)."""
    call()  # first-call checks and caches out of the way
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    out = []
    for event in prof.events():
        name = event.name.removeprefix("aten::")
        if not event.name.startswith("aten::") or name not in LAUNCHING:
            continue
        parent = event.cpu_parent
        while parent is not None and "c10d" not in parent.name:
            parent = parent.cpu_parent
        if parent is None:
            out.append(name)
    return out


def accumulated(ops: list[str]) -> list[str]:
    """``ops`` with each ``mm`` followed by ``add_`` (a GEMM, then its sum into the gradient) as one
    ``addmm_``."""
    out: list[str] = []
    for name in ops:
        if name == "add_" and out and out[-1] == "mm":
            out[-1] = "addmm_"
        else:
            out.append(name)
    return out


@pytest.fixture(params=[2, 4], ids=lambda w: f"w{w}")
def group(request):
    with loopback_world(request.param, "cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # funcol's older names, as DTensor calls them
        yield dist.group.WORLD.group_name, request.param


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("ns", [(8,), (8, 4, 4)], ids=["one weight", "q/k/v"])
@pytest.mark.parametrize("return_a", [True, False])
def test_serial_gather_launches_pytorchs_ops(group, batch, ns, return_a):
    name, _ = group
    k = 16
    shard = torch.randn(batch, 4, k, dtype=torch.bfloat16)
    weights = [torch.randn(n, k, dtype=torch.bfloat16) for n in ns]

    def pytorch():
        gathered = funcol.wait_tensor(funcol.all_gather_tensor(shard, 1, name))
        return [F.linear(gathered, weight) for weight in weights]

    def ficco():
        ts = [weight.t() for weight in weights]
        return torch.ops.ficco._all_gather_matmul(shard, ts, 1, name, "serial/sm", return_a)

    theirs = launched(pytorch)
    assert theirs == ["cat", *["mm"] * len(ns)]
    assert launched(ficco) == theirs


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("ks", [(8,), (8, 4, 4)], ids=["one weight", "q/k/v gradients"])
def test_serial_scatter_launches_pytorchs_gemms_and_one_concatenation(group, batch, ks):
    name, w = group
    n = 16
    parts = [torch.randn(batch, 4 * w, k, dtype=torch.bfloat16) for k in ks]
    weights = [torch.randn(n, k, dtype=torch.bfloat16) for k in ks]

    def pytorch():
        partial = F.linear(parts[0], weights[0])
        for x, weight in zip(parts[1:], weights[1:], strict=True):
            partial += F.linear(x, weight)  # autograd's sum of each weight's input gradient
        return funcol.wait_tensor(funcol.reduce_scatter_tensor(partial, "sum", 1, name))

    def ficco():
        ts = [weight.t() for weight in weights]
        if len(parts) == 1:
            return torch.ops.ficco._matmul_reduce_scatter(parts[0], ts[0], "sum", 1, name, "serial/sm")
        return torch.ops.ficco._matmuls_reduce_scatter(parts, ts, "sum", 1, name, "serial/sm")

    theirs = launched(pytorch)
    assert theirs == ["mm", *["mm", "add_"] * (len(ks) - 1), "cat"]
    assert launched(ficco) == accumulated(theirs)
