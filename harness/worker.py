"""The torchrun entry point of ``ficco bench --backend gpu|gloo``: one process per rank.

    torchrun --standalone --nproc-per-node 2 -m ficco.harness.worker \
        --plan DIR/plan.json --out DIR --device cuda

Every rank builds the executor-backed ``TorchBackend`` and runs the same phase: ``sweep`` (``run_sweep``)
or ``noise`` (``run_noise``: the independent re-measure, launched as its own process group after the
sweep); rank 0 writes the dataset. ``ficco bench`` writes the plan file and launches both for you.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ficco.dataclass_options import add_arguments, from_arguments
from ficco.features import MODES
from ficco.harness.backend import Timing
from ficco.harness.cpu_placement import DEFAULT_PIN, PIN_POLICIES, placement_from_env

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast (NVLS) off for NCCL, PyTorch symmetric memory and NVSHMEM: not every machine supports it
reliably, and the executor's copy-engine path does not need it."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ficco.harness.worker", description=__doc__.splitlines()[0])
    p.add_argument("--plan", type=Path, required=True, help="plan.json written by `ficco bench`")
    p.add_argument("--out", type=Path, required=True, help="dataset directory (rank 0 writes it)")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True, help="cuda (NCCL) or cpu (gloo)")
    p.add_argument("--phase", choices=("sweep", "noise"), default="sweep", help="what to measure")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated execution modes to time")
    add_arguments(p, Timing)
    p.add_argument("--remeasure", type=int, default=0, help="noise phase: scenarios to measure again")
    p.add_argument("--deadline", type=float, default=0.0, help="unix time after which no scenario starts")
    p.add_argument("--flush-seconds", type=float, default=10.0, help="seconds between dataset writes")
    p.add_argument("--pin", choices=PIN_POLICIES, default=DEFAULT_PIN, help="where the rank's threads run")
    args = p.parse_args(argv)
    args.timing = from_arguments(Timing, args, p)
    return args


def main(argv: list[str] | None = None) -> None:
    """In this rank's process group (NCCL on the local GPU, or gloo), sweep or re-measure the plan."""
    args = parse_args(argv)
    os.environ.update(SAFE_ENV)  # before torch.distributed initialises NCCL or symmetric memory
    import torch.distributed as dist

    from ficco import executor
    from ficco.harness.plan import Plan
    from ficco.harness.sweep import run_noise, run_sweep
    from ficco.harness.torch_backend import TorchBackend

    placement = placement_from_env(args.pin, cuda=args.device == "cuda")
    placement.confine()
    rank = os.environ.get("LOCAL_RANK", "0")
    print(f"rank {rank}: CPU placement {placement.describe()}", file=sys.stderr, flush=True)
    with executor.process_group(args.device):
        plan = Plan.from_json(args.plan.read_text())
        sizes = {s.world_size for _, s in plan}
        if sizes - {dist.get_world_size()}:
            raise ValueError(
                f"the plan's world sizes {sorted(sizes)} must equal the process group size "
                f"{dist.get_world_size()} (--nproc-per-node)"
            )
        modes = tuple(m for m in args.modes.split(",") if m)
        deadline = args.deadline or None
        seed = 1 if args.phase == "noise" else 0  # the re-measure: other inputs and round orders
        backend = TorchBackend(
            device=args.device, modes=modes, timing=args.timing, seed=seed, placement=placement
        )
        if args.phase == "sweep":
            run_sweep(plan, backend, args.out, flush_seconds=args.flush_seconds, deadline=deadline)
        else:
            run_noise(
                plan, backend, args.out, args.remeasure, flush_seconds=args.flush_seconds, deadline=deadline
            )
        if dist.get_rank() == 0 and backend.phase_seconds:
            spent = ", ".join(f"{name} {sec:.1f} s" for name, sec in sorted(backend.phase_seconds.items()))
            print(f"{args.phase}: wall time by phase: {spent}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
