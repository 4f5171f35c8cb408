"""Every executor schedule on CUDA against serial, eager and graph-captured; torchrun, one rank per GPU.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/executor_gpu_check.py

For both ops and all 30 schedules: two eager warm-up calls, an eager call compared with serial/sm (bf16
tolerance, same shape and strides), then the call captured into a ``torch.cuda.CUDAGraph`` and replayed with
new data copied into its static inputs, compared with serial on that data. Rank 0 prints one line per
(op, schedule, mode) ``CHECK <op> <schedule> <mode> ok|FAIL <detail>`` and ``ALL OK`` at the end; exits 1 on
any failure.
"""

from __future__ import annotations

import os
import sys

from ficco.harness.worker import SAFE_ENV

os.environ.update(SAFE_ENV)  # before torch.distributed initialises NCCL

import torch
import torch.distributed as dist

from ficco import executor
from ficco.features.schedule import all_schedules

M, N, K = 1024, 512, 256
"""Small shapes: every schedule's split divides them at up to 8 ranks."""
RTOL = 2e-2
"""Relative error (max abs difference over max abs of serial) allowed for bf16."""


def _run(op: str, x: torch.Tensor, b: torch.Tensor, schedule) -> torch.Tensor:
    """One call of ``op`` (``ag_gemm`` or ``gemm_rs``) on ``x`` and ``b``."""
    if op == "ag_gemm":
        return executor.all_gather_matmul(x, b, schedule)
    return executor.matmul_reduce_scatter(x, b, schedule)


def _inputs(op: str, world: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-specific bf16 inputs: ag_gemm ``[M/w, K] x [K, N]``, gemm_rs ``[M, K/w] x [K/w, N]``."""
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + dist.get_rank())
    rows, red = (M // world, K) if op == "ag_gemm" else (M, K // world)
    a = torch.randn(rows, red, generator=g).to(device, torch.bfloat16)
    b = torch.randn(red, N, generator=g).to(device, torch.bfloat16)
    return a, b


def _compare(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when ``got`` matches ``want`` in shape, strides and values (bf16 tolerance), else the reason."""
    if got.shape != want.shape or got.stride() != want.stride():
        return f"shape/stride {tuple(got.shape)}/{got.stride()} != {tuple(want.shape)}/{want.stride()}"
    err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
    return "" if err <= RTOL else f"relative error {err:.3g} > {RTOL}"


def _check(op: str, schedule, world: int, device: torch.device) -> list[tuple[str, str]]:
    """[(mode, failure or '')] for eager and graph mode of one schedule."""
    a, b = _inputs(op, world, 1, device)
    want = _run(op, a, b, "serial/sm").clone()
    for _ in range(2):
        _run(op, a, b, schedule)
    torch.cuda.synchronize()
    out = [("eager", _compare(_run(op, a, b, schedule), want))]
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static = _run(op, a, b, schedule)
        a2, b2 = _inputs(op, world, 2, device)
        a.copy_(a2)
        b.copy_(b2)
        g.replay()
        torch.cuda.synchronize()
        want2 = _run(op, a2, b2, "serial/sm")
        out.append(("graph", _compare(static, want2)))
    except Exception as exc:  # report and carry on with the next schedule
        out.append(("graph", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    dist.barrier()
    return out


def main() -> int:
    """Check every (op, schedule, mode); rank 0 prints the results; 0 when all passed."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    world = dist.get_world_size()
    failures = 0
    for op in ("ag_gemm", "gemm_rs"):
        for schedule in all_schedules():
            for mode, why in _check(op, schedule, world, device):
                flags = torch.tensor([0 if not why else 1], device=device)
                dist.all_reduce(flags)
                failures += int(flags.item() > 0)
                if dist.get_rank() == 0:
                    status = "ok" if flags.item() == 0 else f"FAIL {why or '(another rank failed)'}"
                    print(f"CHECK {op} {schedule} {mode} {status}", flush=True)
    if dist.get_rank() == 0:
        print("ALL OK" if failures == 0 else f"FAILED {failures}", flush=True)
    dist.destroy_process_group()
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
