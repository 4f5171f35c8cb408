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
    Schedule,
    candidates,
    feature_matrix,
    get_hardware,
    roofline_comm_us,
    roofline_gemm_us,
)
from ficco.training.dataset_table import DatasetTable
from ficco.training.fit import TrainConfig
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES
from ficco.training.predict.policy import DecisionPolicy

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"
MOE_CONFIGS_DIR = CONFIGS_DIR.parent / "moe_configs"

FAMILIES: dict[str, tuple[int, int, int]] = {
    "toy-small": (2048, 5632, 16),
    "toy-mid": (4096, 14336, 32),
    "toy-wide": (5120, 25600, 40),
    "toy-large": (8192, 28672, 64),
}
"""Fake dense model families: hidden size, intermediate size, attention heads (head dim 128)."""
TOKENS = (512, 2048, 8192, 32768)
FAST_CONFIGS = (
    TrainConfig(objective="ratio", max_depth=3, n_estimators=30, learning_rate=0.3),
    TrainConfig(objective="rank", max_depth=3, n_estimators=30, learning_rate=0.3),
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


GRAPH_HOST_SAVING_MS = 0.004
"""Toy graph mode: each piece of a schedule costs this much less host time than in eager mode."""


def _modes(times: dict[str, float], world_size: int) -> dict[str, dict[str, float]]:
    """Toy eager and graph times of every schedule (graph replays skip the per-piece host cost)."""
    graph = {}
    for schedule, t in times.items():
        pieces = 1 if schedule.startswith("serial") else world_size * Schedule.parse(schedule).splits
        graph[schedule] = max(t - GRAPH_HOST_SAVING_MS * pieces, 0.3 * t)
    return {"eager": times, "graph": graph}


def synthetic_frame(*, n_grid: int = 160, seed: int = 0, noise: float = 0.005, hardware_id: str = "h200x2"):
    """A dataset in the ``harness.dataset`` row schema (one row per scenario, mode and candidate schedule);
    ``in_best_set`` marks schedules within 1% of the mode's best, ``async_tp_ms`` is 1.1 x shard/dma."""
    rng = np.random.default_rng(seed + 1)
    rows, seen = [], set()
    for family, s in toy_scenarios(n_grid, seed, hardware_id):
        if s.key() in seen:
            continue
        seen.add(s.key())
        for mode, times in _modes(toy_times_ms(s), s.world_size).items():
            times = {k: t * float(np.exp(noise * rng.standard_normal())) for k, t in times.items()}
            rows += _rows(family, s, mode, times, hardware_id)
    return pd.DataFrame(rows)


def _rows(family: str, s: Scenario, mode: str, times: dict[str, float], hardware_id: str) -> list[dict]:
    """Dataset rows of one scenario in one mode."""
    rows = []
    failed_schedule = "finer/sm/s8/chunk/hp" if s.m % 4096 == 0 else None  # a few failures, never serial
    best = min(t for k, t in times.items() if k != failed_schedule)
    for schedule, t in times.items():
        failed = schedule == failed_schedule
        rows.append({
            "scenario_id": s.key(), "family": family, "op": s.op, "m": s.m, "n": s.n, "k": s.k,
            "dtype": s.dtype, "world_size": s.world_size, "experts": s.experts, "top_k": s.top_k,
            "imbalance": s.imbalance, "schedule": schedule, "mode": mode,
            "round_ms": [] if failed else [t] * 5, "in_best_set": not failed and t <= 1.01 * best,
            "median_ms": math.nan if failed else t, "p10_ms": math.nan if failed else 0.99 * t,
            "p90_ms": math.nan if failed else 1.01 * t, "ok": not failed,
            "error": "RuntimeError: out of memory" if failed else "", "backend": "sim",
            "hardware_id": hardware_id, "gemm_alone_ms": math.nan, "nccl_comm_ms": math.nan,
            "dma_comm_ms": math.nan, "async_tp_ms": 1.1 * times["shard/dma"],
        })  # fmt: skip
    return rows


@pytest.fixture(scope="session")
def frame() -> pd.DataFrame:
    return synthetic_frame()


@pytest.fixture(scope="session")
def table(frame):
    from ficco.training.dataset_table import build_table

    return build_table(frame, get_hardware("h200x2"))


FAST_POLICIES = (DecisionPolicy(), DecisionPolicy(min_gain=0.0), DecisionPolicy(min_gain=0.02))
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
def sim_moe_dataset(tmp_path_factory):
    """A small MoE dataset directory on the simulator (h200x2, 1% noise): the dispatch and combine pairs
    of two MoE families at 2 token counts, 4 scenarios re-measured; no scenario of ``sim_dataset``."""
    from ficco.features import MOE_OPS
    from ficco.features.model_config import load_model_configs
    from ficco.harness.plan import plan_scenarios
    from ficco.harness.sim import SimBackend
    from ficco.harness.sweep import run_noise, run_sweep

    hw = get_hardware("h200x2")
    configs = [
        c for c in load_model_configs(MOE_CONFIGS_DIR) if c.name in ("Mixtral-8x7B-v0.1", "Qwen3-30B-A3B")
    ]
    plan = plan_scenarios(
        configs, tp=2, tokens=(2048, 8192), grid_size=0, include_moe=True, ops=MOE_OPS, seed=0
    )
    out = run_sweep(plan, SimBackend(hw, noise=0.01), tmp_path_factory.mktemp("sim-moe"), progress=False)
    run_noise(plan, SimBackend(hw, noise=0.01, seed=1), out, 4, progress=False)
    return out


@pytest.fixture(scope="session")
def fast_configs():
    return FAST_CONFIGS


@pytest.fixture(scope="session")
def fast_policies():
    return FAST_POLICIES


@pytest.fixture
def tiny_table() -> DatasetTable:
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
    return DatasetTable(
        scenario_ids=np.array(["a", "b", "c"], dtype=object),
        modes=np.array(["eager"] * 3, dtype=object),
        families=np.array(["f", "f", "g"], dtype=object),
        scenarios=scenarios,
        X=feature_matrix(scenarios),
        times_ms=times,
        in_best=times <= 1.011 * np.nanmin(times, axis=1, keepdims=True),
        async_tp_ms=np.array([0.6, 1.5, np.nan]),
    )
