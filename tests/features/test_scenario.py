"""Scenario: validation messages, derived sizes, JSON round trip."""

import json

import pytest

from ficco.features import KNOWN_HARDWARE, HardwareProfile, Scenario, get_hardware


def test_defaults_are_valid():
    s = Scenario()
    assert s.op == "ag_gemm" and s.hardware.id == "h200x2"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"m": 0}, "Scenario.m must be an int in [1, 1048576]; got 0"),
        ({"n": -4}, "Scenario.n must be an int in [1, 1048576]; got -4"),
        ({"k": 2.5}, "Scenario.k must be an int in [1, 1048576]; got 2.5"),
        (
            {"op": "allreduce"},
            "Scenario.op must be one of ['ag_gemm', 'gemm_rs', 'a2a_gemm', 'gemm_a2a']; got 'allreduce'",
        ),
        ({"dtype": "int8"}, "Scenario.dtype must be one of ['bf16', 'fp16', 'fp32']; got 'int8'"),
        ({"world_size": 12}, "Scenario.world_size must be an int in [2, 8]; got 12"),
        ({"world_size": 1}, "Scenario.world_size must be an int in [2, 8]; got 1"),
        ({"world_size": 4}, "Scenario.world_size must be <= hardware.gpu_count=2 (h200x2); got 4"),
        (
            {"m": 1001},
            "Scenario.m must be divisible by world_size=2 for op 'ag_gemm' "
            "(each rank owns m / world_size rows); got 1001",
        ),
        ({"experts": 8}, "Scenario.experts applies only to MoE ops ['a2a_gemm', 'gemm_a2a']"),
        (
            {"op": "a2a_gemm", "experts": 7, "top_k": 2},
            "Scenario.experts must be a multiple of world_size=2; got 7",
        ),
        ({"op": "a2a_gemm", "experts": 8, "top_k": 9}, "Scenario.top_k must be an int in [1, 8]; got 9"),
        (
            {"op": "gemm_a2a", "experts": 8, "top_k": 2, "imbalance": 0.5},
            "Scenario.imbalance must be a number [1.0, 2.0]",
        ),
        (
            {"op": "a2a_gemm", "m": 7, "experts": 8, "top_k": 1},
            "Scenario.m * top_k must be divisible by world_size=2",
        ),
    ],
)
def test_invalid_scenario_names_field_value_and_allowed(kwargs, message):
    with pytest.raises(ValueError) as err:
        Scenario(**kwargs)
    assert message in str(err.value)


def test_bool_is_not_an_int():
    with pytest.raises(ValueError, match=r"Scenario\.m must be an int"):
        Scenario(m=True)


def test_derived_sizes_ag_gemm():
    s = Scenario(op="ag_gemm", m=8192, n=14336, k=4096, world_size=2)
    assert s.rows == 8192
    assert s.gemm_flops == 2 * 8192 * 14336 * 4096
    # half of A arrives from the one peer, bf16
    assert s.comm_bytes == 8192 / 2 * 4096 * 2


def test_derived_sizes_gemm_rs_use_output_width():
    s = Scenario(op="gemm_rs", m=8192, n=4096, k=7168, world_size=2)
    assert s.comm_bytes == 8192 / 2 * 4096 * 2


def test_derived_sizes_moe_rows_scale_with_top_k_and_imbalance():
    s = Scenario(op="a2a_gemm", m=4096, n=14336, k=4096, experts=8, top_k=2, imbalance=1.5, world_size=2)
    assert s.rows == 8192
    assert s.gemm_flops == pytest.approx(2 * 8192 * 14336 * 4096 * 1.5)
    assert s.comm_bytes == pytest.approx(8192 / 2 * 4096 * 2 * 1.5)


def test_key_is_unique_per_field():
    base = Scenario()
    others = [
        Scenario(m=8192),
        Scenario(dtype="fp16"),
        Scenario(op="gemm_rs"),
        Scenario(hardware=get_hardware("h100x2")),
    ]
    assert len({base.key(), *(o.key() for o in others)}) == 5


@pytest.mark.parametrize(
    "scenario",
    [
        Scenario(),
        Scenario(op="gemm_rs", m=4096, n=8192, k=1024, dtype="fp32"),
        Scenario(op="gemm_a2a", m=512, n=1024, k=2048, experts=16, top_k=4, imbalance=1.25),
        Scenario(op="ag_gemm", world_size=8, hardware=get_hardware("h200x8")),
    ],
)
def test_json_round_trip(scenario):
    assert Scenario.from_json(scenario.to_json()) == scenario
    assert Scenario.from_dict(json.loads(scenario.to_json())) == scenario


def test_from_dict_accepts_hardware_id():
    s = Scenario.from_dict(
        {"op": "gemm_rs", "m": 64, "n": 64, "k": 64, "hardware": "h200x4", "world_size": 4}
    )
    assert s.hardware == KNOWN_HARDWARE["h200x4"]


def test_from_dict_rejects_unknown_field_and_hardware():
    with pytest.raises(ValueError, match=r"Scenario has no field\(s\) \['tokens'\]"):
        Scenario.from_dict({"tokens": 5})
    with pytest.raises(ValueError, match=r"unknown hardware id 'tpu'; known ids are \["):
        Scenario.from_dict({"hardware": "tpu"})


def test_hardware_profile_validation_and_round_trip():
    with pytest.raises(ValueError, match=r"HardwareProfile\.link_gbps must be a number >= 0\.1; got 0"):
        HardwareProfile(link_gbps=0)
    with pytest.raises(ValueError, match=r"HardwareProfile\.id must be a non-empty string"):
        HardwareProfile(id="a b")
    for profile in KNOWN_HARDWARE.values():
        assert HardwareProfile.from_json(profile.to_json()) == profile
