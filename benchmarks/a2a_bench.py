r"""All-to-all alone, NCCL against the copy engines, from 64 KiB to 256 MiB per rank: where the copy
engines catch up with NCCL (the latency-bound regime of the MoE dispatch and combine).

    # 2 GPUs (estimated about a minute on 2 x H200): writes OUT/a2a-h200x2.json and .md
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.a2a_bench \
        --out benchmarks/results
    # 4 GPUs: writes OUT/a2a-h200x4.json and .md
    python3 -m torch.distributed.run --standalone --nproc-per-node 4 -m benchmarks.a2a_bench \
        --out benchmarks/results
    # re-render the markdown from a finished JSON (no GPU)
    python3 -m benchmarks.a2a_bench --render benchmarks/results/a2a-h200x2.json
    # plumbing check without a GPU (gloo, 16 to 64 KiB per rank; what CI runs)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.a2a_bench \
        --cpu-dry-run --out /tmp/a2a-dry

What runs: the MoE dispatch's all-to-all (``executor.communicate("a2a_gemm", ...)``; ``--op gemm_a2a`` for
the combine's) under a balanced routing, every rank sending ``bytes_per_rank / w`` to every rank (itself
included) as rows of ``WIDTH`` bf16 values, in these variants (``VARIANTS``):

- ``nccl``: NCCL ``all_to_all_single`` (``executor="sm"``);
- ``dma``: the executor's copy-engine all-to-all as shipped (``streams="auto"``: on two ranks every copy on
  the caller's stream, on more one side stream per peer), pushes into peer symmetric memory and one
  device barrier;
- ``dma_per_peer`` / ``dma_current``: the same with each peer's copy on its own side stream (forked and
  joined with events) / every copy on the caller's stream;
- ``dma_batched``: every copy of the call in one ``cudaMemcpyBatchAsync`` (CUDA runtime >= 13, called
  through ctypes: torch exposes no batched copy), then the barrier; left out where the runtime lacks it
  or ``--no-batched``;
- ``nccl_graph`` / ``dma_graph``: ``nccl`` / ``dma`` captured into a CUDA graph and replayed (the launch
  path of one graph launch).

Protocol: the largest size first (the peer memory is allocated once); per size, every variant is checked
once (the rows it leaves must equal ``all_to_all_single``'s) and warmed up, then timed in ``--rounds``
interleaved rounds, each visiting the variants in a freshly shuffled order (the same on every rank). Before
each timed repetition the ranks are aligned (a one-element all-reduce, then a host synchronisation,
outside the timed region); a repetition is ``CALLS`` back-to-back calls between CUDA events (CPU: the host
clock), its time per call the maximum over ranks, and a variant's time the median over rounds. The host
time to issue the calls is kept beside it (``<variant>_host_ms``). The crossover is the smallest size from
which a variant is at least as fast as NCCL at every larger size; the goal (issue #14): ``dma`` >= NCCL at
>= 1 MiB per peer and within 1.2x of NCCL below, in the same run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import say, torchrun_main
from ficco.files import write_text_atomic
from ficco.harness.worker import SAFE_ENV
from ficco.rounds import interleaved_rounds

# NVLink multicast stays off in NCCL, PyTorch symmetric memory and NVSHMEM: set before torch loads them.
os.environ.update(SAFE_ENV)

MIN_BYTES, MAX_BYTES = 64 << 10, 256 << 20
"""Bytes each rank sends in one all-to-all (itself included), doubling from the first to the last."""
DRY_RUN_BYTES = (16 << 10, 64 << 10)
"""``--cpu-dry-run``: the same doubling over these bytes per rank."""
WIDTH = 1024
"""Columns of a routed row (bf16: 2 KiB per row; 64 KiB per rank is 4 rows per peer at 8 ranks)."""
ROUNDS = 30
"""Interleaved rounds per size (the median over them is published)."""
CALLS = 2
"""Back-to-back calls per timed repetition: even, so that a captured graph's replays keep alternating the
copy-engine executor's double-buffered halves."""
WARMUP = 3
"""Untimed calls per variant and size before its check."""
GOAL_BYTES_PER_PEER = 1 << 20
"""From this size per peer on, the copy engines must be at least as fast as NCCL; below it within
``GOAL_BELOW``x."""
GOAL_BELOW = 1.2
VARIANTS = {
    "nccl": "NCCL all_to_all_single",
    "dma": "copy engines as the executor ships them (streams='auto')",
    "dma_per_peer": "copy engines, one side stream per peer (fork and join by events)",
    "dma_current": "copy engines, every copy on the caller's stream",
    "dma_batched": "copy engines, one cudaMemcpyBatchAsync for every copy (ctypes)",
    "nccl_graph": "nccl captured in a CUDA graph",
    "dma_graph": "dma captured in a CUDA graph",
}
"""Variant -> what it runs (the JSON's ``<variant>_ms`` columns)."""
_FAILED_CAPTURES: list = []
"""CUDA graphs whose capture raised (see ``_graphed``)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/a2a_bench.py",
        description="Time the all-to-all alone, NCCL against the copy engines (run under torchrun).",
    )
    p.add_argument("--out", type=Path, help="folder for the JSON and markdown results (rank 0 writes)")
    p.add_argument("--op", choices=("a2a_gemm", "gemm_a2a"), default="a2a_gemm", help="dispatch or combine")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds per size (>= 5; {ROUNDS})")
    p.add_argument("--name", help="file stem of the outputs (default: a2a-h200x<world size>)")
    p.add_argument("--no-batched", action="store_true", help="leave out the cudaMemcpyBatchAsync variant")
    p.add_argument("--render", type=Path, help="only re-render the markdown of this JSON (no torchrun)")
    p.add_argument("--cpu-dry-run", action="store_true", help="check the script without a GPU (gloo, tiny)")
    args = p.parse_args(argv)
    if args.render is None and args.out is None:
        p.error("--out is required (unless --render)")
    if args.rounds < 5:
        p.error(f"--rounds must be >= 5 (the medians are published); got {args.rounds}")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    """Run the benchmark (under torchrun, or inside an initialised group); rank 0's result, else None."""
    return torchrun_main(parse_args(argv), run, render_markdown)


def run(args: argparse.Namespace) -> dict:
    """Every size, largest first; rank 0 writes the JSON and markdown after each size and returns the data."""
    import torch
    import torch.distributed as dist

    from ficco import executor
    from ficco.harness.fingerprint import cpu_fingerprint, gpu_fingerprint

    w, rank = dist.get_world_size(), dist.get_rank()
    cuda = not args.cpu_dry_run
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    executor.set_barrier_timeout(60.0)
    lo, hi = DRY_RUN_BYTES if args.cpu_dry_run else (MIN_BYTES, MAX_BYTES)
    sizes = [lo << i for i in range(int(math.log2(hi // lo)) + 1)]
    name = args.name or f"a2a-h200x{w}"
    data: dict = {
        "meta": {
            "title": f"{w} x {torch.cuda.get_device_name() if cuda else 'CPU (gloo dry run)'}",
            "fingerprint": gpu_fingerprint(w) if cuda else cpu_fingerprint(w),
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "op": args.op,
            "dtype": "bf16",
            "width": WIDTH,
            "rounds": args.rounds,
            "calls_per_repetition": CALLS,
            "variants": VARIANTS,
        },
        "sizes": [],
    }
    out_json = args.out / f"{name}.json"
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        say(f"{len(sizes)} sizes, {lo >> 10} KiB to {hi >> 10} KiB per rank; writing {out_json}")
    start = time.perf_counter()
    for bytes_per_rank in sorted(sizes, reverse=True):
        row = measure_size(args, bytes_per_rank, device)
        data["sizes"] = sorted([*data["sizes"], row], key=lambda r: r["bytes_per_peer"])
        data["crossover"] = crossovers(data["sizes"])
        data["goal"] = goal(data["sizes"])
        data["meta"]["wall_s"] = round(time.perf_counter() - start, 1)
        if rank == 0:
            _save(out_json, data)
            say(_progress(row))
    if rank == 0:
        for variant, at in data["crossover"].items():
            where = "never" if at is None else f"from {_size(at)} per peer on"
            say(f"crossover: {variant} at least as fast as NCCL {where}")
        g = data["goal"]
        say(f"goal (dma >= NCCL at >= 1 MiB per peer, <= {GOAL_BELOW}x below): {g['met']}; {g['note']}")
    return data


def measure_size(args: argparse.Namespace, bytes_per_rank: int, device) -> dict:
    """One size: every variant checked, then timed in interleaved rounds; one JSON row."""
    import torch
    import torch.distributed as dist

    from ficco import executor
    from ficco.features import Routing

    w, rank = dist.get_world_size(), dist.get_rank()
    rows_per_peer = bytes_per_rank // (w * WIDTH * 2)
    routing = Routing([[[rows_per_peer]] * w] * w)
    gen = torch.Generator(device="cpu").manual_seed(rank)
    x = torch.randn(rows_per_peer * w, WIDTH, generator=gen).to(device, torch.bfloat16)
    variants, errors = build_variants(args, x, routing)
    token = torch.zeros(1, device=device)
    cuda = device.type == "cuda"

    def align() -> None:
        dist.all_reduce(token)
        if cuda:
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {v: [] for v in variants}
    host: dict[str, list[float]] = {v: [] for v in variants}

    def run_round(order: list[str]) -> None:
        local = []
        for name in order:
            call = variants[name]
            align()
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                t0 = time.perf_counter()
                call()
                issued = time.perf_counter() - t0
                end.record()
                end.synchronize()
                ms = begin.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                call()
                issued = time.perf_counter() - t0
                ms = 1e3 * issued
            local.append((name, ms / CALLS, 1e3 * issued / CALLS))
        flat = torch.tensor([v for _, ms, hs in local for v in (ms, hs)], dtype=torch.float64, device=device)
        dist.all_reduce(flat, op=dist.ReduceOp.MAX)
        for j, (variant, _, _) in enumerate(local):
            times[variant].append(flat[2 * j].item())
            host[variant].append(flat[2 * j + 1].item())

    interleaved_rounds(list(variants), run_round, rounds=args.rounds, seed=[bytes_per_rank, args.rounds])
    row: dict = {"bytes_per_rank": bytes_per_rank, "bytes_per_peer": rows_per_peer * WIDTH * 2}
    for variant in VARIANTS:
        row[f"{variant}_ms"] = statistics.median(times[variant]) if times.get(variant) else None
        row[f"{variant}_host_ms"] = statistics.median(host[variant]) if host.get(variant) else None
    row["errors"] = errors
    variants.clear()  # graphs go before the buffers they replay into
    executor.clear_buffers()
    return row


def build_variants(
    args: argparse.Namespace, x, routing
) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """The variants that run here, each a closure of ``CALLS`` calls, checked against ``all_to_all_single``
    and warmed up; and why each of the others does not run (agreed by every rank)."""
    import torch

    from ficco import executor

    op, cuda = args.op, x.is_cuda

    def repeat(one: Callable[[], object]) -> Callable[[], None]:
        def calls() -> None:
            for _ in range(CALLS):
                one()

        return calls

    eager = {
        "nccl": lambda: executor.communicate(op, x, "sm", routing=routing),
        "dma": lambda: executor.communicate(op, x, "dma", routing=routing),
        "dma_per_peer": lambda: executor.communicate(op, x, "dma", routing=routing, streams="per_peer"),
        "dma_current": lambda: executor.communicate(op, x, "dma", routing=routing, streams="current"),
    }
    built: dict[str, Callable[[], None]] = {name: repeat(one) for name, one in eager.items()}
    reasons: dict[str, str] = {}
    if not cuda:
        reasons |= dict.fromkeys(("dma_batched", "nccl_graph", "dma_graph"), "needs CUDA")
    elif args.no_batched:
        reasons["dma_batched"] = "left out (--no-batched)"
    if cuda and not args.no_batched:
        eager["dma"]()  # the executor sizes its peer memory (a collective) before the batch views it
        try:
            built["dma_batched"] = repeat(BatchedCopies(op, x, routing))
        except Exception as err:  # no runtime support here: say why, measure the rest
            reasons["dma_batched"] = f"{type(err).__name__}: {err}"
    want = _reference(op, x, routing)
    for name in list(built):
        problem = _try(lambda name=name: _check(built[name], name, op, x, routing, want))
        if problem:
            reasons[name] = problem
            del built[name]
    if cuda:
        for name in ("nccl", "dma"):
            if name in built:
                graph = f"{name}_graph"
                try:
                    built[graph] = _graphed(built[name])
                    problem = _check(built[graph], graph, op, x, routing, want)
                except Exception as err:
                    problem = f"{type(err).__name__}: {err}"
                if problem:
                    reasons[graph] = problem
                    built.pop(graph, None)
    reasons = _agreed_reasons(reasons)
    for name in [n for n in built if n in reasons]:
        del built[name]  # failed on another rank
    for call in built.values():
        for _ in range(WARMUP):
            call()
    if cuda:
        torch.cuda.synchronize()
    return built, reasons


class BatchedCopies:
    """One call of the copy-engine all-to-all with every copy in one ``cudaMemcpyBatchAsync`` (the rows
    this rank keeps included), then the executor's device barrier, into the executor's peer memory (its
    double-buffered halves, as ``communicate`` uses them). CUDA runtime >= 13 only: its signature has no
    ``failIdx`` (12.8 and 12.9 differ), and torch exposes no batched copy."""

    def __init__(self, op: str, x, routing) -> None:
        import torch

        from ficco.executor.context import get_context
        from ficco.executor.experts import routed_state
        from ficco.executor.plan import Piece
        from ficco.features import OP_SPECS

        self._fn, self._attrs = _memcpy_batch()
        ctx = get_context(None, x.device)
        layout = routed_state(ctx.routed, routing, ctx.rank).layout(OP_SPECS[op].direction, 1)
        width, itemsize = x.shape[1], x.element_size()
        self.workspace = ctx.get_workspace(max(layout.dest_rows) * width * itemsize, what="dma_batched")
        row_bytes = width * itemsize
        self._batches: dict[int, tuple] = {}
        for _ in range(2):  # one pointer list per half
            remote = [self.workspace.rows(q, width, x.dtype) for q in range(ctx.world_size)]
            own_source, own_dest = layout.own_block()
            copies = [(remote[ctx.rank][own_dest], x[own_source])]
            for offset in range(1, ctx.world_size):
                piece = Piece(offset=offset, sub=0)
                copies.append((remote[layout.peer_to(piece)][layout.remote(piece)], x[layout.sent(piece)]))
            copies = [(d, s) for d, s in copies if s.numel()]
            count = len(copies)
            self._batches[self.workspace.parity] = (
                (ctypes.c_void_p * count)(*[d.data_ptr() for d, _ in copies]),
                (ctypes.c_void_p * count)(*[s.data_ptr() for _, s in copies]),
                (ctypes.c_size_t * count)(*[s.shape[0] * row_bytes for _, s in copies]),
                count,
            )
            self.workspace.advance()
        self._views_alive = x  # the source rows the pointers address
        self._index = ctypes.c_size_t(0)
        self._stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def __call__(self) -> None:
        dsts, srcs, sizes, count = self._batches[self.workspace.parity]
        status = self._fn(
            dsts, srcs, sizes, count, ctypes.byref(self._attrs), ctypes.byref(self._index), 1, self._stream()
        )
        if status:
            raise RuntimeError(f"cudaMemcpyBatchAsync returned CUDA error {status}")
        self.workspace.barrier()
        self.workspace.advance()


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    """``cudaMemcpyAttributes`` (CUDA 12.8+): source access order, two location hints, flags."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


_SRC_ACCESS_ORDER_STREAM = 1
"""``cudaMemcpySrcAccessOrderStream``: the sources are read in stream order, as ``cudaMemcpyAsync`` does."""


def _memcpy_batch() -> tuple[Callable[..., int], _MemcpyAttributes]:
    """``cudaMemcpyBatchAsync`` of the CUDA runtime torch loaded, and stream-ordered attributes for it;
    RuntimeError naming what is missing."""
    lib = None
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libcudart.so" in os.path.basename(path):
            lib = ctypes.CDLL(path)
            break
    if lib is None:
        raise RuntimeError("no CUDA runtime library (libcudart.so) is loaded in this process")
    version = ctypes.c_int(0)
    lib.cudaRuntimeGetVersion(ctypes.byref(version))
    if version.value < 13000 or not hasattr(lib, "cudaMemcpyBatchAsync"):
        raise RuntimeError(
            f"needs CUDA runtime >= 13.0 with cudaMemcpyBatchAsync; this one is {version.value}"
        )
    fn = lib.cudaMemcpyBatchAsync
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,  # void** dsts
        ctypes.c_void_p,  # void** srcs
        ctypes.c_void_p,  # size_t* sizes
        ctypes.c_size_t,  # count
        ctypes.POINTER(_MemcpyAttributes),
        ctypes.POINTER(ctypes.c_size_t),  # attrsIdxs
        ctypes.c_size_t,  # numAttrs
        ctypes.c_void_p,  # stream
    ]
    return fn, _MemcpyAttributes(srcAccessOrder=_SRC_ACCESS_ORDER_STREAM)


def _reference(op: str, x, routing):
    """What ``all_to_all_single`` leaves on this rank (a copy)."""
    from ficco import executor
    from ficco.executor.context import get_context

    executor.communicate(op, x, "sm", routing=routing)
    return _landed(get_context(None, x.device), "sm", x, op, routing).clone()


def _landed(ctx, kind: str, x, op: str, routing):
    """The rows the last all-to-all left here: the ``received`` buffer (sm) or the half of the peer memory
    the last call used (dma)."""
    from ficco.features import OP_SPECS

    direction = OP_SPECS[op].direction
    rows = sum(routing.received(ctx.rank)) if direction == "gather" else sum(routing.sent(ctx.rank))
    if kind == "sm":
        return ctx.rows_buffer("received", x.shape[1], x.dtype, rows)[:rows]
    ctx.workspace.advance()  # back to the half the last call used
    try:
        return ctx.workspace.rows(ctx.rank, x.shape[1], x.dtype)[:rows].clone()
    finally:
        ctx.workspace.advance()


def _check(call: Callable[[], None], name: str, op: str, x, routing, want) -> str:
    """'' when one repetition of ``call`` leaves the reference rows, else why not (every rank calls it)."""
    import torch

    from ficco import executor
    from ficco.executor.context import get_context

    executor.poison_buffers()
    call()
    if x.is_cuda:
        torch.cuda.synchronize()
    got = _landed(get_context(None, x.device), "sm" if name.startswith("nccl") else "dma", x, op, routing)
    return "" if torch.equal(got, want) else "wrong rows: differ from all_to_all_single's"


def _graphed(calls: Callable[[], None]) -> Callable[[], None]:
    """``calls`` (``CALLS`` calls, already run eagerly) captured into a CUDA graph; its replay."""
    import torch

    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph):
            calls()
    except Exception:
        # torch 2.11 aborts the process when a graph whose capture failed is destroyed (its destructor
        # unregisters it from the RNG state a second time): such graphs live until the process ends.
        _FAILED_CAPTURES.append(graph)
        raise
    torch.cuda.synchronize()

    def replay() -> None:
        graph.replay()

    return replay


def _agreed_reasons(reasons: dict[str, str]) -> dict[str, str]:
    """Every rank's reasons merged (a variant that failed anywhere is left out everywhere)."""
    import torch.distributed as dist

    every: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, reasons)
    merged: dict[str, str] = {}
    for rank, found in enumerate(every):
        for name, why in (found or {}).items():
            merged.setdefault(name, f"rank {rank}: {why}")
    return merged


def _try(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def crossovers(rows: list[dict]) -> dict[str, int | None]:
    """Per measured copy-engine variant: the smallest bytes per peer from which it is at least as fast as
    NCCL (``dma_graph``: as ``nccl_graph``) at every larger size where both were measured; None: slower at
    the largest such size."""
    out = {}
    for variant in (v for v in VARIANTS if v.startswith("dma")):
        against = "nccl_graph_ms" if variant == "dma_graph" else "nccl_ms"
        both = [r for r in rows if r.get(f"{variant}_ms") is not None and r.get(against) is not None]
        if not both:
            continue
        at = None
        for row in sorted(both, key=lambda r: r["bytes_per_peer"], reverse=True):
            if row[f"{variant}_ms"] > row[against]:
                break
            at = row["bytes_per_peer"]
        out[variant] = at
    return out


def goal(rows: list[dict]) -> dict:
    """The issue's goal on ``dma`` against ``nccl``: >= NCCL (time <= NCCL's) at >= 1 MiB per peer, within
    ``GOAL_BELOW``x below; the worst ratio on each side."""
    above = [
        r["dma_ms"] / r["nccl_ms"] for r in rows if _both(r) and r["bytes_per_peer"] >= GOAL_BYTES_PER_PEER
    ]
    below = [
        r["dma_ms"] / r["nccl_ms"] for r in rows if _both(r) and r["bytes_per_peer"] < GOAL_BYTES_PER_PEER
    ]
    met = bool(above or below) and max(above, default=0.0) <= 1.0 and max(below, default=0.0) <= GOAL_BELOW
    note = (
        f"worst dma/nccl time {max(above):.3g} at >= 1 MiB per peer" if above else "no size >= 1 MiB per peer"
    ) + (f", {max(below):.3g} below" if below else "")
    return {
        "met": met,
        "worst_at_or_above": max(above, default=None),
        "worst_below": max(below, default=None),
        "note": note,
    }


def _both(row: dict) -> bool:
    return row.get("dma_ms") is not None and row.get("nccl_ms") is not None


def render_markdown(data: dict) -> str:
    """The table (ms per call; CE/NCCL = dma over nccl time), the crossovers and the goal."""
    meta = data["meta"]
    shown = [v for v in VARIANTS if any(r.get(f"{v}_ms") is not None for r in data["sizes"])]
    lines = [f"# All-to-all alone, NCCL vs copy engines: {meta['title']}", ""]
    for key in ("started_utc", "op", "dtype", "width", "rounds", "calls_per_repetition", "wall_s"):
        lines.append(f"- {key}: {meta.get(key)}")
    lines += [f"- fingerprint.{k}: {v}" for k, v in meta.get("fingerprint", {}).items()]
    lines += ["", "Variants: " + "; ".join(f"`{v}` {VARIANTS[v]}" for v in shown), ""]
    header = ["KiB per peer", *(f"{v} ms" for v in shown), "dma / nccl"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in data["sizes"]:
        ratio = r["dma_ms"] / r["nccl_ms"] if _both(r) else None
        cells = [f"{r['bytes_per_peer'] / 1024:g}", *(_f(r.get(f"{v}_ms")) for v in shown), _f(ratio)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Host time to issue one call (ms, median):", ""]
    lines += ["| KiB per peer | " + " | ".join(shown) + " |", "|" + "---|" * (len(shown) + 1)]
    for r in data["sizes"]:
        lines.append(
            f"| {r['bytes_per_peer'] / 1024:g} | "
            + " | ".join(_f(r.get(f"{v}_host_ms")) for v in shown)
            + " |"
        )
    lines += ["", "## Crossover", ""]
    for variant, at in crossovers(data["sizes"]).items():
        where = "never (slower at the largest size)" if at is None else f"from {_size(at)} per peer on"
        lines.append(
            f"- `{variant}` at least as fast as NCCL{' (graph)' if variant == 'dma_graph' else ''}: {where}"
        )
    g = goal(data["sizes"])
    met = "met" if g["met"] else "missed"
    lines += [
        "",
        f"Goal (dma >= NCCL at >= 1 MiB per peer, within {GOAL_BELOW}x below): **{met}**; {g.get('note')}",
    ]
    where_not: dict[tuple[str, str], list[str]] = {}
    for r in data["sizes"]:
        for name, why in sorted(r.get("errors", {}).items()):
            where_not.setdefault((name, why.splitlines()[0]), []).append(_size(r["bytes_per_peer"]))
    if where_not:
        lines += ["", "## Not measured", ""]
        lines += [f"- `{name}` at {', '.join(at)} per peer: {why}" for (name, why), at in where_not.items()]
    return "\n".join(lines) + "\n"


def _progress(row: dict) -> str:
    ratio = row["dma_ms"] / row["nccl_ms"] if _both(row) else None
    return (
        f"{_size(row['bytes_per_peer']):>9s} per peer: NCCL {_f(row['nccl_ms'])} ms, "
        f"CE {_f(row['dma_ms'])} ms (x{_f(ratio)})"
    )


def _save(path: Path, data: dict) -> None:
    """Write the JSON (NaN as null) and the markdown beside it, atomically."""
    write_text_atomic(path, json.dumps(data, indent=1))
    write_text_atomic(path.with_suffix(".md"), render_markdown(data))


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:g} KiB"


def _f(x: float | None) -> str:
    return f"{x:.4g}" if isinstance(x, float) and math.isfinite(x) else "n/a"


if __name__ == "__main__":
    main()
    if _FAILED_CAPTURES:
        # The results are on disk; destroying these graphs at interpreter exit would abort (see _graphed).
        sys.stdout.flush()
        os._exit(0)
