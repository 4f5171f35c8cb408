r"""How much a fresh process's host time per executor call moves with where its threads run.

    python3 benchmarks/host_placement.py --jobs 4 --out OUT/host-placement-h200x2.json   # on 2+ GPUs

Eager-mode labels of small shapes are host time, and two processes on the same machine measured it up to
15% apart (`harness.affinity`). This runs ``benchmarks/executor_overhead.py`` as ``--jobs`` fresh
torchrun jobs per CPU placement policy (``--policies``, interleaved: job ``j`` of every policy runs before
job ``j + 1`` of any, in a shuffled order), then reports, per policy and (op, schedule), the median host
microseconds per call over jobs and the spread between jobs (slowest job over fastest, and the
coefficient of variation). The policy with the smallest spread is the one whose labels another process
reproduces. Writes the per-job results, the machine's CPU topology (``lscpu``, ``nvidia-smi topo -m``)
and the summary to ``--out``; prints the summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from ficco.harness.affinity import PIN_POLICIES  # noqa: E402 (needs the path above)
from ficco.harness.launch import torchrun_prefix  # noqa: E402
from ficco.tables import text_table  # noqa: E402

SCHEDULES = ("serial/sm", "shard/dma", "shard/sm", "finer/dma/s4/chunk")
"""Schedules timed in every job, for both ops (the two extremes of host work, and the common pick)."""


def run_job(policy: str, nproc: int, args: argparse.Namespace, out: Path) -> dict:
    """One fresh torchrun job of ``executor_overhead.py`` on ``nproc`` GPUs under ``policy``; its JSON."""
    command = [
        *torchrun_prefix(nproc), str(REPO / "benchmarks" / "executor_overhead.py"), "--device", "cuda",
        "--pin", policy, "--rounds", str(args.rounds), "--batch", str(args.batch), "--out", str(out),
        "--schedules", *args.schedules,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.job_timeout)
    if done.returncode:
        raise RuntimeError(f"job ({policy}) exited with {done.returncode}:\n{done.stderr[-3000:]}")
    placements = [line for line in done.stdout.splitlines() if "placement" in line]
    return json.loads(out.read_text()) | {"placements": placements}


def topology() -> dict[str, str]:
    """The machine's CPU and GPU topology as its tools print it (empty where a tool is missing)."""
    found = {}
    for name, command in {"lscpu": ["lscpu"], "nvidia_smi_topo": ["nvidia-smi", "topo", "-m"]}.items():
        try:
            found[name] = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            found[name] = ""
    return found


def summarize(jobs: list[dict]) -> list[dict]:
    """Per (policy, op, schedule): the jobs' host us per call, their median, spread and CV."""
    per: dict[tuple[str, str, str], list[float]] = {}
    for job in jobs:
        for row in job["results"]:
            per.setdefault((job["pin"], row["op"], row["schedule"]), []).append(row["host_us_per_call"])
    rows = []
    for (policy, op, schedule), us in per.items():
        mean = statistics.fmean(us)
        rows.append(
            {
                "policy": policy,
                "op": op,
                "schedule": schedule,
                "jobs_us": us,
                "median_us": round(statistics.median(us), 1),
                "spread": round(max(us) / min(us), 3),
                "cv": round(statistics.pstdev(us) / mean, 4) if mean else 0.0,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=4, help="fresh torchrun jobs per policy")
    parser.add_argument(
        "--policies", nargs="+", choices=PIN_POLICIES, default=list(PIN_POLICIES), help="placements compared"
    )
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), help="schedules timed per job")
    parser.add_argument("--rounds", type=int, default=10, help="shuffled rounds per job")
    parser.add_argument("--batch", type=int, default=50, help="calls per timed batch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the policies' order per job")
    parser.add_argument("--job-timeout", type=float, default=180.0, help="seconds before a job is killed")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    if args.jobs < 2:
        parser.error(f"--jobs {args.jobs}: need at least 2 jobs per policy to see a spread")

    import torch

    nproc = torch.cuda.device_count()
    if nproc < 2:
        sys.exit(f"error: {nproc} CUDA devices; this needs at least 2")
    order = random.Random(args.seed)
    jobs = []
    with tempfile.TemporaryDirectory() as scratch:
        for j in range(args.jobs):
            for policy in order.sample(args.policies, len(args.policies)):
                job = run_job(policy, nproc, args, Path(scratch) / f"{policy}-{j}.json")
                jobs.append(job | {"job": j})
                print(f"job {j} {policy}: " + ", ".join(
                    f"{r['op']} {r['schedule']} {r['host_us_per_call']}" for r in job["results"]
                ), flush=True)  # fmt: skip
    summary = summarize(jobs)
    env = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "TORCH_", "NVSHMEM_"))}
    body = {"world_size": nproc, "torch": torch.__version__, "env": env, "topology": topology()}
    body |= {"summary": summary, "jobs": jobs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(body, indent=1) + "\n")
    cells = [
        [r["op"], r["schedule"], r["policy"], f"{r['median_us']:.1f}", f"{r['spread']:.3f}", f"{r['cv']:.3f}"]
        for r in sorted(summary, key=lambda r: (r["op"], r["schedule"], r["policy"]))
    ]
    print(
        text_table(["op", "schedule", "policy", "median us", "slowest/fastest", "CV"], cells, align="<<<>>>")
    )


if __name__ == "__main__":
    main()
