"""GPU tests (marker ``gpu``): skipped without at least 2 CUDA GPUs; ``make test-gpu`` runs them.

Each test launches torchrun with one rank per GPU (the machine's GPU count) in the NVLink-multicast-off
environment of ``ficco.harness.worker.SAFE_ENV`` and checks the script's output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ficco.harness.worker import SAFE_ENV

REPO = Path(__file__).resolve().parents[2]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS < 2, reason=f"needs >= 2 CUDA GPUs, found {GPUS}"),
]


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    """``args`` run from the repository root in SAFE_ENV; output captured as text."""
    env = {**os.environ, **SAFE_ENV, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _check_ops(ops: str) -> None:
    """``executor_gpu_check.py --ops ops`` under torchrun passes every check."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={GPUS}"]
    proc = _run([*cmd, "tests/gpu/executor_gpu_check.py", "--ops", ops], timeout=580)
    fails = [line for line in proc.stdout.splitlines() if " FAIL " in line]
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, "\n".join(fails) or proc.stderr[-4000:]


@pytest.mark.timeout(600)
def test_every_schedule_eager_and_graph_matches_serial():
    """All 30 schedules of both dense ops, eager and graph-captured with new data, against serial/sm."""
    _check_ops("ag_gemm,gemm_rs")


@pytest.mark.timeout(600)
def test_every_moe_schedule_eager_and_graph_matches_serial():
    """All 30 schedules of the MoE dispatch and combine, balanced, uneven (1.5x) and all-to-rank-0 routing,
    eager and graph-captured with new data, against serial/sm."""
    _check_ops("a2a_gemm,gemm_a2a")


@pytest.mark.timeout(600)
def test_layers_gradients_and_graphs_match_serial():
    """The runtime's column- and row-parallel layers under autograd (every schedule family, bf16 and fp32,
    the gathered input kept and gathered again, the shipped model's planner) and inside CUDA graphs, against
    the serial reference (``tests/runtime/gpu_layers_check.py``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={GPUS}"]
    proc = _run([*cmd, "tests/runtime/gpu_layers_check.py"], timeout=580)
    bad = [line for line in proc.stdout.splitlines() if "FAILED" in line]
    assert proc.returncode == 0 and proc.stdout.count("all within tolerance") == GPUS, (
        "\n".join(bad) or proc.stdout[-2000:] + proc.stderr[-4000:]
    )


@pytest.mark.timeout(600)
def test_tp_styles_give_pytorchs_outputs_and_gradients():
    """``ficco.runtime.tp``'s styles against PyTorch's on 2 GPUs (NCCL, the copy engines), every gradient:
    a biased row-parallel layer (GPT-2 under sequence parallelism), plain tensor-parallel blocks (GPT-2,
    Llama), Llama, Gemma, a fused gate/up MLP, an MLP that views its input, an uneven projection; fp32 and
    bf16; schedules of both executors (``tests/runtime/gpu_tp_check.py``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    proc = _run([*cmd, "tests/runtime/gpu_tp_check.py"], timeout=580)
    fails = [line for line in proc.stdout.splitlines() if " FAIL " in line]
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, "\n".join(fails) or proc.stderr[-4000:]


@pytest.mark.timeout(600)
def test_harness_smoke_sweep(tmp_path):
    """``ficco bench --backend gpu`` runs a small sweep end to end (one model family, 8 scenarios)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(REPO / "datasets" / "model_configs" / "Llama-3.1-8B.json", configs)
    args = ["--backend", "gpu", "--grid", "4", "--tokens", "1024", "--configs", str(configs)]
    args += ["--out", str(tmp_path / "sweep")]
    args += ["--tp", str(GPUS)]
    proc = _run([sys.executable, "-m", "ficco.cli", "bench", *args], timeout=580)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.timeout(600)
def test_harness_smoke_sweep_moe_ops(tmp_path):
    """``ficco bench --backend gpu --ops all`` measures a MoE layer's pairs: Mixtral-8x7B at 1k tokens
    (QKV, attention out, the dispatch a2a_gemm and the combine gemm_a2a), every schedule ok in both modes."""
    from ficco.features.dataset import load_dataset

    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(REPO / "datasets" / "model_configs" / "Mixtral-8x7B-v0.1.json", configs)
    args = ["--backend", "gpu", "--ops", "all", "--grid", "0", "--tokens", "1024", "--configs", str(configs)]
    args += ["--out", str(tmp_path / "sweep"), "--tp", str(GPUS)]
    proc = _run([sys.executable, "-m", "ficco.cli", "bench", *args], timeout=580)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    df = load_dataset(tmp_path / "sweep")
    moe = df[df["op"].isin(["a2a_gemm", "gemm_a2a"])]
    assert set(moe["op"]) == {"a2a_gemm", "gemm_a2a"} and set(moe["mode"]) == {"eager", "graph"}
    assert moe["ok"].all(), moe[~moe["ok"]][["scenario_id", "mode", "schedule", "error"]].to_string()
    assert (moe[["gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms"]] > 0).all().all()
