"""Fixtures for the training tests: a synthetic dataset in the harness schema, and fitted models.

The synthetic times are a toy model, not the simulator: serial wins small GEMMs (launch and sync
overheads), copy-engine shard overlap wins communication-heavy shapes, and finer splits win large row
counts where decomposition costs little. Enough structure for a model to learn, and near-ties to be
careful about.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ficco.features import (
    Scenario,
    candidates,
    feature_matrix,
    get_hardware,
    roofline_comm_us,
    roofline_gemm_us,
)
from ficco.training.fit import TrainConfig
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES
from ficco.training.policy import DecisionPolicy
from ficco.training.table import ScheduleTable

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"

FAMILIES: dict[str, tuple[int, int, int]] = {
    "toy-small": (2048, 5632, 16),
    "toy-mid": (4096, 14336, 32),
    "toy-wide": (5120, 25600, 40),
    "toy-large": (8192, 28672, 64),
}
"""Fake dense model families: hidden size, intermediate size, attention heads (head dim 128)."""
TOKENS = (512, 2048, 8192, 32768)
FAST_CONFIGS = (
    TrainConfig(max_depth=3, n_estimators=40),
    TrainConfig(max_depth=3, n_estimators=40, weighting="cost"),
)
"""A small grid that keeps cross-validation in the tests fast."""


def toy_times_ms(scenario: Scenario) -> dict[str, float]:
    """Toy time of every candidate schedule of ``scenario``, ms (noise-free)."""
    gemm = roofline_gemm_us(scenario) * 1.2 + 6.0
    comm = {"sm": roofline_comm_us(scenario) / 0.7 + 12.0, "dma": roofline_comm_us(scenario) / 0.85 + 20.0}
    latency = {"sm": 3.0, "dma": 8.0}
    contention = {"sm": 0.25, "dma": 0.08}
    out = {}
    for schedule in candidates(scenario):
        e = schedule.executor
        if not schedule.overlapped:
            out[str(schedule)] = (gemm + comm[e]) / 1e3
            continue
        pieces = scenario.world_size * schedule.splits
        gemm_pieces = pieces if schedule.grain == "chunk" else scenario.world_size
        dil = 1.0 + 0.03 * math.log2(gemm_pieces) + 256.0 / (scenario.rows / gemm_pieces)
        hp = schedule.priority == "high"
        c = comm[e] * (0.93 if hp else 1.0) + latency[e] * (pieces - scenario.world_size)
        g = gemm * dil * (1.0 + contention[e] + (0.05 if hp else 0.0))
        t = max(g * (1.0 - 1.0 / gemm_pieces), c) + gemm * dil / gemm_pieces + 4.0 * pieces
        out[str(schedule)] = t / 1e3
    return out


def toy_scenarios(n_grid: int, seed: int, hardware_id: str) -> list[tuple[str, Scenario]]:
    """(family, scenario) pairs: the toy families' layers at ``TOKENS`` plus ``n_grid`` random grid shapes."""
    hw = get_hardware(hardware_id)
    out = []
    for family, (hidden, inter, heads) in FAMILIES.items():
        for tokens in TOKENS:
            shapes = [
                ("ag_gemm", (heads // 2 + 2 * 4) * 128, hidden),
                ("gemm_rs", hidden, heads * 64),
                ("ag_gemm", inter, hidden),
                ("gemm_rs", hidden, inter // 2),
            ]
            out += [(family, Scenario(op=op, m=tokens, n=n, k=k, hardware=hw)) for op, n, k in shapes]
    rng = np.random.default_rng(seed)
    for _ in range(n_grid):
        op = ("ag_gemm", "gemm_rs")[int(rng.integers(2))]
        m = 2 * int(rng.choice([3, 64, 256, 1024, 4096, 16384, 24576]))
        n, k = (int(128 * rng.integers(4, 129)) for _ in range(2))
        out.append(("grid", Scenario(op=op, m=m, n=n, k=k, hardware=hw)))
    return out


def synthetic_frame(*, n_grid: int = 160, seed: int = 0, noise: float = 0.005, hardware_id: str = "h200x2"):
    """A dataset in the ``harness.dataset`` row schema (one row per scenario and candidate schedule)."""
    rng = np.random.default_rng(seed + 1)
    rows, seen = [], set()
    for family, s in toy_scenarios(n_grid, seed, hardware_id):
        if s.key() in seen:
            continue
        seen.add(s.key())
        times = toy_times_ms(s)
        for schedule, t in times.items():
            t *= float(np.exp(noise * rng.standard_normal()))
            failed = schedule == "finer/sm/s8/chunk/hp" and s.m % 4096 == 0  # a few failures, never serial
            rows.append({
                "scenario_id": s.key(), "family": family, "op": s.op, "m": s.m, "n": s.n, "k": s.k,
                "dtype": s.dtype, "world_size": s.world_size, "experts": s.experts, "top_k": s.top_k,
                "imbalance": s.imbalance, "schedule": schedule, "mode": "eager",
                "round_ms": [] if failed else [t] * 5, "in_best_set": False,
                "median_ms": math.nan if failed else t, "p10_ms": math.nan if failed else 0.99 * t,
                "p90_ms": math.nan if failed else 1.01 * t, "ok": not failed,
                "error": "RuntimeError: out of memory" if failed else "", "backend": "sim",
                "hardware_id": hardware_id, "gemm_alone_ms": math.nan, "nccl_comm_ms": math.nan,
                "dma_comm_ms": math.nan, "async_tp_ms": math.nan,
            })  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="session")
def frame() -> pd.DataFrame:
    return synthetic_frame()


@pytest.fixture(scope="session")
def table(frame):
    from ficco.training.table import build_table

    return build_table(frame, get_hardware("h200x2"))


FAST_POLICIES = (
    DecisionPolicy(),
    DecisionPolicy(speedup_weight=16.0, min_gain=0.0),
    DecisionPolicy(min_probability=0.5, min_gain=0.02),
)
"""A small threshold grid for the tests."""


@pytest.fixture(scope="session")
def trained(table):
    from ficco.training.train import train_model

    return train_model(table, configs=FAST_CONFIGS, policies=FAST_POLICIES)


@pytest.fixture(scope="session")
def sim_dataset(tmp_path_factory):
    """A small dataset directory written by the harness sweep on the simulator (h200x2, 1% noise)."""
    from ficco.features.model_config import load_model_configs
    from ficco.harness.plan import plan_scenarios
    from ficco.harness.sim import SimBackend
    from ficco.harness.sweep import run_sweep

    configs = [
        c for c in load_model_configs(CONFIGS_DIR) if c.name in ("Llama-3.1-8B", "Qwen2.5-7B", "Gemma-2-9B")
    ]
    plan = plan_scenarios(configs, tp=2, tokens=(2048, 8192), grid_size=24, seed=0)
    return run_sweep(
        plan, SimBackend(get_hardware("h200x2"), noise=0.01), tmp_path_factory.mktemp("sim"), progress=False
    )


@pytest.fixture(scope="session")
def fast_configs():
    return FAST_CONFIGS


@pytest.fixture(scope="session")
def fast_policies():
    return FAST_POLICIES


@pytest.fixture
def tiny_table() -> ScheduleTable:
    """Three scenarios, times in ms:

    0: serial 1.0, shard/dma 0.5 (best)
    1: serial 1.0 (best), shard/dma 1.2
    2: serial 2.0, shard/dma 1.0 (best), shard/sm 1.01
    """
    times = np.full((3, len(SCHEDULES)), np.nan)
    serial, shard_dma, shard_sm = (SCHEDULE_INDEX[s] for s in ("serial/sm", "shard/dma", "shard/sm"))
    times[0, [serial, shard_dma]] = [1.0, 0.5]
    times[1, [serial, shard_dma]] = [1.0, 1.2]
    times[2, [serial, shard_dma, shard_sm]] = [2.0, 1.0, 1.01]
    scenarios = (Scenario(),) * 3
    return ScheduleTable(
        scenario_ids=np.array(["a", "b", "c"], dtype=object),
        families=np.array(["f", "f", "g"], dtype=object),
        scenarios=scenarios,
        X=feature_matrix(scenarios),
        times_ms=times,
    )
