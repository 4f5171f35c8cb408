r"""The host's speed over time: whether it flips between states, for how long, and on which CPUs at once.

    python3 -m benchmarks.studies.host.host_states --out OUT/host-states-h200.json  # no GPU needed
    python3 -m benchmarks.studies.host.host_states --render OUT/host-states-h200.json  # its plot

On one H200 machine, fresh processes timed the executor's host path up to 1.8x apart within two minutes,
and a fixed piece of pure Python moved with it, 4.2-4.5 us per call in some rounds and 7-9 us in others,
within one process too (``benchmarks/results/host-placement-loopback-h200.json``). Eager labels of small
shapes are host time, so this decides how far a re-measure can agree with a sweep. Here the interpreter's
speed (``harness.host_factor.python_work``, ``--batch`` calls per sample) is sampled as a time series by
worker processes pinned to one CPU each (``--cpus``): first every CPU alone for ``--alone`` seconds, one
after another, then all of them together for ``--seconds``.

Per series: the fast state's time per call (5th percentile of the samples), the share of samples slower
than ``--slow`` times it, and how long slow spells last (median and longest, ms). For the joint phase, the
mean correlation between CPUs of their slow share in ``BIN_MS`` bins: near 1, the CPUs slow down together
(the machine: clocks, the hypervisor); near 0, each on its own (a CPU's neighbour). Beside each, the steal
time the kernel counted on the CPU (``/proc/stat``) over the phase. Writes the summaries and the series in
``BIN_MS`` bins (median time per call) to ``--out``; ``--render`` plots them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import REPO
from benchmarks.executor_overhead import python_work
from ficco.files import write_text_atomic
from ficco.tables import text_table

BIN_MS = 10.0
"""Width of the bins the series are kept and compared in, ms."""
FAST_PERCENTILE = 5
"""The fast state's time per call: this percentile of a series' samples."""
START_DELAY_S = 0.5
"""Workers start sampling this long after they are launched, together (their imports done)."""


def sample(cpu: int, start: float, stop: float, batch: int) -> np.ndarray:
    """On ``cpu`` (pinned): ``[t, us]`` rows from ``start`` to ``stop`` (``time.monotonic`` seconds, the
    same clock in every process): each row one batch of ``batch`` :func:`python_work` calls, its start
    time and its microseconds per call."""
    os.sched_setaffinity(0, {cpu})
    while time.monotonic() < start:
        pass
    rows = []
    while (begun := time.monotonic()) < stop:
        for _ in range(batch):
            python_work()
        rows.append((begun, (time.monotonic() - begun) / batch * 1e6))
    return np.asarray(rows)


def steal_seconds() -> dict[int, float]:
    """Steal time per CPU so far, seconds (``/proc/stat``: the hypervisor ran something else while the CPU
    wanted to run); empty where ``/proc/stat`` is missing."""
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 8:
            out[int(name[3:])] = int(fields[7]) / ticks
    return out


def run_phase(cpus: list[int], seconds: float, batch: int, scratch: Path) -> dict[int, np.ndarray]:
    """One worker process per CPU of ``cpus``, sampling together for ``seconds``: ``{cpu: [t, us] rows}``
    with ``t`` from the phase's start."""
    start = time.monotonic() + START_DELAY_S
    stop = start + seconds
    workers = {}
    for cpu in cpus:
        out = scratch / f"cpu{cpu}-{start:.3f}.npy"
        command = [sys.executable, "-m", __spec__.name, "--worker", str(cpu), "--start", repr(start),
                   "--stop", repr(stop), "--batch", str(batch), "--out", str(out)]  # fmt: skip
        workers[cpu] = (subprocess.Popen(command, cwd=REPO), out)
    series = {}
    for cpu, (process, out) in workers.items():
        if process.wait(timeout=seconds + 60):
            raise RuntimeError(f"the worker on CPU {cpu} exited with {process.returncode}")
        rows = np.load(out)
        series[cpu] = np.column_stack([rows[:, 0] - start, rows[:, 1]])
    return series


def binned(series: np.ndarray, seconds: float) -> np.ndarray:
    """Median us per call in each ``BIN_MS`` bin of ``[0, seconds)`` (NaN where a bin has no sample)."""
    edges = np.arange(0.0, seconds + 1e-9, BIN_MS / 1e3)
    which = np.digitize(series[:, 0], edges) - 1
    out = np.full(len(edges) - 1, np.nan)
    for b in np.unique(which[(which >= 0) & (which < len(out))]):
        out[b] = np.median(series[which == b, 1])
    return out


def json_bins(bins: np.ndarray) -> list[float | None]:
    """Bins as JSON values: 3 decimals, None for an empty bin."""
    return [None if np.isnan(x) else round(float(x), 3) for x in bins]


def spells_ms(t: np.ndarray, slow: np.ndarray) -> list[float]:
    """Durations of the runs of consecutive slow samples, ms (from a run's first sample to the next
    sample after its last)."""
    out, begun = [], None
    for i, is_slow in enumerate(slow):
        if is_slow and begun is None:
            begun = t[i]
        elif not is_slow and begun is not None:
            out.append((t[i] - begun) * 1e3)
            begun = None
    if begun is not None:
        out.append((t[-1] - begun) * 1e3)
    return out


def summarize(series: np.ndarray, slow_factor: float) -> dict:
    """The fast state, the slow share and the slow spells of one ``[t, us]`` series (module docstring)."""
    fast = float(np.percentile(series[:, 1], FAST_PERCENTILE))
    slow = series[:, 1] > slow_factor * fast
    spells = spells_ms(series[:, 0], slow)
    return {
        "samples": len(series),
        "fast_us": round(fast, 3),
        "median_us": round(float(np.median(series[:, 1])), 3),
        "slow_share": round(float(slow.mean()), 4),
        "slow_spells": len(spells),
        "median_spell_ms": round(float(np.median(spells)), 1) if spells else 0.0,
        "longest_spell_ms": round(max(spells), 1) if spells else 0.0,
    }


def together(series: dict[int, np.ndarray], seconds: float, slow_factor: float) -> float | None:
    """Mean correlation over CPU pairs of their slow share per ``BIN_MS`` bin (None: fewer than two CPUs
    or no variation)."""
    shares = []
    for rows in series.values():
        fast = np.percentile(rows[:, 1], FAST_PERCENTILE)
        slow = np.column_stack([rows[:, 0], rows[:, 1] > slow_factor * fast])
        shares.append(binned(slow, seconds))
    matrix = np.vstack(shares)
    matrix = matrix[:, ~np.isnan(matrix).any(axis=0)]
    if len(matrix) < 2 or (matrix.std(axis=1) == 0).any():
        return None
    corr = np.corrcoef(matrix)
    return round(float(corr[np.triu_indices(len(matrix), 1)].mean()), 3)


def default_cpus(count: int = 4) -> list[int]:
    """``count`` CPUs spread over those this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    picks = np.linspace(0, len(allowed) - 1, min(count, len(allowed))).round().astype(int)
    return sorted({allowed[i] for i in picks})


def measure(args: argparse.Namespace) -> dict:
    """Both phases on ``args.cpus``; the JSON body."""
    import tempfile

    phases = {}
    with tempfile.TemporaryDirectory() as scratch:
        plan = [(f"alone cpu{cpu}", [cpu], args.alone) for cpu in args.cpus]
        plan.append(("together", args.cpus, args.seconds))
        for name, cpus, seconds in plan:
            steal = steal_seconds()
            series = run_phase(cpus, seconds, args.batch, Path(scratch))
            after = steal_seconds()
            phases[name] = {
                "seconds": seconds,
                "cpus": {
                    str(cpu): summarize(rows, args.slow)
                    | {"steal_share": round((after.get(cpu, 0.0) - steal.get(cpu, 0.0)) / seconds, 4)}
                    for cpu, rows in series.items()
                },
                "bins_us": {str(cpu): json_bins(binned(rows, seconds)) for cpu, rows in series.items()},
            }
            if len(cpus) > 1:
                phases[name]["slow_together"] = together(series, seconds, args.slow)
            shown = [f"cpu{c} fast {s['fast_us']} us, slow {s['slow_share']:.0%}"
                     for c, s in phases[name]["cpus"].items()]  # fmt: skip
            print(f"{name}: " + ", ".join(shown), flush=True)
    settings = {"batch": args.batch, "slow_factor": args.slow, "bin_ms": BIN_MS, "cpus": args.cpus}
    return {"settings": settings, "nproc": os.cpu_count(), "phases": phases}


def print_table(body: dict) -> None:
    """One row per (phase, CPU)."""
    head = [
        "phase",
        "cpu",
        "fast us",
        "median us",
        "slow share",
        "spells",
        "median ms",
        "longest ms",
        "steal",
    ]
    cells = [
        [name, cpu, f"{s['fast_us']:.2f}", f"{s['median_us']:.2f}", f"{s['slow_share']:.1%}",
         str(s["slow_spells"]), f"{s['median_spell_ms']:.0f}", f"{s['longest_spell_ms']:.0f}",
         f"{s['steal_share']:.1%}"]
        for name, phase in body["phases"].items()
        for cpu, s in phase["cpus"].items()
    ]  # fmt: skip
    print(text_table(head, cells, align="<>" + ">" * 7))
    joint = body["phases"].get("together", {}).get("slow_together")
    print(f"slow together (mean correlation of the CPUs' slow share per {BIN_MS:g} ms bin): {joint}")


def render(path: Path) -> Path:
    """The series of ``path``'s phases as a plot beside it (``.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    body = json.loads(path.read_text())
    phases = body["phases"]
    fig, axes = plt.subplots(len(phases), 1, figsize=(11, 1.6 * len(phases) + 1), sharey=True, squeeze=False)
    for ax, (name, phase) in zip(axes[:, 0], phases.items(), strict=True):
        for cpu, bins in phase["bins_us"].items():
            t = np.arange(len(bins)) * body["settings"]["bin_ms"] / 1e3
            ax.plot(t, np.asarray(bins, dtype=float), lw=0.7, label=f"cpu {cpu}")
        ax.set_title(name, fontsize=9, loc="left")
        ax.set_ylabel("us / call")
        ax.legend(fontsize=7, loc="upper right", ncols=4)
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(f"the interpreter's speed over time (python_work, {body['settings']['bin_ms']:g} ms bins)")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpus", type=int, nargs="+", default=None, help="CPUs sampled (default: 4 spread)")
    parser.add_argument("--alone", type=float, default=5.0, help="seconds each CPU is sampled alone")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds all CPUs are sampled together")
    parser.add_argument("--batch", type=int, default=64, help="python_work calls per sample")
    parser.add_argument(
        "--slow", type=float, default=1.5, help="a sample this many times the fast state is slow"
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--render", type=Path, metavar="JSON", help="plot a finished JSON (needs matplotlib)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--stop", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        np.save(args.out, sample(args.worker, args.start, args.stop, args.batch))
        return
    if args.render:
        print(f"wrote {render(args.render)}")
        return
    if args.out is None:
        parser.error("--out is required (or --render JSON)")
    allowed = sorted(os.sched_getaffinity(0))
    args.cpus = args.cpus or default_cpus()
    if bad := [cpu for cpu in args.cpus if cpu not in allowed]:
        parser.error(f"--cpus {bad}: not among the CPUs this process may use ({allowed[0]}-{allowed[-1]})")
    for name in ("alone", "seconds"):
        if not 0.1 <= getattr(args, name) <= 120:
            parser.error(f"--{name} must be within [0.1, 120] seconds; got {getattr(args, name)}")
    if not 1.05 <= args.slow <= 10:
        parser.error(f"--slow must be within [1.05, 10]; got {args.slow}")
    if args.batch < 1:
        parser.error(f"--batch must be >= 1; got {args.batch}")
    body = measure(args)
    write_text_atomic(args.out, json.dumps(body) + "\n")
    print_table(body)


if __name__ == "__main__":
    main()
