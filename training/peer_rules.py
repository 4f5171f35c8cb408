"""The peer rules that choose between serial and PyTorch async-TP by thresholds: vLLM's sequence-parallelism
rule (``vllm_sp_rule``) and PyTorch PR #176943's fuse/no-fuse tree (``pytorch_autoheuristic``); their
sources and thresholds: docs/training.md, "Baselines". numpy and the feature types only, so that the
benchmarks that run these rules on a GPU machine (``benchmarks/runtimes.py``) need no training stack.
"""

from __future__ import annotations

import numpy as np

from ficco.features import DTYPE_BYTES, HardwareProfile, Scenario

SP_MIN_HIDDEN_SIZE: dict[int, int] = {90: 8192, 100: 8192}
"""vLLM's smallest hidden size for sequence parallelism + async-TP, per compute capability (sm90 Hopper,
sm100 Blackwell); a capability it does not list never gets them."""
SP_MIN_PER_GPU_SIZE_MB: dict[int, float] = {90: 8, 100: 32}
"""vLLM's smallest activation size per GPU, MiB, per compute capability: ``min_tokens`` scales it by tp."""
MIB = 1024 * 1024
CAPABILITY_OF_GPU: dict[str, int] = {"H100": 90, "H200": 90, "H800": 90, "H20": 90, "B200": 100, "GB200": 100}
"""Compute capability (major * 10 + minor) by the GPU model in ``HardwareProfile.gpu_name``."""
AUTOHEURISTIC_NEVER_MN = 403e6
"""PR #176943's tree: ``m * n`` above this never fuses (the output is so large communication dominates)."""
AUTOHEURISTIC_SMALL_MN = 14e6
"""PR #176943's tree: ``m * n`` up to this fuses only when ``m * k`` exceeds ``AUTOHEURISTIC_SMALL_MK``."""
AUTOHEURISTIC_SMALL_MK = 26e6
"""PR #176943's tree: the ``m * k`` a small-output GEMM needs to fuse."""


def compute_capability(hardware: HardwareProfile) -> int | None:
    """``hardware``'s GPU compute capability as vLLM keys it (90 for H100/H200), None when unknown."""
    for model, capability in CAPABILITY_OF_GPU.items():
        if model in hardware.gpu_name.split():
            return capability
    return None


def rule_hidden_size(scenario: Scenario) -> int:
    """The hidden size vLLM's rule reads for ``scenario``'s GEMM: ``k`` for an all-gather (the gathered
    activations are ``[m, k]``), ``n`` for a reduce-scatter (the scattered output is ``[m, n]``)."""
    return scenario.k if scenario.op == "ag_gemm" else scenario.n


def vllm_sp_min_tokens(hidden: int, tp: int, elem_bytes: int, capability: int | None) -> int | None:
    """vLLM's ``get_sequence_parallelism_threshold``: the fewest tokens that get sequence parallelism and
    async-TP, or None when they are off (capability unlisted or ``hidden`` below its minimum)."""
    if capability not in SP_MIN_HIDDEN_SIZE or hidden < SP_MIN_HIDDEN_SIZE[capability]:
        return None
    return int(SP_MIN_PER_GPU_SIZE_MB[capability] * tp * MIB) // (hidden * elem_bytes)


def vllm_sp_rule(scenarios: tuple[Scenario, ...]) -> np.ndarray:
    """vLLM's rule on each scenario: True where it runs async-TP (``m >= min_tokens``), bool ``[n]``."""
    out = np.zeros(len(scenarios), dtype=bool)
    for i, s in enumerate(scenarios):
        floor = vllm_sp_min_tokens(rule_hidden_size(s), s.world_size, DTYPE_BYTES[s.dtype],
                                   compute_capability(s.hardware))  # fmt: skip
        out[i] = floor is not None and s.m >= floor
    return out


def autoheuristic_fuse(m: int, n: int, k: int) -> bool:
    """PyTorch PR #176943's fuse/no-fuse tree on a GEMM of ``m`` (gathered) rows, ``n`` columns and
    reduction ``k``: True = fuse (async-TP)."""
    if m * n > AUTOHEURISTIC_NEVER_MN:
        return False
    if m * n <= AUTOHEURISTIC_SMALL_MN:
        return m * k > AUTOHEURISTIC_SMALL_MK
    return True


def pytorch_autoheuristic(scenarios: tuple[Scenario, ...]) -> np.ndarray:
    """:func:`autoheuristic_fuse` of each scenario, bool ``[n]``."""
    return np.array([autoheuristic_fuse(s.m, s.n, s.k) for s in scenarios], dtype=bool)
