"""benchmarks/studies/eager_vs_graph.py times on a GPU; without one it says so, and it names bad arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks.studies.eager_vs_graph", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_bad_block_sizes_are_named():
    done = _run("--calls", "0", "--out", "unused.json")
    assert done.returncode == 2 and "--calls and --rounds must be 1-1000; got 0, 15" in done.stderr


@pytest.mark.heavy
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_without_a_gpu_it_says_it_needs_one(tmp_path):
    done = _run("--out", str(tmp_path / "x.json"))
    assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr
