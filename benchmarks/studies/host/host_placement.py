r"""How much a fresh process's host time per executor call moves with where its threads and memory lie.

    python3 -m benchmarks.studies.host.host_placement --jobs 4 --out OUT/host-placement-h200x2.json  # 2+ GPUs
    # one GPU: each job one process, rank 0 of a pretend 2-rank world (no NCCL cost), with the references
    python3 -m benchmarks.studies.host.host_placement --loopback --primitives --layouts random fixed \
        --jobs 4 --out OUT/host-placement-loopback-h200.json

Eager-mode labels of small shapes are host time, and two processes on the same machine measured it up to
15% apart (`harness.cpu_placement`; a one-GPU loopback benchmark moved up to 1.5x between processes, even
pinned with ``taskset``). This runs ``benchmarks/executor_overhead.py`` as ``--jobs`` fresh jobs (torchrun, or
with ``--loopback`` one plain process on one GPU) per CPU placement policy (``--policies``) and address-space
layout (``--layouts``: ``random``, the kernel's default; ``fixed``, the job run under ``setarch -R``, so that
every process lays its heap, libraries and stacks out alike), interleaved: job ``j`` of every (policy,
layout) runs before job ``j + 1`` of any, in a shuffled order. Per (policy, layout, op, schedule) it
reports the median host microseconds per call over jobs and the spread between jobs (slowest job over
fastest, and the coefficient of variation); with ``--primitives`` also for each building block, the pure
Python and CPU-dispatch references included. The (policy, layout) with the smallest spread is the one whose
labels another process reproduces. A second table puts the spread of the executor's calls beside the
references': if dividing each job's calls by its pure-Python reference takes the spread away, the
interpreter's speed moved (the machine), not the launch path. Writes the per-job results, the machine's CPU
topology (``lscpu``, ``nvidia-smi topo -m``) and both summaries to ``--out``; prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import REPO
from ficco.files import write_text_atomic
from ficco.harness.cpu_placement import PIN_POLICIES
from ficco.harness.launch import torchrun_prefix
from ficco.rounds import interleaved_rounds
from ficco.tables import text_table

SCHEDULES = ("serial/sm", "shard/dma", "shard/sm", "finer/dma/s4/chunk")
"""Schedules timed in every job, for both ops (the two extremes of host work, and the common pick)."""
LAYOUTS = ("random", "fixed")
"""Address-space layouts a job runs under: the kernel's randomised one, or none (``setarch -R``)."""
PYTHON_REFERENCE = "python only: dict updates (the interpreter's speed)"
"""The pure-Python primitive of ``executor_overhead.primitive_calls``: each job's interpreter speed."""


def job_command(policy: str, layout: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The command of one fresh job of ``executor_overhead.py`` under ``policy`` and ``layout``, writing
    ``out``: torchrun on every GPU, or with ``args.loopback`` one process on one device."""
    if args.loopback:
        start = [sys.executable]
        world = ["--loopback", "--world-size", str(args.world_size)]
    else:
        start, world = torchrun_prefix(args.nproc), []
    command = [
        *start, "-m", "benchmarks.executor_overhead", *world, "--device", args.device,
        "--pin", policy, "--rounds", str(args.rounds), "--batch", str(args.batch), "--out", str(out),
        "--schedules", *args.schedules, *(["--primitives"] if args.primitives else []),
    ]  # fmt: skip
    return [*FIXED_LAYOUT, *command] if layout == "fixed" else command


FIXED_LAYOUT = ["setarch", platform.machine(), "-R"]
"""Runs a command with address-space layout randomisation off (util-linux ``setarch``; its children inherit
it, torchrun's ranks included)."""


def fixed_layout_refused() -> str | None:
    """Why jobs cannot run under :data:`FIXED_LAYOUT` here (``setarch`` missing, or the kernel or a
    container's seccomp profile refusing the personality flag), or None when they can."""
    if shutil.which(FIXED_LAYOUT[0]) is None:
        return f"{FIXED_LAYOUT[0]} is not on PATH (util-linux)"
    done = subprocess.run([*FIXED_LAYOUT, "true"], capture_output=True, text=True)
    return f"{' '.join(FIXED_LAYOUT)} failed: {done.stderr.strip()}" if done.returncode else None


def run_job(policy: str, layout: str, args: argparse.Namespace, out: Path) -> dict:
    """One fresh job (:func:`job_command`); its JSON, with the placement lines it printed. With
    ``args.processes`` > 1 (``--loopback``), that many loopback processes at once, each as local rank ``i``
    of ``args.processes`` (disjoint CPU shares, as torchrun's ranks get), and each case's time the slowest
    process's (as a round's time is the slowest rank's)."""
    count = args.processes if args.loopback else 1  # torchrun sets its ranks' LOCAL_RANK itself
    ranks = [
        {"LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(count)} if args.loopback else {} for i in range(count)
    ]
    outs = [out.with_suffix(f".rank{i}.json") for i in range(count)]
    running = [
        subprocess.Popen(
            job_command(policy, layout, path, args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | rank,
            cwd=REPO,
        )
        for rank, path in zip(ranks, outs, strict=True)
    ]
    placements = []
    for process in running:
        stdout, stderr = process.communicate(timeout=args.job_timeout)
        if process.returncode:
            failed = f"job ({policy}, {layout}) exited with {process.returncode}"
            raise RuntimeError(f"{failed}:\n{stderr[-3000:]}")
        placements += [line for line in stdout.splitlines() if "placement" in line]
    bodies = [json.loads(path.read_text()) for path in outs]
    return slowest(bodies) | {"placements": placements, "layout": layout, "processes": len(outs)}


def slowest(bodies: list[dict]) -> dict:
    """The first process's JSON with each case's host us per call the largest over ``bodies`` (results
    and primitives, matched by position: every process timed the same cases)."""
    merged = bodies[0]
    for key in ("results", "primitives"):
        for rows in zip(*(body.get(key, []) for body in bodies), strict=True):
            rows[0]["host_us_per_call"] = max(row["host_us_per_call"] for row in rows)
    return merged


def topology() -> dict[str, str]:
    """The machine's CPU and GPU topology as its tools print it (empty where a tool is missing)."""
    found = {}
    for name, command in {"lscpu": ["lscpu"], "nvidia_smi_topo": ["nvidia-smi", "topo", "-m"]}.items():
        try:
            found[name] = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            found[name] = ""
    return found


def job_cases(job: dict) -> dict[tuple[str, str], float]:
    """Host us per call of every case one job timed: (op, schedule), and ("primitive", name) for its
    primitives."""
    cases = {(row["op"], row["schedule"]): row["host_us_per_call"] for row in job["results"]}
    primitives = job.get("primitives", [])
    return cases | {("primitive", row["primitive"]): row["host_us_per_call"] for row in primitives}


def placement_of(job: dict) -> tuple[str, str]:
    """The (policy, layout) a job ran under (a job from before the layouts ran under the kernel's,
    ``random``)."""
    return job["pin"], job.get("layout", "random")


def spread_cv(us: list[float]) -> tuple[float, float]:
    """Slowest over fastest of ``us``, and its coefficient of variation (population)."""
    mean = statistics.fmean(us)
    return max(us) / min(us), statistics.pstdev(us) / mean if mean else 0.0


def summarize(jobs: list[dict]) -> list[dict]:
    """Per (policy, layout, op, schedule) (:func:`placement_of`): the jobs' host us per call, their median,
    spread and CV."""
    per: dict[tuple[str, str, str, str], list[float]] = {}
    for job in jobs:
        for (op, schedule), us in job_cases(job).items():
            per.setdefault((*placement_of(job), op, schedule), []).append(us)
    rows = []
    for (policy, layout, op, schedule), us in per.items():
        spread, cv = spread_cv(us)
        rows.append(
            {
                "policy": policy,
                "layout": layout,
                "op": op,
                "schedule": schedule,
                "jobs_us": us,
                "median_us": round(statistics.median(us), 1),
                "spread": round(spread, 3),
                "cv": round(cv, 4),
            }
        )
    return rows


def drift(jobs: list[dict]) -> list[dict]:
    """Per (policy, layout): the median over executor cases (not primitives) of the spread between jobs,
    the pure-Python reference's own spread, and the cases' median spread once each job's times are divided
    by its reference (what is left when the interpreter's speed is taken out). Empty without the
    reference (jobs run without ``--primitives``)."""
    per: dict[tuple[str, str], list[dict[tuple[str, str], float]]] = {}
    for job in jobs:
        per.setdefault(placement_of(job), []).append(job_cases(job))
    rows = []
    for (policy, layout), cases in per.items():
        reference = [c.get(("primitive", PYTHON_REFERENCE)) for c in cases]
        if None in reference:
            return []
        calls = [key for key in cases[0] if key[0] != "primitive"]
        raw = [spread_cv([c[key] for c in cases])[0] for key in calls]
        scaled = [spread_cv([c[key] / r for c, r in zip(cases, reference, strict=True)])[0] for key in calls]
        rows.append(
            {
                "policy": policy,
                "layout": layout,
                "jobs": len(cases),
                "calls_spread": round(statistics.median(raw), 3),
                "python_spread": round(spread_cv(reference)[0], 3),
                "calls_over_python_spread": round(statistics.median(scaled), 3),
            }
        )
    return rows


def write(args: argparse.Namespace, jobs: list[dict], machine: dict) -> tuple[list[dict], list[dict]]:
    """Both summaries of ``jobs`` so far, written with them and ``machine`` to ``args.out`` (atomically,
    after every job: a run cut short keeps the jobs it finished)."""
    summary, by_placement = summarize(jobs), drift(jobs)
    body = machine | {"summary": summary, "drift": by_placement, "jobs": jobs}
    write_text_atomic(args.out, json.dumps(body, indent=1) + "\n")
    return summary, by_placement


def print_tables(summary: list[dict], by_placement: list[dict]) -> None:
    """The per-case table and, with the references, the drift table."""
    cells = [
        [r["op"], r["schedule"], r["policy"], r["layout"], f"{r['median_us']:.1f}", f"{r['spread']:.3f}",
         f"{r['cv']:.3f}"]
        for r in sorted(summary, key=lambda r: (r["op"], r["schedule"], r["policy"], r["layout"]))
    ]  # fmt: skip
    head = ["op", "schedule", "policy", "layout", "median us", "slowest/fastest", "CV"]
    print(text_table(head, cells, align="<<<<>>>"))
    if by_placement:
        head = ["policy", "layout", "jobs", "calls: slowest/fastest", "python ref", "calls / python ref"]
        cells = [
            [r["policy"], r["layout"], str(r["jobs"]), f"{r['calls_spread']:.3f}",
             f"{r['python_spread']:.3f}", f"{r['calls_over_python_spread']:.3f}"]
            for r in by_placement
        ]  # fmt: skip
        print(text_table(head, cells, align="<<>>>>"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=4, help="fresh jobs per (policy, layout)")
    parser.add_argument(
        "--policies", nargs="+", choices=PIN_POLICIES, default=list(PIN_POLICIES), help="placements compared"
    )
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=LAYOUTS,
        default=["random"],
        help="address-space layouts compared: random (the kernel's default), fixed (setarch -R)",
    )
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), help="schedules timed per job")
    parser.add_argument(
        "--primitives",
        action="store_true",
        help="jobs also time the building blocks and the pure-Python and CPU-dispatch references (CUDA)",
    )
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="each job one process on one GPU, rank 0 of a pretend world (executor_overhead --loopback)",
    )
    parser.add_argument("--world-size", type=int, default=2, help="--loopback: ranks of the pretend world")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="--loopback: processes per job at once, each a local rank with its own CPU share (as the ranks "
        "of a sweep on that many GPUs compete for the host); a case's time is the slowest process's",
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: checks the --loopback jobs on gloo"
    )
    parser.add_argument("--rounds", type=int, default=10, help="shuffled rounds per job")
    parser.add_argument("--batch", type=int, default=50, help="calls per timed batch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the placements' order per job")
    parser.add_argument("--job-timeout", type=float, default=180.0, help="seconds before a job is killed")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    if args.jobs < 2:
        parser.error(f"--jobs {args.jobs}: need at least 2 jobs per policy to see a spread")
    if not 1 <= args.processes <= 8 or (args.processes > 1 and not args.loopback):
        parser.error(f"--processes must be 1 to 8, above 1 with --loopback only; got {args.processes}")
    if args.device == "cpu" and not args.loopback:
        parser.error("--device cpu needs --loopback (the torchrun jobs time GPUs)")
    if args.primitives and args.device != "cuda":
        parser.error("--primitives needs --device cuda (the building blocks are CUDA calls)")
    if "fixed" in args.layouts and (refused := fixed_layout_refused()):
        parser.error(f"--layouts fixed cannot run here: {refused}")

    import torch

    args.nproc = torch.cuda.device_count()
    needed = 1 if args.loopback else 2
    if args.device == "cuda" and args.nproc < needed:
        sys.exit(f"error: {args.nproc} CUDA devices; this needs at least {needed}")
    env = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "TORCH_", "NVSHMEM_"))}
    world = args.world_size if args.loopback else args.nproc
    machine = {"world_size": world, "loopback": args.loopback, "torch": torch.__version__, "env": env}
    machine["topology"] = topology()
    placements = [(policy, layout) for policy in args.policies for layout in args.layouts]
    jobs: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:

        def run_round(order: list[tuple[str, str]]) -> None:
            j = len(jobs) // len(placements)
            for policy, layout in order:
                job = run_job(policy, layout, args, Path(scratch) / f"{policy}-{layout}-{j}.json")
                jobs.append(job | {"job": j})
                print(f"job {j} {policy} {layout}: " + ", ".join(
                    f"{r['op']} {r['schedule']} {r['host_us_per_call']}" for r in job["results"]
                ), flush=True)  # fmt: skip
                write(args, jobs, machine)

        interleaved_rounds(placements, run_round, rounds=args.jobs, seed=args.seed)
    print_tables(*write(args, jobs, machine))


if __name__ == "__main__":
    main()
