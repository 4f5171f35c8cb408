"""Hardware ids from the GPUs found (what result files and datasets are named after), and loading a profile by
id or from its JSON file."""

from __future__ import annotations

import dataclasses

import pytest

from ficco.features.hardware import KNOWN_HARDWARE, hardware_id_of, load_hardware


@pytest.mark.parametrize(
    ("name", "count", "expected"),
    [
        ("NVIDIA H200", 4, "h200x4"),
        ("NVIDIA H100 80GB HBM3", 4, "h100x4"),
        ("NVIDIA H100 80GB HBM3", 2, "h100x2"),
        ("NVIDIA H200", 3, "h200x3"),  # no built-in profile of 3 GPUs: the model's slug
        ("AMD Instinct MI300X", 8, "mi300xx8"),
        ("NVIDIA B200", 4, "b200x4"),
        ("Tesla T4", 2, "tesla-t4x2"),
    ],
)
def test_hardware_id_of_the_gpus_found(name, count, expected):
    assert hardware_id_of(name, count) == expected


def test_every_built_in_profile_is_found_from_its_own_gpu_name():
    for profile in KNOWN_HARDWARE.values():
        assert hardware_id_of(profile.gpu_name, profile.gpu_count) == profile.id


def test_load_hardware_takes_ids_and_files_and_registers_a_file_s_id(tmp_path):
    assert load_hardware("h100x4", tmp_path) is KNOWN_HARDWARE["h100x4"]
    what_if = dataclasses.replace(KNOWN_HARDWARE["h200x2"], id="b300x2", link_gbps=900.0)
    path = tmp_path / "b300x2.json"
    path.write_text(what_if.to_json())
    assert load_hardware(str(path), tmp_path / "models") == what_if
    assert load_hardware("b300x2", tmp_path / "models") == what_if  # registered by the file


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "h200x2-sim",
            r"'h200x2-sim' is the registry id of simulated models; name the hardware itself, 'h200x2'",
        ),
        ("h2002", r"unknown hardware id 'h2002' \(did you mean 'h200x2'\?\); built-in ids are"),
        ("missing.json", r"No such file or directory: 'missing.json'"),
    ],
)
def test_load_hardware_raises_value_error_naming_the_value(tmp_path, value, message):
    with pytest.raises(ValueError, match=message):
        load_hardware(value, tmp_path)
