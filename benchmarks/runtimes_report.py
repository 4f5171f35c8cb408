"""The runtimes benchmark's report (``benchmarks/runtimes.py``): its markdown page and plot from a results
JSON, and the one-line summary of a point. No torch: ``--render`` and the tests read finished JSON.

The comparisons themselves (each variant over its baseline, the limit and the realized share, the
done-when) are ``benchmarks.support.end_to_end``'s, which the results page (``ficco results``) uses too.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

from benchmarks import loopback_report, speedup_axes
from benchmarks.step_profile import KINDS, dominant
from benchmarks.support import end_to_end as e2e
from ficco.tables import markdown_table

TITLES = {"train": "training step, eager or compiled per layer", "inference": "forward, CUDA graph"}
"""What a phase's steps run, for the plot's panels; also the panels' order."""


def point_line(p: dict) -> str:
    """One point in a line: its limit share, every variant's step time (ms), its wall time, failures."""
    ms = "  ".join(f"{k}={v:.3f}" for k, v in p["step_ms"].items() if v is not None)
    limit = e2e.share_text(e2e.limit_share(p))
    failed = f"  FAILED {p['errors']}" if p["errors"] else ""
    wall = f"({p.get('wall_s', 0):.0f} s)"
    return f"{p['model']} {p['phase']} T={p['tokens']}: limit {limit}  {ms}  {wall}{failed}"


SHOWN = ("serial", "ficco_eager", "serial_compile", "async_tp", "ficco_compile", "no_comm")
"""The variants of the step-time table, in order."""
DOMINANT = ("serial", "serial_compile")
"""The baselines whose profile says what a point's time goes to most (host, comm or a compute kind)."""


def markdown(result: dict) -> str:
    """The comparisons per model and phase, the done-when, step times and ratios per point, where each
    step's time goes, the eager diagnoses, and what ran; a loopback run's page is
    ``benchmarks.loopback_report``'s (ficco's own GPU and host work, its goals)."""
    meta, points = result["meta"], result["points"]
    if meta.get("loopback"):
        return loopback_report.markdown(result)
    summary = e2e.summarize(points, meta["dtype"], loopback=meta["loopback"])
    lines = [
        f"# Llama 3 layers at TP={meta['world_size']}, end to end: step time, ms ({meta['hardware']})",
        "",
    ]
    if meta["hardware"].startswith("cpu"):
        lines += ["**CPU (gloo), a debug-size Llama: a check of the plumbing, not a GPU result.**", ""]
    if meta.get("loopback"):
        lines += [
            "**Loopback world: one process (one GPU) as rank 0 of a pretend world of 2. No communication is"
            " measured (every collective returns at once) and no peer's data arrives: these times show the"
            " plumbing and the host time, not overlap results; the errors against serial are not checks.**",
            "",
        ]
    lines += [
        f"{meta['layers']} decoder layer(s) of torchtitan's Llama 3, {meta['dtype']}, sequence parallel,"
        f" {meta['batch']} sequences per step; {meta['device']}, torch {meta['torch']}; compiled token count:"
        f" {meta['shapes']}. Training step: {meta.get('step', 'forward and backward, eager')}. Planner:"
        f" {meta['planner']}, asked about {meta['planner_hardware']}. Step time: median, slowest rank."
        " Each variant is compared with the one that differs from it only in how the collectives run:"
        " ficco eager with eager serial (PyTorch's DTensor styles), ficco compile and async-TP with serial"
        " compile (the same model compiled per layer without either pass). No communication: serial compile"
        " with its collectives replaced by local ops of the same shapes; limit share: (serial compile - no"
        " communication) / serial compile; realized: the share of that saving a variant realizes.",
        "",
        "## Each variant over its baseline",
        "",
        e2e.job_table(points),
        "",
        "## Done when (issue 48)",
        "",
        *e2e.goal_lines(summary),
        "",
        f"Largest relative error against serial: {json.dumps(summary['max_rel_err'])}.",
        "",
        "## Step time per point, ms",
        "",
        markdown_table(
            [
                "model",
                "phase",
                "tokens",
                "limit share",
                "collectives alone / serial",
                *(e2e.LABELS[v] for v in SHOWN),
                "vLLM's rule (runs)",
                "dominates (eager serial / serial compile)",
                "wall s",
            ],
            [_times_row(p) for p in points],
        ),
        "",
        "## Where the time goes (one profiled step per variant, rank 0)",
        "",
        "GPU time by kind (ms, each kind's kernels' union over streams), the GPU's idle time in the step"
        " (waiting for the host), the communication no compute kernel ran beside (exposed), and what"
        " dominates (`benchmarks/step_profile.py`).",
        "",
        *_profile_table(points),
        "",
        "## Why ficco's eager styles lose or win (training points with the diagnoses)",
        "",
        *_diagnosis_lines(points),
    ]
    failures = [(p["model"], p["phase"], p["tokens"], p["errors"]) for p in points if p["errors"]]
    unavailable = {v: r for p in points for v, r in p["unavailable"].items()}
    lines += ["", f"Not run here: {unavailable or 'none'}. Failed: {failures or 'none'}."]
    lines += [f"Skipped (budget): {result.get('skipped') or 'none'}.", ""]
    lines += ["## What ran (one profiled step per variant, first and last point of each model and phase)", ""]
    for p in _first_and_last(points):
        calls = {v: o.get("calls") for v, o in p["ops"].items() if ":" not in v}
        lines.append(f"- {p['model']} {p['phase']} T={p['tokens']}: {json.dumps(calls)}")
        for v in ("ficco_eager", "ficco_compile"):
            ran = Counter(
                f"{r.get('direction', '')} {r.get('op', r.get('shape', '').split()[0])} {r['ran']}".strip()
                for r in p["ops"].get(v, {}).get("ran", [])
            )
            if ran:
                lines.append(f"  - {v} ran: {dict(ran)}")
            left = Counter(f"{x.get('direction', '')} {x['op']}: {x['reason']}" for x in
                           p["ops"].get(v, {}).get("left", []))  # fmt: skip
            if left:
                lines.append(f"  - {v} left: {dict(left)}")
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _times_row(p: dict) -> list[str]:
    return [
        p["model"],
        p["phase"],
        str(p["tokens"]),
        e2e.share_text(e2e.limit_share(p)),
        e2e.share_text(p.get("comm_share")),
        *(_ms(p["step_ms"].get(v)) for v in SHOWN),
        f"{_ms(p['step_ms'].get('vllm_rule'))} ({p.get('vllm_rule_runs', '-')})",
        " / ".join(dominant(prof) if (prof := p.get("profile", {}).get(v)) else "-" for v in DOMINANT),
        f"{p['wall_s']:.0f}" if p.get("wall_s") else "-",
    ]


def _profile_table(points: list[dict]) -> list[str]:
    rows = []
    for p in points:
        for v, prof in p.get("profile", {}).items():
            if v == "comm_only":
                continue
            kinds = prof["kinds"]
            rows.append([p["model"], p["phase"], str(p["tokens"]), v, f"{prof['step_ms']:.2f}",
                         f"{prof['idle_ms']:.2f}", *(f"{kinds[k]:.2f}" for k in KINDS),
                         f"{prof['exposed_comm_ms']:.2f}", dominant(prof)])  # fmt: skip
    if not rows:
        return ["(no GPU profile in this run)"]
    header = [
        "model",
        "phase",
        "tokens",
        "variant",
        "step",
        "idle (host)",
        *KINDS,
        "exposed comm",
        "dominant",
    ]
    return [markdown_table(header, rows)]


def _diagnosis_lines(points: list[dict]) -> list[str]:
    """Per training point with diagnoses: each restriction's step over eager serial and over ficco eager
    as planned, its host time, and the in-place verdict on the plan."""
    lines = []
    for p in points:
        diag = [v for v in p["step_ms"] if v.startswith("ficco_eager:") and p["step_ms"][v]]
        if not diag:
            continue
        rows = []
        for v in ("serial", "ficco_eager", *diag):
            t = p["step_ms"].get(v)
            if not t:
                continue
            host = p.get("host_ms", {}).get(v)
            idle = p.get("profile", {}).get(v, {}).get("idle_ms")
            over = (e2e.ratio_text(e2e.speedup(p, v, base)) for base in ("serial", "ficco_eager"))
            rows.append([v, _ms(t), *over, _ms(host), _ms(idle)])
        lines += [f"{p['model']} {p['phase']} T={p['tokens']}:", ""]
        lines.append(markdown_table(["variant", "step ms", "over eager serial", "over ficco eager",
                                     "host ms to queue", "GPU idle ms"], rows))  # fmt: skip
        verdict = p.get("verify")
        if verdict:
            times = ", ".join(f"{k} {v:.3f}" for k, v in verdict["times_ms"].items())
            pinned = f", pinned {', '.join(verdict['pinned'])}" if verdict["pinned"] else ""
            lines += ["", f"In place (`runtime.verify_plan`, ms): {times}; kept {verdict['winner']}{pinned}."]
        lines.append("")
    return lines or ["(no diagnosis in this run)"]


def _first_and_last(points: list[dict]) -> list[dict]:
    out = []
    for pts in e2e.jobs(points).values():
        out += [pts[0]] if len(pts) == 1 else [pts[0], pts[-1]]
    return out


def plot(result: dict, path: Path) -> None:
    """One panel per model (columns) and phase (rows): each variant's speedup over its baseline against
    tokens, the limit (no communication over serial compile) dashed (a loopback run:
    ``benchmarks.loopback_report``'s). Needs matplotlib."""
    if result["meta"].get("loopback"):
        loopback_report.plot(result, path)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = e2e.jobs(result["points"])
    models = list(dict.fromkeys(m for m, _ in jobs))
    phases = [ph for ph in TITLES if any(ph == p for _, p in jobs)]
    if not jobs:
        return
    fig, axes = plt.subplots(len(phases), len(models), figsize=(6 * len(models), 4.2 * len(phases)),
                             squeeze=False)  # fmt: skip
    loopback = " (loopback: not overlap)" if result["meta"].get("loopback") else ""
    lines = {
        "ficco_eager": ("ficco eager / eager serial", "C0", "-"),
        "ficco_compile": ("ficco compile / serial compile", "C1", "-"),
        "async_tp": ("async-TP / serial compile", "C2", "-"),
        "no_comm": ("limit: no communication / serial compile", "grey", "--"),
    }
    for (i, phase), (j, model) in itertools.product(enumerate(phases), enumerate(models)):
        ax, pts = axes[i][j], jobs.get((model, phase), [])
        for v, (label, colour, style) in lines.items():
            xy = [(p["tokens"], s) for p in pts if (s := e2e.speedup(p, v)) is not None]
            if xy:
                ax.plot(*zip(*xy, strict=True), style, color=colour, marker="o", label=label)
        speedup_axes(ax, f"{model} {phase} ({TITLES[phase]}){loopback}", "speedup over its baseline")
    fig.suptitle(f"{result['meta']['hardware']}, TP={result['meta']['world_size']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
