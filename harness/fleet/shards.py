"""Shards of a sweep: one deterministic, disjoint part of a plan per machine, balanced by estimated GPU time.

Shard ``I`` of ``N`` measures into ``OUT/shards/shard-0000I-of-0000N/``, an ordinary dataset directory
whose ``plan.json`` records in ``settings["shard"]`` its index, count, the whole plan's hash and its
positions; every part carries its :func:`provenance`. See docs/fleet.md, "Shards".
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import math
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ficco.harness.plan import Plan

SHARDS_DIR = "shards"
"""Folder of ``--out`` that holds the shards' dataset directories."""
RUNS = "runs.jsonl"
"""File of a shard directory: one JSON line per run of the shard (machine, engine, job, progress before)."""
COST_DIGITS = 3
"""Significant digits of the estimated seconds the split is computed from."""
VOLATILE_SETTINGS = ("estimated_minutes", "shard")
"""Plan settings left out of :func:`plan_hash`: they differ between the shards of one plan."""
SHARD_COUNT_ENV = "FICCO_SHARD_COUNT"
"""Environment variable with the shard count beside ``JOB_COMPLETION_INDEX`` (Kubernetes sets only the
index; the manifest of ``ficco fleet emit k8s`` sets this to the Job's completions)."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based)."""

    index: int
    """Which part of the plan, in ``[0, count)``."""
    count: int
    """How many parts the plan is split into (>= 1)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and 1 <= self.count <= 100_000):
            raise ValueError(f"shard count must be an int in [1, 100000]; got {self.count!r}")
        if not (isinstance(self.index, int) and 0 <= self.index < self.count):
            raise ValueError(f"shard index must be an int in [0, {self.count - 1}]; got {self.index!r}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def name(self) -> str:
        """The shard's directory name, e.g. ``shard-00002-of-00004``."""
        return f"shard-{self.index:05d}-of-{self.count:05d}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"`` -> ``Shard(I, N)``; ``ValueError`` naming the value otherwise."""
        index, sep, count = text.partition("/")
        try:
            if not sep:
                raise ValueError
            return cls(int(index), int(count))
        except ValueError as err:
            why = f": {err}" if str(err) else ""
            raise ValueError(f"a shard is I/N with 0 <= I < N, e.g. 0/4; got {text!r}{why}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardedSweep:
    """A sweep run as shards on a cluster (``ficco fleet emit`` / ``run``): what its jobs need."""

    out: Path
    """The dataset folder (``--out``); the shards measure into its ``SHARDS_DIR``."""
    shards: int
    backend: str
    """``gpu``, ``gloo`` or ``sim``."""
    world_size: int
    """GPUs (gloo: CPU ranks) of one shard's sweep (``--tp``)."""
    share_nodes: bool
    """Shards may share a node (``--share-nodes``); else each holds a whole node (gpu)."""
    max_retries: int
    """Runs of a failed shard beyond its first."""


def shard_from_env(env: Mapping[str, str]) -> Shard | None:
    """The shard of a Slurm job array task (``SLURM_ARRAY_TASK_ID`` less ``SLURM_ARRAY_TASK_MIN``, of
    ``SLURM_ARRAY_TASK_COUNT``) or of a Kubernetes indexed Job pod (``JOB_COMPLETION_INDEX`` of
    ``SHARD_COUNT_ENV``); None outside both. ``ValueError`` names a variable that is set but unusable."""
    if "SLURM_ARRAY_TASK_ID" in env:
        first = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        index, count = _ints(env, ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"))
        return Shard(index - first, count)
    if "JOB_COMPLETION_INDEX" in env:
        return Shard(*_ints(env, ("JOB_COMPLETION_INDEX", SHARD_COUNT_ENV)))
    return None


def _ints(env: Mapping[str, str], names: tuple[str, str]) -> tuple[int, int]:
    try:
        return int(env[names[0]]), int(env[names[1]])
    except (KeyError, ValueError):
        values = ", ".join(f"{n}={env.get(n, '<unset>')!r}" for n in names)
        raise ValueError(
            f"a shard from the environment needs integer {' and '.join(names)}; got {values}"
        ) from None


def assign(costs: Sequence[float], count: int) -> list[int]:
    """The shard of each position of ``costs`` (seconds): longest first, to the least loaded shard (ties:
    the lower position, the lower shard), costs rounded to ``COST_DIGITS`` significant digits."""
    rounded = [float(f"{c:.{COST_DIGITS}g}") if math.isfinite(c) and c > 0 else 0.0 for c in costs]
    order = sorted(range(len(rounded)), key=lambda i: (-rounded[i], i))
    loads = [(0.0, shard) for shard in range(count)]
    owner = [0] * len(rounded)
    for i in order:
        load, shard = heapq.heappop(loads)
        owner[i] = shard
        heapq.heappush(loads, (load + rounded[i], shard))
    return owner


def plan_hash(plan: Plan) -> str:
    """SHA-256 of the plan's scenarios (in order) and settings, less ``VOLATILE_SETTINGS``; a shard's part of
    a plan (:func:`shard_plan`) answers the hash of the whole plan, the same for every shard."""
    if "shard" in plan.settings:
        return plan.settings["shard"]["plan_hash"]
    settings = {k: v for k, v in plan.settings.items() if k not in VOLATILE_SETTINGS}
    entries = [[family, s.to_dict()] for family, s in plan.entries]
    text = json.dumps({"settings": settings, "entries": entries}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def shard_plan(plan: Plan, shard: Shard, costs: Sequence[float]) -> Plan:
    """The part of ``plan`` that ``shard`` measures (plan order) given each scenario's estimated seconds
    ``costs``; its ``settings["shard"]`` records the shard, the plan hash, its positions and seconds."""
    if len(costs) != len(plan):
        raise ValueError(f"costs must give one time per plan scenario ({len(plan)}); got {len(costs)}")
    owner = assign(costs, shard.count)
    positions = [i for i, o in enumerate(owner) if o == shard.index]
    entries = tuple(plan.entries[i] for i in positions)
    keys = {s.key() for _, s in entries}
    record = {
        "index": shard.index,
        "count": shard.count,
        "plan_hash": plan_hash(plan),
        "plan_scenarios": len(plan),
        "positions": positions,
        "estimated_seconds": round(sum(costs[i] for i in positions), 1),
    }
    return dataclasses.replace(
        plan,
        entries=entries,
        shared={k: v for k, v in plan.shared.items() if k in keys},
        settings={**plan.settings, "shard": record},
    )


def shard_dir(out: Path, shard: Shard) -> Path:
    """Where ``shard`` of a sweep with ``--out out`` is measured."""
    return out / SHARDS_DIR / shard.name


def code_version() -> str:
    """``ficco.__version__``, plus ``+g<commit>`` (and ``.dirty``) in a git checkout."""
    from ficco import CHECKOUT, __version__

    if CHECKOUT is None:  # an installed ficco: no git checkout to read
        return __version__

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=20, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return __version__
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{__version__}+g{commit}{'.dirty' if dirty else ''}"


def machine_id() -> str:
    """A stable 12-hex-digit id of this machine (a hash of its host name and ``/etc/machine-id``): shards
    run on one machine share it, and it names no host."""
    try:
        system = Path("/etc/machine-id").read_text().strip()
    except OSError:
        system = ""
    return hashlib.sha256(f"{socket.gethostname()}|{system}".encode()).hexdigest()[:12]


def provenance(plan: Sequence[Any], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What every part of a sweep of ``plan`` records in its Parquet metadata: the backend's
    ``fingerprint``, the plan hash (None for a bare list of scenarios), the code version and the shard."""
    is_plan = isinstance(plan, Plan)
    shard = plan.settings.get("shard") if is_plan else None
    return {
        "fingerprint": fingerprint,
        "plan_hash": plan_hash(plan) if is_plan else None,
        "code_version": code_version(),
        "shard": None if shard is None else f"{shard['index']}/{shard['count']}",
    }


def runner_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Which engine runs this process and its job id: ``ray`` (``FICCO_RAY_JOB``), ``slurm``, ``k8s`` or
    ``local``; and whether the node's GPUs are shared with other shards (``FICCO_SHARED_NODE=1``)."""
    if "FICCO_RAY_JOB" in env:
        engine, job = "ray", env["FICCO_RAY_JOB"]
    elif "SLURM_JOB_ID" in env:
        engine, job = "slurm", env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
    elif "JOB_COMPLETION_INDEX" in env:
        engine, job = "k8s", env.get("HOSTNAME", "")
    else:
        engine, job = "local", ""
    return {"engine": engine, "job": job, "shared_node": env.get("FICCO_SHARED_NODE") == "1"}


def record_run(directory: Path, *, finished_before: int, env: Mapping[str, str] = os.environ) -> None:
    """Append this run of the shard in ``directory`` to its ``RUNS`` file (created with the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    line = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_id(),
        "code_version": code_version(),
        "finished_before": finished_before,
        **runner_env(env),
    }
    with open(directory / RUNS, "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def read_runs(directory: Path) -> list[dict[str, Any]]:
    """The runs of the shard in ``directory`` (:func:`record_run`), oldest first; [] if none."""
    path = directory / RUNS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def in_order(plan: Plan, keys: Sequence[str], source: str = "the order") -> Plan:
    """``plan`` with its scenarios in the order of ``keys`` (scenario ids, e.g. ``ficco retrain
    --order-only``'s ``order.json``), those ``keys`` does not name after them in plan order; each shard of it
    then measures its scenarios in that order. ``ValueError`` naming ``source`` when it names none of the
    plan's scenarios (an order of another plan)."""
    rank = {key: i for i, key in enumerate(keys)}
    named = [e for e in plan.entries if e[1].key() in rank]
    if plan.entries and not named:
        raise ValueError(f"{source} names none of the plan's {len(plan)} scenarios: it is of another plan")
    rest = [e for e in plan.entries if e[1].key() not in rank]
    entries = tuple(sorted(named, key=lambda e: rank[e[1].key()])) + tuple(rest)
    return dataclasses.replace(plan, entries=entries, settings={**plan.settings, "order": source})
