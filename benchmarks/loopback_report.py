"""The report of a loopback run of ``benchmarks/runtimes.py`` (``--loopback``: one GPU as rank 0 of a pretend
world, the collectives faked, every kernel real): ficco's own GPU and host work against PyTorch's, per step
and per op, and the goals it is held to. No torch: ``--render`` and the tests read finished JSON.

Per step, each variant's GPU work is ``kernel_ms``, the durations of its kernels summed (the median of the
profiled steps; ``benchmarks/step_profile.py``): what it asks of the SMs, whatever overlapped. Copies on
the copy engines are shown apart (in a loopback world the copy-engine schedules' transfers are local
copies). Each ficco variant is compared with its baseline: ficco eager with eager serial (PyTorch's DTensor
styles), ficco compile with serial compile (the same model compiled per layer without ficco's pass).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks import speedup_axes
from benchmarks.step_profile import KINDS
from ficco.tables import markdown_table

PAIRS: dict[str, str] = {"ficco_eager": "serial", "ficco_compile": "serial_compile"}
"""Each ficco variant and its baseline."""
LABELS = {
    "serial": "eager serial",
    "ficco_eager": "ficco eager",
    "serial_compile": "serial compile",
    "ficco_compile": "ficco compile",
}
ALL_SERIAL_MAX = 1.01
"""Goal: a ficco variant's kernel time per step over its baseline's where every op it ran is serial."""
ANY_MAX = 1.05
"""Goal: the same at every point."""
SMALL_TOKENS = (64, 1024)
"""The token range where the batched (segmented) path blew up. There each op's pick in the layout ficco
chose is held to :data:`ANY_MAX` of the same pick in its cheapest measured layout (the blow-up was a
layout's cost), and ``serial/sm`` to :data:`ANY_MAX` of PyTorch's path. The pick over PyTorch's path is
reported beside them, not held to a bound: it adds the decomposition's extra GPU work (smaller GEMMs, copies),
which overlap hides on real GPUs and a loopback world, with no communication, cannot."""
SERIAL = "serial/sm"


def ran(point: dict, variant: str) -> list[str]:
    """The schedules ``variant``'s ficco ops ran at ``point`` (its planner's table or the compile pass's
    report)."""
    return [r["ran"] for r in point.get("ops", {}).get(variant, {}).get("ran", []) if r.get("ran")]


def all_serial(point: dict, variant: str) -> bool:
    """Whether every ficco op ``variant`` ran at ``point`` ran ``serial/sm`` (True where it ran none)."""
    return all(r == SERIAL for r in ran(point, variant))


def kernel_ms(point: dict, variant: str) -> float | None:
    """``variant``'s GPU kernel time per step at ``point``, ms; None where it was not profiled."""
    profile = point.get("profile", {}).get(variant)
    return profile.get("kernel_ms") if profile else None


def kernel_ratio(point: dict, variant: str) -> float | None:
    """``variant``'s kernel time per step over its baseline's (:data:`PAIRS`); None where one is missing."""
    mine, theirs = kernel_ms(point, variant), kernel_ms(point, PAIRS[variant])
    return mine / theirs if mine and theirs else None


def op_ratio(row: dict, variant: str) -> float | None:
    """One op's kernel time under ``variant`` (a schedule, or ``schedule:layout``) over PyTorch's path."""
    mine, theirs = row["variants"].get(variant), row["variants"].get("pytorch")
    if not mine or not theirs or not theirs["kernel_ms"]:
        return None
    return mine["kernel_ms"] / theirs["kernel_ms"]


def layout_ratio(row: dict) -> float | None:
    """One op's pick in the layout ficco chose over the same pick in its cheapest measured layout (the
    ``pick:layout`` variants), GPU kernel time; None where no layout of the pick was measured."""
    pick = row["pick"]
    layouts = [
        v["kernel_ms"] for k, v in row["variants"].items() if k.startswith(f"{pick}:") and v["kernel_ms"]
    ]
    mine = row["variants"].get(pick)
    return mine["kernel_ms"] / min(layouts) if layouts and mine else None


def summarize(points: list[dict]) -> dict[str, Any]:
    """The goals: the worst kernel-time ratio of each ficco variant over its baseline where every op it ran
    is serial and at every point, and, at :data:`SMALL_TOKENS`, the worst per-op ratio of the layout ficco
    chose over the pick's cheapest and of ``serial/sm`` over PyTorch's path; each with ``met``. Beside them,
    not a goal: each pick over PyTorch's path there (``small_pick_max``, ``small_pick_median``)."""
    out: dict[str, Any] = {}
    for variant in PAIRS:
        every = [(p, r) for p in points if (r := kernel_ratio(p, variant)) is not None]
        serial = [r for p, r in every if all_serial(p, variant)]
        out[f"{variant}_all_serial_max"] = max(serial, default=None)
        out[f"{variant}_max"] = max((r for _, r in every), default=None)
    lo, hi = SMALL_TOKENS
    small = [row for p in points if lo <= p["tokens"] <= hi for row in p.get("op_costs", [])]
    layouts = [r for row in small if (r := layout_ratio(row)) is not None]
    serial = [r for row in small if (r := op_ratio(row, SERIAL)) is not None]
    picks = [r for row in small if (r := op_ratio(row, row["pick"])) is not None]
    out["small_layout_max"] = max(layouts, default=None)
    out["small_serial_max"] = max(serial, default=None)
    out["small_pick_max"] = max(picks, default=None)
    out["small_pick_median"] = median(picks) if picks else None
    met = {}
    for variant in PAIRS:
        met[f"{variant}_all_serial_max"] = _at_most(out[f"{variant}_all_serial_max"], ALL_SERIAL_MAX)
        met[f"{variant}_max"] = _at_most(out[f"{variant}_max"], ANY_MAX)
    met["small_layout_max"] = _at_most(out["small_layout_max"], ANY_MAX)
    met["small_serial_max"] = _at_most(out["small_serial_max"], ANY_MAX)
    out["met"] = met
    return out


def _at_most(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def goal_lines(summary: dict[str, Any]) -> list[str]:
    """The goals, one line each, with the measured value and ``met: True/False``."""
    met, lines = summary["met"], []
    for variant, base in PAIRS.items():
        name = f"{LABELS[variant]} over {LABELS[base]}"
        key = f"{variant}_all_serial_max"
        lines.append(
            f"- {name}, GPU kernel time per step at every point where every op it ran is serial: worst "
            f"{_x(summary[key])} (goal <= {ALL_SERIAL_MAX}x; met: {met[key]})"
        )
        key = f"{variant}_max"
        lines.append(
            f"- {name}, GPU kernel time per step at every point: worst {_x(summary[key])} (goal <= "
            f"{ANY_MAX}x; met: {met[key]})"
        )
    lo, hi = SMALL_TOKENS
    lines.append(
        f"- the batched path's blow-up gone at {lo}-{hi} tokens, each op's pick in the layout ficco chose "
        f"over the same pick in its cheapest measured layout, GPU kernel time: worst "
        f"{_x(summary['small_layout_max'])} (goal <= {ANY_MAX}x; met: {met['small_layout_max']}); and "
        f"serial/sm over PyTorch's path: worst "
        f"{_x(summary['small_serial_max'])} (goal <= {ANY_MAX}x; met: {met['small_serial_max']})"
    )
    return lines


def pick_line(summary: dict[str, Any]) -> str:
    """Each pick over PyTorch's path at :data:`SMALL_TOKENS`, worst and median: reported, not a goal."""
    lo, hi = SMALL_TOKENS
    return (
        f"Each pick over PyTorch's path at {lo}-{hi} tokens, its decomposition's extra GPU work included "
        f"(which overlap hides on real GPUs and faked communication cannot; not a goal): worst "
        f"{_x(summary['small_pick_max'])}, median {_x(summary['small_pick_median'])}."
    )


def coverage_line(points: list[dict], skipped: list[dict]) -> str:
    """Which points of the plan the run measured: every one, or how many, and the ones it did not (the
    goals hold over the measured points only)."""
    if not skipped:
        return f"Points: all {len(points)} of the plan measured."
    left = ", ".join(f"{p['model']} {p['phase']} {p['tokens']}" for p in skipped)
    return (
        f"Points: {len(points)} of the plan's {len(points) + len(skipped)} measured (the goals below hold"
        f" over these only); not measured, the call's time budget spent (a later call resumes from this"
        f" JSON): {left}."
    )


def markdown(result: dict) -> str:
    """The page: per step, kernel time and host time of each variant and ficco's ratios; the kernel time by
    kind; per op, each schedule and layout against PyTorch's path; then the goals."""
    meta, points = result["meta"], result["points"]
    summary = summarize(points)
    gpu = meta["hardware"].split("x")[0]
    lines = [
        f"# The runtime's own GPU and host work, one GPU ({gpu}, loopback world of {meta['world_size']})",
        "",
        "**Loopback world: one process (one GPU) as rank 0 of a pretend world of"
        f" {meta['world_size']}. Every collective returns at once (no communication is measured) and no"
        " peer's data arrives; every kernel is real. These numbers are ficco's own GPU work and host time"
        " against PyTorch's on the same shapes, not overlap results.**",
        "",
        f"{meta['layers']} decoder layer(s) of torchtitan's Llama 3, {meta['dtype']}, sequence parallel,"
        f" {meta['batch']} sequences per step; {meta['device']}, torch {meta['torch']}; planner:"
        f" {meta['planner']}, asked about {meta['planner_hardware']} (the picks of a 2-GPU run). GPU kernel"
        " time: the durations of a step's kernels summed (SM work, whatever overlapped; the median of 3"
        " profiled steps); copies: the copy engines' copies and memsets (the copy-engine schedules'"
        " transfers, local copies here); host: the time to queue one step (median over rounds).",
        "",
        coverage_line(points, result.get("skipped", [])),
        "",
        "## Per step",
        "",
        markdown_table(
            [
                "model",
                "phase",
                "tokens",
                "picks (eager / compile)",
                "eager serial ms",
                "ficco eager ms",
                "ratio",
                "serial compile ms",
                "ficco compile ms",
                "ratio",
                "copies ms (serial / ficco eager)",
                "host ms (serial / ficco eager)",
            ],
            [_step_row(p) for p in points],
        ),
        "",
        "## GPU kernel time by kind, ms per step",
        "",
        markdown_table(
            ["model", "phase", "tokens", "variant", "kernels", *KINDS],
            [_kind_row(p, v) for p in points for v in LABELS if p.get("profile", {}).get(v)],
        ),
        "",
        "## Per op (one decoder layer's ops, each alone)",
        "",
        "GPU kernel time of one call over PyTorch's path (DTensor's gather or scatter along the sequence"
        " beside `F.linear`: the functional collective, its copy, the GEMMs), for ficco's `serial/sm`, the"
        " planner's pick in the layout ficco chooses and, for an overlapped schedule, each batched layout;"
        " host time per call, us.",
        "",
        *_op_tables(points),
        "",
        pick_line(summary),
        "",
        "## Goals",
        "",
        *goal_lines(summary),
    ]
    return "\n".join(lines) + "\n"


def _picks(point: dict, variant: str) -> str:
    schedules = sorted(set(ran(point, variant)))
    if not schedules:
        return "-"
    return "serial" if schedules == [SERIAL] else ", ".join(schedules)


def _step_row(p: dict) -> list[str]:
    prof = p.get("profile", {})
    copies = " / ".join(
        _ms(prof.get(v, {}).get("work_ms", {}).get("copy")) for v in ("serial", "ficco_eager")
    )
    host = " / ".join(_ms(p.get("host_ms", {}).get(v)) for v in ("serial", "ficco_eager"))
    return [p["model"], p["phase"], str(p["tokens"]),
            f"{_picks(p, 'ficco_eager')} / {_picks(p, 'ficco_compile')}",
            _ms(kernel_ms(p, "serial")), _ms(kernel_ms(p, "ficco_eager")), _x(kernel_ratio(p, "ficco_eager")),
            _ms(kernel_ms(p, "serial_compile")), _ms(kernel_ms(p, "ficco_compile")),
            _x(kernel_ratio(p, "ficco_compile")), copies, host]  # fmt: skip


def _kind_row(p: dict, variant: str) -> list[str]:
    prof = p["profile"][variant]
    work = prof.get("work_ms", {})
    return [p["model"], p["phase"], str(p["tokens"]), LABELS[variant], _ms(prof.get("kernel_ms")),
            *(_ms(work.get(k)) for k in KINDS)]  # fmt: skip


def _op_tables(points: list[dict]) -> list[str]:
    rows = []
    for p in points:
        for row in p.get("op_costs", []):
            variants = row["variants"]
            others = [v for v in variants if v not in ("pytorch", SERIAL, row["pick"])]
            layouts = ", ".join(f"{v} {_x(op_ratio(row, v))}" for v in others)
            chosen = row.get("layouts", {}).get(row["pick"], "-")
            rows.append([p["model"], p["phase"], str(p["tokens"]), row["layers"], row["direction"], row["op"],
                         _ms(variants["pytorch"]["kernel_ms"]), _x(op_ratio(row, SERIAL)), row["pick"],
                         chosen, _x(op_ratio(row, row["pick"])), layouts or "-", _host(row)])  # fmt: skip
    if not rows:
        return ["(no op timed alone in this run)"]
    header = ["model", "phase", "tokens", "layers", "direction", "op", "PyTorch ms", "serial/sm",
              "pick", "its layout", "pick", "each layout", "host us (PyTorch / pick)"]  # fmt: skip
    return [markdown_table(header, rows)]


def _host(row: dict) -> str:
    variants = row["variants"]
    return f"{variants['pytorch']['host_us']:.0f} / {variants[row['pick']]['host_us']:.0f}"


def plot(result: dict, path: Path) -> None:
    """One panel per model (columns) and phase (rows): each ficco variant's GPU kernel time per step over its
    baseline's against tokens (hollow where every op it ran is serial), the goals dashed. Needs
    matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    models = list(dict.fromkeys(p["model"] for p in points))
    phases = list(dict.fromkeys(p["phase"] for p in points))
    if not points:
        return
    fig, axes = plt.subplots(len(phases), len(models), figsize=(6 * len(models), 4 * len(phases)),
                             squeeze=False)  # fmt: skip
    for (i, phase), (j, model) in itertools.product(enumerate(phases), enumerate(models)):
        ax = axes[i][j]
        pts = sorted(
            (p for p in points if p["model"] == model and p["phase"] == phase), key=lambda p: p["tokens"]
        )
        for variant, colour in (("ficco_eager", "C0"), ("ficco_compile", "C1")):
            xy = [(p["tokens"], r, all_serial(p, variant)) for p in pts if (r := kernel_ratio(p, variant))]
            if not xy:
                continue
            ax.plot([x for x, _, _ in xy], [y for _, y, _ in xy], "-", color=colour,
                    label=f"{LABELS[variant]} / {LABELS[PAIRS[variant]]}")  # fmt: skip
            for x, y, serial in xy:
                ax.plot(x, y, "o", color=colour, mfc="none" if serial else colour)
        for bound in (ALL_SERIAL_MAX, ANY_MAX):
            ax.axhline(bound, color="grey", ls="--", lw=0.8)
        speedup_axes(ax, f"{model} {phase}", "GPU kernel time over baseline")
    title = f"{result['meta']['hardware']} loopback: ficco's GPU work per step (hollow: every op serial)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
