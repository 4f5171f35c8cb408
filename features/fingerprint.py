"""Fingerprints: what a dataset's timings depend on, recorded in its manifest and compared on resume.

GPU: GPU name and count, interconnect (from ``nvidia-smi topo -m``), driver, CUDA, torch and NCCL
versions and the world size. CPU (gloo): CPU model and torch version. The hostname is never recorded:
two identical machines give the same fingerprint, and a dataset names no host.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections import Counter
from typing import Any

from ficco.features.schedule_table import FINGERPRINT_KEYS

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"GPU\d+")


def parse_topology(text: str) -> str:
    """The links between distinct GPUs in ``nvidia-smi topo -m`` output, e.g. ``NV18`` when all pairs are
    joined by 18 NVLinks, or ``NV18 x12, SYS x16`` for a mixed machine; ``unknown`` if no GPU matrix."""
    rows = [_ANSI.sub("", line).split() for line in text.splitlines()]
    # The column header is the first line naming GPU0; the matrix rows follow it, one per GPU.
    start = next((i for i, tokens in enumerate(rows) if "GPU0" in tokens), None)
    if start is None:
        return "unknown"
    header = rows[start]
    columns = [i for i, token in enumerate(header) if _GPU.fullmatch(token)]
    links: dict[tuple[str, str], str] = {}
    for tokens in rows[start + 1 :]:
        if len(tokens) < 2 or not _GPU.fullmatch(tokens[0]):
            continue
        for i in columns:
            peer = header[i]
            if peer != tokens[0] and i + 1 < len(tokens):
                links[tuple(sorted((tokens[0], peer)))] = tokens[i + 1]
    if not links:
        return "unknown"
    counts = Counter(links.values())
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{link} x{n}" for link, n in sorted(counts.items()))


def _run(args: list[str]) -> str | None:
    """stdout of ``args``, or None when the tool is missing or fails."""
    if shutil.which(args[0]) is None:
        return None
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def gpu_fingerprint(world_size: int) -> dict:
    """Fingerprint of this CUDA machine (imports torch)."""
    import torch

    query = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) or ""
    gpus = [line.split(",") for line in query.strip().splitlines() if "," in line]
    topology = _run(["nvidia-smi", "topo", "-m"])
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {
        "backend": "gpu",
        "gpu_name": gpus[0][0].strip() if gpus else torch.cuda.get_device_name(0),
        "gpu_count": len(gpus) or torch.cuda.device_count(),
        "interconnect": parse_topology(topology) if topology else "unknown (no nvidia-smi)",
        "driver": gpus[0][1].strip() if gpus else "unknown",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "world_size": world_size,
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_fingerprint(world_size: int) -> dict:
    """Fingerprint of a CPU (gloo) run (imports torch)."""
    import torch

    return {"backend": "gloo", "cpu": cpu_model(), "torch": torch.__version__, "world_size": world_size}


def fingerprint_differences(recorded: dict, current: dict) -> list[str]:
    """``key: recorded vs current`` for every key whose value differs (or exists on one side only)."""
    keys = sorted(set(recorded) | set(current))
    return [
        f"{key}: {recorded.get(key, '<absent>')!r} in the dataset vs {current.get(key, '<absent>')!r} here"
        for key in keys
        if recorded.get(key) != current.get(key)
    ]


def machine_fingerprint() -> dict[str, Any] | None:
    """This machine's ``features.schedule_table.FINGERPRINT_KEYS``: its GPUs' name and count from
    ``nvidia-smi`` (no torch needed, so a runtime reads tables without it), else from torch's CUDA devices
    where torch is installed; None without either (then nothing can be checked)."""
    query = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or ""
    names = [line.strip() for line in query.splitlines() if line.strip()]
    if not names:
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found = {"backend": "gpu", "gpu_name": names[0], "gpu_count": len(names)}
    return {k: found[k] for k in FINGERPRINT_KEYS}
