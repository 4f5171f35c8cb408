"""The Makefile installs torch for the tests from PyTorch's CPU wheel index where no GPU is present, so a
machine without GPUs downloads no CUDA wheels (issue 50), with the pin of pyproject's [test] extra."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from ficco import CHECKOUT
from ficco.extras import TORCH_CPU_INDEX as CPU_INDEX

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _install_lines(tmp_path: Path, path: str) -> list[str]:
    """The commands ``make`` would run to make the test environment in ``tmp_path`` (dry run), with
    ``path`` as PATH."""
    venv = tmp_path / ".venv"
    done = subprocess.run(
        ["make", "-n", f"VENV={venv}", f"{venv}/.test-installed"],
        cwd=CHECKOUT, env={**os.environ, "PATH": path}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def _pin() -> str:
    test = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "test"
    ]
    (torch,) = [r for r in test if r.startswith("torch")]
    return torch


def test_without_a_gpu_torch_comes_from_the_cpu_index_before_the_test_extra(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").symlink_to(shutil.which("make"))
    lines = _install_lines(
        tmp_path, f"{bin_dir}:/usr/bin:/bin" if not shutil.which("nvidia-smi") else str(bin_dir)
    )
    (torch,) = [i for i, line in enumerate(lines) if f'"{_pin()}"' in line]
    (extra,) = [i for i, line in enumerate(lines) if '-e ".[test]"' in line]
    assert f"--index-url {CPU_INDEX}" in lines[torch] and torch < extra, lines


def test_with_a_gpu_torch_comes_from_the_configured_index(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    lines = _install_lines(tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    (torch,) = [line for line in lines if f'"{_pin()}"' in line]
    assert "--index-url" not in torch, torch
