r"""``ficco.runtime.tp``'s rule on GPUs (NCCL, the copy engines): models and plans of ``tp_plans`` under
ficco's styles against the same plans under PyTorch's, outputs and every gradient, schedules of both
executors; among them a biased row-parallel layer (GPT-2's ``c_proj`` under sequence parallelism) and plain
tensor-parallel blocks (GPT-2, Llama: replicated activations, row-parallel all-reduces).

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/runtime/gpu_tp_check.py
    # the same on CPU (gloo), to try the script without GPUs
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/runtime/gpu_tp_check.py --device cpu

Rank 0 prints one line per (case, schedules) ``CHECK <case> | <schedules> ok|FAIL <what>`` and ``ALL OK`` at
the end; exits 1 on any failure on any rank. Tolerance: bf16 as on the CPU (``tp_plans.failures``); fp32
1e-4, as cuBLAS sums in other orders than the host (the GPU layers check's).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "runtime")]

from ficco.harness.worker import SAFE_ENV  # noqa: E402 (needs the path above; imports no torch)

os.environ.update(SAFE_ENV)  # NVLink multicast off, before torch loads NCCL

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from tp_plans import TOLERANCE, Case, check, failures  # noqa: E402

from ficco import executor  # noqa: E402

SEQ = 64
"""Tokens per sequence: every schedule below splits the rows of batch 1 and 2 at 2 to 8 ranks."""
SCHEDULES = ("serial/sm", "shard/dma", "finer/dma/s4/chunk", "0:shard/sm;128:finer/sm/s2/shard/hp")
CASES = [
    Case(model="gpt2", seq=SEQ),  # biased row-parallel c_proj, Shard(1) output
    Case(model="gpt2", seq=SEQ, dtype="bf16", local=True),
    Case(model="gpt2", seq=SEQ, sp=False),  # plain tensor parallelism
    Case(model="gpt2", seq=SEQ, sp=False, dtype="bf16", batch=1),
    Case(model="llama", seq=SEQ, sp=False, dtype="bf16"),
    Case(model="llama", seq=SEQ),
    Case(model="llama", seq=SEQ, dtype="bf16", batch=1, prepare="torch"),
    Case(model="llama", seq=SEQ, dtype="bf16", batch=3),  # sub-chunks of the shard across its sequences
    Case(model="gemma", seq=SEQ, dtype="bf16"),
    Case(model="phi3_mlp", seq=SEQ, flat=True, dtype="bf16"),
    Case(model="reshaping_mlp", seq=SEQ, local=True),
    Case(model="odd_head", seq=SEQ, dtype="bf16"),
]
GPU_TOLERANCE = TOLERANCE | {"fp32": 1e-4}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo (default: NCCL)")
    args = parser.parse_args(argv)
    with executor.process_group(args.device) as device:
        mesh = init_device_mesh(args.device, (dist.get_world_size(),))
        failed = 0
        for case in CASES:
            for schedules in SCHEDULES:
                try:
                    bad = failures(check(case, mesh, schedules, device), GPU_TOLERANCE)
                except Exception as err:  # a case that raises fails; the others still run
                    bad = [f"{type(err).__name__}: {err}"]
                flag = torch.tensor([len(bad)], device=device)
                dist.all_reduce(flag)
                failed += int(flag.item() > 0)
                if dist.get_rank() == 0:
                    status = "ok" if not flag.item() else f"FAIL {'; '.join(bad) or 'on another rank'}"
                    print(f"CHECK {case} | {schedules} {status}", flush=True)
        if dist.get_rank() == 0:
            print("ALL OK" if not failed else f"FAILED {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
