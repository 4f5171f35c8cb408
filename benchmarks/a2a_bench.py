r"""All-to-all alone, NCCL against the copy engines, from 64 KiB to 256 MiB per rank: where the copy
engines catch up with NCCL (the latency-bound regime of the MoE dispatch and combine).

    # 2 GPUs (estimated about a minute on 2 x H200): writes OUT/a2a-h200x2.json and .md (named after the GPUs
    # found: a2a-h100x2 on H100s)
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
- ``dma``: the executor's copy-engine all-to-all under its copy arrangement (``streams="auto"``,
  ``executor.copy_streams()``: on two ranks every copy on the caller's stream; on more, one side stream per
  peer under ``per_peer``), pushes into peer symmetric memory and one device barrier;
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
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import machine_id, parse_torchrun_args, say, torchrun_main, torchrun_parser
from benchmarks.variants import (
    CALLS,
    BatchedCopies,
    agreed_reasons,
    attempt,
    exit_keeping_failed_captures,
    graphed,
    repeat,
    time_variants,
)
from ficco.files import write_text_atomic

MIN_BYTES, MAX_BYTES = 64 << 10, 256 << 20
"""Bytes each rank sends in one all-to-all (itself included), doubling from the first to the last."""
DRY_RUN_BYTES = (16 << 10, 64 << 10)
"""``--cpu-dry-run``: the same doubling over these bytes per rank."""
WIDTH = 1024
"""Columns of a routed row (bf16: 2 KiB per row; 64 KiB per rank is 4 rows per peer at 8 ranks)."""
ROUNDS = 30
"""Interleaved rounds per size (the median over them is published)."""
WARMUP = 3
"""Untimed calls per variant and size before its check."""
GOAL_BYTES_PER_PEER = 1 << 20
"""From this size per peer on, the copy engines must be at least as fast as NCCL; below it within
``GOAL_BELOW``x."""
GOAL_BELOW = 1.2
VARIANTS = {
    "nccl": "NCCL all_to_all_single",
    "dma": "copy engines under the executor's copy arrangement (streams='auto')",
    "dma_per_peer": "copy engines, one side stream per peer (fork and join by events)",
    "dma_current": "copy engines, every copy on the caller's stream",
    "dma_batched": "copy engines, one cudaMemcpyBatchAsync for every copy (ctypes)",
    "nccl_graph": "nccl captured in a CUDA graph",
    "dma_graph": "dma captured in a CUDA graph",
}
"""Variant -> what it runs (the JSON's ``<variant>_ms`` columns)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = torchrun_parser(
        "benchmarks/a2a_bench.py",
        "Time the all-to-all alone, NCCL against the copy engines (run under torchrun).",
        name="a2a-<hardware id>, e.g. a2a-h200x4",
        rounds=ROUNDS,
    )
    p.add_argument("--op", choices=("a2a_gemm", "gemm_a2a"), default="a2a_gemm", help="dispatch or combine")
    p.add_argument("--no-batched", action="store_true", help="leave out the cudaMemcpyBatchAsync variant")
    return parse_torchrun_args(p, argv)


def main(argv: list[str] | None = None) -> dict | None:
    """Run the benchmark (under torchrun, or inside an initialised group); rank 0's result, else None."""
    return torchrun_main(parse_args(argv), run, render_markdown)


def run(args: argparse.Namespace) -> dict:
    """Every size, largest first; rank 0 writes the JSON and markdown after each size and returns the data."""
    import torch
    import torch.distributed as dist

    from ficco import executor
    from ficco.features.fingerprint import cpu_fingerprint, gpu_fingerprint

    w, rank = dist.get_world_size(), dist.get_rank()
    cuda = not args.cpu_dry_run
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    executor.set_barrier_timeout(60.0)
    lo, hi = DRY_RUN_BYTES if args.cpu_dry_run else (MIN_BYTES, MAX_BYTES)
    sizes = [lo << i for i in range(int(math.log2(hi // lo)) + 1)]
    name = args.name or f"a2a-{machine_id(w, cuda)}"
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
    timed = time_variants(variants, rounds=args.rounds, seed=[bytes_per_rank, args.rounds], device=device)
    row: dict = {"bytes_per_rank": bytes_per_rank, "bytes_per_peer": rows_per_peer * WIDTH * 2}
    for variant in VARIANTS:
        row[f"{variant}_ms"], row[f"{variant}_host_ms"] = timed.get(variant, (None, None))
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
    import torch.distributed as dist

    from ficco import executor
    from ficco.executor.context import get_context
    from ficco.executor.experts import routed_state
    from ficco.features import OP_SPECS

    op, cuda = args.op, x.is_cuda

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
            layout = routed_state(get_context(None, x.device).routed, routing, dist.get_rank())
            batched = BatchedCopies(x, layout.layout(OP_SPECS[op].direction, 1), keep_own=True)
            built["dma_batched"] = repeat(batched)
        except Exception as err:  # no runtime support here: say why, measure the rest
            reasons["dma_batched"] = f"{type(err).__name__}: {err}"
    want = _reference(op, x, routing)
    for name in list(built):
        problem = attempt(lambda name=name: _check(built[name], name, op, x, routing, want))
        if problem:
            reasons[name] = problem
            del built[name]
    if cuda:
        for name in ("nccl", "dma"):
            if name in built:
                graph = f"{name}_graph"
                try:
                    built[graph] = graphed(built[name])
                    problem = _check(built[graph], graph, op, x, routing, want)
                except Exception as err:
                    problem = f"{type(err).__name__}: {err}"
                if problem:
                    reasons[graph] = problem
                    built.pop(graph, None)
    reasons = agreed_reasons(reasons)
    for name in [n for n in built if n in reasons]:
        del built[name]  # failed on another rank
    for call in built.values():
        for _ in range(WARMUP):
            call()
    if cuda:
        torch.cuda.synchronize()
    return built, reasons


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
    exit_keeping_failed_captures()
