"""Goal metrics and the markdown report of the executor benchmark, from its JSON records (no torch).

Records (``executor-h200x2.json``, key ``records``): one per shape and schedule, with ``op, m, n, k,
schedule, median_ms, ok`` and the shape's ``gemm_alone_ms, comm_alone_ms`` (the NCCL collective alone),
``dma_comm_alone_ms`` (the copy-engine transfer alone), ``serial_ms`` (``serial/sm``) and ``async_tp_ms``
(PyTorch's ``torch.ops.symm_mem.fused_*``); ``None`` where not measured. ``allgather_bandwidth``: rows
``{mbytes, nccl_ms, dma_ms}``, ``mbytes`` = MiB each GPU receives.

Definitions (issue 3):

- realized overlap of a shape = (serial - best) / (serial - max(gemm alone, fastest comm alone)), where
  fastest = the quicker of NCCL and copy engines, each alone; averaged over shapes whose fastest comm is
  >= 20% of the GEMM (shapes whose ideal is not at least 5% below serial are left out, and counted);
- async-TP ratio = async_tp_ms / best_ms, geometric mean over shapes where async-TP beats serial, and
  over all shapes with an async-TP time;
- copy-engine all-gather bandwidth = bytes received per GPU / time, GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ficco.tables import markdown_table

GOAL_CE_GBPS = 360.0
"""Copy-engine all-gather, per direction, at >= ``BIG_MBYTES`` (80% of NVLink 4's 450 GB/s)."""
BIG_MBYTES = 256
RATIO_MBYTES = 64
"""Copy engines against NCCL are compared at all-gathers of at least this many MiB received per GPU."""
GOAL_CE_OVER_NCCL = {2: 1.35}
"""Copy-engine over NCCL all-gather bandwidth (same run, worst size >= ``RATIO_MBYTES``) by world size;
``GOAL_CE_OVER_NCCL_MANY`` for any other (issue 47: at least NCCL's at 4 ranks and more)."""
GOAL_CE_OVER_NCCL_MANY = 1.0
GOAL_REALIZED = {2: 0.8}
"""Average realized overlap on communication-heavy shapes by world size; ``GOAL_REALIZED_MANY`` for any
other (issue 47: 0.6 at 4 ranks, where each peer's share of the link shrinks)."""
GOAL_REALIZED_MANY = 0.6
MIN_COMM_SHARE = 0.2
"""A shape counts as communication-heavy when fastest comm alone >= this share of the GEMM alone."""
MIN_GAIN_SHARE = 0.05
"""Realized overlap is left undefined when the ideal saves less than this share of serial (a near-zero
denominator would swamp the average)."""
GOAL_ASYNC_TP_WHERE_IT_WINS = 1.2
GOAL_ASYNC_TP_ALL = 1.4
LATENCY_MBYTES = (1, 4)
"""The latency-bound all-gather region reported against NCCL, MiB per GPU (inclusive)."""

SHAPE_KEYS = ("gemm_alone_ms", "comm_alone_ms", "dma_comm_alone_ms", "serial_ms", "async_tp_ms")


def _num(x: object) -> float | None:
    """A finite float, or None (JSON null, NaN, missing)."""
    if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def shape_summaries(records: Iterable[dict]) -> list[dict]:
    """One summary per (op, m, n, k), in first-seen order: the shape's baselines plus ``best_ms`` /
    ``best_schedule`` (fastest ok schedule), ``n_ok`` and ``n_schedules``."""
    shapes: dict[tuple, dict] = {}
    for r in records:
        key = (r["op"], r["m"], r["n"], r["k"])
        if key not in shapes:
            shapes[key] = {
                **{k: r[k] for k in ("op", "m", "n", "k")},
                "layers": r.get("layers", []),
                **{k: _num(r.get(k)) for k in SHAPE_KEYS},
                "best_ms": None,
                "best_schedule": None,
                "n_ok": 0,
                "n_schedules": 0,
            }
        s = shapes[key]
        s["n_schedules"] += 1
        median = _num(r.get("median_ms"))
        if r.get("ok") and median is not None:
            s["n_ok"] += 1
            if s["best_ms"] is None or median < s["best_ms"]:
                s["best_ms"], s["best_schedule"] = median, r["schedule"]
    return list(shapes.values())


def fastest_comm_ms(s: dict) -> float | None:
    """The quicker of the NCCL collective and the copy-engine transfer, each alone."""
    times = [t for t in (s.get("comm_alone_ms"), s.get("dma_comm_alone_ms")) if t is not None]
    return min(times) if times else None


def realized_overlap(s: dict) -> float | None:
    """(serial - best) / (serial - max(gemm alone, fastest comm alone)); None if not defined (missing
    times, or an ideal less than ``MIN_GAIN_SHARE`` below serial)."""
    serial, best, gemm, comm = (
        s.get("serial_ms"),
        s.get("best_ms"),
        s.get("gemm_alone_ms"),
        fastest_comm_ms(s),
    )
    if None in (serial, best, gemm, comm):
        return None
    gain = serial - max(gemm, comm)
    return (serial - best) / gain if gain > MIN_GAIN_SHARE * serial else None


def is_comm_heavy(s: dict, min_share: float = MIN_COMM_SHARE) -> bool:
    """Fastest comm alone >= ``min_share`` x GEMM alone."""
    comm, gemm = fastest_comm_ms(s), s.get("gemm_alone_ms")
    return comm is not None and gemm is not None and gemm > 0 and comm >= min_share * gemm


def average_realized_overlap(summaries: list[dict], min_share: float = MIN_COMM_SHARE) -> dict:
    """Mean realized overlap over communication-heavy shapes: ``{"value", "shapes", "undefined"}``."""
    heavy = [s for s in summaries if is_comm_heavy(s, min_share)]
    values = [v for v in (realized_overlap(s) for s in heavy) if v is not None]
    return {
        "value": sum(values) / len(values) if values else None,
        "shapes": len(values),
        "undefined": len(heavy) - len(values),
    }


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def async_tp_ratios(summaries: list[dict]) -> dict:
    """Geometric mean of async_tp_ms / best_ms where async-TP beats serial, and over every shape."""
    pairs = [
        (s["async_tp_ms"], s["best_ms"], s["serial_ms"])
        for s in summaries
        if s.get("async_tp_ms") is not None
        and s.get("best_ms") is not None
        and s.get("serial_ms") is not None
    ]
    wins = [a / b for a, b, serial in pairs if a < serial]
    return {
        "where_async_tp_wins": geomean(wins),
        "shapes_where_async_tp_wins": len(wins),
        "all": geomean([a / b for a, b, _ in pairs]),
        "shapes": len(pairs),
    }


def gbps(mbytes: float, ms: float | None) -> float | None:
    """GB/s (1e9 bytes/s) of ``mbytes`` MiB moved in ``ms`` milliseconds."""
    ms = _num(ms)
    return mbytes * (1 << 20) / (ms * 1e-3) / 1e9 if ms else None


def bandwidth_summary(rows: list[dict]) -> dict:
    """Copy-engine GB/s at >= ``BIG_MBYTES`` (mean and min) and the latency region's dma/nccl ratio."""
    big = [gbps(r["mbytes"], r.get("dma_ms")) for r in rows if r["mbytes"] >= BIG_MBYTES]
    big = [b for b in big if b is not None]
    lo, hi = LATENCY_MBYTES
    small = [
        (r["mbytes"], _num(r.get("dma_ms")), _num(r.get("nccl_ms"))) for r in rows if lo <= r["mbytes"] <= hi
    ]
    pairs = [(_num(r.get("nccl_ms")), _num(r.get("dma_ms"))) for r in rows if r["mbytes"] >= RATIO_MBYTES]
    ratios = [nccl / dma for nccl, dma in pairs if nccl and dma]
    return {
        "ce_over_nccl_min": min(ratios) if ratios else None,
        "ce_gbps_big_mean": sum(big) / len(big) if big else None,
        "ce_gbps_big_min": min(big) if big else None,
        "latency_dma_over_nccl": {mb: (d / n if d and n else None) for mb, d, n in small},
    }


def goals(records: list[dict], bandwidth: list[dict], world_size: int = 2) -> list[dict]:
    """The issues' goals at ``world_size`` ranks, each ``{"goal", "value", "target", "met", "note"}``
    (``met`` None: not measured)."""
    summaries = shape_summaries(records)
    bw = bandwidth_summary(bandwidth)
    overlap = average_realized_overlap(summaries)
    ratios = async_tp_ratios(summaries)

    def row(goal: str, value: float | None, target: float, note: str) -> dict:
        met = None if value is None else value >= target
        return {"goal": goal, "value": value, "target": target, "met": met, "note": note}

    big = f"copy-engine all-gather GB/s per direction, >= {BIG_MBYTES} MiB (mean)"
    heavy = f"average realized overlap, comm >= {MIN_COMM_SHARE:.0%} of GEMM"
    left_out = f"{overlap['shapes']} shapes; {overlap['undefined']} left out (ideal not 5% below serial)"
    ratio = f"copy-engine / NCCL all-gather bandwidth, >= {RATIO_MBYTES} MiB (worst size)"
    ratio_goal = GOAL_CE_OVER_NCCL.get(world_size, GOAL_CE_OVER_NCCL_MANY)
    return [
        row(ratio, bw["ce_over_nccl_min"], ratio_goal, f"{world_size} ranks, same run"),
        row(big, bw["ce_gbps_big_mean"], GOAL_CE_GBPS, f"min {_fmt(bw['ce_gbps_big_min'])}"),
        row(heavy, overlap["value"], GOAL_REALIZED.get(world_size, GOAL_REALIZED_MANY), left_out),
        row(
            "geomean async-TP / best, where async-TP beats serial",
            ratios["where_async_tp_wins"],
            GOAL_ASYNC_TP_WHERE_IT_WINS,
            f"{ratios['shapes_where_async_tp_wins']} shapes",
        ),
        row(
            "geomean async-TP / best, all shapes",
            ratios["all"],
            GOAL_ASYNC_TP_ALL,
            f"{ratios['shapes']} shapes",
        ),
    ]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def _copies_markdown(copies: dict) -> list[str]:
    """The per-pair copy bandwidth matrix (GB/s, row = source, column = destination) and the all-peers push
    at each streams-per-peer layout."""
    ranks = sorted({r["src"] for r in copies["pairs"]} | {r["dst"] for r in copies["pairs"]})
    gb = {(r["src"], r["dst"]): r["gbps"] for r in copies["pairs"]}
    mib = copies["pairs"][0]["mbytes"] if copies["pairs"] else 0
    title = f"## Copy engines: one pair alone, {mib:g} MiB (GB/s; row = source, column = destination)"
    matrix = [[src, *("-" if src == dst else _fmt(gb.get((src, dst))) for dst in ranks)] for src in ranks]
    push = [
        [r["streams_per_peer"], f"{r['mbytes']:g}", _fmt(r["ms"]), _fmt(r["gbps"])]
        for r in copies["push_all"]
    ]
    return [
        "",
        title,
        "",
        markdown_table(["src \\ dst", *map(str, ranks)], matrix),
        "",
        "## Copy engines: every rank pushes to every peer at once, then a barrier",
        "",
        markdown_table(["streams per peer", "MiB received per GPU", "ms", "GB/s received"], push),
    ]


def render_markdown(
    records: list[dict], bandwidth: list[dict], meta: dict, copies: dict | None = None
) -> str:
    """The benchmark's markdown report: goals, all-gather bandwidth, the copy-engine probes (``copies``, as
    ``executor_bench.measure_copies`` returns them), then one row per shape."""
    lines = [f"# Executor benchmark: {meta.get('title', 'executor')}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "title"]
    goal_rows = [
        [
            g["goal"],
            _fmt(g["value"]),
            f"{g['target']:g}",
            "n/a" if g["met"] is None else ("yes" if g["met"] else "**no**"),
            g["note"],
        ]
        for g in goals(records, bandwidth, int(meta.get("fingerprint.world_size", 2)))
    ]
    lines += ["", "## Goals", "", markdown_table(["goal", "value", "target", "met", "note"], goal_rows)]
    bandwidth_rows = []
    for r in bandwidth:
        nccl, dma = _num(r.get("nccl_ms")), _num(r.get("dma_ms"))
        bandwidth_rows.append(
            [
                f"{r['mbytes']:g}",
                _fmt(nccl),
                _fmt(dma),
                _fmt(gbps(r["mbytes"], nccl)),
                _fmt(gbps(r["mbytes"], dma)),
                _fmt(dma / nccl) if nccl and dma else "n/a",
            ]
        )
    lines += [
        "",
        "## All-gather alone, NCCL vs copy engines (MiB received per GPU)",
        "",
        markdown_table(["MiB", "NCCL ms", "CE ms", "NCCL GB/s", "CE GB/s", "CE / NCCL time"], bandwidth_rows),
    ]
    if copies:
        lines += _copies_markdown(copies)
    shape_rows = [
        [
            s["op"],
            s["m"],
            s["n"],
            s["k"],
            ", ".join(s["layers"]) or "-",
            _fmt(s["gemm_alone_ms"]),
            _fmt(s["comm_alone_ms"]),
            _fmt(s["dma_comm_alone_ms"]),
            _fmt(s["serial_ms"]),
            _fmt(s["best_ms"]),
            s["best_schedule"] or "-",
            _fmt(s["async_tp_ms"]),
            _fmt(s["serial_ms"] / s["best_ms"] if s["serial_ms"] and s["best_ms"] else None),
            _fmt(realized_overlap(s), 2),
            f"{s['n_ok']}/{s['n_schedules']}",
        ]
        for s in shape_summaries(records)
    ]
    shape_header = ["op", "m", "n", "k", "layers", "GEMM", "NCCL", "CE", "serial", "best", "best schedule"]
    shape_header += ["async-TP", "serial/best", "realized", "ok"]
    lines += [
        "",
        "## Shapes (ms; realized = (serial - best) / (serial - max(GEMM, fastest comm)))",
        "",
        markdown_table(shape_header, shape_rows),
    ]
    failed = [r for r in records if not r.get("ok")]
    if failed:
        failed_rows = [
            [r["op"], r["m"], r["n"], r["k"], r["schedule"], str(r.get("error", "")).replace("|", "/")]
            for r in failed
        ]
        lines += [
            "",
            f"## Failed schedules ({len(failed)})",
            "",
            markdown_table(["op", "m", "n", "k", "schedule", "error"], failed_rows),
        ]
    return "\n".join(lines) + "\n"
