r"""Executor benchmark on 2 GPUs: every ag_gemm / gemm_rs schedule checked and timed beside serial NCCL and
PyTorch async-TP, and the all-gather alone, NCCL vs copy engines, from 1 MiB to 1 GiB per GPU.

    # smoke test, about a minute: a few small shapes, every schedule, correctness + timing
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.executor_bench --quick \
        --out OUT
    # the full run (budgeted to finish within 8 minutes on 2 x H200)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.executor_bench --out OUT
    # re-render the markdown table from a finished JSON (no GPU)
    python3 -m benchmarks.executor_bench --render benchmarks/results/executor-h200x2.json
    # plumbing check without a GPU: gloo, the quick shapes scaled down 32x
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.executor_bench \
        --cpu-dry-run --out /tmp/bench-dry

Writes ``OUT/executor-h200x<world size>.json`` (``--quick``: ``...-quick.json``) after every shape, so an
interrupted run keeps what it measured, and the markdown table beside it. Per shape: every candidate
schedule runs once on poisoned buffers and is compared with ``serial/sm`` (bf16 relative error <= 1e-2),
then is timed in eager mode with the dataset protocol (``--rounds`` interleaved rounds of ``--block-ms``
blocks, ranks aligned before each; median of the per-round maximum over ranks); plus
the GEMM alone, the NCCL collective alone, the copy-engine transfer alone and async-TP
(``harness.torch_backend.TorchBackend`` does all of it). A schedule that fails is recorded ``ok=false``
with its error and the run goes on. Shapes come from Llama-3.1-8B/70B, Mixtral-8x7B and Qwen2.5-72B at
TP=2 (``datasets/model_configs``, ``features.model_config.layer_pairs``), 1k to 64k tokens, plus
communication-heavy and reference shapes; a wall-clock budget skips the shapes that would not fit.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from benchmarks import REPO, machine_id, parse_torchrun_args, say, torchrun_main, torchrun_parser
from benchmarks.support.alone import time_rounds
from ficco.files import write_text_atomic
from ficco.harness.backend import BLOCK_MS, ROUNDS, Timing
from ficco.tables import text_table

MODELS = ("Llama-3.1-8B", "Llama-3.1-70B", "Mixtral-8x7B-v0.1", "Qwen2.5-72B")
"""Model configs (``datasets/model_configs/<name>.json``) whose TP=2 layers give the shapes."""
TOKENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
MAX_SERIAL_MS = 12.5
"""Layer shapes whose estimated serial time exceeds this are left out (they would not fit the budget)."""
EXTRA_SHAPES = (
    # (op, m, n, k, label): communication-heavy ones, and the shapes of the reference measurements
    ("ag_gemm", 65536, 1024, 4096, "comm-heavy"),
    ("ag_gemm", 32768, 512, 8192, "comm-heavy"),
    ("ag_gemm", 16384, 2048, 4096, "comm-heavy"),
    ("gemm_rs", 65536, 4096, 1024, "comm-heavy"),
    ("gemm_rs", 32768, 8192, 512, "comm-heavy"),
    ("ag_gemm", 8192, 8192, 8192, "reference"),
    ("gemm_rs", 8192, 8192, 8192, "reference"),
    ("ag_gemm", 2048, 8192, 8192, "reference"),
    ("gemm_rs", 2048, 8192, 8192, "reference"),
    ("ag_gemm", 1024, 4096, 4096, "reference"),
    ("gemm_rs", 1024, 4096, 4096, "reference"),
)
QUICK_SHAPES = (
    ("ag_gemm", 4096, 4096, 4096, "quick"),
    ("ag_gemm", 16384, 2048, 4096, "quick"),
    ("gemm_rs", 4096, 4096, 4096, "quick"),
    ("gemm_rs", 16384, 4096, 2048, "quick"),
)
BANDWIDTH_MIB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
QUICK_BANDWIDTH_MIB = (1, 4, 64, 256)
BANDWIDTH_WIDTH = 4096
"""Columns of the all-gathered bf16 matrix in the bandwidth sweep (rows follow from the size)."""
COPY_MIB = 256
"""MiB per transfer in the copy-engine probes (``measure_copies``): large enough to be bandwidth-bound."""
PUSH_STREAMS = (1, 2, 4)
"""Streams per peer tried by the all-peers push probe (each peer's rows split evenly across them)."""
EST_TFLOPS, EST_LINK_GBPS = 650.0, 150.0
"""Deliberately low GEMM and NCCL rates for the run-time estimate (H200 reaches ~790 TFLOP/s, ~240 GB/s)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """One (op, m, n, k) to measure, with the layers it comes from."""

    op: str = "ag_gemm"
    """``ag_gemm`` or ``gemm_rs``."""
    m: int = 4096
    n: int = 4096
    k: int = 4096
    layers: tuple[str, ...] = ()
    """Where the shape occurs, e.g. ``Llama-3.1-8B:qkv@4096`` (model:layer@tokens)."""

    def estimate_serial_ms(self, world_size: int) -> float:
        """A pessimistic serial time: GEMM at ``EST_TFLOPS`` plus the collective at ``EST_LINK_GBPS``."""
        from ficco.features import OP_SPECS

        width = OP_SPECS[self.op].comm_width(self.k, self.n)
        comm_bytes = (world_size - 1) / world_size * self.m * width * 2
        return 1e3 * (2 * self.m * self.n * self.k / (EST_TFLOPS * 1e12) + comm_bytes / (EST_LINK_GBPS * 1e9))

    def estimate_s(self, world_size: int, schedules: int, calls: int) -> float:
        """Seconds to measure: ``schedules`` x ``calls`` runs at 1.3 x serial, plus per-schedule overhead."""
        return schedules * (calls * 1.3 * self.estimate_serial_ms(world_size) / 1e3 + 0.01) + 0.5


def layer_shapes(world_size: int) -> list[Shape]:
    """Deduplicated ag_gemm / gemm_rs shapes of ``MODELS`` at TP=world_size over ``TOKENS``."""
    from ficco.features.model_config import layer_pairs, load_model_config

    found: dict[tuple, list[str]] = {}
    for name in MODELS:
        config = load_model_config(REPO / "datasets" / "model_configs" / f"{name}.json")
        for tokens in TOKENS:
            for pair in layer_pairs(config, tp=world_size, tokens=tokens, hardware=_hardware(world_size)):
                s = pair.scenario
                if s.op in ("ag_gemm", "gemm_rs"):
                    found.setdefault((s.op, s.m, s.n, s.k), []).append(f"{name}:{pair.name}@{tokens}")
    return [Shape(op=op, m=m, n=n, k=k, layers=tuple(labels)) for (op, m, n, k), labels in found.items()]


def plan_shapes(quick: bool, world_size: int, scale_down: int = 1) -> list[Shape]:
    """The shapes of this run, cheapest first, so a tight budget drops the largest ones (``quick``: the
    quick shapes, each dimension divided by ``scale_down``)."""
    if quick:
        d = scale_down
        return [
            Shape(op=op, m=m // d, n=n // d, k=k // d, layers=(label,)) for op, m, n, k, label in QUICK_SHAPES
        ]
    shapes = {(s.op, s.m, s.n, s.k): s for s in layer_shapes(world_size)}
    for op, m, n, k, label in EXTRA_SHAPES:
        old = shapes.get((op, m, n, k))
        shapes[(op, m, n, k)] = Shape(op=op, m=m, n=n, k=k, layers=(*(old.layers if old else ()), label))
    extra = {(op, m, n, k) for op, m, n, k, _ in EXTRA_SHAPES}
    kept = [
        s for key, s in shapes.items() if key in extra or s.estimate_serial_ms(world_size) <= MAX_SERIAL_MS
    ]
    return sorted(kept, key=lambda s: s.estimate_serial_ms(world_size))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = torchrun_parser(
        "python -m benchmarks.executor_bench",
        "Check and time every executor schedule on real layer shapes (run under torchrun).",
        name="executor-<hardware id>",
        rounds=ROUNDS,
        min_rounds=ROUNDS,
        dry_run="gloo, quick shapes / 32",
    )
    p.add_argument("--quick", action="store_true", help="smoke test: 4 small shapes and 4 all-gather sizes")
    p.add_argument(
        "--budget-s", type=float, help="seconds for measuring, from after start-up (default 420; quick 120)"
    )
    p.add_argument("--block-ms", type=float, default=BLOCK_MS, help="target ms of one timed block (> 0)")
    p.add_argument(
        "--strict", action="store_true", help="exit with status 1 if any schedule or baseline failed"
    )
    args = parse_torchrun_args(p, argv)
    if not args.block_ms > 0:
        p.error(f"--block-ms must be > 0; got {args.block_ms}")
    args.quick = args.quick or args.cpu_dry_run
    if args.budget_s is None:
        args.budget_s = 120.0 if args.quick else 420.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # A rank stuck in a collective ends the run in minutes (what was measured is already on disk).
    problems = torchrun_main(args, run, _markdown, timeout=timedelta(minutes=3))
    if args.strict and problems:
        sys.exit(f"--strict: {problems} failed schedules or missing measurements (see the markdown)")


def run(args: argparse.Namespace) -> int:
    """Bandwidth sweep, then every shape within the budget; rank 0 saves after each step. Returns how
    many schedules failed plus how many baselines or bandwidth rows are missing."""
    from ficco.features import candidates
    from ficco.harness.torch_backend import TorchBackend

    start = time.perf_counter()
    device = "cpu" if args.cpu_dry_run else "cuda"
    timing = Timing(rounds=args.rounds, max_rounds=args.rounds, block_ms=args.block_ms)
    backend = TorchBackend(device=device, modes=("eager",), timing=timing, timeout_s=60.0)
    w, lead = backend.world_size, backend.rank == 0
    stem = args.name or f"executor-{machine_id(w, device == 'cuda')}"
    name = f"{stem}-quick" if args.quick else stem
    shapes = plan_shapes(args.quick, w, scale_down=32 if args.cpu_dry_run else 1)
    calls = 2 * args.rounds + 4  # about two calls per block, plus the check and the baselines' share
    data = {
        "meta": {
            "title": f"{w} x {_device_name(device)} ({'quick' if args.quick else 'full'} run)",
            "fingerprint": backend.fingerprint(),
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "protocol": backend.protocol(),
            "budget_s": args.budget_s,
            "dtype": "bf16",
        },
        "records": [],
        "allgather_bandwidth": [],
        "skipped_shapes": [],
    }
    out_json = args.out / f"{name}.json"
    if lead:
        args.out.mkdir(parents=True, exist_ok=True)
        est = sum(s.estimate_s(w, 30, calls) for s in shapes)
        say(f"{len(shapes)} shapes planned, estimated {est:.0f} s (budget {args.budget_s:.0f} s)")
        say(f"writing {out_json} and {out_json.with_suffix('.md')}")

    data["allgather_bandwidth"] = measure_bandwidth(
        backend, (1, 4) if args.cpu_dry_run else QUICK_BANDWIDTH_MIB if args.quick else BANDWIDTH_MIB
    )
    data["copy_engines"] = measure_copies(backend, 4 if args.cpu_dry_run else COPY_MIB)
    _save(lead, out_json, data, start)
    spent_est, spent_real = 1e-9, 0.0
    for i, shape in enumerate(shapes):
        elapsed = time.perf_counter() - start
        scale = max(1.0, spent_real / spent_est)  # the estimate, corrected by what earlier shapes took
        estimate = shape.estimate_s(w, 30, calls) * scale
        if not _agreed(elapsed + estimate <= args.budget_s, backend.device):
            data["skipped_shapes"].append({"op": shape.op, "m": shape.m, "n": shape.n, "k": shape.k})
            continue
        t0 = time.perf_counter()
        scenario = _scenario(shape, w)
        result = backend.measure(scenario, candidates(scenario))
        data["records"] += shape_records(shape, result)
        spent_real += time.perf_counter() - t0
        spent_est += shape.estimate_s(w, 30, calls)
        _save(lead, out_json, data, start)
        if lead:
            say(f"[{i + 1}/{len(shapes)} {time.perf_counter() - start:4.0f} s] {_progress(shape, result)}")
    data["meta"]["wall_s"] = round(time.perf_counter() - start, 1)
    _save(lead, out_json, data, start)
    if lead:
        print_summary(data)
    return _problems(data, expect_async_tp=not args.cpu_dry_run)


def _problems(data: dict, expect_async_tp: bool) -> int:
    """Failed schedules, missing shape baselines and missing bandwidth times, counted."""

    def missing(x: object) -> bool:
        return not (isinstance(x, float) and math.isfinite(x))

    keys = ["gemm_alone_ms", "comm_alone_ms", "dma_comm_alone_ms"] + (
        ["async_tp_ms"] if expect_async_tp else []
    )
    serial_rows = [r for r in data["records"] if r["schedule"] == "serial/sm"]
    count = sum(not r["ok"] for r in data["records"])
    count += sum(missing(r[k]) for r in serial_rows for k in keys)
    count += sum(missing(r[k]) for r in data["allgather_bandwidth"] for k in ("nccl_ms", "dma_ms"))
    return count


def measure_bandwidth(backend, sizes_mib: tuple[int, ...]) -> list[dict]:
    """All-gather alone, NCCL and copy engines: one row per size (MiB each GPU receives), largest first
    so the copy-engine workspace is allocated once."""
    rows = [_bandwidth_row(backend, mib) for mib in sorted(sizes_mib, reverse=True)]
    return sorted(rows, key=lambda r: r["mbytes"])


def _bandwidth_row(backend, mib: int) -> dict:
    import torch

    from ficco import executor

    rows = mib * (1 << 20) // ((backend.world_size - 1) * BANDWIDTH_WIDTH * 2)
    shard = torch.randn(rows, BANDWIDTH_WIDTH, dtype=torch.bfloat16, device=backend.device)
    row: dict = {"mbytes": mib}
    for key, kind in (("nccl_ms", "sm"), ("dma_ms", "dma")):
        try:
            row[key] = statistics.median(
                time_rounds(backend, lambda kind=kind: executor.communicate("ag_gemm", shard, kind))
            )
        except Exception as err:  # one size failing must not lose the others
            row[key], row[f"{key}_error"] = None, f"{type(err).__name__}: {err}"
    executor.clear_buffers()
    if backend.rank == 0:
        say(f"all-gather {mib:5d} MiB per GPU: NCCL {_f(row['nccl_ms'])} ms, CE {_f(row['dma_ms'])} ms")
    return row


def measure_copies(backend, mib: int) -> dict:
    """The machine's copy engines, measured in the same run as the NCCL rows (ms per call, GB/s of bytes
    received per GPU):

    - ``pairs``: every ordered pair alone, rank ``src`` pushing ``mib`` MiB into rank ``dst``'s peer memory
      while the others wait (the per-pair bandwidth matrix);
    - ``push_all``: every rank pushing ``mib`` MiB to every peer at once, each peer's rows split over
      ``streams_per_peer`` streams, then a device barrier: the copy path's all-gather, at the lane layouts
      ``PUSH_STREAMS`` (``mbytes`` = MiB received per GPU).
    """
    import torch

    from benchmarks import executor_report as report
    from ficco import executor
    from ficco.executor.context import get_context

    w, rank = backend.world_size, backend.rank
    rows = mib * (1 << 20) // (BANDWIDTH_WIDTH * 2)
    x = torch.randn(rows, BANDWIDTH_WIDTH, dtype=torch.bfloat16, device=backend.device)
    workspace = get_context(None, x.device).get_workspace(w * x.nbytes)
    remote = [workspace.slots(q, (w, rows, BANDWIDTH_WIDTH), x.dtype) for q in range(w)]
    pairs = []
    for src in range(w):
        for dst in (q for q in range(w) if q != src):

            def push(src=src, dst=dst) -> None:
                if rank == src:
                    remote[dst][src].copy_(x)

            ms = statistics.median(time_rounds(backend, push))
            pairs.append({"src": src, "dst": dst, "mbytes": mib, "ms": ms, "gbps": report.gbps(mib, ms)})
    push_all = []
    for streams in PUSH_STREAMS:
        ms = statistics.median(time_rounds(backend, _push_all(x, remote, rank, streams, workspace.barrier)))
        mbytes = mib * (w - 1)
        row = {"streams_per_peer": streams, "mbytes": mbytes, "ms": ms, "gbps": report.gbps(mbytes, ms)}
        push_all.append(row)
    executor.clear_buffers()
    if rank == 0:
        for r in push_all:
            streams = r["streams_per_peer"]
            say(f"push to all peers, {streams} stream(s) per peer: {_f(r['gbps'])} GB/s received")
    return {"pairs": pairs, "push_all": push_all}


def _push_all(x, remote: list, rank: int, streams: int, barrier: Callable[[], None]) -> Callable[[], None]:
    """One call of the all-peers push: ``x`` [rows, width] into slot ``rank`` of every peer's ``remote``
    [w, rows, width], each peer's rows split over ``streams`` side streams (CUDA; on the CPU the copies
    run in order), joined into the current stream, then ``barrier``."""
    import torch

    w = len(remote)
    copies = [  # (destination rows, source rows), one per (peer, stream)
        (dest, source)
        for o in range(1, w)
        for dest, source in zip(remote[(rank + o) % w][rank].chunk(streams), x.chunk(streams), strict=True)
    ]
    lanes = [torch.cuda.Stream() for _ in copies] if x.is_cuda else []

    def run() -> None:
        if not x.is_cuda:
            for dest, source in copies:
                dest.copy_(source)
            barrier()
            return
        current = torch.cuda.current_stream()
        for lane, (dest, source) in zip(lanes, copies, strict=True):
            lane.wait_stream(current)
            with torch.cuda.stream(lane):
                dest.copy_(source)
        for lane in lanes:
            current.wait_stream(lane)
        barrier()

    return run


def shape_records(shape: Shape, result) -> list[dict]:
    """One JSON record per schedule of ``result`` (a ``ScenarioResult``), with the shape's baselines."""
    b = result.baselines["eager"]
    common = {
        "op": shape.op,
        "m": shape.m,
        "n": shape.n,
        "k": shape.k,
        "layers": list(shape.layers),
        "gemm_alone_ms": b.get("gemm_alone_ms"),
        "comm_alone_ms": b.get("nccl_comm_ms"),
        "dma_comm_alone_ms": b.get("dma_comm_ms"),
        "async_tp_ms": b.get("async_tp_ms"),
        "serial_ms": next(
            (m.median_ms for m in result.measurements if m.schedule == "serial/sm" and m.ok), None
        ),
    }
    fields = ("schedule", "median_ms", "p10_ms", "p90_ms", "ok", "error")
    return [{**common, **{f: getattr(m, f) for f in fields}} for m in result.measurements]


def print_summary(data: dict) -> None:
    """The short table at the end: per shape serial, best, async-TP and realized overlap; then the goals."""
    from benchmarks import executor_report as report

    header = ["op", "m", "n", "k", "serial", "best", "async-TP", "realized", "best schedule"]
    rows = [
        [
            s["op"],
            str(s["m"]),
            str(s["n"]),
            str(s["k"]),
            *(_f(s[key]) for key in ("serial_ms", "best_ms", "async_tp_ms")),
            _f(report.realized_overlap(s)),
            str(s["best_schedule"]),
        ]
        for s in report.shape_summaries(data["records"])
    ]
    say(text_table(header, rows))
    world_size = data["meta"].get("fingerprint", {}).get("world_size", 2)
    for g in report.goals(data["records"], data["allgather_bandwidth"], world_size):
        met = "n/a" if g["met"] is None else ("MET" if g["met"] else "missed")
        say(f"goal: {g['goal']}: {_f(g['value'])} (target {g['target']:g}) {met}; {g['note']}")
    if data["skipped_shapes"]:
        say(f"{len(data['skipped_shapes'])} shapes skipped for the budget")
    say(f"wall time {data['meta'].get('wall_s')} s")


def _progress(shape: Shape, result) -> str:
    """One line: the shape, serial and best medians, how many schedules passed."""
    ok = [m for m in result.measurements if m.ok]
    best = min(ok, key=lambda m: m.median_ms, default=None)
    serial = result.measurements[0].median_ms
    best_text = f"{best.median_ms:.3f} ms ({best.schedule})" if best else "none"
    return (
        f"{shape.op} m={shape.m} n={shape.n} k={shape.k}: serial {serial:.3f} ms, best {best_text}, "
        f"{len(ok)}/{len(result.measurements)} ok"
    )


def _markdown(data: dict) -> str:
    from benchmarks import executor_report as report

    meta = {k: v for k, v in data["meta"].items() if k != "fingerprint"}
    meta.update({f"fingerprint.{k}": v for k, v in data["meta"].get("fingerprint", {}).items()})
    meta["skipped shapes (budget)"] = len(data.get("skipped_shapes", []))
    copies = data.get("copy_engines")
    return report.render_markdown(data["records"], data["allgather_bandwidth"], meta, copies)


def _save(lead: bool, path: Path, data: dict, start: float) -> None:
    """Rank 0: write the JSON (NaN as null; with ``goals``, the goal rows of ``executor_report.goals`` for the
    results page to read) and the markdown atomically."""
    from benchmarks import executor_report as report

    if not lead:
        return
    data["meta"]["elapsed_s"] = round(time.perf_counter() - start, 1)
    world_size = data["meta"].get("fingerprint", {}).get("world_size", 2)
    data["goals"] = report.goals(data["records"], data["allgather_bandwidth"], world_size)
    clean = _clean(data)
    write_text_atomic(path, json.dumps(clean, indent=1))
    write_text_atomic(path.with_suffix(".md"), _markdown(clean))


def _clean(x):
    """JSON-safe copy: NaN and infinities become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _agreed(go: bool, device) -> bool:
    """Rank 0's decision, on every rank."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if go else 0], device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _scenario(shape: Shape, world_size: int):
    from ficco.features import Scenario

    hardware = _hardware(world_size)
    return Scenario(
        op=shape.op, m=shape.m, n=shape.n, k=shape.k, dtype="bf16", world_size=world_size, hardware=hardware
    )


def _hardware(world_size: int):
    """The profile the shapes' scenarios name: H200s at ``world_size`` GPUs where built in, else 8 (a
    scenario's profile decides only which schedules are candidates, by the world size)."""
    from ficco.features import KNOWN_HARDWARE, get_hardware

    return KNOWN_HARDWARE.get(f"h200x{world_size}") or get_hardware("h200x8")


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "CPU (gloo dry run)"


def _f(x: float | None) -> str:
    return f"{x:.3f}" if isinstance(x, float) and math.isfinite(x) else "n/a"


if __name__ == "__main__":
    main()
