"""The wheel as users install it: only ``ficco`` at the top level, the shipped model inside, and an installed
(non-editable) copy that answers ``ficco recommend`` from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        out,
        REPO_ROOT,
    ]
    subprocess.run([str(c) for c in command], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("ficco-*.whl")
    return path


def test_wheel_claims_only_ficco_and_ships_the_default_model(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ficco", wheel.name.split("-py3")[0] + ".dist-info"}
    for package in ("features", "executor", "harness", "training", "service", "runtime"):
        assert f"ficco/{package}/__init__.py" in names
    current = (REPO_ROOT / "models" / "h200x2" / "CURRENT").read_text().strip()
    assert "ficco/models/h200x2/CURRENT" in names
    assert f"ficco/models/h200x2/{current}/card.json" in names


def test_installed_wheel_recommends_from_any_directory(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FICCO_")}
    env["PYTHONPATH"] = str(target)  # ahead of the editable install of the checkout
    command = [sys.executable, "-m", "ficco.cli", "recommend", "--op", "ag_gemm", "--m", "16384"]
    command += ["--n", "14336", "--k", "4096"]
    done = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "schedule" in done.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import ficco.features; print(ficco.features.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target))
