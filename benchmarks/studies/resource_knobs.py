r"""The seeds' SM resource knobs, measured: does a CTA cap on NCCL (``/cta<N>``) or an SM carve-out for the
GEMMs (``/carve<N>``) ever change the best schedule?

    # 2 GPUs (estimated 3-4 minutes on 2 x H200 for every shape): writes OUT/knobs-h200x2.json and .md
    # (named after the GPUs found); 4 GPUs: --nproc-per-node 4, OUT/knobs-h200x4.json; --budget-s cuts
    # the shapes short (the ops take turns, so both stay)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.studies.resource_knobs \
        --out benchmarks/results
    # the probes alone on one GPU (the GEMM probes need no peer): writes OUT/knobs-probes-h200x1.json and .md
    python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m benchmarks.studies.resource_knobs \
        --probes-only --name knobs-probes-h200x1 --out benchmarks/results
    # re-render the markdown from a finished JSON (no GPU)
    python3 -m benchmarks.studies.resource_knobs --render benchmarks/results/knobs-h200x2.json
    # plumbing check without a GPU (gloo, tiny shapes, eager only; the knobs have nothing to act on there)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.studies.resource_knobs \
        --cpu-dry-run --out /tmp/knobs-dry

What runs, in one job (rank 0 rewrites the JSON and the markdown after every step, so an interrupted run
keeps what it measured):

1. **Does each knob act at all** (CUDA only; ``probes``): the GEMM alone under cuBLAS (torch's default), under
   cuBLASLt, and under cuBLASLt with each carve-out of ``CARVEOUTS`` (``executor.resources.SMCarveout``); the
   same GEMM beside an SM-bound kernel on another stream (an elementwise add over ``ADD_MIB``, standing in
   for a communication kernel that needs SMs), without and with each carve-out: what a carve-out is for; the
   point-to-point exchange the ``sm`` pieces make (every rank sends ``P2P_MIB`` to every peer) on the
   default communicator and on each capped twin of ``CTAS``. Per call, median over interleaved rounds.
2. **The schedules** (``shapes``): per shape of ``SHAPES``, every candidate schedule and the knob variants of
   the normal-priority ones (``features.knob_variants``), checked against serial and timed in eager and
   graph mode with the dataset's protocol (``harness.torch_backend.TorchBackend``), its timed work scaled
   to the number of schedules so that the rounds per scenario match a dataset's. Every round is kept.
3. **The verdict per knob** (``verdict``): per (shape, mode), the best set over the plain schedules and that
   knob's variants (``harness.labels.best_set``); the knob *changes the best schedule* there when no plain
   schedule is left in that set, and its gain is the best plain label time over the best one with the knob.
   The knob *wins* there when it changes the best schedule by at least ``MIN_GAIN`` (3%). A knob is kept in
   the design space when it wins on at least ``KEEP_SHARE`` (10%) of the shapes of a mode; otherwise it
   leaves (less to measure, less to learn), and this file records why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy as np

from benchmarks import executor_report, machine_id, say, torchrun_main
from ficco.features.dataset import label_quantile
from ficco.files import write_text_atomic
from ficco.harness.backend import MAX_ROUNDS, TIMED_MS, Timing
from ficco.harness.labels import best_set
from ficco.harness.worker import SAFE_ENV

# NVLink multicast stays off in NCCL, PyTorch symmetric memory and NVSHMEM: set before torch loads them.
os.environ.update(SAFE_ENV)

SHAPES = (
    # (op, m, n, k): communication-heavy to compute-heavy, decode-sized to prefill-sized; the ops take
    # turns, so a run cut short by its budget keeps both
    ("ag_gemm", 4096, 4096, 4096),
    ("gemm_rs", 4096, 4096, 4096),
    ("ag_gemm", 16384, 2048, 4096),
    ("gemm_rs", 16384, 4096, 2048),
    ("ag_gemm", 65536, 1024, 4096),
    ("gemm_rs", 65536, 4096, 1024),
    ("ag_gemm", 8192, 8192, 8192),
    ("gemm_rs", 8192, 8192, 8192),
    ("ag_gemm", 2048, 8192, 8192),
    ("gemm_rs", 2048, 8192, 8192),
    ("ag_gemm", 16384, 14336, 4096),
    ("gemm_rs", 16384, 4096, 7168),
    ("ag_gemm", 1024, 4096, 4096),
    ("gemm_rs", 1024, 4096, 4096),
)
DRY_RUN_SHAPES = (("ag_gemm", 64, 32, 48), ("gemm_rs", 64, 48, 32))
"""``--cpu-dry-run``: tiny shapes every finer split divides at up to 8 ranks."""
CTAS = (2, 8)
"""CTA caps tried on the ``sm`` schedules (NCCL's default on NVLink is several times more)."""
CARVEOUTS = (16, 32)
"""SMs the GEMMs leave free, tried on every overlapped schedule (an H200 has 132)."""
P2P_MIB = (4, 64)
"""MiB each rank sends each peer in the point-to-point probe."""
GEMM_PROBES = ((4096, 4096, 4096), (8192, 8192, 8192))
"""(m, n, k) of the GEMM-alone probe, bf16."""
ADD_MIB = 256
"""MiB of each operand of the elementwise add that runs beside the GEMM in the carve-out probe."""
PLAIN_SCHEDULES = 34
"""Items of a dataset scenario (30 schedules and 4 baselines): the timed work is scaled from it."""
KEEP_SHARE = 0.10
"""A knob stays when it wins (:data:`MIN_GAIN`) on at least this share of the shapes of a mode."""
MIN_GAIN = 1.03
"""A knob wins on a shape when it changes the best schedule and its best variant is at least this much
faster than the best plain schedule."""
KNOBS = {"ctas": "CTA cap on NCCL (/cta<N>)", "carveout": "SM carve-out for the GEMMs (/carve<N>)"}
"""The ``Schedule`` field of each knob and what it is."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.resource_knobs", description=__doc__.splitlines()[0].lstrip('r"')
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder of the JSON and .md")
    p.add_argument("--name", default=None, help="file stem (default: knobs-<hardware id>, e.g. knobs-h200x4)")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip the shapes that would start later")
    p.add_argument("--rounds", type=int, default=5, help="fewest interleaved rounds per shape and mode")
    p.add_argument("--cpu-dry-run", action="store_true", help="gloo on the CPU, tiny shapes, eager only")
    p.add_argument(
        "--probes-only", action="store_true", help="the probes alone (one GPU: no point-to-point probe)"
    )
    p.add_argument("--render", type=Path, default=None, help="re-render the markdown of a finished JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.budget_s <= 0:
        p.error(f"--rounds must be >= 1 and --budget-s > 0; got {args.rounds} and {args.budget_s}")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    return torchrun_main(parse_args(argv), run, render_markdown, timeout=timedelta(minutes=3))


def run(args: argparse.Namespace) -> dict:
    """Probes, then every shape within the budget, then the verdict; rank 0 saves after each step."""
    from ficco.harness.torch_backend import TorchBackend

    start = time.perf_counter()
    cpu = args.cpu_dry_run
    plain_timing = Timing(rounds=args.rounds, max_rounds=max(args.rounds, MAX_ROUNDS))
    backend = TorchBackend(
        device="cpu" if cpu else "cuda", modes=("eager",) if cpu else ("eager", "graph"), timing=plain_timing
    )
    w, lead = backend.world_size, backend.rank == 0
    path = args.out / f"{args.name or f'knobs-{machine_id(w, not cpu)}'}.json"
    data: dict = {
        "meta": {
            "world_size": w,
            "device": "CPU (gloo dry run)" if cpu else _device_name(),
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "fingerprint": backend.fingerprint(),
            "protocol": backend.protocol(),
            "ctas": list(CTAS),
            "carveouts": list(CARVEOUTS),
            "keep_share": KEEP_SHARE,
            "min_gain": MIN_GAIN,
        },
        "probes": {} if cpu else measure_probes(backend),
        "shapes": [],
        "skipped_shapes": [],
    }
    if lead:
        args.out.mkdir(parents=True, exist_ok=True)
        say(f"writing {path} and {path.with_suffix('.md')}")
    _save(lead, path, data, start)
    for op, m, n, k in () if args.probes_only else DRY_RUN_SHAPES if cpu else SHAPES:
        if backend.agree(time.perf_counter() - start > args.budget_s):
            data["skipped_shapes"].append({"op": op, "m": m, "n": n, "k": k})
            continue
        data["shapes"].append(measure_shape(backend, plain_timing, op, m, n, k))
        data["verdict"] = verdict(data["shapes"])
        _save(lead, path, data, start)
        if lead:
            say(f"[{time.perf_counter() - start:4.0f} s] {_progress(data['shapes'][-1])}")
    data["verdict"] = verdict(data["shapes"])
    data["meta"]["wall_s"] = round(time.perf_counter() - start, 1)
    _save(lead, path, data, start)
    if lead:
        say(render_markdown(data))
    return data


def measure_shape(backend, plain_timing: Timing, op: str, m: int, n: int, k: int) -> dict:
    """Every candidate and knob variant of one shape, timed with the dataset protocol: ``{op, m, n, k,
    schedules: [{schedule, mode, ok, error, label_ms, round_ms}]}`` (ms per call)."""
    import dataclasses

    from ficco.features import Scenario, candidates, get_hardware, knob_variants

    w = backend.world_size
    scenario = Scenario(op=op, m=m, n=n, k=k, dtype="bf16", world_size=w, hardware=get_hardware(f"h200x{w}"))
    plain = candidates(scenario)
    normal = [s for s in plain if s.priority == "normal"]
    schedules = plain + knob_variants(normal, ctas=CTAS, carveouts=CARVEOUTS)
    scale = (len(schedules) + 4) / PLAIN_SCHEDULES
    backend.timing = dataclasses.replace(plain_timing, timed_ms=TIMED_MS * scale)
    try:
        result = backend.measure(scenario, schedules)
    finally:
        backend.timing = plain_timing
    rows = [
        {
            "schedule": r.schedule,
            "mode": r.mode,
            "ok": r.ok,
            "error": r.error,
            "label_ms": _label(r.round_ms, r.mode) if r.ok else None,
            "round_ms": [round(t, 5) for t in r.round_ms],
        }
        for r in result.measurements
    ]
    return {"op": op, "m": m, "n": n, "k": k, "schedules": rows}


def verdict(shapes: list[dict]) -> dict:
    """Per knob of ``KNOBS`` and mode: the shapes, those where the knob changes the best schedule beyond
    noise, those where it wins (changes it by at least ``MIN_GAIN``), the geometric-mean and largest gain of
    its best variant over the best plain schedule, and whether the knob is kept (wins on at least
    ``KEEP_SHARE`` of a mode's shapes); plus the per-shape rows behind them (``per_shape``)."""
    out: dict = {}
    for knob in KNOBS:
        per_mode: dict = {}
        rows = [row for shape in shapes for row in _knob_rows(shape, knob)]
        for mode in dict.fromkeys(r["mode"] for r in rows):
            mine = [r for r in rows if r["mode"] == mode]
            gains = [r["gain"] for r in mine]
            changed = sum(r["changes_best"] for r in mine)
            wins = sum(r["wins"] for r in mine)
            per_mode[mode] = {
                "shapes": len(mine),
                "changes_best": changed,
                "wins": wins,
                "share": wins / len(mine),
                "geomean_gain": executor_report.geomean(gains),
                "max_gain": max(gains),
            }
        kept = any(v["share"] >= KEEP_SHARE for v in per_mode.values())
        out[knob] = {"modes": per_mode, "kept": kept, "per_shape": rows}
    return out


def _knob_rows(shape: dict, knob: str) -> list[dict]:
    """One row per mode of ``shape``: the best plain schedule and the best with ``knob``, their label
    times, whether the knob changes the best schedule (no plain schedule in the best set of both), the
    gain."""
    from ficco.features import Schedule

    out = []
    for mode in dict.fromkeys(r["mode"] for r in shape["schedules"]):
        rows, is_plain = [], []
        for r in shape["schedules"]:
            schedule = Schedule.parse(r["schedule"])
            if r["mode"] == mode and r["ok"] and (not schedule.knobs or getattr(schedule, knob) is not None):
                rows.append(r)
                is_plain.append(not schedule.knobs)
        is_plain = np.array(is_plain)
        if not is_plain.any() or is_plain.all():
            continue
        rounds = np.array([r["round_ms"] for r in rows], dtype=float)
        inside = best_set(rounds, quantile=label_quantile(mode))
        labels = np.array([r["label_ms"] for r in rows])
        best_plain = int(np.flatnonzero(is_plain)[np.argmin(labels[is_plain])])
        best_knob = int(np.flatnonzero(~is_plain)[np.argmin(labels[~is_plain])])
        changes = bool(not inside[is_plain].any())
        gain = float(labels[best_plain] / min(labels[best_plain], labels[best_knob]))
        out.append(
            {
                "op": shape["op"],
                "m": shape["m"],
                "n": shape["n"],
                "k": shape["k"],
                "mode": mode,
                "best_plain": rows[best_plain]["schedule"],
                "best_plain_ms": labels[best_plain],
                "best_knob": rows[best_knob]["schedule"],
                "best_knob_ms": labels[best_knob],
                "changes_best": changes,
                "gain": gain,
                "wins": changes and gain >= MIN_GAIN,
            }
        )
    return out


def measure_probes(backend) -> dict:
    """Whether each knob acts (CUDA): the GEMM alone per BLAS setting and carve-out (``gemm``), and the
    ``sm`` pieces' point-to-point exchange per CTA cap (``p2p``); ms per call, median over rounds."""
    out: dict = {"gemm": [], "p2p": [], "errors": []}
    probes = [("gemm", gemm_probe, shape) for shape in GEMM_PROBES]
    probes += [("p2p", p2p_probe, (mib,)) for mib in P2P_MIB if backend.world_size > 1]
    for kind, probe, args in probes:
        try:
            row = probe(backend, *args)
        except Exception as err:  # every rank fails alike (same settings); the schedules still run
            out["errors"].append(f"{kind} {args}: {type(err).__name__}: {err}".splitlines()[0])
            continue
        out[kind].append(row)
        if backend.rank == 0:
            say(", ".join(f"{key} {_f(v) if key.endswith('_ms') else v}" for key, v in row.items()))
    return out


def gemm_probe(backend, m: int, n: int, k: int) -> dict:
    """``C [m, n] = A [m, k] @ B [k, n]`` (bf16) alone under cuBLAS, cuBLASLt, and cuBLASLt with each
    carve-out of ``CARVEOUTS`` (``<setting>_ms``); the elementwise add of ``ADD_MIB`` alone (``add_ms``); the
    GEMM under cuBLASLt and the add on a side stream at once, from the first launch until both end, without
    and with each carve-out (``beside_add_<setting>_ms``): ``{m, n, k, ...}``."""
    import torch

    from ficco.executor.resources import SMCarveout, blas_library

    device = backend.device
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    x, y = (torch.randn(ADD_MIB << 19, device=device, dtype=torch.bfloat16) for _ in range(2))
    z = torch.empty_like(x)
    side = torch.cuda.Stream(device)

    def add() -> None:
        torch.add(x, y, out=z)

    def beside_add(gemm) -> Callable[[], None]:
        def both() -> None:
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                add()
            gemm()
            torch.cuda.current_stream(device).wait_stream(side)

        return both

    def mm() -> None:
        torch.mm(a, b, out=c)

    row: dict = {"m": m, "n": n, "k": k}
    for library in ("cublas", "cublaslt"):
        with blas_library(library):
            row[f"{library}_ms"] = statistics.median(backend.time_rounds(mm))
    row["add_ms"] = statistics.median(backend.time_rounds(add))
    with blas_library("cublaslt"):
        row["beside_add_cublaslt_ms"] = statistics.median(backend.time_rounds(beside_add(mm)))
    for sms in CARVEOUTS:
        carve = SMCarveout(device, sms)

        def carved(carve=carve) -> None:
            with carve:
                mm()

        row[f"carve{sms}_ms"] = statistics.median(backend.time_rounds(carved))
        row[f"beside_add_carve{sms}_ms"] = statistics.median(backend.time_rounds(beside_add(carved)))
    return row


def p2p_probe(backend, mib: int) -> dict:
    """Every rank sends ``mib`` MiB to every peer and receives as much from each (one
    ``batch_isend_irecv``, as the ``sm`` pieces move), on the default communicator and on each CTA-capped
    twin of ``CTAS``: ``{mib_per_peer, cta<cap>_ms}`` (``ctadefault_ms``: no cap)."""
    import torch
    import torch.distributed as dist

    from ficco.executor.context import get_context

    ctx = get_context(None, backend.device)
    w, rank = backend.world_size, backend.rank
    send = torch.randn(mib << 19, device=backend.device, dtype=torch.bfloat16)  # mib MiB of bf16
    recv = [torch.empty_like(send) for _ in range(w)]
    row: dict = {"mib_per_peer": mib}
    for cap in (None, *CTAS):
        group = ctx.p2p_group(False, cap)
        ops = [dist.P2POp(dist.isend, send, q, group) for q in range(w) if q != rank]
        ops += [dist.P2POp(dist.irecv, recv[q], q, group) for q in range(w) if q != rank]

        def exchange(ops=ops) -> None:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        row[f"cta{cap or 'default'}_ms"] = statistics.median(backend.time_rounds(exchange))
    return row


def render_markdown(data: dict) -> str:
    """The verdict, the probes and the per-shape table, as markdown."""
    meta = data["meta"]
    lines = [
        f"# Resource knobs: {meta['world_size']} x {meta['device']}",
        "",
        f"Started {meta['started_utc']} UTC; wall {meta.get('wall_s', 'n/a')} s; CTA caps {meta['ctas']}, "
        f"carve-outs {meta['carveouts']} SMs; a knob wins on a shape when it changes the best schedule "
        f"beyond noise by >= {meta.get('min_gain', MIN_GAIN) - 1:.0%}, and is kept when it wins on >= "
        f"{meta['keep_share']:.0%} of the shapes of a mode.",
        "",
        "## Verdict",
        "",
        "| knob | mode | shapes | changes the best | wins | share | geomean gain | max gain | kept |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for knob, v in data.get("verdict", {}).items():
        for mode, s in v["modes"].items():
            lines.append(
                f"| {KNOBS[knob]} | {mode} | {s['shapes']} | {s['changes_best']} | {s.get('wins', '-')} | "
                f"{s['share']:.0%} | "
                f"{s['geomean_gain']:.3f}x | {s['max_gain']:.3f}x | {'yes' if v['kept'] else 'no'} |"
            )
    probes = data.get("probes") or {}
    if probes.get("gemm"):
        lines += _probe_table(
            "GEMM probes",
            f"`beside_add_*`: the GEMM and an elementwise add of {ADD_MIB} MiB operands on another stream at "
            "once, until both end (`add_ms`: the add alone); a carve-out pays off there when it beats "
            "`beside_add_cublaslt_ms`.",
            "m x n x k",
            [(f"{r['m']}x{r['n']}x{r['k']}", r) for r in probes["gemm"]],
        )
    if probes.get("p2p"):
        rows = [(str(r["mib_per_peer"]), r) for r in probes["p2p"]]
        lines += _probe_table("Point-to-point exchange alone", "", "MiB per peer", rows)
    if probes.get("errors"):
        lines += ["", "Probes that failed:", ""] + [f"- {e}" for e in probes["errors"]]
    lines += [
        "",
        "## Per shape",
        "",
        "| knob | op | m x n x k | mode | best plain | ms | best with knob | ms | changes | gain | wins |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for knob, v in data.get("verdict", {}).items():
        for r in v["per_shape"]:
            lines.append(
                f"| {knob} | {r['op']} | {r['m']}x{r['n']}x{r['k']} | {r['mode']} | {r['best_plain']} | "
                f"{_f(r['best_plain_ms'])} | {r['best_knob']} | {_f(r['best_knob_ms'])} | "
                f"{'yes' if r['changes_best'] else 'no'} | {r['gain']:.3f}x | "
                f"{'yes' if r.get('wins') else 'no'} |"
            )
    failed = [
        (s["op"], s["m"], r["schedule"], r["mode"], r["error"])
        for s in data["shapes"]
        for r in s["schedules"]
        if not r["ok"]
    ]
    if failed:
        lines += ["", "## Failed", ""] + [
            f"- {op} m={m} `{sched}` {mode}: {err}" for op, m, sched, mode, err in failed
        ]
    if data.get("skipped_shapes"):
        lines += ["", f"{len(data['skipped_shapes'])} shapes skipped for the budget."]
    return "\n".join(lines) + "\n"


def _probe_table(title: str, note: str, first: str, rows: list[tuple[str, dict]]) -> list[str]:
    """Markdown lines of one probe's table: a ``## title (ms per call)`` heading, ``note`` (if any), then a
    row per ``(first column, probe row)`` with every ``*_ms`` key of the first probe row as a column."""
    keys = [key for key in rows[0][1] if key.endswith("_ms")]
    lines = ["", f"## {title} (ms per call)", "", *([note, ""] if note else [])]
    lines += ["| " + " | ".join([first, *keys]) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += ["| " + " | ".join([name, *(_f(r[key]) for key in keys)]) + " |" for name, r in rows]
    return lines


def _label(round_ms, mode: str) -> float:
    """The label time of a schedule: the mode's quantile over its rounds (``harness.labels``)."""
    return float(np.quantile(np.asarray(round_ms, dtype=float), label_quantile(mode)))


def _progress(shape: dict) -> str:
    ok = sum(r["ok"] for r in shape["schedules"])
    return f"{shape['op']} {shape['m']}x{shape['n']}x{shape['k']}: {ok}/{len(shape['schedules'])} ok"


def _save(lead: bool, path: Path, data: dict, start: float) -> None:
    if not lead:
        return
    data["meta"]["elapsed_s"] = round(time.perf_counter() - start, 1)
    write_text_atomic(path, json.dumps(data, indent=1))
    write_text_atomic(path.with_suffix(".md"), render_markdown(data))


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def _f(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) and math.isfinite(x) else "n/a"


if __name__ == "__main__":
    main()
