r"""Copy-engine all-gather -> GEMM: pull (one barrier per call) against push (one barrier per round).

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/gather_pull.py --out OUT
    # plumbing check without a GPU (gloo, tiny shapes, eager only)
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/gather_pull.py \
        --device cpu --scale-down 64 --out /tmp/pull

The executor pulls every copy-engine all-gather whose plan has several rounds (``executor.transport.
PULL_MIN_ROUNDS``); this measures that choice. Per shape, every schedule of ``SCHEDULES`` runs both ways
(push forced by raising ``PULL_MIN_ROUNDS`` while its transports are built; the executor keeps one
transport per way), each first checked against ``serial/sm`` (relative error <= 1e-2), then timed with the
other variants in interleaved rounds, ranks aligned before each (``runtime.timing.time_interleaved``), in
eager mode and replayed from CUDA graphs (``runtime.graphs.GraphedCall``). ``shard/dma`` (one round: it
pushes either way) and ``serial/sm`` are timed beside them for scale. Prints a table (median ms per call,
slowest rank; push / pull) and writes ``OUT/gather-pull-h200x<world size>.json`` (CPU:
``gather-pull-cpu-x<world size>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from ficco.harness.worker import SAFE_ENV  # noqa: E402 (needs the path above; imports no torch)
from ficco.tables import text_table  # noqa: E402

# NVLink multicast stays off in NCCL, PyTorch symmetric memory and NVSHMEM: set before torch loads them.
os.environ.update(SAFE_ENV)

SHAPES = (
    # (m, n, k) of ag_gemm at TP=2: m tokens, n the rank's output columns, k the hidden size
    (2048, 7168, 4096),  # Llama-3.1-8B MLP up, 2k tokens
    (8192, 7168, 4096),  # the same, 8k tokens
    (4096, 14336, 8192),  # Llama-3.1-70B MLP up, 4k tokens
    (16384, 14336, 8192),  # the same, 16k tokens
    (16384, 2048, 4096),  # communication-heavy
    (32768, 1024, 8192),  # communication-heavy
)
SCHEDULES = ("finer/dma/s2/chunk", "finer/dma/s4/chunk", "finer/dma/s4/shard", "finer/dma/s8/shard")
"""Copy-engine schedules of several rounds (on two ranks): pulled by default."""
REFERENCES = ("shard/dma", "serial/sm")
"""Timed beside them: one round (pushes either way) and the serial reference."""
TOLERANCE = 1e-2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON (rank 0 writes)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, eager only")
    p.add_argument("--scale-down", type=int, default=1, help="divide m, n, k by this (>= 1; CPU plumbing)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per shape, at least (>= 1)")
    p.add_argument("--timed-ms", type=float, default=200.0, help="timed work per variant, ms (adds rounds)")
    p.add_argument("--max-rounds", type=int, default=30, help="at most this many rounds per shape")
    args = p.parse_args(argv)
    for name in ("scale_down", "rounds", "max_rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch.distributed as dist

    from ficco import executor

    with executor.process_group(args.device) as device:
        records = [record for shape in SHAPES for record in measure_shape(shape, args, device)]
        if dist.get_rank() == 0:
            write(args, records, dist.get_world_size())


def measure_shape(shape: tuple[int, int, int], args: argparse.Namespace, device) -> list[dict]:
    """Every (schedule, way, mode) of one ``(m, n, k)`` shape: checked, then timed interleaved; one record
    per (schedule, way, mode) with ``ms`` (median per call, slowest rank), ``host_ms`` (to issue one call)
    and ``rel_err``."""
    import torch
    import torch.distributed as dist

    from ficco import executor
    from ficco.executor import transport
    from ficco.runtime.graphs import GraphedCall
    from ficco.runtime.timing import time_interleaved

    m, n, k = (max(size // args.scale_down, 16) for size in shape)
    w, rank = dist.get_world_size(), dist.get_rank()
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator().manual_seed(rank)
    a = (torch.randn(m // w, k, generator=gen) / k**0.5).to(device, dtype)
    b = torch.randn(k, n, generator=gen).to(device, dtype)
    ref = executor.all_gather_matmul(a, b, "serial/sm").float()
    default = transport.PULL_MIN_ROUNDS
    ways = {"pull": default, "push": 10**9, "-": default}
    """Each way's ``PULL_MIN_ROUNDS`` ("-": the references, which push either way)."""

    def build_in(way: str, fn):
        """``fn()`` while the executor builds its transports ``way``."""
        transport.PULL_MIN_ROUNDS = ways[way]
        try:
            return fn()
        finally:
            transport.PULL_MIN_ROUNDS = default

    cases = [(s, way) for s in SCHEDULES for way in ("pull", "push")] + [(s, "-") for s in REFERENCES]
    variants, records = {}, {}
    for schedule, way in cases:
        out = torch.empty(m, n, device=device, dtype=dtype)

        def call(schedule=schedule, out=out):
            return executor.all_gather_matmul(a, b, schedule, out=out)

        def activate(way=way):
            transport.PULL_MIN_ROUNDS = ways[way]

        executor.poison_buffers()
        err = float((build_in(way, call).float() - ref).norm() / ref.norm())
        for mode in ("eager", "graph") if cuda else ("eager",):
            step = call if mode == "eager" else build_in(way, lambda call=call: GraphedCall(call))
            name = f"{schedule}|{way}|{mode}"
            variants[name] = (activate, step)
            records[name] = {"m": m, "n": n, "k": k, "schedule": schedule, "way": way, "mode": mode}
            records[name]["rel_err"] = err
    times, host = time_interleaved(
        variants,
        warmup=3,
        rounds=args.rounds,
        reps=8,
        device=device,
        timed_ms=args.timed_ms,
        max_rounds=args.max_rounds,
    )
    transport.PULL_MIN_ROUNDS = default
    for name, record in records.items():
        record |= {"ms": round(times[name], 4), "host_ms": round(host[name], 4)}
    _say(f"{m}x{n}x{k}: " + ", ".join(f"{name} {r['ms']:.3f}" for name, r in records.items()))
    return list(records.values())


def summarize(records: list[dict]) -> tuple[list[list[str]], dict]:
    """Per (shape, schedule, mode): push ms, pull ms, push / pull; and the geometric mean of push / pull
    per mode over every shape and schedule."""
    by = {(r["m"], r["n"], r["k"], r["schedule"], r["mode"], r["way"]): r for r in records}
    rows, ratios = [], {}
    for (m, n, k, schedule, mode, way), pull in by.items():
        if way != "pull":
            continue
        push = by[m, n, k, schedule, mode, "push"]
        ratio = push["ms"] / pull["ms"]
        ratios.setdefault(mode, []).append(ratio)
        rows.append(
            [
                f"{m}x{n}x{k}",
                schedule,
                mode,
                f"{push['ms']:.3f}",
                f"{pull['ms']:.3f}",
                f"{ratio:.3f}",
                f"{1e3 * push['host_ms']:.0f}",
                f"{1e3 * pull['host_ms']:.0f}",
            ]
        )
    gmean = {mode: round(statistics.geometric_mean(r), 4) for mode, r in ratios.items()}
    return rows, gmean


def write(args: argparse.Namespace, records: list[dict], world_size: int) -> None:
    import torch

    rows, gmean = summarize(records)
    header = ["shape", "schedule", "mode", "push ms", "pull ms", "push/pull", "push host us", "pull host us"]
    print(text_table(header, rows))
    print("geometric mean push / pull:", gmean)
    bad = [r for r in records if not r["rel_err"] <= TOLERANCE]
    data = {
        "world_size": world_size,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "settings": {"rounds": args.rounds, "timed_ms": args.timed_ms, "max_rounds": args.max_rounds},
        "gmean_push_over_pull": gmean,
        "failed": bad,
        "records": records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gather-pull-{'h200' if torch.cuda.is_available() else 'cpu-'}x{world_size}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}; {len(bad)} schedule(s) differ from serial/sm beyond {TOLERANCE}")


def _say(text: str) -> None:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(text, flush=True)


if __name__ == "__main__":
    main()
