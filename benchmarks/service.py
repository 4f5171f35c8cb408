"""Service benchmark: /v1/recommend latency under open-loop load, batch throughput, start-up time, and
single requests beside batches of both kinds.

    .venv/bin/python -m benchmarks.service                          # the models/ registry, default settings
    .venv/bin/python -m benchmarks.service --model-root /tmp/models --duration 10 --rates 100,300,500
    .venv/bin/python -m benchmarks.service --quiet-load 1.0      # wait for a quiet machine first

1. Start-up: ``ficco serve`` in a subprocess (by default as a ``[service]``-only install runs it: the
   training stack and torch cannot be imported, ``--full-install`` lifts that); time from process start to
   the first 200 from /readyz. Then, in the first minute after ready: the first ``GET
   /v1/tables/h200x2?tp=2&mode=graph`` (timed from ready to its last byte), and ``STARTUP_ROUNDS`` rounds of
   one 10,000-scenario ``/v1/recommend/batch`` and ``STARTUP_SEQUENTIAL`` sequential ``/v1/recommend``
   requests (one at a time on one keep-alive connection, unseen scenarios): what a fleet starting with the
   server meets while the server's start-up work (loading or building its grid tables) may still run.
   ``--startup-only`` stops here.
2. Latency: a separate process sends POST /v1/recommend at fixed rates (open loop: request ``i`` is due
   at ``t0 + i / rate`` whether or not earlier ones have finished, over keep-alive connections it opens
   as needed; each request is started at its due time, so the first goes out on time as the rest do).
   Latency runs from the due time to the last response byte, so queueing counts. Each rate runs twice:
   with scenarios new to the server (the model answers each) and with 200 repeated ones
   (the server's cache answers); the server's CPU time per request is recorded for each phase.
3. Batch: POST /v1/recommend/batch with 10,000 scenarios the server has not seen, timed from the first
   byte sent to the last byte received (client-side JSON encoding excluded), ``--batch-reps`` times.
4. Isolation: single requests at 200 req/s while one client sends 10,000-scenario batches back to back
   (the server answers batches in its batch worker process; ``FICCO_BATCH_PRIORITY`` sets its priority).
5. Beside score batches: single requests at 100 req/s while four clients post maximal POST
   /v1/score/batch requests (``MAX_SCORE_CONFIGS`` shipped configs at ``MAX_TOKEN_COUNTS`` token counts)
   back to back.
6. Beside hammering: single requests at 100 req/s while clients send requests back to back to each
   endpoint of ``--hammer`` (default ``HAMMERED``: single and batched scoring, the cached grid table by GET
   and a new shape list by POST each time; ``GET <path>`` is a GET), once per count of
   ``--hammer-clients`` (default ``HAMMER_CLIENTS``: one client per endpoint, the four clients of the goal,
   then four per endpoint as a stress run with no goal).

Every request has a timeout (``REQUEST_TIMEOUT_S``) and the generator process a deadline, so a server that
refuses connections or stalls gives errors, never a hang.

Writes ``benchmarks/results/service-cpu.json`` and ``.md`` (``--out``) and prints the table. Goals on a
2-core machine: p99 <= 10 ms at 500 req/s with no errors, p99 <= 25 ms at 200 req/s beside back-to-back
batches and at 100 req/s beside four clients of maximal score batches, p99 <= 10 ms at 100 req/s beside the
hammering clients, a 10,000 batch <= 1 s, start-up (to a ready /readyz: the batch workers warm, the grid
tables ready) <= 3 s; in the first minute after ready, the first grid-table GET within 5 s of ready, a
10,000 batch <= 1.5 s and sequential p99 <= 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue as queue_module
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np

from benchmarks import REPO

GOALS = {
    "p99_ms_at_500": 10.0,
    "p99_ms_at_200_beside_batches": 25.0,
    "p99_ms_at_100_beside_score_batches": 25.0,
    "p99_ms_at_100_beside_hammering": 10.0,
    "batch_10k_s": 1.0,
    "startup_s": 3.0,
    "first_table_after_ready_s": 5.0,
    "startup_batch_10k_s": 1.5,
    "startup_sequential_p99_ms": 2.0,
}
STARTUP_ROUNDS = 3
"""Rounds of one batch and sequential requests in the first minute after ready."""
STARTUP_SEQUENTIAL = 1000
"""Sequential /v1/recommend requests per start-up round."""
SERVICE_ONLY = """
import sys

# ficco serve as a [service]-only install runs it: the training stack and torch are not there.
for name in ("sklearn", "pandas", "pyarrow", "matplotlib", "torch"):
    sys.modules[name] = None
"""
"""The ``sitecustomize`` the server (and the workers it starts) reads unless ``--full-install``."""
SCORE_CLIENTS = 4
"""Clients posting maximal score batches back to back in phase 5."""
HAMMER_CLIENTS = (1, 4)
"""Clients per endpoint sending requests back to back in phase 6, one run per count; the goal is the
first's."""
HAMMERED = "/v1/score,/v1/score/batch,GET /v1/tables/h200x2,/v1/tables/h200x2"
"""Phase 6's endpoints by default (``--hammer``): scoring, single and batched, and the schedule tables (the
grid's, served from the cache, and posted shape lists that are new every time, each a build)."""
REQUEST_TIMEOUT_S = 10.0
"""Longest wait for one request (connect + answer), seconds; a request past it counts as an error."""
GENERATOR_START_S = 30.0
"""Margin for the load generator process to start (spawn, imports) and to exit, seconds."""


def random_scenarios(count: int, seed: int) -> list[dict]:
    """``count`` distinct valid dense scenarios on h200x2 (world size 2), as request bodies."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    out = []
    while len(out) < count:
        body = {
            "op": rng.choice(["ag_gemm", "gemm_rs"]),
            "m": 2 * rng.randint(64, 65536),
            "n": 128 * rng.randint(1, 224),
            "k": 128 * rng.randint(1, 224),
            "dtype": rng.choice(["bf16", "bf16", "fp16"]),
            "world_size": 2,
        }
        key = tuple(body.values())
        if key not in seen:
            seen.add(key)
            out.append(body)
    return out


def machine_info(load_at_start: float) -> dict:
    """The machine a run was made on: CPUs, platform, Python, and the 1-minute load average at the start
    (``load_at_start``) and now (the end)."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model_root: Path, port: int, log: Path, *, service_only: bool = True
) -> tuple[subprocess.Popen, float]:
    """Start ``ficco serve`` of this checkout (``python -m ficco.cli`` from the repository root, not an
    installed ``ficco`` script, which may import another checkout), as a ``[service]``-only install unless
    ``service_only`` is False (:data:`SERVICE_ONLY`); return the process and seconds from its start to a
    ready /readyz."""
    env = {**os.environ, "FICCO_MODEL_ROOT": str(model_root), "PYTHONUNBUFFERED": "1"}
    if service_only:
        site = Path(tempfile.mkdtemp(prefix="ficco-service-only-"))
        (site / "sitecustomize.py").write_text(SERVICE_ONLY)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ficco.cli", "serve", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    deadline = start + 60
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ficco serve exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=0.5).status_code == 200:
                return proc, time.perf_counter() - start
        except httpx.TransportError:
            pass
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError(f"ficco serve was not ready after 60 s; see {log}")


@contextlib.contextmanager
def served(
    model_root: Path, port: int, log: Path, *, service_only: bool = True, stop_timeout_s: float = 10.0
) -> Iterator[tuple[subprocess.Popen, float]]:
    """:func:`start_server` for the ``with`` block: (the process, seconds to ready); the server is
    terminated when the block ends, however it ends."""
    proc, startup_s = start_server(model_root, port, log, service_only=service_only)
    try:
        yield proc, startup_s
    finally:
        proc.terminate()
        proc.wait(timeout=stop_timeout_s)


def _request_bytes(port: int, body: dict) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST /v1/recommend HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _exchange(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> int:
    """Send one request on a keep-alive connection; return the status after reading the whole answer."""
    reader, writer = conn
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return status


async def _open_loop(port: int, rate: float, bodies: list[dict]) -> dict:
    """Send ``bodies`` at ``rate`` per second, open loop; latency from each request's due time.

    A keep-alive connection the server closed while idle (uvicorn closes them after 5 s) is replaced and
    the request sent again, as HTTP clients do; those count as ``reconnects``, not errors.
    """
    requests = [_request_bytes(port, b) for b in bodies]
    idle: list = []
    latencies: list[float] = []
    lateness: list[float] = []
    errors: list[str] = []
    reconnects = 0
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05

    async def connection():
        while idle:
            conn = idle.pop()
            if not conn[0].at_eof():
                return conn, True
            conn[1].close()
        return await asyncio.open_connection("127.0.0.1", port), False

    async def send(i: int) -> tuple[tuple, int]:
        nonlocal reconnects
        conn, reused = await connection()
        try:
            return conn, await _exchange(conn, requests[i])
        except asyncio.IncompleteReadError as err:
            conn[1].close()
            if not (reused and err.partial == b""):
                raise
        reconnects += 1
        conn = await asyncio.open_connection("127.0.0.1", port)
        try:
            return conn, await _exchange(conn, requests[i])
        except BaseException:
            conn[1].close()
            raise

    async def one(i: int, due: float) -> None:
        lateness.append(loop.time() - due)
        try:
            conn, status = await asyncio.wait_for(send(i), REQUEST_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as err:
            errors.append(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
            return
        latencies.append(loop.time() - due)
        if status != 200:
            errors.append(f"HTTP {status}")
        idle.append(conn)

    tasks = []
    for i in range(len(requests)):  # each request starts at its due time (none is created early)
        due = t0 + i / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    elapsed = loop.time() - t0
    for _, writer in idle:
        writer.close()
    return {
        "latencies": latencies,
        "lateness": lateness,
        "errors": errors,
        "elapsed_s": elapsed,
        "connections": len(idle),
        "reconnects": reconnects,
    }


def _generator(port: int, rate: float, bodies: list[dict], queue: mp.Queue) -> None:
    """The load generator process: put the phase's result, or ``{"crash": message}``, on ``queue``."""
    try:
        queue.put(asyncio.run(_open_loop(port, rate, bodies)))
    except Exception as err:  # the parent must hear of it, or it waits for a result forever
        queue.put({"crash": f"{type(err).__name__}: {err}"})


def load_phase(port: int, rate: float, bodies: list[dict]) -> dict:
    """Run one open-loop phase in a separate process and summarise its latencies, milliseconds.

    Never waits past the phase's length plus ``REQUEST_TIMEOUT_S`` and a start-up margin: a generator
    that died or stalls is killed and reported as a RuntimeError.
    """
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    proc = ctx.Process(target=_generator, args=(port, rate, bodies, queue), daemon=True)
    proc.start()
    wait_s = len(bodies) / rate + REQUEST_TIMEOUT_S + GENERATOR_START_S
    try:
        result = queue.get(timeout=wait_s)
    except queue_module.Empty:
        proc.kill()
        raise RuntimeError(
            f"the load generator gave no result in {wait_s:.0f} s (exit {proc.exitcode})"
        ) from None
    proc.join(timeout=GENERATOR_START_S)
    if "crash" in result:
        raise RuntimeError(f"the load generator failed: {result['crash']}")
    ms = sorted(1000 * x for x in result["latencies"])
    late = sorted(1000 * x for x in result["lateness"])

    def pct(p: float, values: list[float] = ms) -> float:
        return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")

    return {
        "rate": rate,
        "requests": len(bodies),
        "achieved_rate": round(len(bodies) / result["elapsed_s"], 1),
        "p50_ms": round(pct(50), 3),
        "p90_ms": round(pct(90), 3),
        "p99_ms": round(pct(99), 3),
        "max_ms": round(ms[-1], 3) if ms else None,
        "errors": len(result["errors"]),
        "error_examples": sorted(set(result["errors"]))[:3],
        "connections": result["connections"],
        "reconnects": result["reconnects"],
        "generator_late_p99_ms": round(pct(99, late), 3),
    }


async def _sequential(port: int, bodies: list[dict]) -> list[float]:
    """Send ``bodies`` one at a time on one keep-alive connection; each request's latency, seconds."""
    conn = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for body in bodies:
            start = time.perf_counter()
            status = await asyncio.wait_for(_exchange(conn, _request_bytes(port, body)), REQUEST_TIMEOUT_S)
            out.append(time.perf_counter() - start)
            if status != 200:
                raise RuntimeError(f"/v1/recommend answered {status}")
    finally:
        conn[1].close()
    return out


def _startup_round(client: httpx.Client, port: int, ready_at: float, seed: int) -> dict:
    """One round of :func:`startup_phase`: a 10,000 batch, then ``STARTUP_SEQUENTIAL`` sequential requests;
    when each started (seconds after ``ready_at``), the batch's seconds, the sequential latencies (s)."""
    payload = json.dumps({"scenarios": random_scenarios(10_000, seed)}).encode()
    begin = time.perf_counter()
    answer = client.post("/v1/recommend/batch", content=payload, headers={"content-type": "application/json"})
    batch_s = time.perf_counter() - begin
    if answer.status_code != 200:
        raise RuntimeError(f"batch answered {answer.status_code}: {answer.text[:300]}")
    single = asyncio.run(_sequential(port, random_scenarios(STARTUP_SEQUENTIAL, seed + 100)))
    return {
        "batch_at_s": round(begin - ready_at, 2),
        "batch_s": round(batch_s, 3),
        "sequential_until_s": round(time.perf_counter() - ready_at, 2),
        "sequential_p99_ms": round(1000 * float(np.percentile(single, 99)), 3),
        "latencies": single,
    }


def startup_phase(port: int, ready_at: float, seed: int) -> dict:
    """What a fleet meets in the first minute after ready (``ready_at``, ``time.perf_counter``): the first
    grid-table GET, then ``STARTUP_ROUNDS`` rounds of a 10,000 batch and ``STARTUP_SEQUENTIAL`` sequential
    requests; seconds after ready of each, the batch times and the sequential latencies' percentiles; and
    the same round once the first minute is over (``reference``: what the machine gives without start-up
    work, so that other load on it can be told from the server's own)."""
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=120, headers={"Accept-Encoding": "gzip"}) as client:
        request = client.build_request("GET", "/v1/tables/h200x2", params={"tp": 2, "mode": "graph"})
        response = client.send(request, stream=True)  # read as sent (gzip), not inflated here
        size = sum(len(chunk) for chunk in response.iter_raw())
        response.close()
        table_s = time.perf_counter() - ready_at
        if response.status_code != 200:
            raise RuntimeError(f"the first grid-table GET answered {response.status_code}")
        rounds = [_startup_round(client, port, ready_at, seed + i) for i in range(STARTUP_ROUNDS)]
        ready = client.get("/readyz").json()
        time.sleep(max(0.0, ready_at + 60.0 - time.perf_counter()))
        reference = _startup_round(client, port, ready_at, seed + STARTUP_ROUNDS)
    ms = 1000 * np.concatenate([r.pop("latencies") for r in rounds])
    reference_ms = 1000 * np.asarray(reference.pop("latencies"))
    return {
        "first_table_after_ready_s": round(table_s, 3),
        "first_table_bytes": size,
        "rounds": rounds,
        "batch_max_s": max(r["batch_s"] for r in rounds),
        "sequential_requests": len(ms),
        "sequential_p50_ms": round(float(np.percentile(ms, 50)), 3),
        "sequential_p99_ms": round(float(np.percentile(ms, 99)), 3),
        "sequential_max_ms": round(float(ms.max()), 3),
        "grid_tables_pending_at_end": ready.get("grid_tables_pending"),
        "reference": {**reference, "sequential_p50_ms": round(float(np.percentile(reference_ms, 50)), 3)},
    }


def batch_phase(port: int, reps: int, size: int, seed: int) -> dict:
    """Time ``reps`` batches of ``size`` unseen scenarios; seconds per batch."""
    times = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for rep in range(reps):
            payload = json.dumps({"scenarios": random_scenarios(size, seed + rep)}).encode()
            start = time.perf_counter()
            response = client.post(
                "/v1/recommend/batch", content=payload, headers={"content-type": "application/json"}
            )
            times.append(time.perf_counter() - start)
            answer = response.json() if response.status_code == 200 else {}
            if answer.get("count") != size or answer.get("failed"):
                raise RuntimeError(f"batch answered {response.status_code}: {response.text[:300]}")
    return {
        "size": size,
        "reps": reps,
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "body_mib": round(len(payload) / 2**20, 2),
    }


def model_info(port: int) -> dict:
    """The model the server answered with: version, hardware and where its training data came from."""
    data = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
    out = {}
    for hw in data:
        card = next((v["card"] for v in hw["versions"] if v["serving"]), {})
        dataset = card.get("dataset", {})
        out[hw["hardware_id"]] = {
            "version": hw["serving"],
            "dataset": {k: dataset.get(k) for k in ("path", "backends", "n_scenarios", "hash")},
            "config": card.get("config"),
            "policy": card.get("policy"),
            "classes": len(card.get("classes", [])),
        }
    return out


def write_results(results: dict, out: Path) -> str:
    """Write ``<out>.json`` and ``<out>.md``; return the Markdown."""
    st = results["startup"]
    ref = st["reference"]
    round_rows = "\n".join(
        f"| {n + 1} | {r['batch_at_s']:g} | {r['batch_s']:.3f} | {r['sequential_until_s']:g} | "
        f"{r['sequential_p99_ms']:.3f} |"
        for n, r in enumerate(st["rounds"])
    )
    md = (
        f"# Service benchmark (CPU)\n\n{results['when']} on {results['machine']['cpus']} CPUs "
        f"({results['machine']['platform']}, Python {results['machine']['python']}); 1-minute load average "
        f"{results['machine']['load_average_1m_at_start']} at the start, "
        f"{results['machine']['load_average_1m_at_end']} at the end (other work on the machine counts).\n"
        f"Model: `{json.dumps(results['model'])}`.\n{results['model_note']}\n"
        f"Server settings from the environment (others are the defaults): "
        f"`{json.dumps(results['server_env'])}`; installed: {results['install']}.\n\n"
        f"Start-up (process start to /readyz 200): **{results['startup_s']:.2f} s** "
        f"(goal <= {GOALS['startup_s']} s)\n\n"
        "## The first minute after ready\n\n"
        "First `GET /v1/tables/h200x2?tp=2&mode=graph` answered "
        f"**{st['first_table_after_ready_s']:.3f} s** after /readyz said ready ({st['first_table_bytes']} "
        f"bytes, gzip; goal <= {GOALS['first_table_after_ready_s']} s). Then rounds of one 10,000-scenario "
        "/v1/recommend/batch and "
        f"{STARTUP_SEQUENTIAL} sequential /v1/recommend requests (one connection, one request at a time, "
        "unseen scenarios), seconds after ready:\n\n"
        "| round | batch at s | batch s | sequential until s | sequential p99 ms |\n"
        f"|---|---|---|---|---|\n{round_rows}\n\n"
        f"Largest batch **{st['batch_max_s']:.3f} s** (goal <= {GOALS['startup_batch_10k_s']} s); sequential "
        f"requests ({st['sequential_requests']}): p50 {st['sequential_p50_ms']:.3f} ms, p99 "
        f"**{st['sequential_p99_ms']:.3f} ms** (goal <= {GOALS['startup_sequential_p99_ms']} ms), max "
        f"{st['sequential_max_ms']:.3f} ms; grid tables pending at the end: "
        f"{st['grid_tables_pending_at_end']}. The same round after the first minute (the machine without "
        f"start-up work, other load included), from {ref['batch_at_s']:g} s: batch {ref['batch_s']:.3f} s, "
        f"sequential p50 {ref['sequential_p50_ms']:.3f} ms, p99 {ref['sequential_p99_ms']:.3f} ms.\n\n"
    )
    if "latency" in results:
        md += steady_markdown(results)
    md += (
        "## Goals\n\n"
        + "\n".join(f"- {k}: {'met' if v else 'NOT met'}" for k, v in results["goals_met"].items())
        + "\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(md)
    return md


def steady_markdown(results: dict) -> str:
    """The Markdown of phases 2 to 6."""
    rows = "\n".join(
        f"| {p['scenarios']} | {p['rate']:g} | {p['achieved_rate']:g} | {p['requests']} | "
        f"{p['p50_ms']:.2f} | {p['p90_ms']:.2f} | {p['p99_ms']:.2f} | {p['max_ms']:.2f} | {p['errors']} | "
        f"{p['reconnects']} | {p['generator_late_p99_ms']:.2f} | {p['server_cpu_ms_per_request']:.2f} | "
        f"{p['machine_busy_pct']:g} |"
        for p in results["latency"]
    )
    b, i, sc = results["batch"], results["beside_batches"], results["beside_score_batches"]
    hammer_rows = "\n".join(
        f"| {h['clients_per_endpoint']} | {h['clients_per_endpoint'] * len(h['answers'])} | "
        f"{h['p50_ms']:.2f} | {h['p90_ms']:.2f} | {h['p99_ms']:.2f} | {h['max_ms']:.2f} | {h['errors']} | "
        f"{h['generator_late_p99_ms']:.2f} | `{json.dumps(h['answers'])}` | {h['server_cpu_s']:g} | "
        f"{h['batch_worker_cpu_s']:g} | {h['machine_busy_pct']:g} | {h.get('peak_rss_mib', float('nan')):g} |"
        for h in results["beside_hammering"]
    )
    hammered = ", ".join(results["beside_hammering"][0]["answers"])
    goal_clients = results["beside_hammering"][0]["clients_per_endpoint"]
    return (
        f"## POST /v1/recommend, open loop, {results['duration_s']:g} s per rate\n\n"
        "| scenarios | rate req/s | achieved | requests | p50 ms | p90 ms | p99 ms | max ms | errors | "
        "reconnects | generator late p99 ms | server CPU ms/request | machine busy % |\n"
        f"|---|---|---|---|---|---|---|---|---|---|---|---|---|\n{rows}\n\n"
        "unseen: every scenario new to the server (the model answers each); repeated: 200 scenarios cycled "
        "(answers from the server's cache, as when every rank of a job asks for the same shapes). "
        "reconnects: keep-alive connections the server had closed while idle, replaced and the request sent "
        "again (counted in its latency). generator late: how far after its due time the load generator "
        "actually sent a request (included in the latency). server CPU: user + system time of the server "
        "process over the phase, per request. machine busy: CPU time of every process on the machine (the "
        "load generator's and other people's work included) over the phase, % of all CPUs.\n\n"
        f"## POST /v1/recommend/batch\n\n{b['size']} unseen scenarios ({b['body_mib']} MiB body), "
        f"{b['reps']} runs: "
        f"median **{b['median_s']:.3f} s**, min {b['min_s']:.3f} s, max {b['max_s']:.3f} s "
        f"(goal <= {GOALS['batch_10k_s']} s)\n\n"
        f"## Single requests beside back-to-back batches\n\n{i['rate']:g} req/s of unseen scenarios while "
        f"one client sends {i['batch_size']}-scenario batches back to back: p50 {i['p50_ms']:.2f} ms, "
        f"p99 **{i['p99_ms']:.2f} ms**, max {i['max_ms']:.2f} ms, {i['errors']} errors "
        f"(goal p99 <= {GOALS['p99_ms_at_200_beside_batches']} ms); batches answered "
        f"{json.dumps(i['batch_answers'])} (HTTP status: count; 429/503 = refused while busy). CPU over the "
        f"phase: server {i['server_cpu_s']:g} s, batch worker {i['batch_worker_cpu_s']:g} s; machine "
        f"{i['machine_busy_pct']:g}% busy (all processes, all CPUs)\n\n"
        f"## Single requests beside maximal score batches\n\n{sc['rate']:g} req/s of unseen scenarios while "
        f"{sc['clients']} clients post POST /v1/score/batch requests of {sc['configs']} configs at "
        f"{sc['token_counts']} token counts back to back: p50 {sc['p50_ms']:.2f} ms, "
        f"p90 {sc['p90_ms']:.2f} ms, p99 **{sc['p99_ms']:.2f} ms**, max {sc['max_ms']:.2f} ms, "
        f"{sc['errors']} errors "
        f"(goal p99 <= {GOALS['p99_ms_at_100_beside_score_batches']} ms); batches answered "
        f"{json.dumps(sc['batch_answers'])} (429 = refused while busy, retried after Retry-After). CPU over "
        f"the phase: server {sc['server_cpu_s']:g} s, batch worker {sc['batch_worker_cpu_s']:g} s; machine "
        f"{sc['machine_busy_pct']:g}% busy\n\n"
        f"## Single requests beside hammering clients\n\n{results['hammer_rate']:g} req/s of unseen "
        f"scenarios while clients send requests back to back to each of {hammered} (goal p99 <= "
        f"{GOALS['p99_ms_at_100_beside_hammering']} ms with {goal_clients} client(s) per endpoint):\n\n"
        "| clients per endpoint | clients | p50 ms | p90 ms | p99 ms | max ms | errors | "
        "generator late p99 ms | answers by endpoint | server CPU s | worker CPU s | machine busy % | "
        "peak RSS MiB |\n"
        f"|---|---|---|---|---|---|---|---|---|---|---|---|---|\n{hammer_rows}\n\n"
        "answers: HTTP status: count per endpoint (429 = refused while busy or past the per-client table "
        "rate, retried after Retry-After). worker CPU: the batch and table workers' CPU time over the phase. "
        "peak RSS: the server and its workers' largest resident memory together.\n\n"
    )


def score_batch_body() -> dict:
    """A maximal POST /v1/score/batch body: ``MAX_SCORE_CONFIGS`` configs (the shipped model configs,
    cycled) at ``MAX_TOKEN_COUNTS`` token counts, tp=2."""
    from ficco.service.schemas import MAX_SCORE_CONFIGS, MAX_TOKEN_COUNTS

    files = sorted((REPO / "datasets" / "model_configs").glob("*.json"))
    configs = [
        {"name": f"{files[i % len(files)].stem}-{i}", "config": json.loads(files[i % len(files)].read_text())}
        for i in range(MAX_SCORE_CONFIGS)
    ]
    return {"configs": configs, "tp": 2, "tokens": [512 * (i + 1) for i in range(MAX_TOKEN_COUNTS)]}


def beside_phase(
    port: int,
    rate: float,
    duration: float,
    seed: int,
    loads: list[tuple[str, bytes | Callable[[], bytes] | None, int]],
) -> dict:
    """Single requests at ``rate`` (unseen scenarios, open loop) while, per ``(endpoint, body, clients)`` of
    ``loads``, ``clients`` client threads send ``body`` (or what ``body()`` makes, anew for each request) to
    ``endpoint`` back to back (``GET <path>``: a GET, else a POST of ``body``); the single requests'
    latencies (ms) and how each endpoint was answered (``answers``: endpoint -> HTTP status -> count; 429 is
    waited out as Retry-After says)."""
    stop = threading.Event()
    answers: dict[str, dict[str, int]] = {endpoint: {} for endpoint, _, _ in loads}
    lock = threading.Lock()

    def hammer(endpoint: str, payload: bytes | None) -> None:
        method, _, path = endpoint.rpartition(" ")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            while not stop.is_set():
                try:
                    # the answer is read as it came (gzip stays compressed): the load generator shares the
                    # server's 2 cores, and a client inflating every 0.2 MB table to its 7 MB of JSON would
                    # take the CPU the server under test needs
                    if method == "GET":
                        request = client.build_request("GET", path)
                    else:
                        body = payload() if callable(payload) else payload
                        headers = {"content-type": "application/json"}
                        request = client.build_request("POST", path, content=body, headers=headers)
                    response = client.send(request, stream=True)
                    for _ in response.iter_raw():
                        pass
                    response.close()
                    code = str(response.status_code)
                    if response.status_code == 429:  # as a client should: wait as told
                        stop.wait(float(response.headers.get("retry-after", 1)))
                except httpx.HTTPError as err:
                    code = type(err).__name__
                with lock:
                    answers[endpoint][code] = answers[endpoint].get(code, 0) + 1

    threads = [
        threading.Thread(target=hammer, args=(endpoint, payload), daemon=True)
        for endpoint, payload, clients in loads
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    try:
        phase = load_phase(port, rate, random_scenarios(int(rate * duration), seed=seed + 1))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=130)
    return {**phase, "answers": answers}


def beside_batches_phase(
    port: int, rate: float, duration: float, seed: int, *, path: str, body: dict, clients: int
) -> dict:
    """``beside_phase`` with one endpoint: ``clients`` clients posting ``body`` to ``path``."""
    phase = beside_phase(port, rate, duration, seed, [(path, json.dumps(body).encode(), clients)])
    return {**phase, "path": path, "clients": clients, "batch_answers": phase.pop("answers")[path]}


def score_body() -> dict:
    """A POST /v1/score body: Llama-3.1-8B's shipped config at two token counts."""
    config = json.loads((REPO / "datasets" / "model_configs" / "Llama-3.1-8B.json").read_text())
    return {"config": config, "tp": 2, "tokens": [4096, 16384]}


def table_shapes_body(seed: int) -> Callable[[], bytes]:
    """POST /v1/tables bodies, a new one per call: ``MAX_TABLE_SHAPES`` dense shapes (``op:n:k``, n and k
    log-uniform in [512, 65536]) that no earlier body asked for, so every request is a build."""
    from ficco.service.schemas import MAX_TABLE_SHAPES

    rng = np.random.default_rng(seed)
    lock = threading.Lock()

    def body() -> bytes:
        with lock:
            dims = np.exp(rng.uniform(np.log(512), np.log(65536), size=(MAX_TABLE_SHAPES, 2))).astype(int)
            ops = rng.choice(["ag_gemm", "gemm_rs"], size=MAX_TABLE_SHAPES)
        shapes = [f"{op}:{n}:{k}" for op, (n, k) in zip(ops, dims, strict=True)]
        return json.dumps({"tp": 2, "mode": "graph", "shapes": shapes}).encode()

    return body


BODIES: dict[str, Callable[[], bytes | Callable[[], bytes]]] = {
    "/v1/score": lambda: json.dumps(score_body()).encode(),
    "/v1/score/batch": lambda: json.dumps(score_batch_body()).encode(),
    "/v1/tables/h200x2": lambda: table_shapes_body(seed=7),
}
"""What each POST endpoint of ``--hammer`` is sent: its body, or (the tables) a maker of a new body per
request."""


def hammer_phase(
    port: int, rate: float, duration: float, seed: int, endpoints: list[str], clients: int
) -> dict:
    """Single requests at ``rate`` beside ``clients`` clients per endpoint of ``endpoints``."""
    loads = [(e, None if e.startswith("GET ") else BODIES[e](), clients) for e in endpoints]
    return {**beside_phase(port, rate, duration, seed, loads), "clients_per_endpoint": clients}


def isolation_phase(port: int, rate: float, duration: float, size: int, seed: int) -> dict:
    """Single requests at ``rate`` beside one client posting batches of ``size`` unseen scenarios."""
    body = {"scenarios": random_scenarios(size, seed)}
    phase = beside_batches_phase(port, rate, duration, seed, path="/v1/recommend/batch", body=body, clients=1)
    return {**phase, "batch_size": size}


def score_isolation_phase(port: int, rate: float, duration: float, seed: int) -> dict:
    """Single requests at ``rate`` beside ``SCORE_CLIENTS`` clients posting maximal score batches."""
    body = score_batch_body()
    phase = beside_batches_phase(
        port, rate, duration, seed, path="/v1/score/batch", body=body, clients=SCORE_CLIENTS
    )
    return {**phase, "configs": len(body["configs"]), "token_counts": len(body["tokens"])}


def _with_cpu(pid: int, run) -> dict:
    """``run()``'s result with the CPU seconds of the server and its batch workers over it, how busy the
    whole machine was (%), and the largest resident memory of the server with its workers (MiB, sampled
    every 0.2 s)."""
    cpu_s, worker_s, machine = server_cpu_s(pid), children_cpu_s(pid), machine_jiffies()
    peak, done = [tree_rss_mib(pid)], threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], tree_rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run()
    finally:
        done.set()
        sampler.join()
    return {
        **result,
        "server_cpu_s": round(server_cpu_s(pid) - cpu_s, 2),
        "batch_worker_cpu_s": round(children_cpu_s(pid) - worker_s, 2),
        "machine_busy_pct": busy_pct(machine, machine_jiffies()),
        "peak_rss_mib": round(peak[0], 1),
    }


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its child processes (the server and its workers), MiB (Linux)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(c) for c in (task / "children").read_text().split()]
    total_kib = 0
    for p in pids:
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
            total_kib += int(next(line.split()[1] for line in lines if line.startswith("VmRSS:")))
    return total_kib / 1024


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine since boot, in clock ticks (Linux ``/proc/stat``): what
    every process used, other people's work included."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    total = sum(fields)  # user nice system idle iowait irq softirq steal
    return total - fields[3] - fields[4], total


def busy_pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Percent of all CPUs busy between two ``machine_jiffies`` readings (100 = every core busy)."""
    return round(100 * (after[0] - before[0]) / max(1, after[1] - before[1]), 1)


def children_cpu_s(pid: int) -> float:
    """CPU seconds of the running child processes of ``pid`` (the server's batch workers)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += (task / "children").read_text().split()
    total = 0.0
    for child in children:
        with contextlib.suppress(FileNotFoundError):  # it exited meanwhile
            total += server_cpu_s(int(child))
    return total


def stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds a Linux ``/proc`` stat file records (a process's ``/proc/<pid>/stat``, or
    one thread's ``/proc/<pid>/task/<tid>/stat``)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` (all its threads) has used (Linux ``/proc``)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def server_env() -> dict[str, str]:
    """The ``FICCO_*`` variables the server inherits (its settings beyond the defaults), token hidden."""
    return {
        k: ("***" if "TOKEN" in k else v) for k, v in sorted(os.environ.items()) if k.startswith("FICCO_")
    }


def wait_for_quiet(max_load: float, wait_s: float) -> None:
    """Wait until the machine's 1-minute load average is below ``max_load`` (other work skews latency)."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5)
    print(f"1-minute load average {os.getloadavg()[0]:.2f} (asked for < {max_load:g})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-root", type=Path, default=REPO / "models", help="model registry to serve")
    parser.add_argument("--rates", default="100,300,500", help="comma-separated request rates, req/s")
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help="seconds per phase (30: a p99 at 100 req/s is then the 30th-slowest of 3,000 requests)",
    )
    parser.add_argument("--batch-reps", type=int, default=5, help="timed 10,000-scenario batches")
    parser.add_argument("--model-note", default="", help="how the served model was made (recorded)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/service-cpu", help="results stem"
    )
    parser.add_argument(
        "--quiet-load",
        type=float,
        default=0.0,
        help="first wait (up to --wait-s) for a 1-minute load below this",
    )
    parser.add_argument("--wait-s", type=float, default=900.0, help="longest wait for --quiet-load, seconds")
    parser.add_argument(
        "--hammer",
        default=HAMMERED,
        help="comma-separated endpoints phase 6 hammers: POST paths of BODIES, or 'GET <path>'",
    )
    parser.add_argument(
        "--full-install",
        action="store_true",
        help="serve with every module this environment has (default: as a [service]-only install)",
    )
    parser.add_argument(
        "--startup-only", action="store_true", help="stop after the first minute after ready (phase 1)"
    )
    parser.add_argument(
        "--hammer-clients",
        type=lambda text: tuple(int(c) for c in text.split(",")),
        default=HAMMER_CLIENTS,
        help="clients per endpoint in phase 6, comma-separated: one run per count, the goal is the first's "
        "(default 1,4)",
    )
    args = parser.parse_args()

    if args.quiet_load:
        wait_for_quiet(args.quiet_load, args.wait_s)
    load_at_start = round(os.getloadavg()[0], 2)
    port = _free_port()
    log = Path(tempfile.gettempdir()) / f"ficco-serve-bench-{port}.log"
    with served(args.model_root, port, log, service_only=not args.full_install) as (proc, startup_s):
        ready_at = time.perf_counter()
        startup = startup_phase(port, ready_at, seed=3000)
        print(f"first minute after ready: {startup}", flush=True)
        steady = {} if args.startup_only else steady_phases(proc, port, args)
        model = model_info(port)
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(load_at_start),
        "model": model,
        "model_note": args.model_note,
        "server_env": server_env(),
        "install": "full environment"
        if args.full_install
        else "[service] only (training stack and torch hidden)",
        "startup_s": round(startup_s, 3),
        "startup": startup,
        **steady,
        "goals": GOALS,
    }
    results["goals_met"] = goals_met(results)
    print(write_results(results, args.out))


def steady_phases(proc: subprocess.Popen, port: int, args: argparse.Namespace) -> dict:
    """Phases 2 to 6 of the module docstring, after a warm-up."""
    warm = random_scenarios(300, seed=999)
    load_phase(port, 200, warm)  # warm-up, not recorded
    latency = []
    for kind in ("unseen", "repeated"):
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            count = int(rate * args.duration)
            if kind == "unseen":
                bodies = random_scenarios(count, seed=100 + i)
            else:
                bodies = (random_scenarios(200, seed=7) * (count // 200 + 1))[:count]
            cpu_s, machine = server_cpu_s(proc.pid), machine_jiffies()
            phase = load_phase(port, rate, bodies)
            cpu_ms = 1000 * (server_cpu_s(proc.pid) - cpu_s) / count
            latency.append(
                {
                    "scenarios": kind,
                    **phase,
                    "server_cpu_ms_per_request": round(cpu_ms, 3),
                    "machine_busy_pct": busy_pct(machine, machine_jiffies()),
                }
            )
            print(f"{kind} rate {rate:g}: {latency[-1]}", flush=True)
    batch = batch_phase(port, args.batch_reps, 10_000, seed=5000)
    print(f"batch: {batch}", flush=True)
    isolation = _with_cpu(proc.pid, lambda: isolation_phase(port, 200, args.duration, 10_000, seed=7000))
    print(f"200 req/s beside back-to-back batches: {isolation}", flush=True)
    scoring = _with_cpu(proc.pid, lambda: score_isolation_phase(port, 100, args.duration, seed=8000))
    print(f"100 req/s beside {SCORE_CLIENTS} clients of maximal score batches: {scoring}", flush=True)
    endpoints = [e.strip() for e in args.hammer.split(",") if e.strip()]
    hammering = []
    for clients in args.hammer_clients:
        hammering.append(
            _with_cpu(proc.pid, lambda c=clients: hammer_phase(port, 100, args.duration, 9000, endpoints, c))
        )
        print(f"100 req/s beside {clients} clients per endpoint of {endpoints}: {hammering[-1]}", flush=True)
    return {
        "duration_s": args.duration,
        "latency": latency,
        "batch": batch,
        "beside_batches": isolation,
        "beside_score_batches": scoring,
        "hammer_rate": 100,
        "hammered": endpoints,
        "hammer_clients": list(args.hammer_clients),
        "beside_hammering": hammering,
    }


def goals_met(results: dict) -> dict[str, bool]:
    """Each goal of :data:`GOALS` the results measure, met or not (a phase not run has no line)."""
    out = {}
    s = results["startup"]
    out["start-up <= 3 s"] = results["startup_s"] <= GOALS["startup_s"]
    out["first grid-table GET within 5 s of ready"] = (
        s["first_table_after_ready_s"] <= GOALS["first_table_after_ready_s"]
    )
    out["in the first minute after ready, every 10,000 batch <= 1.5 s"] = (
        s["batch_max_s"] <= GOALS["startup_batch_10k_s"]
    )
    out["in the first minute after ready, sequential /v1/recommend p99 <= 2 ms"] = (
        s["sequential_p99_ms"] <= GOALS["startup_sequential_p99_ms"]
    )
    if "latency" not in results:
        return out
    at_500 = next((p for p in results["latency"] if p["rate"] == 500 and p["scenarios"] == "unseen"), None)
    isolation, scoring = results["beside_batches"], results["beside_score_batches"]
    hammering, clients = results["beside_hammering"], results["hammer_clients"][0]
    out["p99 <= 10 ms at 500 req/s of unseen scenarios, no errors"] = bool(
        at_500 and at_500["p99_ms"] <= GOALS["p99_ms_at_500"] and not at_500["errors"]
    )
    out["p99 <= 25 ms at 200 req/s beside back-to-back 10,000 batches, no errors"] = (
        isolation["p99_ms"] <= GOALS["p99_ms_at_200_beside_batches"] and not isolation["errors"]
    )
    out[f"p99 <= 25 ms at 100 req/s beside {SCORE_CLIENTS} clients of maximal score batches, no errors"] = (
        scoring["p99_ms"] <= GOALS["p99_ms_at_100_beside_score_batches"] and not scoring["errors"]
    )
    out[
        f"p99 <= 10 ms at 100 req/s beside {clients} client(s) per endpoint hammering "
        f"({clients * len(results['hammered'])} clients), no errors"
    ] = hammering[0]["p99_ms"] <= GOALS["p99_ms_at_100_beside_hammering"] and not hammering[0]["errors"]
    out["batch of 10,000 <= 1 s"] = results["batch"]["median_s"] <= GOALS["batch_10k_s"]
    return out


if __name__ == "__main__":
    main()
