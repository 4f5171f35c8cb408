"""The wheel as users install it: only ``ficco`` at the top level, the shipped model inside, and a
non-editable install in a fresh virtual environment answers ``ficco recommend`` from any directory.

Offline and fast: the wheel is built without build isolation and installed without dependencies; the fresh
environment sees this environment's third-party packages through a ``.pth`` line (not ficco itself: the
editable install's finder is registered by a ``.pth`` file that a ``.pth``-added directory does not run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / "models" / "h200x2"


def _run(*command: object, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _source_copy(dest: Path) -> Path:
    """The files the wheel is built from (pyproject's package-dir folders), copied to ``dest``: setuptools
    writes ``build/`` beside the sources, and a stale one there could put deleted modules in the wheel."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, dest / name)
    for folder in config["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(REPO_ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = _source_copy(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("wheel")
    build = ["-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", out]
    _run(sys.executable, *build, source, cwd=source)
    (path,) = out.glob("ficco-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The ``bin`` directory of a fresh virtual environment holding the wheel (not editable)."""
    venv = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv)
    python = venv / "bin" / "python"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv)
    Path(purelib.strip(), "third-party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = ["-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel]
    _run(sys.executable, *install, cwd=venv)
    return venv / "bin"


def test_wheel_claims_only_ficco_and_ships_the_current_model(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ficco", "ficco-0.1.0.dist-info"}
    for package in ("features", "executor", "harness", "training", "service", "service/core"):
        assert f"ficco/{package}/__init__.py" in names
    current = (SHIPPED / "CURRENT").read_text().strip()
    assert "ficco/models/h200x2/CURRENT" in names
    shipped = {f"ficco/models/h200x2/{current}/{p.name}" for p in (SHIPPED / current).iterdir()}
    assert shipped and shipped <= set(names)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FICCO_MODEL_ROOT")}
    return {**env, **extra}


def test_installed_wheel_recommends_from_any_directory(installed, tmp_path):
    args = ["recommend", "--op", "ag_gemm", "--m", "16384", "--n", "14336", "--k", "4096"]
    out = _run(installed / "ficco", *args, cwd=tmp_path, env=_env())
    assert "schedule:" in out and "(h200x2, measured)" in out
    where = "import ficco.training.registry as r; print(r.__file__, r.default_model_root())"
    module, root = _run(installed / "python", "-c", where, cwd=tmp_path, env=_env()).split()
    assert Path(module).is_relative_to(installed.parent) and Path(root) == Path(module).parents[1] / "models"


def test_installed_wheel_reads_a_user_registry_from_the_environment(installed, tmp_path):
    args = ["recommend", "--op", "ag_gemm", "--m", "16384", "--n", "14336", "--k", "4096"]
    done = subprocess.run(
        [installed / "ficco", *args], cwd=tmp_path, env=_env(FICCO_MODEL_ROOT=str(tmp_path / "mine")),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and str(tmp_path / "mine") in done.stdout + done.stderr
