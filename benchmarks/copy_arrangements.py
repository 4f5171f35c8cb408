r"""Which copy arrangement the executor should ship on this machine: the copy-engine all-gather alone and the
copy-engine schedules under every arrangement (``executor.set_copy_streams``), against NCCL, in one run.

    # 4 GPUs (about a minute and a half on 4 x H200): writes OUT/copy-arrangements-h200x4.json and .md
    python3 -m torch.distributed.run --standalone --nproc-per-node 4 -m benchmarks.copy_arrangements \
        --out benchmarks/results
    # re-render the markdown from a finished JSON (no GPU)
    python3 -m benchmarks.copy_arrangements --render benchmarks/results/copy-arrangements-h200x4.json
    # plumbing check without a GPU (gloo, tiny sizes and shapes; the arrangements act only on CUDA)
    python3 -m torch.distributed.run --standalone --nproc-per-node 4 -m benchmarks.copy_arrangements \
        --cpu-dry-run --out /tmp/arrangements

The arrangements (``ARRANGEMENTS``, those that differ at this world size): ``per_peer`` (one side stream per
peer, every peer's piece in flight at once), ``2`` and ``1`` (at most that many side streams, the peers
taking them in ring order; ``1`` with nothing to overlap runs on the caller's stream).

1. **The all-gather alone** (``executor.communicate("ag_gemm", ...)``), at ``SIZES_MIB`` MiB received per
   GPU (rows of ``WIDTH`` bf16 values): NCCL, the copy engines under each arrangement, every copy in one
   ``cudaMemcpyBatchAsync`` (``batched``: the driver spreads one batch over its copy engines), and NCCL and
   each arrangement replayed from a CUDA graph (device time without the host's launches). Every variant is
   checked once (the rows it lands equal NCCL's), then timed in interleaved rounds (``benchmarks.variants``).
2. **The schedules** on ``SHAPES`` at this world size: ``serial/sm``, ``shard/dma`` (one peer at a time
   whatever the arrangement: the control) and the ``serial``/``finer`` copy-engine schedules, checked and
   timed with the dataset's protocol (``harness.torch_backend``), eager and graph, once per arrangement (the
   arrangements' order rotating from shape to shape); each time is read relative to ``serial/sm`` of the
   same run, which cancels drift between runs.
3. **The verdict**: per arrangement, the geometric mean over every all-gather size and mode, and every
   (shape, mode)'s fastest copy-engine schedule, of its time over the fastest arrangement's; the lowest
   ships (ties within ``TIE`` keep the current arrangement). Where the all-gather's winner changes once with
   the size, the table of the two (``0:A;MiB:B``, by the MiB of one piece) is proposed when it beats the
   single winner by ``TABLE_GAIN``. Also: the shipped arrangement's all-gather over NCCL's at each size
   (the goal: at most 1.0 from ``GOAL_MIB`` on), and what limits small sizes (eager over graph time, and
   the host time to issue a call).

The last line printed is ``ship: FICCO_COPY_STREAMS=<arrangement>``; the JSON's ``verdict.ship`` holds it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from benchmarks import machine_id, parse_torchrun_args, say, torchrun_main, torchrun_parser
from benchmarks.variants import (
    BatchedCopies,
    agreed_reasons,
    attempt,
    exit_keeping_failed_captures,
    graphed,
    repeat,
    time_variants,
)
from ficco.files import write_text_atomic
from ficco.tables import markdown_table

ARRANGEMENTS = ("per_peer", "4", "2", "1")
"""Copy arrangements tried (``executor.lanes.CopyStreams`` strings); one of those giving the same lanes at
this world size is kept."""
SIZES_MIB = (1, 4, 16, 64, 128, 256)
"""All-gather sizes, MiB each GPU receives."""
DRY_RUN_SIZES_MIB = (1, 4)
WIDTH = 4096
"""Columns of the all-gathered bf16 matrix (rows follow from the size)."""
ROUNDS = 20
"""Interleaved rounds per all-gather size."""
SHAPES = (
    # (op, m, n, k): communication-heavy to balanced, decode-sized to prefill-sized
    ("ag_gemm", 65536, 1024, 4096),
    ("ag_gemm", 16384, 4096, 4096),
    ("ag_gemm", 2048, 4096, 4096),
    ("gemm_rs", 65536, 4096, 1024),
    ("gemm_rs", 16384, 4096, 4096),
)
DRY_RUN_SHAPES = (("ag_gemm", 256, 32, 48), ("gemm_rs", 256, 48, 32))
SCHEDULES = (
    "serial/sm",
    "shard/dma",
    "serial/dma",
    "finer/dma/s2/chunk",
    "finer/dma/s4/chunk",
    "finer/dma/s2/shard",
)
"""Schedules timed under each arrangement: serial/sm is the reference, shard/dma the control."""
TIE = 0.005
"""Arrangements whose scores are within this share of the best tie; the current one is kept among them."""
TABLE_GAIN = 0.02
"""A size table is proposed when it beats the single winner's all-gather score by this share."""
GOAL_MIB = 64
"""From this size (MiB received per GPU) on, the copy engines' all-gather must be as fast as NCCL's."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = torchrun_parser(
        "python -m benchmarks.copy_arrangements",
        "Time the executor's copy arrangements against NCCL and say which to ship (torchrun).",
        name="copy-arrangements-<hardware id>",
        rounds=ROUNDS,
    )
    p.add_argument("--budget-s", type=float, default=150.0, help="no schedule shape starts after this")
    p.add_argument("--no-schedules", action="store_true", help="the all-gather alone only")
    args = parse_torchrun_args(p, argv)
    if args.budget_s <= 0:
        p.error(f"--budget-s must be > 0; got {args.budget_s}")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    """Run the probe (under torchrun); rank 0's result, else None."""
    return torchrun_main(parse_args(argv), run, render_markdown, timeout=timedelta(minutes=3))


def arrangements(world_size: int) -> list[str]:
    """The arrangements of ``ARRANGEMENTS`` that differ at ``world_size`` ranks (first of each lane count)."""
    seen: dict[int, str] = {}
    for name in ARRANGEMENTS:
        lanes = world_size - 1 if name == "per_peer" else min(int(name), world_size - 1)
        seen.setdefault(lanes, name)
    return list(seen.values())


def run(args: argparse.Namespace) -> dict:
    """The all-gather sizes, then the schedule shapes within the budget, then the verdict; rank 0 saves after
    each step and returns the data."""
    import torch
    import torch.distributed as dist

    from ficco import executor
    from ficco.harness.torch_backend import TorchBackend

    start = time.perf_counter()
    cuda = not args.cpu_dry_run
    backend = TorchBackend(device="cuda" if cuda else "cpu", modes=("eager", "graph") if cuda else ("eager",))
    w, lead = backend.world_size, backend.rank == 0
    shipped = str(executor.copy_streams())
    names = arrangements(w)
    data: dict = {
        "meta": {
            "title": f"{w} x {torch.cuda.get_device_name() if cuda else 'CPU (gloo dry run)'}",
            "world_size": w,
            "fingerprint": backend.fingerprint(),
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "arrangements": names,
            "current": shipped,
            "width": WIDTH,
            "rounds": args.rounds,
            "protocol": backend.protocol(),
        },
        "allgather": [],
        "schedules": [],
        "skipped_shapes": [],
    }
    path = args.out / f"{args.name or f'copy-arrangements-{machine_id(w, cuda)}'}.json"
    if lead:
        args.out.mkdir(parents=True, exist_ok=True)
        say(f"arrangements {names} at {w} ranks (current: {shipped}); writing {path}")
    try:
        for mib in sorted(DRY_RUN_SIZES_MIB if args.cpu_dry_run else SIZES_MIB, reverse=True):
            row = measure_size(args, backend, names, mib)
            data["allgather"] = sorted([*data["allgather"], row], key=lambda r: r["mbytes"])
            _save(lead, path, data, start)
            if lead:
                say(_size_line(row, names))
        shapes = () if args.no_schedules else DRY_RUN_SHAPES if args.cpu_dry_run else SHAPES
        for i, (op, m, n, k) in enumerate(shapes):
            if backend.agree(time.perf_counter() - start > args.budget_s):
                data["skipped_shapes"].append({"op": op, "m": m, "n": n, "k": k})
                continue
            order = names[i % len(names) :] + names[: i % len(names)]  # the first runs first once each
            data["schedules"] += [measure_schedules(backend, a, op, m, n, k) for a in order]
            _save(lead, path, data, start)
            if lead:
                say(f"[{time.perf_counter() - start:4.0f} s] {op} {m}x{n}x{k}: {len(order)} arrangements")
    finally:
        executor.set_copy_streams(shipped)
        executor.clear_buffers()
    dist.barrier()
    data["meta"]["wall_s"] = round(time.perf_counter() - start, 1)
    _save(lead, path, data, start)
    if lead:
        say(render_markdown(data))
        say(f"ship: FICCO_COPY_STREAMS={data['verdict']['ship']}")
    return data


def measure_size(args: argparse.Namespace, backend, names: list[str], mib: int) -> dict:
    """One all-gather size: every variant checked against NCCL's rows, then timed; one JSON row."""
    import torch

    from ficco import executor

    w, rank = backend.world_size, backend.rank
    rows = max(1, mib * (1 << 20) // ((w - 1) * WIDTH * 2))
    gen = torch.Generator(device="cpu").manual_seed(rank)
    x = torch.randn(rows, WIDTH, generator=gen).to(backend.device, torch.bfloat16)
    variants, errors = build_variants(x, names)
    timed = time_variants(variants, rounds=args.rounds, seed=[mib, args.rounds], device=backend.device)
    row: dict = {"mbytes": mib, "rows": rows, "ms": {}, "host_ms": {}, "errors": errors}
    for name, (ms, host_ms) in timed.items():
        row["ms"][name], row["host_ms"][name] = ms, host_ms
    variants.clear()  # graphs go before the buffers they replay into
    executor.clear_buffers()
    return row


def build_variants(x, names: list[str]) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """The all-gather variants that run here (``nccl``, ``dma:<arrangement>``, ``batched``, and on CUDA
    each of ``nccl`` and ``dma:*`` replayed from a graph as ``<name>@graph``), each checked against NCCL's
    rows and warmed up; and why each of the others does not run (agreed by every rank)."""
    import torch

    from ficco import executor
    from ficco.executor.context import get_context
    from ficco.executor.lanes import CopyStreams
    from ficco.executor.plan import Layout

    ctx = get_context(None, x.device)
    cuda = x.is_cuda

    def dma(arrangement: CopyStreams) -> Callable[[], None]:
        def one() -> None:
            executor.set_copy_streams(arrangement)
            executor.communicate("ag_gemm", x, "dma")

        return one

    built = {"nccl": repeat(lambda: executor.communicate("ag_gemm", x, "sm"))}
    built |= {f"dma:{name}": repeat(dma(CopyStreams.parse(name))) for name in names}
    reasons: dict[str, str] = {}
    if cuda:
        built["dma:per_peer"]()  # the executor sizes its peer memory (a collective) before the batch views it
        try:
            layout = Layout.shards("gather", ctx.rank, ctx.world_size, x.shape[0], 1)
            built["batched"] = repeat(BatchedCopies(x, layout, keep_own=False))
        except Exception as err:  # no runtime support here: say why, measure the rest
            reasons["batched"] = f"{type(err).__name__}: {err}"
    else:
        reasons["batched"] = "needs CUDA"
    want = _gathered(ctx, "sm", x, lambda: executor.communicate("ag_gemm", x, "sm"))
    for name in list(built):
        problem = attempt(lambda name=name: _check(ctx, built[name], name, x, want))
        if problem:
            reasons[name] = problem
            del built[name]
    if cuda:
        for name in [n for n in built if n != "batched"]:
            try:
                built[f"{name}@graph"] = graphed(built[name])
                problem = _check(ctx, built[f"{name}@graph"], name, x, want)
            except Exception as err:
                problem = f"{type(err).__name__}: {err}"
            if problem:
                reasons[f"{name}@graph"] = problem
                built.pop(f"{name}@graph", None)
    reasons = agreed_reasons(reasons)
    for name in [n for n in built if n in reasons]:
        del built[name]  # failed on another rank
    for call in built.values():
        for _ in range(3):
            call()
    if cuda:
        torch.cuda.synchronize()
    return built, reasons


def _check(ctx, call: Callable[[], None], name: str, x, want) -> str:
    """'' when one repetition of ``call`` lands NCCL's rows of every peer, else why not (every rank)."""
    import torch

    from ficco import executor

    executor.poison_buffers()
    got = _gathered(ctx, "sm" if name.startswith("nccl") else "dma", x, call)
    peers = [q for q in range(ctx.world_size) if q != ctx.rank]  # the copy engines leave the own slot alone
    return "" if torch.equal(got[peers], want[peers]) else "wrong rows: differ from NCCL's all-gather"


def _gathered(ctx, kind: str, x, call: Callable[[], None]):
    """The ``[w, rows, width]`` rows one call of ``call`` left here (a copy): the ``gathered`` buffer (sm) or
    the half of the peer memory its last call used (dma)."""
    import torch

    call()
    if x.is_cuda:
        torch.cuda.synchronize()
    shape = (ctx.world_size, x.shape[0], x.shape[1])
    if kind == "sm":
        return ctx.buffer("gathered", shape, x.dtype).clone()
    ctx.workspace.advance()  # back to the half the last call used
    try:
        return ctx.workspace.slots(ctx.rank, shape, x.dtype).clone()
    finally:
        ctx.workspace.advance()


def measure_schedules(backend, arrangement: str, op: str, m: int, n: int, k: int) -> dict:
    """``SCHEDULES`` on one shape under ``arrangement``, with the dataset's protocol: ``{arrangement, op, m,
    n, k, rows: [{schedule, mode, ok, error, label_ms, relative}]}``, ``relative`` = label time over
    ``serial/sm``'s in the same mode."""
    from ficco import executor
    from ficco.features import Scenario, Schedule, get_hardware
    from ficco.features.dataset import LABEL_STAT

    w = backend.world_size
    scenario = Scenario(op=op, m=m, n=n, k=k, dtype="bf16", world_size=w, hardware=get_hardware("h200x8"))
    executor.set_copy_streams(arrangement)
    executor.clear_buffers()
    result = backend.measure(scenario, [Schedule.parse(s) for s in SCHEDULES])
    serial = {
        r.mode: getattr(r, LABEL_STAT[r.mode]) for r in result.measurements if r.schedule == "serial/sm"
    }
    rows = []
    for r in result.measurements:
        label = getattr(r, LABEL_STAT[r.mode]) if r.ok else None
        relative = label / serial[r.mode] if label and serial.get(r.mode) else None
        rows.append(
            {"schedule": r.schedule, "mode": r.mode, "ok": r.ok, "error": r.error, "label_ms": label,
             "relative": relative}
        )  # fmt: skip
    return {"arrangement": arrangement, "op": op, "m": m, "n": n, "k": k, "rows": rows}


def verdict(data: dict) -> dict:
    """The arrangement to ship (module docstring, step 3), with the scores behind it, the per-size winners,
    a size table where one pays, the shipped all-gather over NCCL per size, and the small-size limits."""
    names, current = data["meta"]["arrangements"], data["meta"]["current"]
    gathers = [times for _, times in _allgather_items(data["allgather"], names)]
    items = gathers + _schedule_items(data["schedules"], names)
    scores = {a: _geomean([times[a] / min(times.values()) for times in items]) for a in names}
    scored = {a: s for a, s in scores.items() if s is not None}
    best = min(scored, key=scored.get) if scored else current
    if current in scored and scored[current] <= scored[best] * (1 + TIE):
        best = current
    winners = _size_winners(data["allgather"], names)
    table = _size_table(data["allgather"], names, winners, best, data["meta"]["world_size"])
    ship = table["arrangement"] if table else best
    return {
        "ship": ship,
        "best_single": best,
        "scores": scores,
        "items": len(items),
        "size_winners": winners,
        "table": table,
        "against_nccl": _against_nccl(data["allgather"], ship if not table else None, winners),
        "goal_met": _goal_met(data["allgather"], ship if not table else None, winners),
    }


def _allgather_items(rows: list[dict], names: list[str]) -> list[tuple[int, dict[str, float]]]:
    """Per all-gather size and mode where every arrangement was timed: ``(MiB, {arrangement: ms})``."""
    items = []
    for row in rows:
        for suffix in ("", "@graph"):
            times = {a: row["ms"].get(f"dma:{a}{suffix}") for a in names}
            if all(_num(t) for t in times.values()):
                items.append((row["mbytes"], times))
    return items


def _schedule_items(shapes: list[dict], names: list[str]) -> list[dict[str, float]]:
    """Per (shape, mode) measured under every arrangement: ``{arrangement: the fastest copy-engine schedule's
    time relative to serial/sm}``."""
    best: dict[tuple, dict[str, float]] = {}
    for shape in shapes:
        for r in shape["rows"]:
            if r["schedule"].split("/")[1] != "dma" or not _num(r["relative"]):
                continue
            key = (shape["op"], shape["m"], shape["n"], shape["k"], r["mode"])
            held = best.setdefault(key, {})
            a = shape["arrangement"]
            held[a] = min(held.get(a, math.inf), r["relative"])
    return [times for times in best.values() if set(times) == set(names)]


def _size_winners(rows: list[dict], names: list[str]) -> dict[int, str]:
    """Per all-gather size, the arrangement with the lowest geometric mean of its times over the modes in
    which every arrangement was timed."""
    by_size: dict[int, list[dict[str, float]]] = {}
    for mib, times in _allgather_items(rows, names):
        by_size.setdefault(mib, []).append(times)
    return {
        mib: min(names, key=lambda a, items=items: _geomean([t[a] for t in items]))
        for mib, items in by_size.items()
    }


def _size_table(
    rows: list[dict], names: list[str], winners: dict[int, str], single: str, world_size: int
) -> dict | None:
    """Where the per-size winner changes exactly once (arrangement ``a`` below ``S`` MiB, ``b`` from there),
    the table ``0:a;<S / (w - 1) MiB per piece>:b`` and its all-gather score against ``single``'s; None
    unless it beats ``single`` by ``TABLE_GAIN``."""
    sizes = sorted(winners)
    changes = [i for i in range(1, len(sizes)) if winners[sizes[i]] != winners[sizes[i - 1]]]
    if len(changes) != 1:
        return None
    cut = sizes[changes[0]]
    small, large = winners[sizes[0]], winners[cut]
    items = _allgather_items(rows, names)
    table_times = [t[small if mib < cut else large] / min(t.values()) for mib, t in items]
    single_times = [t[single] / min(t.values()) for _, t in items]
    gain = _geomean(single_times) / _geomean(table_times) - 1 if items else 0.0
    if gain < TABLE_GAIN:
        return None
    piece_mib = cut / (world_size - 1)
    return {"arrangement": f"0:{small};{piece_mib:g}:{large}", "from_mib": cut, "gain": gain}


def _against_nccl(rows: list[dict], ship: str | None, winners: dict[int, str]) -> list[dict]:
    """Per size and mode: the shipped arrangement's time (a table: each size's winner) over NCCL's."""
    out = []
    for row in rows:
        arrangement = ship or winners.get(row["mbytes"])
        for suffix, mode in (("", "eager"), ("@graph", "graph")):
            dma, nccl = row["ms"].get(f"dma:{arrangement}{suffix}"), row["ms"].get(f"nccl{suffix}")
            batched = row["ms"].get("batched") if mode == "eager" else None
            out.append(
                {
                    "mbytes": row["mbytes"],
                    "mode": mode,
                    "arrangement": arrangement,
                    "dma_over_nccl": dma / nccl if _num(dma) and _num(nccl) else None,
                    "batched_over_nccl": batched / nccl if _num(batched) and _num(nccl) else None,
                    "host_dma_ms": row["host_ms"].get(f"dma:{arrangement}") if mode == "eager" else None,
                    "host_nccl_ms": row["host_ms"].get("nccl") if mode == "eager" else None,
                }
            )
    return out


def _goal_met(rows: list[dict], ship: str | None, winners: dict[int, str]) -> bool | None:
    """Whether the shipped arrangement's eager all-gather is at least as fast as NCCL's at every size from
    ``GOAL_MIB`` on (None: no such size measured)."""
    ratios = [
        r["dma_over_nccl"]
        for r in _against_nccl(rows, ship, winners)
        if r["mode"] == "eager" and r["mbytes"] >= GOAL_MIB and r["dma_over_nccl"] is not None
    ]
    return all(v <= 1.0 for v in ratios) if ratios else None


def _geomean(values: list) -> float | None:
    """The geometric mean of ``values``; None if empty or any is not a positive number."""
    if not values or not all(_num(v) and v > 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def render_markdown(data: dict) -> str:
    """The verdict, the all-gather table (ms per call), the copy engines over NCCL, and the schedules."""
    meta, names = data["meta"], data["meta"]["arrangements"]
    v = verdict(data)  # recomputed: a re-render follows the current rule
    lines = [f"# Copy arrangements: {meta['title']}", ""]
    for key in ("started_utc", "world_size", "current", "width", "rounds", "wall_s"):
        lines.append(f"- {key}: {meta.get(key)}")
    lines += [f"- fingerprint.{k}: {val}" for k, val in meta.get("fingerprint", {}).items()]
    scores = ", ".join(f"`{a}` {_f(s)}" for a, s in v["scores"].items())
    lines += [
        "",
        "## Verdict",
        "",
        f"Ship **`FICCO_COPY_STREAMS={v['ship']}`** (scores, geomean of time over the fastest arrangement "
        f"over {v['items']} items: {scores}).",
    ]
    if v["table"]:
        t = v["table"]
        lines.append(
            f"A size table beats the best single arrangement `{v['best_single']}` by {t['gain']:.1%}: "
            f"the winner changes at {t['from_mib']} MiB per GPU."
        )
    met = {None: "not measured", True: "met", False: "**missed**"}[v["goal_met"]]
    lines += ["", f"Goal: copy-engine all-gather at least as fast as NCCL from {GOAL_MIB} MiB on: {met}."]
    variants = [
        "nccl",
        *(f"dma:{a}" for a in names),
        "batched",
        "nccl@graph",
        *(f"dma:{a}@graph" for a in names),
    ]
    shown = [n for n in variants if any(_num(r["ms"].get(n)) for r in data["allgather"])]
    table = [
        [str(r["mbytes"]), *(_f(r["ms"].get(n)) for n in shown), v["size_winners"].get(r["mbytes"], "-")]
        for r in data["allgather"]
    ]
    lines += ["", "## All-gather alone (ms per call; MiB received per GPU)", ""]
    lines.append(markdown_table(["MiB", *shown, "winner"], table))
    against = [
        [str(r["mbytes"]), r["mode"], r["arrangement"], _f(r["dma_over_nccl"]), _f(r["batched_over_nccl"]),
         _f(r["host_dma_ms"]), _f(r["host_nccl_ms"])]
        for r in v["against_nccl"]
    ]  # fmt: skip
    lines += ["", "## Shipped arrangement against NCCL (time ratio; host ms to issue one call, eager)", ""]
    header = ["MiB", "mode", "arrangement", "dma / nccl", "batched / nccl", "host dma", "host nccl"]
    lines.append(markdown_table(header, against))
    if data["schedules"]:
        rows = [
            [f"{s['op']} {s['m']}x{s['n']}x{s['k']}", s["arrangement"], r["schedule"], r["mode"],
             _f(r["label_ms"]), _f(r["relative"]), "" if r["ok"] else r["error"][:80]]
            for s in data["schedules"]
            for r in s["rows"]
        ]  # fmt: skip
        lines += [
            "",
            "## Schedules under each arrangement (label ms; relative to serial/sm of the same run)",
            "",
        ]
        lines.append(
            markdown_table(["shape", "arrangement", "schedule", "mode", "ms", "relative", "error"], rows)
        )
    where_not: dict[tuple[str, str], list[str]] = {}
    for r in data["allgather"]:
        for name, why in sorted(r.get("errors", {}).items()):
            where_not.setdefault((name, why.splitlines()[0]), []).append(f"{r['mbytes']} MiB")
    if where_not:
        lines += ["", "## Not measured", ""]
        lines += [f"- `{name}` at {', '.join(at)}: {why}" for (name, why), at in where_not.items()]
    if data.get("skipped_shapes"):
        lines += ["", f"{len(data['skipped_shapes'])} schedule shapes skipped for the budget."]
    return "\n".join(lines) + "\n"


def _size_line(row: dict, names: list[str]) -> str:
    parts = [f"{n} {_f(row['ms'].get(n))}" for n in ("nccl", *(f"dma:{a}" for a in names), "batched")]
    return f"all-gather {row['mbytes']:4d} MiB per GPU (ms): " + ", ".join(parts)


def _save(lead: bool, path: Path, data: dict, start: float) -> None:
    """Rank 0: the JSON (with the verdict on what is measured so far, so a run cut short still says what
    to ship) and the markdown, atomically."""
    if not lead:
        return
    data["meta"]["elapsed_s"] = round(time.perf_counter() - start, 1)
    data["verdict"] = verdict(data)
    write_text_atomic(path, json.dumps(data, indent=1))
    write_text_atomic(path.with_suffix(".md"), render_markdown(data))


def _f(x: object) -> str:
    return f"{x:.4g}" if _num(x) else "n/a"


if __name__ == "__main__":
    main()
    exit_keeping_failed_captures()
