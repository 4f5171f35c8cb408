"""Hardware ids from the GPUs found (what result files and datasets are named after)."""

from __future__ import annotations

import pytest

from ficco.features.hardware import KNOWN_HARDWARE, hardware_id_of


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
