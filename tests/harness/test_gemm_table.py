"""The GEMM table the simulator reads: the shipped one, its lookup (measured buckets, neighbours, off the
table), carrying it to another GPU by the rates, and the expert-GEMM shapes."""

import json

import numpy as np
import pytest

from ficco.harness.gemm_table import (
    TABLE_DIR,
    GemmTable,
    bucket,
    expert_split,
    gpu_model,
    grouped,
    shape_us,
    table_for,
)

H200 = {"peak_bf16_tflops": 989.0, "hbm_gbps": 4800.0, "sm_count": 132.0}
H100 = {**H200, "hbm_gbps": 3350.0}


def _table(dense: list[list[float]], grouped_rows: list[list[float]] = ()) -> GemmTable:
    return GemmTable(
        gpu_name="NVIDIA H200", profile=H200, dense=np.array(dense), grouped=np.array(grouped_rows)
    )


def _dense(table: GemmTable, rows: float, n: float, k: float, rates: dict = H200) -> float:
    one = np.array([1.0])
    return float(table.lookup(one, one * rows, one * n, one * k, grouped_kernel=one < 0, rates=rates)[0])


def test_the_shipped_h200_table_is_small_and_measured():
    path = TABLE_DIR / "h200.json"
    assert path.stat().st_size < 300_000
    table = table_for("NVIDIA H200")
    assert table is not None and table.model == "h200" and table_for("NVIDIA B200") is None
    assert len(table.dense) > 1000 and len(table.grouped) > 100
    assert table.source["buckets_measured"] == len(table.dense) + len(table.grouped)
    # a large square GEMM near the bf16 peak the datasheets give (measured: about 700-800 TFLOP/s)
    t = _dense(table, 8192, 8192, 8192)
    assert 600 < 2 * 8192**3 / t / 1e6 < 989


def test_a_measured_shape_answers_its_measurement_and_neighbours_scale_by_the_model():
    table = _table([[1024, 4096, 4096, 50.0], [2896, 4096, 4096, 120.0]])
    assert _dense(table, 1024, 4096, 4096) == pytest.approx(50.0)
    # the same bucket (half an octave): the measured time times the model's ratio
    near = _dense(table, 1100, 4096, 4096)
    ratio = shape_us(*(np.array([v]) for v in (1, 1100, 4096, 4096)), H200) / shape_us(
        *(np.array([v]) for v in (1, 1024, 4096, 4096)), H200
    )
    assert near == pytest.approx(50.0 * float(ratio[0]))
    # an unmeasured bucket (2048 rows) beside a measured one (2896, one half octave up): its ratio
    assert _dense(table, 2048, 4096, 4096) == pytest.approx(120.0 / _model(2896) * _model(2048))
    assert np.isnan(_dense(table, 65536, 4096, 4096))  # no measured neighbour: the simulator's roofline


def _model(rows: int) -> float:
    return float(shape_us(np.array([1]), np.array([rows]), np.array([4096]), np.array([4096]), H200)[0])


def test_another_gpu_gets_the_table_through_its_rates():
    table = table_for("NVIDIA H200")
    # memory-bound (few rows): slower at the H100's lower HBM bandwidth; compute-bound: the same peak
    assert _dense(table, 16, 8192, 8192, H100) > 1.2 * _dense(table, 16, 8192, 8192)
    assert _dense(table, 8192, 8192, 8192, H100) == pytest.approx(_dense(table, 8192, 8192, 8192), rel=0.02)


def test_grouped_kernel_rule_follows_the_executor():
    groups = np.array([8, 7, 64, 64, 64])
    n, k = np.array([4096, 4096, 4100, 4096, 4096]), np.array([4096, 4096, 4096, 4096, 4096])
    assert grouped(groups, n, k, np.array([2, 2, 2, 2, 4])).tolist() == [True, False, False, True, False]


def test_expert_units_cover_their_experts():
    rows, w, e = np.array([8192.0]), np.array([2.0]), np.array([64.0])
    whole = expert_split(rows, rows, w, e)
    shard = expert_split(rows / 2, rows, w, e)
    piece = expert_split(rows / 16, rows, w, e)  # finer s8 piece of a shard
    assert (whole[0][0], whole[1][0]) == (64, 128)  # every expert, rows / experts each
    assert (shard[0][0], shard[1][0]) == (64, 64)  # one source's block: every expert, fewer rows
    assert (piece[0][0], piece[1][0]) == (8, 64)  # a piece: 1/8 of the experts, the same rows each
    dense = expert_split(rows / 2, rows, w, np.array([1.0]))
    assert (dense[0][0], dense[1][0]) == (1, 4096)


def test_buckets_are_half_octaves_and_the_gpu_model_names_the_file():
    assert bucket(np.array([1024, 1448, 1449, 2048])).tolist() == [20, 21, 21, 22]
    assert gpu_model("NVIDIA H100 80GB HBM3") == "h100" and gpu_model("NVIDIA H200") == "h200"


def test_a_table_of_another_format_is_refused_with_the_remake_command(tmp_path):
    text = json.loads(_table([[1024, 4096, 4096, 50.0]]).to_json())
    assert GemmTable.from_json(json.dumps(text)).dense.tolist() == [[1024, 4096, 4096, 50.0]]
    text["resolution"] = 4
    with pytest.raises(ValueError, match=r"resolution 4.*python -m benchmarks.gemm_table"):
        GemmTable.from_json(json.dumps(text), "h200.json")
    with pytest.raises(ValueError, match="must be finite and > 0"):
        _table([[1024, 4096, 4096, 0.0]])
