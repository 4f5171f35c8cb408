"""The runtime layers under ``torch.compile(fullgraph=True)`` on a gloo world of 2 ranks: their forward and
backward (the ficco ops' registered autograd) trace into one graph with no break, and the compiled step
(AOTAutograd's forward and backward graphs) gives the eager output and gradients."""

from __future__ import annotations

import pytest
from executor_world import run_world

CASES = [("serial/sm", True), ("shard/dma", False), ("finer/sm/s2/chunk", True)]
"""(schedule, keep the gathered input): every family, both weight-gradient paths."""


def _compile_world(rank: int, world_size: int) -> list[dict]:
    import torch
    import torch._dynamo.testing as dynamo_testing
    import torch.nn.functional as F

    from ficco.runtime import ColumnParallelLinear, FixedSource, PlannedOps, Planner, RowParallelLinear

    out = []
    for schedule, keep in CASES:
        torch.manual_seed(0)  # the same weights on every rank and in both runs
        ops = PlannedOps(Planner(FixedSource(schedule)))
        up = ColumnParallelLinear(16, 32, ops=ops, name="up", keep_gathered=keep)
        down = RowParallelLinear(32, 16, ops=ops, name="down")

        def step(x, up=up, down=down):
            return down(F.gelu(up(x)))

        x = torch.randn(16 // world_size, 16, generator=torch.Generator().manual_seed(rank))

        def grads(fn, x=x, up=up, down=down):
            up.weight.grad = down.weight.grad = None
            xi = x.clone().requires_grad_()
            y = fn(xi)
            (y * y).sum().backward()
            return [y.detach(), xi.grad, up.weight.grad, down.weight.grad]

        eager = grads(step)
        explained = torch._dynamo.explain(step)(x.clone().requires_grad_())
        counter = dynamo_testing.CompileCounterWithBackend("aot_eager")
        compiled = grads(torch.compile(step, fullgraph=True, backend=counter))
        errors = [float((c - e).norm() / e.norm()) for c, e in zip(compiled, eager, strict=True)]
        out.append(
            {
                "case": (schedule, keep),
                "breaks": explained.graph_break_count,
                "graphs": explained.graph_count,
                "frames": counter.frame_count,
                "errors": errors,
            }
        )
        torch._dynamo.reset()
    return out


@pytest.mark.slow
def test_compiled_layers_have_no_graph_break_and_give_eager_gradients():
    for rank, cases in enumerate(run_world(2, _compile_world)):
        assert len(cases) == len(CASES)
        for case in cases:
            assert (case["breaks"], case["graphs"], case["frames"]) == (0, 1, 1), (rank, case)
            assert max(case["errors"]) <= 1e-6, (rank, case)
