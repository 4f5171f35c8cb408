"""Every executor schedule on CUDA against serial, eager and graph-captured; torchrun, one rank per GPU.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/executor_gpu_check.py
    # only some ops (names of features.OP_SPECS), e.g. the MoE all-to-alls
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/executor_gpu_check.py \
        --ops a2a_gemm,gemm_a2a

For every op of ``features.OP_SPECS`` (its shapes and whether it takes a routing come from the table), on
each case of ``cases`` (the MoE ops, 2 local experts: a balanced routing, rank 0 taking 1.5x, and every row
sent to rank 0, which leaves the other ranks empty blocks; and 16 local experts, balanced, whose blocks of
>= ``GROUPED_MIN_GEMMS`` expert GEMMs run grouped), every candidate schedule (all 30): two eager warm-up
calls, an eager call compared with serial/sm (bf16 tolerance, same shape and strides), then the call captured
into a ``torch.cuda.CUDAGraph`` and replayed with new data copied into its static inputs, compared with serial
on that data. Rank 0 prints one line per
(op, case, schedule, mode) ``CHECK <op> <case> <schedule> <mode> ok|FAIL <detail>`` and ``ALL OK`` at the
end; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys

from ficco.harness.worker import SAFE_ENV

os.environ.update(SAFE_ENV)  # before torch.distributed initialises NCCL

import torch
import torch.distributed as dist

from ficco import executor
from ficco.features import OP_SPECS, Routing, Scenario, candidates, get_hardware

M, N, K = 1024, 512, 256
"""Small shapes: every schedule's split divides them at up to 8 ranks (dense: M rows, K the reduction of
ag_gemm and the summed one of gemm_rs; MoE: M / 4 tokens per rank, top-2, so M / 2 routed rows)."""
RTOL = 2e-2
"""Relative error (max abs difference over max abs of serial) allowed for bf16."""


def cases(op: str, world: int) -> list[tuple[str, Scenario]]:
    """The (label, scenario) pairs ``op`` is checked on at ``world`` ranks."""
    hardware = get_hardware("h200x8")
    if not OP_SPECS[op].moe:  # gemm_rs: each rank holds its K / w slice of the reduction
        k = K if OP_SPECS[op].comm_first else K // world
        return [("dense", Scenario(op=op, m=M, n=N, k=k, world_size=world, hardware=hardware))]

    def moe(imbalance: float, local_experts: int) -> Scenario:
        return Scenario(
            op=op,
            m=M // 4,
            n=N,
            k=K,
            world_size=world,
            experts=local_experts * world,
            top_k=2,
            imbalance=imbalance,
            hardware=hardware,
        )

    # 2 local experts: every block a loop of torch.mm; 16: the blocks of >= GROUPED_MIN_GEMMS grouped
    return [(f"i{i:g}", moe(float(i), 2)) for i in (1.0, 1.5, world)] + [("e16", moe(1.0, 16))]


def _inputs(scenario: Scenario, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-specific bf16 inputs shaped as the op's spec says (``OpSpec.shapes``)."""
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + dist.get_rank())
    shapes = OP_SPECS[scenario.op].shapes(scenario, dist.get_rank())
    a = torch.randn(shapes.a, generator=g).to(device, torch.bfloat16)
    b = torch.randn(shapes.b, generator=g).to(device, torch.bfloat16)
    return a, b


def _compare(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when ``got`` matches ``want`` in shape, strides and values (bf16 tolerance), else the reason."""
    if got.shape != want.shape or got.stride() != want.stride():
        return f"shape/stride {tuple(got.shape)}/{got.stride()} != {tuple(want.shape)}/{want.stride()}"
    if want.numel() == 0:
        return ""
    err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
    return "" if err <= RTOL else f"relative error {err:.3g} > {RTOL}"


def _check(scenario: Scenario, schedule, device: torch.device) -> list[tuple[str, str]]:
    """[(mode, failure or '')] for eager and graph mode of one schedule."""
    routing = Routing.for_scenario(scenario) if OP_SPECS[scenario.op].moe else None

    def run(a: torch.Tensor, b: torch.Tensor, s) -> torch.Tensor:
        return executor.run_op(scenario.op, a, b, s, routing=routing)

    a, b = _inputs(scenario, 1, device)
    want = run(a, b, "serial/sm").clone()
    for _ in range(2):
        run(a, b, schedule)
    torch.cuda.synchronize()
    out = [("eager", _compare(run(a, b, schedule), want))]
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static = run(a, b, schedule)
        a2, b2 = _inputs(scenario, 2, device)
        a.copy_(a2)
        b.copy_(b2)
        g.replay()
        torch.cuda.synchronize()
        want2 = run(a2, b2, "serial/sm")
        out.append(("graph", _compare(static, want2)))
    except Exception as exc:  # report and carry on with the next schedule
        out.append(("graph", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    dist.barrier()
    return out


def main(argv: list[str] | None = None) -> int:
    """Check every (op, case, schedule, mode); rank 0 prints the results; 0 when all passed."""
    p = argparse.ArgumentParser(prog="tests/gpu/executor_gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(OP_SPECS), help="comma-separated ops (default: every op)")
    ops = p.parse_args(argv).ops.split(",")
    unknown = [op for op in ops if op not in OP_SPECS]
    if unknown:
        p.error(f"--ops must name ops of {list(OP_SPECS)}; got {unknown}")
    with executor.process_group("cuda") as device:
        world = dist.get_world_size()
        failures = 0
        for op in ops:
            for label, scenario in cases(op, world):
                for schedule in candidates(scenario):
                    for mode, why in _check(scenario, schedule, device):
                        flags = torch.tensor([0 if not why else 1], device=device)
                        dist.all_reduce(flags)
                        failures += int(flags.item() > 0)
                        if dist.get_rank() == 0:
                            status = "ok" if flags.item() == 0 else f"FAIL {why or '(another rank failed)'}"
                            print(f"CHECK {op} {label} {schedule} {mode} {status}", flush=True)
                executor.clear_buffers()
        if dist.get_rank() == 0:
            print("ALL OK" if failures == 0 else f"FAILED {failures}", flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
