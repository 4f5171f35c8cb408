"""Shared fixtures of the harness tests: the h200x2 profile, a small plan, tiny dense and MoE configs, and
``ficco bench`` and ``ficco fleet`` in process with a small simulated sweep (the sharded-sweep tests)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import HardwareProfile, get_hardware
from ficco.features.model_config import load_model_config
from ficco.harness.plan import Plan, plan_scenarios

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "datasets" / "model_configs"


@pytest.fixture(scope="session")
def h200() -> HardwareProfile:
    return get_hardware("h200x2")


@pytest.fixture(scope="session")
def small_plan(h200) -> Plan:
    """Llama-3.1-8B at 1k and 4k tokens plus 4 grid shapes: 12 scenarios."""
    config = load_model_config(CONFIGS / "Llama-3.1-8B.json")
    return plan_scenarios([config], tp=2, tokens=[1024, 4096], grid_size=4, hardware=h200, seed=1)


TINY_CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "model_type": "llama",
}
"""A tiny dense model (fast enough for CPU processes)."""


def _config_folder(folder: Path, name: str, config: dict) -> Path:
    """``folder`` (made) holding ``name``.json with ``config``."""
    folder.mkdir()
    (folder / f"{name}.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def tiny_configs(tmp_path) -> Path:
    """A directory with one tiny dense model (``TINY_CONFIG``)."""
    return _config_folder(tmp_path / "configs", "Tiny", TINY_CONFIG)


@pytest.fixture
def tiny_moe_configs(tmp_path) -> Path:
    """A directory with one tiny Mixtral-style MoE model: 4 experts, 2 per token (its layer: QKV and
    attention out, then the dispatch a2a_gemm and the combine gemm_a2a)."""
    config = {**TINY_CONFIG, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    return _config_folder(tmp_path / "moe-configs", "TinyMoE", config)


def _ficco(*args) -> str:
    result = CliRunner().invoke(app, list(map(str, args)))
    assert result.exit_code == 0, result.output
    return result.output


def _bench(*args) -> str:
    return _ficco("bench", *args)


@pytest.fixture(scope="session")
def bench():
    """``bench(*args)``: ``ficco bench *args`` in process; its output (the test fails on a non-zero exit)."""
    return _bench


@pytest.fixture(scope="session")
def fleet():
    """``fleet(verb, *args)``: ``ficco fleet VERB *args`` in process; its output (the test fails on a non-zero
    exit)."""
    return lambda *args: _ficco("fleet", *args)


@pytest.fixture(scope="session")
def llama_configs(tmp_path_factory) -> Path:
    """A directory holding Llama-3.1-8B's config alone."""
    folder = tmp_path_factory.mktemp("configs")
    shutil.copy(CONFIGS / "Llama-3.1-8B.json", folder)
    return folder


@pytest.fixture(scope="session")
def small_sweep(llama_configs) -> tuple:
    """``ficco bench`` options of a 16-scenario simulated sweep of Llama-3.1-8B (``--out`` to add)."""
    return (
        "--backend",
        "sim",
        "--tokens",
        "1024,4096",
        "--grid",
        "8",
        "--flush-seconds",
        "0",
        "--configs",
        llama_configs,
    )


@pytest.fixture(scope="session")
def whole(small_sweep, tmp_path_factory) -> Path:
    """The small sweep, unsharded."""
    out = tmp_path_factory.mktemp("whole") / "ds"
    _bench(*small_sweep, "--out", out)
    return out
