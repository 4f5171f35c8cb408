"""Feature vector: determinism, names, and the schema-version pin."""

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from ficco.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    Scenario,
    feature_dict,
    feature_matrix,
    feature_vector,
)

# The vector of REFERENCE, rounded, hashed. If this test fails you changed the feature vector:
# bump FEATURE_SCHEMA_VERSION in features/vector.py and update both constants here.
REFERENCE = Scenario(op="gemm_rs", m=16384, n=8192, k=14336, world_size=2)
PINNED = {"fv4": "286fa8e0e655610a"}  # fv3 and fv4 kept fv2's vector (their new columns are pair columns)


def _digest(scenario: Scenario) -> str:
    text = ",".join(f"{name}={value:.6g}" for name, value in feature_dict(scenario).items())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_schema_version_pins_the_vector():
    assert PINNED.get(FEATURE_SCHEMA_VERSION) == _digest(REFERENCE), (
        "the feature vector changed: bump FEATURE_SCHEMA_VERSION and re-pin"
    )


def test_vector_is_deterministic_and_finite():
    a, b = feature_vector(REFERENCE), feature_vector(Scenario.from_json(REFERENCE.to_json()))
    assert a.dtype == np.float64 and a.shape == (len(FEATURE_NAMES),)
    assert np.array_equal(a, b) and np.isfinite(a).all()


def test_names_are_unique_and_in_dict_order():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    assert tuple(feature_dict(REFERENCE)) == FEATURE_NAMES


def test_matrix_stacks_vectors():
    scenarios = [REFERENCE, Scenario(), Scenario(op="a2a_gemm", m=64, experts=8, top_k=2)]
    mat = feature_matrix(scenarios)
    assert mat.shape == (3, len(FEATURE_NAMES))
    assert np.array_equal(mat[0], feature_vector(REFERENCE))
    assert feature_matrix([]).shape == (0, len(FEATURE_NAMES))


@pytest.mark.parametrize(
    ("name", "bigger"), [("log2_comm_over_gemm", Scenario(n=512)), ("log2_gemm_flops", Scenario(m=8192))]
)
def test_features_move_the_right_way(name, bigger):
    idx = FEATURE_NAMES.index(name)
    base = Scenario()
    # a narrower n shrinks the GEMM but not the all-gather of A: comm/compute rises
    assert feature_vector(bigger)[idx] > feature_vector(base)[idx]


_ONLY_STDLIB_AND_NUMPY = """
import importlib.abc, sys
allowed = set(sys.stdlib_module_names) | {"numpy"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        own = name == "ficco" or name.startswith("ficco.features")
        if name.partition(".")[0] not in allowed and not own:
            raise ImportError(f"features imported {name}, which is neither stdlib nor numpy")
sys.meta_path.insert(0, Block())
from ficco import features
from ficco.features import launch_cost
launch_cost.host_over_gpu(features.feature_matrix([features.Scenario()]))
"""


def test_features_import_with_stdlib_and_numpy_only():
    subprocess.run([sys.executable, "-c", _ONLY_STDLIB_AND_NUMPY], check=True)


@pytest.mark.parametrize(
    ("rows", "n", "fill"), [(128, 256 * 132, 1.0), (128, 256 * 133, 133 / 264), (64, 256, 1 / 132)]
)
def test_wave_fill_counts_128x256_tiles_over_the_sms(rows, n, fill):
    from ficco.features.vector import wave_fill

    assert wave_fill(rows, n, 132) == pytest.approx(fill)


def _random_scenarios(count: int, seed: int) -> list[Scenario]:
    """Valid scenarios of every op, dtype and world size up to 8, with MoE fields (invalid draws skipped)."""
    from ficco.features import DTYPES, OPS, get_hardware

    rng = np.random.default_rng(seed)
    hardware, out = get_hardware("h200x8"), []
    while len(out) < count:
        op, w = str(rng.choice(OPS)), int(rng.choice([2, 4, 8]))
        moe = op in ("a2a_gemm", "gemm_a2a")
        fields = {"op": op, "world_size": w, "dtype": str(rng.choice(DTYPES)), "hardware": hardware}
        fields |= {d: int(2 ** rng.uniform(3, 16)) for d in ("n", "k")}
        fields["m"] = w * int(2 ** rng.uniform(0, 14))
        if moe:
            experts = w * int(rng.integers(1, 17))
            fields |= {"experts": experts, "top_k": int(rng.integers(1, min(experts, 8) + 1))}
            fields["imbalance"] = float(rng.uniform(1.0, w))
        try:
            out.append(Scenario(**fields))
        except ValueError:
            continue
    return out


def test_columnwise_features_equal_the_per_scenario_ones():
    """feature_matrix switches to column-wise numpy at COLUMNWISE_MIN scenarios: same numbers, same order."""
    from ficco.features.vector import COLUMNWISE_MIN

    scenarios = _random_scenarios(500, seed=3)
    batch = feature_matrix(scenarios)
    one_by_one = np.stack([feature_vector(s) for s in scenarios])
    assert len(scenarios) >= COLUMNWISE_MIN and batch.shape == one_by_one.shape
    np.testing.assert_allclose(batch, one_by_one, rtol=1e-12, atol=1e-12)
    small = feature_matrix(scenarios[: COLUMNWISE_MIN - 1])
    assert np.array_equal(small, one_by_one[: COLUMNWISE_MIN - 1])
