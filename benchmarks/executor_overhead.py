r"""Host-side overhead of the executor: microseconds of Python per call, per schedule.

    # CPU (gloo, 2 ranks): tiny tensors, so the time is the executor's Python plus gloo's transfers
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/executor_overhead.py --device cpu --out /tmp/overhead-cpu.json
    # CUDA (2 GPUs): host time to issue one call (perf_counter; the GPU is synchronised every --batch calls)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/executor_overhead.py --device cuda --out OUT/overhead-cuda.json

Per (op, schedule): ``--warmup`` untimed calls, then ``--reps`` timed calls in batches of ``--batch``; each
batch is timed with ``time.perf_counter`` from a synchronisation (CUDA: device synchronise + barrier; CPU:
barrier) to the return of its last call, so on CUDA it measures how fast the host issues work (tiny shapes
keep the GPU from being the bottleneck), not device time. On the CPU the gloo transfers and barriers block
and dominate (and vary run to run by 2x on a loaded machine), so the time spent inside torch.distributed
calls is also clocked and subtracted: ``excl_comm_us`` is the executor's own Python (plan, transport,
views, bookkeeping, the tiny GEMMs), the part the CUDA path shares, measured in CPU time of the calling
thread (``time.thread_time``), which leaves out the time the other rank's process holds the core. (On
CUDA the collectives only enqueue work, so ``excl_comm_us`` equals ``host_us_per_call`` there.) Prints a
table (median microseconds per call over batches, maximum over ranks) and writes the same rows as JSON to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from ficco.harness.worker import SAFE_ENV  # noqa: E402 (needs the path above; imports no torch)

# NVLink multicast stays off in NCCL, PyTorch symmetric memory and NVSHMEM: set before torch loads them.
os.environ.update(SAFE_ENV)

SCHEDULES = (
    "serial/sm",
    "serial/dma",
    "shard/sm",
    "shard/dma",
    "finer/sm/s4/chunk",
    "finer/dma/s4/chunk",
    "finer/dma/s4/shard",
)
"""Schedules timed for both ops (the serial/sm reference, the copy-engine path first)."""


class CommClock:
    """CPU seconds (``time.thread_time``) spent inside wrapped torch.distributed calls and in ``wait()`` of
    the works they return."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn):
        """``fn`` timed into ``self.seconds``; the works of ``batch_isend_irecv`` get timed ``wait()``s."""

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                out = fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start
            return [TimedWork(work, self) for work in out] if isinstance(out, list) else out

        return timed


class TimedWork:
    """A ``dist.Work`` whose ``wait()`` is clocked by a ``CommClock``."""

    def __init__(self, work, clock: CommClock) -> None:
        self._work, self._clock = work, clock

    def wait(self):
        start = time.thread_time()
        try:
            return self._work.wait()
        finally:
            self._clock.seconds += time.thread_time() - start


def clock_comm(dist, ops_module) -> CommClock:
    """Wrap the blocking torch.distributed entry points the executor uses on the CPU (gloo)."""
    clock = CommClock()
    dist.barrier = clock.wrap(dist.barrier)
    dist.batch_isend_irecv = clock.wrap(dist.batch_isend_irecv)
    for name in ("_all_gather_single", "_reduce_scatter_single"):
        setattr(ops_module, name, clock.wrap(getattr(ops_module, name)))
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="tensors and backend")
    parser.add_argument("--rows", type=int, default=64, help="m: rows of the gathered A (a multiple of 8*w)")
    parser.add_argument("--width", type=int, default=64, help="n = k of the tiny GEMMs")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls per schedule")
    parser.add_argument("--reps", type=int, default=1000, help="timed calls per schedule")
    parser.add_argument("--batch", type=int, default=50, help="calls between synchronisations")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (rank 0)")
    args = parser.parse_args()

    import torch.distributed as dist

    from ficco import executor

    with executor.process_group(args.device) as device:
        rows = measure(args, device)
        if dist.get_rank() == 0:
            write(args, rows)


def measure(args: argparse.Namespace, device) -> list[dict]:
    """Per (op, schedule): the median host time per call (us) over ``args.reps // args.batch`` batches, and
    the same without the time spent inside the communication calls (CPU only), the slowest rank's."""
    import torch
    import torch.distributed as dist

    from ficco import executor

    cuda = device.type == "cuda"
    w, rank = dist.get_world_size(), dist.get_rank()
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator().manual_seed(rank)
    shard = torch.randn(args.rows // w, args.width, generator=gen).to(device, dtype)
    full = torch.randn(args.rows, args.width, generator=gen).to(device, dtype)
    b = torch.randn(args.width, args.width, generator=gen).to(device, dtype)
    ops = {
        "ag_gemm": lambda s: executor.all_gather_matmul(shard, b, s),
        "gemm_rs": lambda s: executor.matmul_reduce_scatter(full, b, s),
    }

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    clock = None if cuda else clock_comm(dist, executor.ops)

    rows = []
    for op, call in ops.items():
        for schedule in SCHEDULES:
            for _ in range(args.warmup):
                call(schedule)
            per_call, excl_comm = [], []
            for _ in range(max(1, args.reps // args.batch)):
                sync()
                comm_before = clock.seconds if clock else 0.0
                start, cpu_start = time.perf_counter(), time.thread_time()
                for _ in range(args.batch):
                    call(schedule)
                seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
                per_call.append(seconds / args.batch * 1e6)
                if clock:
                    excl_comm.append((cpu_seconds - (clock.seconds - comm_before)) / args.batch * 1e6)
                else:
                    excl_comm.append(per_call[-1])
            sync()
            us = [statistics.median(per_call), statistics.median(excl_comm)]
            us_max = torch.tensor(us, dtype=torch.float64, device=device)
            dist.all_reduce(us_max, op=dist.ReduceOp.MAX)
            total, own = (round(x, 1) for x in us_max.tolist())
            rows.append({"op": op, "schedule": schedule, "host_us_per_call": total, "excl_comm_us": own})
    return rows


def write(args: argparse.Namespace, rows: list[dict]) -> None:
    """Print the table and write ``args.out`` (rank 0)."""
    import torch
    import torch.distributed as dist

    from ficco.tables import text_table

    print(f"{args.device}, world {dist.get_world_size()}")
    cells = [
        [r["op"], r["schedule"], f"{r['host_us_per_call']:.1f}", f"{r['excl_comm_us']:.1f}"] for r in rows
    ]
    print(text_table(["op", "schedule", "host us/call", "excl. comm"], cells, align="<<>>"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": args.device,
        "world_size": dist.get_world_size(),
        "rows": args.rows,
        "width": args.width,
    }
    meta |= {"reps": args.reps, "batch": args.batch, "torch": torch.__version__}
    args.out.write_text(json.dumps({**meta, "results": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
