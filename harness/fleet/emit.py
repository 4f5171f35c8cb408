"""``ficco fleet emit slurm|k8s``: the job that runs a sweep's shards on a cluster scheduler: a Slurm job
array script (:func:`slurm_script`) or a Kubernetes indexed Job (:func:`k8s_job`), one task per shard, each
resuming its shard when rerun. See docs/fleet.md, "Slurm and Kubernetes".
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from ficco.files import write_text_atomic
from ficco.harness.fleet.shards import SHARD_COUNT_ENV, SHARDS_DIR, ShardedSweep


class Engine(StrEnum):
    """Cluster schedulers ``--emit`` writes a job for."""

    slurm = "slurm"
    k8s = "k8s"


SCRIPT = {Engine.slurm: "bench.sbatch", Engine.k8s: "bench-job.json"}
"""File name of the emitted job, in ``OUT/shards/``."""
K8S_PVC = "ficco-datasets"
"""Default PersistentVolumeClaim holding ``--out`` in the Kubernetes Job."""


def gather_command(out: Path) -> str:
    """The command that unions the shards of ``--out out`` into the dataset at ``out``."""
    return shlex.join(["ficco", "dataset", "gather", str(out / SHARDS_DIR), "--out", str(out)])


def slurm_script(command: Sequence[str], sweep: ShardedSweep, *, name: str) -> str:
    """The ``sbatch`` job array script running ``command`` (``ficco fleet shard`` with ``--out``, no
    ``--shard``) once per shard of ``sweep``."""
    out = sweep.out
    gpu = sweep.backend == "gpu"
    directives = [
        f"--job-name={name}",
        f"--array=0-{sweep.shards - 1}",
        "--nodes=1",
        "--ntasks=1",
        *([f"--gres=gpu:{sweep.world_size}"] if gpu else []),
        f"--cpus-per-task={max(sweep.world_size, 2) if sweep.backend != 'sim' else 1}",
        *(["--exclusive"] if gpu and not sweep.share_nodes else []),
        "--requeue",
        f"--output={out / SHARDS_DIR}/slurm-%A_%a.log",
    ]
    lines = [
        "#!/bin/bash",
        f"# ficco fleet, {sweep.shards} shards: one array task per shard "
        "(written by `ficco fleet emit slurm`).",
        "# Submit: sbatch " + shlex.quote(str(out / SHARDS_DIR / SCRIPT[Engine.slurm])),
        "# A task run again (scontrol requeue JOBID_I; --requeue lets Slurm requeue a preempted one)",
        "# resumes its shard. After every task has finished:",
        f"#   {gather_command(out)}",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        *(
            ["export FICCO_SHARED_NODE=1  # --share-nodes: the dataset card notes the co-tenancy"]
            if sweep.share_nodes
            else []
        ),
        ': "${SLURM_ARRAY_TASK_ID:?run this script as a job array task (sbatch), or set it by hand}"',
        shlex.join(command),
    ]
    return "\n".join(lines) + "\n"


def k8s_job(
    command: Sequence[str], sweep: ShardedSweep, *, name: str, image: str, claim: str = K8S_PVC
) -> dict[str, Any]:
    """The ``batch/v1`` indexed Job running ``command`` (``ficco fleet shard`` with ``--out``) once per shard
    of ``sweep``."""
    labels = {"app.kubernetes.io/name": "ficco-bench", "ficco/sweep": name}
    resources = (
        {"limits": {"nvidia.com/gpu": str(sweep.world_size)}}
        if sweep.backend == "gpu"
        else {"requests": {"cpu": str(sweep.world_size if sweep.backend == "gloo" else 1)}}
    )
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "bench",
                "image": image,
                "command": list(command),
                "env": [
                    {"name": SHARD_COUNT_ENV, "value": str(sweep.shards)},
                    *(
                        [{"name": "FICCO_SHARED_NODE", "value": "1"}]
                        if sweep.share_nodes and sweep.backend == "gpu"
                        else []
                    ),
                ],
                "resources": resources,
                "volumeMounts": [{"name": "datasets", "mountPath": str(sweep.out)}],
            }
        ],
        "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": claim}}],
    }
    if not sweep.share_nodes:
        term = {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
        pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": sweep.shards,
            "parallelism": sweep.shards,
            "backoffLimitPerIndex": sweep.max_retries,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def job_name(hardware_id: str, backend: str) -> str:
    """A DNS-1123 job name for a sweep of ``hardware_id`` on ``backend`` (``ficco-bench-h100x8``)."""
    suffix = "" if backend == "gpu" else f"-{backend}"
    return re.sub(r"[^a-z0-9-]+", "-", f"ficco-bench-{hardware_id}{suffix}".lower()).strip("-")[:63]


def write_job(
    engine: Engine, command: Sequence[str], sweep: ShardedSweep, *, hardware_id: str, image: str
) -> Path:
    """Write the ``engine`` job of ``sweep`` into ``OUT/shards/`` (see the module docstring); return it."""
    name = job_name(hardware_id, sweep.backend)
    path = sweep.out / SHARDS_DIR / SCRIPT[engine]
    path.parent.mkdir(parents=True, exist_ok=True)
    if engine is Engine.slurm:
        write_text_atomic(path, slurm_script(command, sweep, name=name), mode=0o755)
    else:
        write_text_atomic(path, json.dumps(k8s_job(command, sweep, name=name, image=image), indent=2) + "\n")
    return path
