"""Sequential single requests: what one client waiting on each answer meets, and where the server's CPU goes.

    .venv/bin/python -m benchmarks.service_sequential                  # 2,000 requests per kind
    .venv/bin/python -m benchmarks.service_sequential --requests 500 --out /tmp/seq.json

Starts ``ficco serve`` as a ``[service]``-only install (``benchmarks.service.served``), then for each
kind of request (one scenario repeated, so the server's cache answers; unseen eager scenarios; unseen graph
scenarios) sends ``--requests`` POST /v1/recommend one at a time on one keep-alive connection and records
each one's latency, and the CPU time each thread of the server process spent over the kind, per request
(Linux ``/proc/<pid>/task``: the event-loop thread, which also predicts single requests, is the process's
main thread; the others hold the threads large lists are split over). Prints the table and writes
``benchmarks/results/service-sequential.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import REPO
from benchmarks.service import _free_port, _sequential, machine_info, random_scenarios, served, stat_cpu_s
from ficco.files import write_text_atomic

KINDS = ("cached", "unseen eager", "unseen graph")
"""The request kinds, in the order they are sent."""


def thread_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of process ``pid`` (thread id -> seconds)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            out[int(task.name)] = stat_cpu_s(task / "stat")
    return out


def bodies_of(kind: str, count: int, seed: int) -> list[dict]:
    """``count`` request bodies of ``kind`` (:data:`KINDS`)."""
    if kind == "cached":
        return random_scenarios(1, seed) * count
    mode = kind.split()[-1]
    return [body | {"mode": mode} for body in random_scenarios(count, seed)]


def measure(pid: int, port: int, kind: str, count: int, seed: int) -> dict:
    """Send ``count`` requests of ``kind`` one at a time: latency percentiles (ms) and the server's CPU per
    request (ms) on its event-loop thread and on its other threads."""
    before = thread_cpu_s(pid)
    latencies = np.array(asyncio.run(_sequential(port, bodies_of(kind, count, seed)))) * 1e3
    after = thread_cpu_s(pid)
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop = spent.pop(pid, 0.0)
    return {
        "kind": kind,
        "requests": count,
        "p50_ms": round(float(np.percentile(latencies, 50)), 3),
        "p90_ms": round(float(np.percentile(latencies, 90)), 3),
        "p99_ms": round(float(np.percentile(latencies, 99)), 3),
        "max_ms": round(float(latencies.max()), 3),
        "loop_cpu_ms_per_request": round(1e3 * loop / count, 3),
        "other_cpu_ms_per_request": round(1e3 * sum(spent.values()) / count, 3),
    }


def render(result: dict) -> str:
    """The markdown of a result."""
    machine = result["machine"]
    lines = [
        "# Sequential single requests (CPU)",
        "",
        f"{result['when']} on {machine['cpus']} CPUs ({machine['platform']}, Python {machine['python']}); "
        f"1-minute load average {machine['load_average_1m_at_start']} at the start. `ficco serve` as a "
        "[service]-only install with the models of `models/`; one client, one request at a time on one "
        "keep-alive connection (`python -m benchmarks.service_sequential`).",
        "",
        "| requests | count | p50 ms | p90 ms | p99 ms | max ms | event-loop thread CPU ms/request | "
        "other threads CPU ms/request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['kind']} | {row['requests']} | {row['p50_ms']} | {row['p90_ms']} | {row['p99_ms']} | "
            f"{row['max_ms']} | {row['loop_cpu_ms_per_request']} | {row['other_cpu_ms_per_request']} |"
        )
    lines += [
        "",
        "cached: one scenario repeated (the server's cache answers); unseen: every scenario new to the "
        "server (the model answers it on the event-loop thread).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests per kind (default 2000)")
    parser.add_argument("--model-root", type=Path, default=REPO / "models", help="registry to serve")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/service-sequential.json", help="results JSON"
    )
    args = parser.parse_args()
    if args.requests < 100:
        parser.error(f"--requests must be at least 100 (a p99 needs them); got {args.requests}")
    load = round(os.getloadavg()[0], 2)
    port = _free_port()
    log = Path(tempfile.gettempdir()) / f"ficco-serve-sequential-{port}.log"
    with served(args.model_root, port, log) as (proc, _):
        rows = [measure(proc.pid, port, kind, args.requests, seed=7000 + i) for i, kind in enumerate(KINDS)]
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(load),
        "rows": rows,
    }
    markdown = render(result)
    print(markdown)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    write_text_atomic(args.out.with_suffix(".md"), markdown)
    print(f"wrote {args.out} and its .md")


if __name__ == "__main__":
    main()
