"""The sweep plan: model expansion, de-duplication, the grid, the time cap and the sweep estimate."""

from pathlib import Path

import pytest

from ficco.features import candidates
from ficco.features.model_config import load_model_config, load_model_configs
from ficco.harness.backend import Timing
from ficco.harness.plan import Plan, estimate_sweep, plan_scenarios

CONFIGS = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"


def _config(name):
    return load_model_config(CONFIGS / f"{name}.json")


def test_plan_llama_8b_tp2_expands_the_four_pairs(h200):
    plan = plan_scenarios([_config("Llama-3.1-8B")], tp=2, tokens=[4096], grid_size=0, hardware=h200)
    got = [(family, s.op, s.m, s.n, s.k, s.world_size) for family, s in plan]
    assert got == [
        ("Llama-3.1-8B", "ag_gemm", 4096, 3072, 4096, 2),  # QKV: (16 + 2 * 4) heads * 128
        ("Llama-3.1-8B", "gemm_rs", 4096, 4096, 2048, 2),  # attention out: 16 heads * 128
        ("Llama-3.1-8B", "ag_gemm", 4096, 14336, 4096, 2),  # MLP gate + up: 2 * 14336 / 2
        ("Llama-3.1-8B", "gemm_rs", 4096, 4096, 7168, 2),  # MLP down: 14336 / 2
    ]


def test_plan_keeps_first_family_and_records_sharing(h200):
    configs = [_config("Llama-3.1-8B"), _config("Mistral-7B-v0.3"), _config("Mixtral-8x7B-v0.1")]
    plan = plan_scenarios(configs, tp=2, tokens=[1024, 2048], grid_size=0, hardware=h200)
    assert len(plan) == 8 and plan.families == ["Llama-3.1-8B"]
    qkv = plan[0][1].key()
    assert plan.shared[qkv] == ("Llama-3.1-8B", "Mistral-7B-v0.3", "Mixtral-8x7B-v0.1")
    mlp_up = plan[2][1].key()
    assert plan.shared[mlp_up] == ("Llama-3.1-8B", "Mistral-7B-v0.3")  # Mixtral's MLP is MoE


def test_plan_moe_pairs_only_when_asked(h200):
    config = _config("Qwen3-30B-A3B")
    dense_only = plan_scenarios([config], tp=2, tokens=[4096], grid_size=0, hardware=h200)
    with_moe = plan_scenarios([config], tp=2, tokens=[4096], grid_size=0, hardware=h200, include_moe=True)
    assert {s.op for _, s in dense_only} == {"ag_gemm", "gemm_rs"}
    assert {s.op for _, s in with_moe} == {"ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"}


def test_plan_ops_keeps_only_those_ops_grid_included(h200):
    config = _config("Qwen3-30B-A3B")
    moe = plan_scenarios(
        [config],
        tp=2,
        tokens=[4096],
        grid_size=10,
        hardware=h200,
        include_moe=True,
        ops=["a2a_gemm", "gemm_a2a"],
    )
    assert {s.op for _, s in moe} == {"a2a_gemm", "gemm_a2a"} and moe.settings["ops"] == [
        "a2a_gemm",
        "gemm_a2a",
    ]
    rs = plan_scenarios([config], tp=2, tokens=[4096], grid_size=10, hardware=h200, ops=["gemm_rs"])
    assert {s.op for _, s in rs} == {"gemm_rs"} and sum(f == "grid" for f, _ in rs) == 10
    with pytest.raises(ValueError, match=r"ops must be a non-empty list of .*bad: \['all_reduce'\]"):
        plan_scenarios([config], tp=2, tokens=[4096], grid_size=0, hardware=h200, ops=["all_reduce"])


def test_plan_drops_scenarios_over_the_time_cap(h200):
    config = _config("Llama-3.1-405B")
    plan = plan_scenarios([config], tp=2, tokens=[1024, 65536], grid_size=0, hardware=h200, max_serial_ms=2.0)
    assert len(plan) + len(plan.dropped) == 8
    assert all(s.m == 1024 for _, s in plan) and plan.dropped
    assert all(d.startswith("Llama-3.1-405B:") for d in plan.dropped)


def test_grid_is_seeded_divisible_and_distinct(h200):
    a = plan_scenarios([], tp=2, grid_size=40, hardware=h200, seed=5)
    b = plan_scenarios([], tp=2, grid_size=40, hardware=h200, seed=5)
    c = plan_scenarios([], tp=2, grid_size=40, hardware=h200, seed=6)
    assert [s.key() for _, s in a] == [s.key() for _, s in b] != [s.key() for _, s in c]
    assert len({s.key() for _, s in a}) == 40 and {f for f, _ in a} == {"grid"}
    for _, s in a:
        assert s.m % (64 * 2) == 0 and s.n % 128 == 0 and s.k % 128 == 0
        assert len(candidates(s)) == 30  # every finer split divides
    assert {s.op for _, s in a} == {"ag_gemm", "gemm_rs"}


def test_plan_json_round_trip(small_plan):
    again = Plan.from_json(small_plan.to_json())
    assert [(f, s.key()) for f, s in again] == [(f, s.key()) for f, s in small_plan]
    assert again.settings == small_plan.settings and again.shared == small_plan.shared


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 4}, r"plan_scenarios.tp must be an int in \[2, 2\]; got 4"),
        ({"tokens": [1000, 1001]}, r"positive multiples of tp=2; bad: \[1001\]"),
        ({"tokens": []}, "non-empty list"),
        ({"grid_size": -1}, r"plan_scenarios.grid_size must be an int in \[0, 100000\]; got -1"),
        ({"max_serial_ms": 0}, "max_serial_ms must be > 0; got 0"),
    ],
)
def test_plan_bad_arguments_are_named(h200, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_scenarios([], hardware=h200, **kwargs)


def test_estimate_counts_rows_and_scales_with_repetitions(small_plan, h200):
    estimate = estimate_sweep(small_plan, h200)
    assert estimate.rows == 2 * sum(len(candidates(s)) for _, s in small_plan)  # eager and graph
    assert estimate.scenarios == len(small_plan) and estimate.remeasured == 0
    five = estimate_sweep(small_plan, h200, timing=Timing(rounds=5, max_rounds=5))
    ten = estimate_sweep(small_plan, h200, timing=Timing(rounds=10, max_rounds=10))
    assert ten.timed_s > 1.5 * five.timed_s and ten.overhead_s > five.overhead_s
    # rounds sized by time: up to the most for schedules (baselines keep the fewest), never beyond
    sized = estimate_sweep(small_plan, h200, timing=Timing(rounds=5, max_rounds=10, timed_ms=1e6))
    assert five.timed_s < sized.timed_s < ten.timed_s
    eager = estimate_sweep(small_plan, h200, modes=("eager",))
    assert eager.rows == estimate.rows // 2 and eager.seconds < estimate.seconds
    again = estimate_sweep(small_plan, h200, remeasure=len(small_plan))
    assert again.seconds == pytest.approx(2 * estimate.seconds) and again.remeasured == len(small_plan)


@pytest.mark.heavy
def test_default_plan_meets_the_dataset_targets(h200):
    # Issue 10: >= 600 scenarios from >= 8 model families plus the grid, decode sizes included, both
    # modes; a complete re-measure (64 re-measured too) in <= 25 minutes of GPU time.
    plan = plan_scenarios(load_model_configs(CONFIGS), hardware=h200)
    assert len(plan) >= 600
    assert len(set(plan.families) - {"grid"}) >= 8 and "grid" in plan.families
    assert {128, 256, 512} <= {s.m for f, s in plan if f != "grid"}
    estimate = estimate_sweep(plan, h200, remeasure=64)
    assert 10 * 60 < estimate.seconds < 25 * 60


def test_plan_skips_configs_that_do_not_split_tp_ways():
    from ficco.features import get_hardware

    phi, llama = _config("Phi-3-medium-4k"), _config("Llama-3.1-8B")  # Phi-3: 10 KV heads
    plan = plan_scenarios([phi, llama], tp=4, tokens=[4096], grid_size=0, hardware=get_hardware("h200x4"))
    assert set(plan.settings["skipped_configs"]) == {"Phi-3-medium-4k"}
    assert "num_key_value_heads=10" in plan.settings["skipped_configs"]["Phi-3-medium-4k"]
    assert plan.families == ["Llama-3.1-8B"]


def test_evenly_spaced_spreads_a_sample_over_the_whole_sequence():
    from ficco.harness.plan import evenly_spaced

    assert evenly_spaced(list(range(10)), 4) == [0, 2, 5, 7]
    assert evenly_spaced(list(range(3)), 5) == [0, 1, 2]  # fewer than asked: all, in order
    assert evenly_spaced([], 2) == []


def test_build_plan_sample_keeps_plan_order_and_spans_families(h200):
    from ficco.harness.launch import build_plan

    full = build_plan(CONFIGS, h200, tp=2, tokens=[1024, 8192], grid=20, include_moe=False, seed=0)
    sample = build_plan(
        CONFIGS, h200, tp=2, tokens=[1024, 8192], grid=20, include_moe=False, seed=0, sample=8
    )
    assert len(sample) == 8 and list(sample) == [e for e in full if e in set(sample)]
    assert sample[0] == full[0] and len(set(sample.families)) >= 3
