r"""Host-side overhead of the executor: microseconds of Python per call, per schedule.

    # CPU (gloo, 2 ranks): tiny tensors, so the time is the executor's Python plus gloo's transfers
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/executor_overhead.py --device cpu --out /tmp/overhead-cpu.json
    # CUDA (2 GPUs): host time to issue one call (perf_counter; the GPU is synchronised every --batch calls)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/executor_overhead.py --device cuda --out OUT/overhead-cuda.json
    # CUDA, one GPU, no torchrun: rank 0 of a pretend 2-rank world (--loopback, below)
    python3 -m benchmarks.executor_overhead --device cuda --loopback --out OUT/overhead-loopback.json

Per (op, schedule): ``--warmup`` untimed calls, then ``--rounds`` batches of ``--batch`` timed calls, one
batch of every (op, schedule) per round in a shuffled order (host-speed drift and warm-up land on no
schedule in particular); each batch is timed with ``time.perf_counter`` from a synchronisation (CUDA: device
synchronise + barrier; CPU: barrier) to the return of its last call, so on CUDA it measures how fast the
host issues work (tiny shapes keep the GPU from being the bottleneck), not device time. On the CPU the gloo
transfers and barriers block and dominate (and vary run to run by 2x on a loaded machine), so the time spent
inside torch.distributed calls is also clocked and subtracted: ``excl_comm_us`` is the executor's own Python
(plan, transport, views, bookkeeping, the tiny GEMMs), the part the CUDA path shares, measured in CPU time
of the calling thread (``time.thread_time``), which leaves out the time the other rank's process holds the
core. (On CUDA the collectives only enqueue work, so ``excl_comm_us`` equals ``host_us_per_call`` there.)
``--primitives`` (CUDA) adds each building block of a call timed alone the same way (NCCL calls, a GEMM,
events, stream switches, copies, the symmetric-memory barrier, graph replays of captured calls), under
``primitives``: what a schedule's host time is made of; two references beside them, a fixed piece of pure
Python and a torch op on the CPU, tell the interpreter's and the dispatcher's speed from the CUDA launch
path's when a process's host time moves. Prints a table (median microseconds per call over
batches, maximum over ranks) and writes the same rows as JSON to ``--out``. ``--profile CALLS`` adds, per
(op, schedule), the functions where rank 0's host time goes (cProfile, which inflates small calls; read it
for proportions; or, ``--profiler torch``, torch's ops and c10d's calls by torch.profiler), under
``profiles`` in the JSON. ``--pin`` places each rank's threads on the host (``harness.cpu_placement``: none,
share) after the warm-up; run the script several times per policy to see how much a fresh process's host
time moves with where the kernel put it (``benchmarks.studies.host.host_placement`` does; the JSON's
``address_space`` says whether the process ran with its address-space layout randomised).

``--loopback`` (one process, one GPU; ``--device cpu`` checks the mode itself): the process plays rank 0 of a
world of ``--world-size`` ranks (``benchmarks.support.loopback``): torch's fake process group, whose
collectives and point-to-point calls return at once and move nothing, and the copy-engine executor's peer
memory one local buffer per rank on this GPU, its device barrier a one-element add (one kernel launch, as the
real barrier is). What it times is the executor's own host path on a real GPU: planning, transports, views,
events, stream switches, the copies' and GEMMs' launches, without NCCL's host cost (the ``sm`` schedules'
NCCL calls cost nothing here; ``--primitives`` on two GPUs prices them) and with no result to check;
``--primitives`` then times the blocks that need no peer. For finding and cutting host time when only one
GPU is at hand; never a substitute for the 2-GPU figures. ``--knockout`` (loopback, dense ops) also times
every case with one kind of launch made a no-op at a time (:data:`KNOCKOUTS`: GEMMs, barriers, CUDA events,
stream switches), in the same shuffled rounds; ``knockout_us``, the median over rounds of the round's drop,
is what that kind costs inside a call, Python around it included.

``--ops`` adds the MoE ops (``a2a_gemm``, ``gemm_a2a``) on a balanced routing of ``--tokens`` tokens per
rank to ``--top-k`` of ``--experts`` experts; ``--grouped-min`` sets the block size from which expert GEMMs
run as one grouped GEMM (``executor.experts.GROUPED_MIN_GEMMS``; a large value times the ``torch.mm`` loop).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from ficco.features import OP_SPECS
from ficco.files import write_text_atomic
from ficco.harness.cpu_placement import PIN_POLICIES, placement_from_env
from ficco.harness.host_factor import executor_calls, seeded_randn, time_host_calls, tiny_operands

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from ficco.features.routing import Routing

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
DENSE_OPS = ("ag_gemm", "gemm_rs")
"""The tensor-parallel ops (the MoE ops take a routing)."""
KNOCKOUTS = {
    "gemms": ("torch.mm",),
    "barriers": ("ficco.benchmarks.support.loopback.LoopbackPeerMemory.barrier",),
    "events": ("torch.cuda.Event.record", "torch.cuda.Stream.wait_event"),
    "stream switches": ("torch.cuda.set_stream",),
}
"""``--knockout``: the kinds of launch made no-ops one at a time, by the callables replaced."""
TRACKED_ENV = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "TORCH_SYMM_MEM_", "NVSHMEM_")
"""Environment variables recorded with the results (those that change the host path)."""
PROFILE_TOP = 15
"""Functions listed per (op, schedule) by ``--profile``."""
ADDR_NO_RANDOMIZE = 0x0040000
"""Linux personality flag: no address-space layout randomisation (``<linux/personality.h>``)."""


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


def python_work() -> int:
    """A fixed piece of pure Python (64 dict updates, no torch; about 3-5 us on the GPU machines' hosts): a
    reference for the interpreter's own speed, beside which the executor's calls show whether a process's
    host time moved with the machine (``--primitives``; ``benchmarks.studies.host.host_states`` samples it
    on every CPU)."""
    counts: dict[int, int] = {}
    for i in range(64):
        counts[i & 7] = counts.get(i & 7, 0) + i
    return counts[7]


def clock_comm(dist, ops_module) -> CommClock:
    """Wrap the blocking torch.distributed entry points the executor uses on the CPU (gloo)."""
    clock = CommClock()
    dist.barrier = clock.wrap(dist.barrier)
    dist.batch_isend_irecv = clock.wrap(dist.batch_isend_irecv)
    dist.all_to_all_single = clock.wrap(dist.all_to_all_single)
    for name in ("all_gather_single", "reduce_scatter_single"):
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
    parser.add_argument("--rounds", type=int, default=20, help="shuffled rounds, a batch per schedule each")
    parser.add_argument("--batch", type=int, default=50, help="timed calls per batch (between syncs)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rounds' orders")
    parser.add_argument(
        "--schedules",
        nargs="*",
        default=list(SCHEDULES),
        metavar="SCHEDULE",
        help=f"schedules timed for both ops (default: {' '.join(SCHEDULES)}; none: only --primitives)",
    )
    parser.add_argument(
        "--ops",
        nargs="+",
        default=list(DENSE_OPS),
        choices=list(OP_SPECS),
        help="ops timed (default: the dense ones; the MoE ops route --tokens x --top-k rows over --experts)",
    )
    parser.add_argument("--experts", type=int, default=128, help="MoE ops: experts over all ranks")
    parser.add_argument("--top-k", type=int, default=8, help="MoE ops: experts per token")
    parser.add_argument("--tokens", type=int, default=256, help="MoE ops: tokens per rank (balanced routing)")
    parser.add_argument(
        "--grouped-min",
        type=int,
        default=None,
        metavar="N",
        help="MoE ops: run blocks of >= N expert GEMMs as one grouped GEMM (executor.experts."
        "GROUPED_MIN_GEMMS; default: the executor's; a large N times the loop of torch.mm)",
    )
    parser.add_argument(
        "--knockout",
        action="store_true",
        help="--loopback, dense ops: also time every case with one kind of launch made a no-op at a time "
        "(GEMMs, barriers, events, stream switches): what each kind costs inside a call",
    )
    parser.add_argument(
        "--primitives",
        action="store_true",
        help="also time each building block of a call alone (NCCL calls, GEMM, events, copies, barrier, "
        "graph replays; CUDA only), under 'primitives' in the JSON",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="CALLS",
        help="after timing, profile CALLS calls of every schedule (0: no profile)",
    )
    parser.add_argument(
        "--profiler",
        choices=("cprofile", "torch"),
        default="cprofile",
        help="--profile's tool: cProfile (Python functions) or torch.profiler (the host time of torch's "
        "ops and of c10d's calls, e.g. nccl:send, below Python)",
    )
    parser.add_argument(
        "--pin",
        choices=PIN_POLICIES,
        default="none",
        help="where each rank's threads run (harness.cpu_placement), applied after the warm-up (--loopback: "
        "the process as local rank LOCAL_RANK of LOCAL_WORLD_SIZE, 0 of 1 when unset)",
    )
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="one process on one GPU, rank 0 of a pretend world (fake process group, local peer memory): "
        "the executor's own host path without NCCL's cost, no result to check; run without torchrun",
    )
    parser.add_argument(
        "--world-size", type=int, default=2, help="--loopback: ranks of the pretend world (2, 4 or 8)"
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (rank 0)")
    args = parser.parse_args()
    if args.primitives and args.device != "cuda":
        parser.error("--primitives needs --device cuda (the building blocks are CUDA calls)")
    if args.world_size not in (2, 4, 8):
        parser.error(f"--world-size must be one of [2, 4, 8]; got {args.world_size}")
    if args.knockout and not args.loopback:
        parser.error("--knockout needs --loopback (it makes launches no-ops, so no result is right)")
    if args.grouped_min is not None and args.grouped_min < 1:
        parser.error(f"--grouped-min must be >= 1; got {args.grouped_min}")

    import torch.distributed as dist

    from ficco import executor

    if args.loopback:
        from benchmarks.support.loopback import loopback_world

        world = loopback_world(args.world_size, args.device)
    else:
        world = executor.process_group(args.device)
    with world as device:
        rows, profiles = measure(args, device)
        if dist.get_rank() == 0:
            write(args, rows, profiles)


def routed_calls(
    cases: Sequence[tuple[str, str]],
    routing: Routing,
    width: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> dict[tuple[str, str], Callable[[], object]]:
    """One executor call per (MoE op, schedule) of ``cases`` under ``routing`` (a ``features.Routing``), on
    random ``width``-wide rows and ``[local experts, width, width]`` weights on ``device`` (bf16 on CUDA,
    fp32 on the CPU; seeded by the rank), keyed by the case: ``a2a_gemm`` dispatches this rank's routed
    rows, ``gemm_a2a`` combines the rows its experts received."""
    import torch.distributed as dist

    from ficco import executor

    rank = dist.get_rank(group)
    randn = seeded_randn(rank, device)
    x, h = randn(sum(routing.sent(rank)), width), randn(sum(routing.received(rank)), width)
    b = randn(routing.local_experts, width, width)
    ops = {
        "a2a_gemm": lambda s: executor.all_to_all_matmul(x, b, routing, s, group),
        "gemm_a2a": lambda s: executor.matmul_all_to_all(h, b, routing, s, group),
    }
    return {(op, s): functools.partial(ops[op], s) for op, s in cases}


def moe_routing(args: argparse.Namespace, world_size: int):
    """The MoE ops' balanced routing: ``args.tokens`` tokens per rank to ``args.top_k`` of ``args.experts``
    experts (``features.Routing.synthetic``)."""
    from ficco.features.routing import Routing

    routing = {"tokens": args.tokens, "top_k": args.top_k, "experts": args.experts}
    return Routing.synthetic(**routing, world_size=world_size)


@contextlib.contextmanager
def knockout_patches(kind: str) -> Iterator[None]:
    """``--knockout``: the launches of ``kind`` (:data:`KNOCKOUTS`) do nothing inside the block."""

    def skip(*args, **kwargs) -> None:
        return None

    with contextlib.ExitStack() as stack:
        for target in KNOCKOUTS[kind]:
            stack.enter_context(mock.patch(target, skip))
        yield


def measure(args: argparse.Namespace, device) -> tuple[list[dict], dict]:
    """Per (op, schedule): the median host time per call (us) over ``args.rounds`` rounds, and the same
    without the time spent inside the communication calls (CPU only), the slowest rank's, and rank 0's time
    of every round in round order; with ``args.primitives``, the same for each building block of a call
    (op ``primitive``, :func:`primitive_calls`); with ``args.profile``, also where rank 0's host time goes
    (:func:`profile_calls`).

    Every round times one batch of ``args.batch`` calls of every case, in a new shuffled order (the same on
    every rank), so that drift of the host's speed and warm-up land on no case in particular."""
    import torch
    import torch.distributed as dist

    from ficco import executor
    from ficco.executor import experts

    cuda = device.type == "cuda"
    rank = dist.get_rank()
    if args.grouped_min is not None:
        experts.GROUPED_MIN_GEMMS = args.grouped_min
    shard, full, b = tiny_operands(args.rows, args.width, device=device)
    dense = [(op, s) for op in args.ops if op in DENSE_OPS for s in args.schedules]
    calls = executor_calls(dense, shard, full, b)
    moe = [(op, s) for op in args.ops if op not in DENSE_OPS for s in args.schedules]
    if moe:
        calls |= routed_calls(moe, moe_routing(args, dist.get_world_size()), args.width, device)
    if args.primitives:
        primitives = primitive_calls(shard, full, b, peers=not args.loopback)
        calls |= {("primitive", name): call for name, call in primitives.items()}
    cases = list(calls)
    if args.knockout:  # the same call with one kind of launch knocked out, in the same shuffled rounds
        calls |= {(*case, kind): calls[case] for case in dense for kind in KNOCKOUTS}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    clock = None if cuda else clock_comm(dist, executor.ops)
    placement = placement_from_env(args.pin, cuda)
    print(f"rank {rank}: placement {placement.describe()} (after the warm-up)", flush=True)
    clocks = [time.perf_counter]
    if clock:  # CPU time of this thread outside the communication calls
        clocks.append(lambda: time.thread_time() - clock.seconds)
    timed = time_host_calls(
        calls,
        rounds=args.rounds,
        batch=args.batch,
        warmup=args.warmup,
        seed=args.seed,
        sync=sync,
        clocks=clocks,
        after_warmup=placement.confine,
        around=lambda case: knockout_patches(case[2]) if len(case) == 3 else contextlib.nullcontext(),
    )
    print(f"rank {rank}: placement after the rounds: {placement.describe()}", flush=True)
    per_call, excl_comm = timed[0], timed[-1]
    rows = []
    for case in cases:
        us = [statistics.median(per_call[case]), statistics.median(excl_comm[case])]
        us_max = torch.tensor(us, dtype=torch.float64, device=device)
        dist.all_reduce(us_max, op=dist.ReduceOp.MAX)
        total, own = (round(x, 1) for x in us_max.tolist())
        row = {"op": case[0], "schedule": case[1], "host_us_per_call": total, "excl_comm_us": own}
        rows.append(row | {"round_us": [round(x, 1) for x in per_call[case]]})
        if args.knockout and case in dense:  # rank 0's: the ranks of a loopback world are one process
            base = per_call[case]
            saved = {k: [x - y for x, y in zip(base, per_call[(*case, k)], strict=True)] for k in KNOCKOUTS}
            rows[-1]["knockout_us"] = {k: round(statistics.median(saved[k]), 1) for k in KNOCKOUTS}
    profiles = {}
    if args.profile:
        for case in cases:
            sync()
            profile = torch_profile_calls if args.profiler == "torch" else profile_calls
            profiles[" ".join(case)] = profile(calls[case], args.profile)
        sync()
    return rows, profiles


def primitive_calls(shard, full, b, *, peers: bool = True) -> dict[str, Callable[[], object]]:
    """The building blocks of an executor call on CUDA, each alone, on the tiny tensors of the schedule
    cases (``shard [m/w, k]``, ``full [m, k]``, ``b [k, n]``): what a schedule's host time is made of, and
    what a replacement would cost. Point-to-point cases move one ring step (send to rank + 1, receive from
    rank - 1); the graph cases replay an executor call captured once (the floor of a captured call).
    ``peers=False`` (``--loopback``): only the blocks that need no other rank (no NCCL call, no symmetric
    memory)."""
    import torch

    from ficco import executor
    from ficco.executor.lanes import DeviceLanes

    device = shard.device
    r = shard.shape[0]
    received = torch.empty_like(shard)
    out = torch.empty(full.shape[0], b.shape[1], device=device, dtype=b.dtype)
    main, side, event = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Event()

    def stream_there_and_back() -> None:
        torch.cuda.set_stream(side)
        torch.cuda.set_stream(main)

    def event_pair() -> None:
        event.record(main)
        side.wait_event(event)

    def replay(schedule: str) -> Callable[[], None]:
        def call() -> None:
            executor.all_gather_matmul(shard, b, schedule, out=out)

        call()
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        return graph.replay

    lanes = DeviceLanes(device, 1, False)
    on_cpu = torch.zeros(8)
    local = {
        "python only: dict updates (the interpreter's speed)": python_work,
        "torch add_ on 8 CPU floats (the dispatcher's speed)": lambda: on_cpu.add_(1.0),
        "torch.mm(out=)": lambda: torch.mm(full, b, out=out),
        "event record + stream wait": event_pair,
        "set_stream there and back": stream_there_and_back,
        "copy_ local": lambda: received.copy_(shard),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "the lanes' caller stream (kept by id)": lanes.caller_stream,
    }
    replays = {
        "graph replay: ag_gemm serial/sm": replay("serial/sm"),
        "graph replay: ag_gemm shard/dma": replay("shard/dma"),
        "graph replay: ag_gemm finer/sm/s4/chunk": replay("finer/sm/s4/chunk"),
    }
    if not peers:
        return local | replays
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    w, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    to, frm = (rank + 1) % w, (rank - 1) % w
    gathered = torch.empty_like(full)
    scattered = torch.empty(r, full.shape[1], device=device, dtype=full.dtype)
    sends = [r if q == to else 0 for q in range(w)]
    receives = [r if q == frm else 0 for q in range(w)]
    memory = symm_mem.empty(full.numel(), dtype=full.dtype, device=device)
    handle = symm_mem.rendezvous(memory, group.group_name)
    peer_rows = handle.get_buffer(to, tuple(shard.shape), shard.dtype, 0)
    pair = [dist.P2POp(dist.isend, shard, to), dist.P2POp(dist.irecv, received, frm)]

    def coalesced_pair() -> None:
        group._start_coalescing(device)
        group.send([shard], to, 0)
        group.recv([received], frm, 0)
        group._end_coalescing(device).wait()

    def coalesced_pair_from_side_stream() -> None:
        torch.cuda.set_stream(side)  # where the executor's sm gather issues its groups (a copy lane)
        try:
            coalesced_pair()
        finally:
            torch.cuda.set_stream(main)

    def batched_pair() -> None:
        for work in dist.batch_isend_irecv(pair):
            work.wait()

    return {
        "nccl all_gather_into_tensor": lambda: dist.all_gather_into_tensor(gathered, shard),
        "nccl reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(scattered, full),
        "nccl all_to_all_single, ring step": lambda: dist.all_to_all_single(received, shard, receives, sends),
        "nccl send+recv, coalesced (executor sm)": coalesced_pair,
        "nccl send+recv, coalesced, from a side stream": coalesced_pair_from_side_stream,
        "nccl batch_isend_irecv, ring step": batched_pair,
        **local,
        "copy_ into peer memory": lambda: peer_rows.copy_(shard),
        "symmetric-memory barrier": lambda: handle.barrier(channel=0),
        **replays,
    }


def profile_calls(call: Callable[[], object], calls: int, top: int = PROFILE_TOP) -> dict:
    """Where ``calls`` calls of ``call()`` spend host time, by ``cProfile``: the profiled
    microseconds per call (cProfile's own cost inflates this, most for many small functions) and the
    ``top`` functions by their own time (``tottime``), each in microseconds per call, with its calls per
    call."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    total = sum(entry[2] for entry in stats.values())
    ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    functions = [
        {
            "function": f"{Path(file).name}:{line}({name})" if line else name,
            "own_us": round(entry[2] / calls * 1e6, 2),
            "calls": round(entry[1] / calls, 2),
        }
        for (file, line, name), entry in ranked
    ]
    return {"profiled_us_per_call": round(total / calls * 1e6, 1), "functions": functions}


def torch_profile_calls(call: Callable[[], object], calls: int, top: int = PROFILE_TOP) -> dict:
    """:func:`profile_calls` by ``torch.profiler`` (CPU activity): the ``top`` torch ops and c10d calls by
    their own host time (``self_cpu_time_total``), in microseconds per call, with their calls per call;
    ``profiled_us_per_call`` is the wall time of the profiled calls (the profiler's cost included)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    seconds = time.perf_counter() - start
    ranked = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    functions = [
        {
            "function": e.key,
            "own_us": round(e.self_cpu_time_total / calls, 2),
            "calls": round(e.count / calls, 2),
        }
        for e in ranked
    ]
    return {"profiled_us_per_call": round(seconds / calls * 1e6, 1), "functions": functions}


def address_space_layout() -> str:
    """``"fixed"`` when this process runs without address-space layout randomisation (Linux personality
    flag ``ADDR_NO_RANDOMIZE``, as ``setarch -R`` sets it), ``"random"`` otherwise, ``"unknown"`` where
    ``/proc`` does not say."""
    try:
        flags = int(Path("/proc/self/personality").read_text(), 16)
    except (OSError, ValueError):
        return "unknown"
    return "fixed" if flags & ADDR_NO_RANDOMIZE else "random"


def write(args: argparse.Namespace, rows: list[dict], profiles: dict) -> None:
    """Print the table and write ``args.out`` (rank 0)."""
    import torch
    import torch.distributed as dist

    from ficco.tables import text_table

    pretend = " (loopback: one process, fake process group, no NCCL cost, no result)" if args.loopback else ""
    print(f"{args.device}, world {dist.get_world_size()}{pretend}")
    kinds = list(KNOCKOUTS) if args.knockout else []
    cells = [
        [r["op"], r["schedule"], f"{r['host_us_per_call']:.1f}", f"{r['excl_comm_us']:.1f}"]
        + [f"{r['knockout_us'][k]:.1f}" if "knockout_us" in r else "" for k in kinds]
        for r in rows
    ]
    head = ["op", "schedule", "host us/call", "excl. comm", *(f"- {k}" for k in kinds)]
    print(text_table(head, cells, align="<<" + ">" * (len(head) - 2)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": args.device,
        "loopback": args.loopback,
        "world_size": dist.get_world_size(),
        "rows": args.rows,
        "width": args.width,
    }
    meta |= {"rounds": args.rounds, "batch": args.batch, "pin": args.pin, "torch": torch.__version__}
    if any(op not in DENSE_OPS for op in args.ops):
        from ficco.executor import experts

        meta["moe"] = {"experts": args.experts, "top_k": args.top_k, "tokens": args.tokens}
        meta["moe"]["grouped_min_gemms"] = experts.GROUPED_MIN_GEMMS
    meta |= {"env": {name: os.environ[name] for name in sorted(os.environ) if name.startswith(TRACKED_ENV)}}
    meta["address_space"] = address_space_layout()
    results = [r for r in rows if r["op"] != "primitive"]
    primitives = [
        {"primitive": r["schedule"], "host_us_per_call": r["host_us_per_call"], "round_us": r["round_us"]}
        for r in rows
        if r["op"] == "primitive"
    ]
    body = {**meta, "results": results, "profiles": profiles}
    if primitives:
        body["primitives"] = primitives
    write_text_atomic(args.out, json.dumps(body, indent=1) + "\n")
    for case, profile in profiles.items():
        top = ", ".join(f"{f['function']} {f['own_us']:.0f}" for f in profile["functions"][:4])
        print(f"{case}: {profile['profiled_us_per_call']:.0f} us profiled; {top}")


if __name__ == "__main__":
    main()
