"""``ficco fleet run ADDRESS``: the shards of a sweep as Ray tasks, one placement group each, then gathered.

Each task runs ``ficco fleet shard --shard I/N ...`` in a subprocess inside a placement group of one bundle
packed on one node (:func:`shard_bundle`); Ray retries a task whose worker dies or whose sweep fails, and the
retry resumes the shard. Ray is an optional dependency (``pip install 'ficco[fleet]'``). See docs/fleet.md.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ficco.features.dataset import read_manifest
from ficco.harness.fleet.shards import Shard, ShardedSweep, shard_dir

POLL_SECONDS = 1.0
"""Seconds between progress updates while shards run."""
LOG = "bench.log"
"""File of a shard directory collecting the output of every run of the shard under Ray."""


class ShardFailed(RuntimeError):
    """A shard's sweep process exited non-zero or was killed (Ray retries the task)."""


def shard_bundle(
    backend: str, world_size: int, *, share_nodes: bool, node_gpus: Sequence[float]
) -> dict[str, float]:
    """The one bundle a shard's placement group holds, given the GPUs of each alive node (``node_gpus``):
    gpu, the whole node unless ``share_nodes``; gloo ``world_size`` CPUs; sim 1. ``ValueError`` says why no
    node fits."""
    if backend == "sim":
        return {"CPU": 1}
    if backend == "gloo":
        return {"CPU": float(world_size)}
    sizes = sorted({int(g) for g in node_gpus if g >= world_size})
    if not sizes:
        raise ValueError(
            f"no node of the Ray cluster has {world_size} GPUs (--tp {world_size}); nodes have "
            f"{sorted(int(g) for g in node_gpus)} GPUs"
        )
    if share_nodes:
        return {"CPU": 1, "GPU": float(world_size)}
    if len(sizes) > 1:
        raise ValueError(
            f"the cluster's GPU nodes differ in size ({sizes} GPUs): a node of each size is another "
            "machine (another fingerprint); run one sweep per node type"
        )
    return {"CPU": 1, "GPU": float(sizes[0])}


def run_shard(argv: Sequence[str], shard: Shard, out: Path, env: dict[str, str]) -> int:
    """The Ray task of one shard: ``ficco fleet shard --shard I/N *argv --out out`` in a subprocess, its
    output appended to the shard's ``LOG``; returns the scenarios the shard has finished. Raises
    ``ShardFailed`` when the subprocess fails."""
    from ficco.harness.launch import REPO_ROOT, launch_env

    directory = shard_dir(out, shard)
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "ficco.cli", "fleet", "shard", "--shard", str(shard), *argv]
    command += ["--out", str(out)]
    with open(directory / LOG, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        code = subprocess.run(
            command, env={**launch_env(), **env}, cwd=REPO_ROOT, stdout=log, stderr=log, check=False
        ).returncode
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        raise ShardFailed(f"shard {shard} {how}; its output: {directory / LOG}")
    return _finished_in(directory)


def run_on_ray(address: str, sweep: ShardedSweep, *, argv: Sequence[str], scenarios: int) -> list[Path]:
    """Run the shards of ``sweep``, the sweep ``argv`` (``ficco bench`` options, without ``--out``), as Ray
    tasks on the connected cluster, with a progress bar over the plan's ``scenarios``; returns the shard
    directories. Raises ``RuntimeError`` naming the shards that failed after their retries."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from tqdm import tqdm

    out, shards, world_size = sweep.out, sweep.shards, sweep.world_size

    connect(address)
    node_gpus = [n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"]]
    bundle = shard_bundle(sweep.backend, world_size, share_nodes=sweep.share_nodes, node_gpus=node_gpus)
    shared = sweep.backend == "gpu" and sweep.share_nodes and max(node_gpus) >= 2 * world_size
    env = {"FICCO_RAY_JOB": ray.get_runtime_context().get_job_id(), "FICCO_SHARED_NODE": str(int(shared))}
    task = ray.remote(run_shard)
    pending = {}
    for index in range(shards):
        group = placement_group([bundle], strategy="STRICT_PACK", name=f"ficco-shard-{index}-of-{shards}")
        options: dict[str, Any] = {
            "num_cpus": bundle.get("CPU", 0),
            "num_gpus": bundle.get("GPU", 0),
            "max_retries": sweep.max_retries,
            "retry_exceptions": [ShardFailed],
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        }
        shard = Shard(index, shards)
        pending[task.options(**options).remote(list(argv), shard, out, env)] = (shard, group)
    failed: dict[str, str] = {}
    bar = tqdm(total=scenarios, desc=f"{shards} shards", unit="scenario", mininterval=5.0)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            for ref in done:
                shard, group = pending.pop(ref)
                remove_placement_group(group)  # its resources go to a shard still waiting
                try:
                    ray.get(ref)
                except Exception as err:  # retries exhausted: report it, let the other shards finish
                    failed[str(shard)] = str(err).strip().splitlines()[-1]
            bar.set_postfix(running=len(pending), failed=len(failed), refresh=False)
            bar.update(_finished(out, shards) - bar.n)
    finally:
        bar.close()
        for _, group in pending.values():  # interrupted: give back what is still held
            remove_placement_group(group)
    if failed:
        lines = "\n  ".join(f"shard {s}: {why}" for s, why in failed.items())
        raise RuntimeError(
            f"{len(failed)} of {shards} shards failed after {sweep.max_retries} retries:\n  {lines}\n"
            "The same command resumes them (finished shards are skipped)"
        )
    return [shard_dir(out, Shard(i, shards)) for i in range(shards)]


def _finished(out: Path, shards: int) -> int:
    """Scenarios finished over every shard of ``out`` (from their manifests)."""
    return sum(_finished_in(shard_dir(out, Shard(index, shards))) for index in range(shards))


def _finished_in(directory: Path) -> int:
    """Scenarios the shard in ``directory`` has finished (its manifest's; 0 before it has one)."""
    manifest = read_manifest(directory)
    return 0 if manifest is None else len(manifest["finished"])


def default_shards(backend: str, world_size: int, share_nodes: bool) -> int:
    """Shards when ``--shards`` is not given: one per GPU node (``share_nodes``: per ``world_size`` GPUs of
    the cluster) for gpu, one per ``world_size`` CPUs for gloo and one per CPU for sim (Ray connected)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    if backend == "gpu":
        gpus = [r.get("GPU", 0.0) for r in nodes]
        if share_nodes:
            return max(1, sum(int(g // world_size) for g in gpus))
        return max(1, sum(g >= world_size for g in gpus))
    cpus = sum(r.get("CPU", 0.0) for r in nodes)
    return max(1, math.floor(cpus / (world_size if backend == "gloo" else 1)))


CONNECT_TIMEOUT_S = 10.0
"""Seconds ``ficco fleet run ADDRESS`` waits for the cluster's head to accept a connection (Ray itself would
retry for minutes, silently)."""


def head_address(address: str) -> tuple[str, int] | None:
    """(host, port) of the head that ``ray.init(address)`` connects to: ``auto`` as Ray finds it
    (``RAY_ADDRESS``, then the cluster this machine started last), ``ray://host:port`` or ``host:port``;
    None for ``local`` (a cluster started here). ``ConnectionError`` when ``auto`` finds none."""
    from ray._private.services import canonicalize_bootstrap_address

    if address.startswith("ray://"):
        host, _, port = address.removeprefix("ray://").rpartition(":")
        return host, int(port or 10001)
    found = canonicalize_bootstrap_address(address)
    if found is None:
        return None
    host, _, port = found.rpartition(":")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """``ConnectionError`` naming ``address`` when the head it names does not accept a TCP connection within
    ``timeout_s`` seconds."""
    try:
        head = head_address(address)
    except ValueError as err:
        raise ConnectionError(f"Ray address {address!r}: {err}; give auto, local or HOST:PORT") from None
    except ConnectionError:
        raise ConnectionError(
            f"Ray address {address!r}: no running Ray cluster found (RAY_ADDRESS is unset and this machine "
            "started none): start one (`ray start --head`) and name its address, or give local"
        ) from None
    if head is None:
        return
    try:
        socket.create_connection(head, timeout=timeout_s).close()
    except OSError as err:
        why = (
            f"no answer within {timeout_s:g} s" if isinstance(err, TimeoutError) else str(err.strerror or err)
        )
        raise ConnectionError(
            f"Ray address {address!r}: no Ray cluster answers at {head[0]}:{head[1]} ({why.lower()}); start "
            f"its head there (`ray start --head --port {head[1]}`), or give local to start one here"
        ) from None


def connect(address: str) -> None:
    """Connect to (``auto``, an address) or start (``local``) the Ray cluster at ``address`` once; a head that
    does not answer within ``CONNECT_TIMEOUT_S`` is a ``ConnectionError`` (:func:`check_reachable`)."""
    import ray

    if not ray.is_initialized():
        check_reachable(address)
        started = time.perf_counter()
        ray.init(address=None if address == "local" else address)
        print(f"ray: connected in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
