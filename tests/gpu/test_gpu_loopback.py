"""One-GPU tests (marker ``gpu``) of the executor's CUDA stream, event and graph-capture code at 2, 4 and 8
ranks, in a loopback world (``benchmarks.support.loopback``): this process is rank 0 of a pretend world whose
collectives move nothing and whose peer memory is local and zeroed, so the side lanes, events, barriers and
captures of 4 and 8 ranks run on a machine with one GPU. Every op, case and schedule of the 2-GPU check
(``executor_gpu_check``: all 30 schedules; the MoE ops on their four routings, grouped expert GEMMs
included) runs three times eagerly, then is captured into a CUDA graph and replayed, which must write what
the eager call wrote (same inputs and output; the fake transfers leave the same bytes behind both times).
The copy-engine schedules of the dense ops must also give serial's answer for peers that hold zeros. Then
captured training steps: the runtime layers' (gradients as eager) and the block benchmark's ``train_graph``
phase (every variant runs). What the peers would have sent is not checked here: that is the 2-GPU check's.
Skipped without a CUDA GPU."""

from __future__ import annotations

import executor_gpu_check as check
import pytest
import torch
from replays import replayed_grads

from benchmarks.support.loopback import loopback_world
from ficco import executor
from ficco.features import OP_SPECS, Routing, Scenario, candidates

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _zero_peers(op: str, a: torch.Tensor, b: torch.Tensor, world: int) -> torch.Tensor:
    """Serial's answer on rank 0 when every peer's input is zero: ``ag_gemm``, the gathered A holds rank 0's
    shard on top and zeros below, times ``b``; ``gemm_rs``, rank 0's block of ``a @ b`` alone."""
    if op == "ag_gemm":
        gathered = torch.zeros(a.shape[0] * world, a.shape[1], device=a.device, dtype=a.dtype)
        gathered[: a.shape[0]] = a
        return gathered @ b
    return (a @ b)[: a.shape[0] // world]


def _same(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when ``got`` equals ``want`` within bf16 tolerance with non-finite values in the same places (a
    fake receive leaves whatever its buffer held, NaN included), else the reason."""
    finite = want.isfinite()
    same_places = torch.equal(finite, got.isfinite())
    if not same_places or not torch.equal(want[~finite].isnan(), got[~finite].isnan()):
        return "non-finite values differ"
    return check._compare(torch.where(finite, got, 0), torch.where(finite, want, 0))


def _failures(op: str, scenario: Scenario, world: int, device: torch.device) -> list[str]:
    """What went wrong for each schedule of ``scenario`` (empty: nothing)."""
    routing = Routing.for_scenario(scenario) if OP_SPECS[op].moe else None
    a, b = check._inputs(scenario, 1, device)
    out = torch.zeros_like(executor.run_op(op, a, b, "serial/sm", routing=routing))
    failures = []
    for schedule in candidates(scenario):

        def run(schedule=schedule) -> None:
            executor.run_op(op, a, b, schedule, routing=routing, out=out)

        try:
            for _ in range(3):
                out.zero_()
                run()
            eager = out.clone()
            if schedule.executor == "dma" and not OP_SPECS[op].moe:
                why = check._compare(eager, _zero_peers(op, a, b, world))
                if why:
                    failures.append(f"{op} {schedule} eager: {why}")
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            why = _same(out, eager)
        except Exception as exc:  # report it with the others
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if why:
            failures.append(f"{op} {schedule} graph: {why}")
    return failures


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_schedule_replays_what_it_wrote_eagerly_in_a_loopback_world(world):
    failures = []
    with loopback_world(world) as device:
        for op in OP_SPECS:
            for label, scenario in check.cases(op, world):
                failures += [f"{label}: {why}" for why in _failures(op, scenario, world, device)]
                executor.clear_buffers()
    assert not failures, f"{len(failures)} failures, e.g. {failures[:5]}"


@pytest.mark.parametrize("world", [2, 4])
def test_a_training_step_of_the_layers_replays_from_cuda_graphs(world):
    """An MLP of the runtime layers (column-parallel up, row-parallel down), forward and backward with the
    gradients zeroed inside the step, captured by ``runtime.GraphedCall``: each replay leaves the weight and
    input gradients the eager step left (copy-engine schedules, whose zero peers make the step deterministic
    in a loopback world)."""
    import torch.nn.functional as F

    from ficco.runtime import ColumnParallelLinear, FixedSource, PlannedOps, Planner, RowParallelLinear
    from ficco.runtime.graphs import GraphedCall

    tokens, d_in, hidden, d_out = 512, 256, 512, 256
    failures = []
    with loopback_world(world) as device:
        gen = torch.Generator(device="cuda").manual_seed(3)
        for schedule in ("serial/dma", "shard/dma", "finer/dma/s2/chunk", "finer/dma/s4/shard/hp"):
            planner = Planner(FixedSource(schedule), mode="graph", hardware=f"h200x{world}")
            ops = PlannedOps(planner)
            layer = {"ops": ops, "device": device, "dtype": torch.bfloat16}
            up = ColumnParallelLinear(d_in, hidden, name="up", **layer)
            down = RowParallelLinear(hidden, d_out, name="down", **layer)
            x = torch.randn(tokens // world, d_in, device="cuda", dtype=torch.bfloat16, generator=gen)
            x.requires_grad_()
            grad_y = torch.randn(tokens // world, d_out, device="cuda", dtype=torch.bfloat16, generator=gen)
            leaves = [up.weight, down.weight, x]

            def step(up=up, down=down, x=x, grad_y=grad_y, leaves=leaves) -> None:
                for leaf in leaves:
                    if leaf.grad is not None:
                        leaf.grad.zero_()
                down(F.gelu(up(x))).backward(grad_y)

            step()
            eager = [leaf.grad.clone() for leaf in leaves]
            assert {str(d.schedule) for d in planner.decisions.values()} == {schedule}  # no fallback
            graphed = GraphedCall(step)
            for replay, grads in replayed_grads(graphed, leaves):  # both captures
                for name, grad, want in zip(("up.weight", "down.weight", "x"), grads, eager, strict=True):
                    why = _same(grad, want)
                    if why:
                        failures.append(f"{schedule} replay {replay} grad of {name}: {why}")
            del graphed
            executor.clear_buffers()
    assert not failures, failures


def test_the_block_benchmarks_graphed_training_step_runs_every_variant():
    """``benchmarks/block_bench.py``'s ``train_graph`` phase on the tiny block in a loopback world of 2: every
    variant of the phase is captured, replayed and timed. The numbers are not the block's (no peer sends
    anything): this runs the code path on a GPU."""
    import argparse
    from dataclasses import asdict

    from benchmarks import block_bench as bench
    from benchmarks.step_timing import StepTiming
    from ficco.runtime import FixedSource

    args = argparse.Namespace(
        timing=asdict(StepTiming(warmup=1, rounds=2, reps=2, timed_ms=0.0, max_rounds=2))
    )
    with loopback_world(2) as device:
        ops = bench.ShapeOnlyOps(2, 0)
        block = bench.Block(bench.CPU_SMOKE, ops, seq_len=16, device=device, dtype=torch.bfloat16)
        sources = {"planner": FixedSource("finer/dma/s2/chunk"), "oracle": {}, "timeout_s": 1.0}
        variants = bench.make_variants("train_graph", sources, device)
        got = bench.run_train_point(block, variants, 64, args, device, torch.bfloat16, graphed=True)
    assert "async_tp" not in variants and "verified" in variants
    assert got["errors"] == {}
    assert set(got["times"]) == set(variants) and all(ms > 0 for ms in got["times"].values())
