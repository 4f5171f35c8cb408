"""``ficco export``: exported tables reproduce the model; exports the model cannot back are refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ficco.features import feature_matrix
from ficco.features.schedule_table import FingerprintMismatch, ScheduleTableFile
from ficco.runtime.sources import TableSource
from ficco.training.export import (
    ExportRefused,
    build_schedule_table,
    dataset_shapes,
    export,
    token_grid,
)
from ficco.training.registry import load_predictor

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
DATASETS = sorted(p for p in (REPO / "datasets").glob("h200x2*") if (p / "manifest.json").exists())
"""Every committed dataset of the hardware a model is registered for."""


@pytest.fixture(scope="module")
def predictor():
    return load_predictor(MODELS, "h200x2")


def test_token_grid_is_sorted_multiples_of_the_world_size():
    for w in (2, 4, 6, 8):
        grid = token_grid(w)
        assert np.all(np.diff(grid) > 0) and np.all(grid % w == 0)
        if w in (2, 4, 8):  # other sizes round each point down to a multiple of w
            above = grid[:-1] >= 16 * w  # below, the step is the world size itself
            assert (np.diff(grid)[above] / grid[:-1][above]).max() <= 1 / 16 + 1e-9


def test_lookup_between_breakpoints_is_the_pick_at_the_grid_point_below(predictor):
    shape = ("ag_gemm", 14336, 4096, 0, 0)
    table = build_schedule_table(predictor, [shape], world_size=2, mode="graph", dtype="bf16")
    source = TableSource(tables=[table])
    grid = token_grid(2)
    from ficco.training.export import grid_scenarios

    scenarios, ms = grid_scenarios(shape, grid, world_size=2, dtype="bf16", hardware_id="h200x2")
    model = predictor.decide(feature_matrix(scenarios), ["graph"] * len(scenarios)).schedules
    looked_up = [source.answer(s, "graph").schedule for s in scenarios]
    assert looked_up == list(model)
    # half-way between two grid points of the same pick (no refinement between them): that pick
    i = next(i for i in range(100, len(ms) - 1) if model[i] == model[i + 1] and ms[i + 1] - ms[i] > 2)
    middle = replace(scenarios[i], m=int(ms[i] + ms[i + 1]) // 4 * 2)
    assert ms[i] < middle.m < ms[i + 1]
    assert source.answer(middle, "graph").schedule == model[i]
    # where two grid points differ, the breakpoint is located to a multiple of 64 tokens between them
    j = next(j for j in range(len(ms) - 1) if model[j] != model[j + 1] and ms[j + 1] - ms[j] > 64)
    entry = table.entries[shape]
    located = [b for b in entry.breakpoints if ms[j] < b <= ms[j + 1]]
    assert located and all(b % 64 == 0 for b in located)


@pytest.mark.slow
def test_exported_tables_reproduce_the_model_on_every_committed_dataset(predictor, tmp_path):
    from ficco.training.table import load_dataset_table

    shapes = sorted({s for d in DATASETS for s in dataset_shapes([d], tp=2, dtype="bf16")})
    paths = export(predictor, out=tmp_path, shapes=shapes, world_size=2)
    source = TableSource.load(tmp_path, machine=None)
    for dataset in DATASETS:
        table = load_dataset_table(dataset).table
        model = predictor.decide(table.X, table.modes).schedules
        looked_up = [source.answer(s, m).schedule for s, m in zip(table.scenarios, table.modes, strict=True)]
        agree = np.mean(np.asarray(looked_up, dtype=object) == model)
        assert agree >= 0.99, f"{dataset.name}: the table gives the model's pick on {agree:.2%} of rows"
    assert len(paths) == 2


def test_table_header_names_model_datasets_fingerprint_and_grid(predictor, tmp_path):
    (path,) = export(predictor, out=tmp_path, shapes=[("gemm_rs", 4096, 7168, 0, 0)], world_size=2,
                     modes=["eager"])  # fmt: skip
    assert path.name == "op=tp_overlap,device_name=NVIDIA_H200,tp=2,mode=eager,dtype=bf16.json"
    data = json.loads(path.read_text())
    assert data["format_version"] == 1 and data["simulated"] is False
    assert data["model"]["version"] == predictor.version
    assert data["datasets"][0]["hash"] == predictor.card["dataset"]["hash"]
    assert data["fingerprint"].startswith("sha256:") and data["grid"]["points_per_octave"] == 16
    (entry,) = data["entries"]
    assert entry["breakpoints"] == sorted(entry["breakpoints"]) and len(entry["ranges"]) == len(
        entry["breakpoints"]
    )
    assert {"schedule", "predicted_speedup", "margin", "confident", "runner_up"} <= set(entry["ranges"][0])


def test_export_refuses_world_sizes_the_model_did_not_measure(predictor):
    with pytest.raises(ExportRefused, match="measured at world sizes \\[2\\], not 4"):
        build_schedule_table(
            predictor, [("ag_gemm", 4096, 4096, 0, 0)], world_size=4, mode="graph", dtype="bf16"
        )


def test_export_of_simulated_model_needs_the_flag_and_is_marked(predictor):
    class Simulated:
        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)
            self.card = {**inner.card, "dataset": {**inner.card["dataset"], "backends": ["sim"]}}
            self._inner = inner

        def decide(self, *args, **kwargs):
            return self._inner.decide(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    sim = Simulated(predictor)
    with pytest.raises(ExportRefused, match="not GPU measurements"):
        build_schedule_table(sim, [("ag_gemm", 4096, 4096, 0, 0)], world_size=2, mode="graph", dtype="bf16")
    table = build_schedule_table(sim, [("ag_gemm", 4096, 4096, 0, 0)], world_size=2, mode="graph",
                                 dtype="bf16", allow_simulated=True)  # fmt: skip
    assert table.header["simulated"] is True and "(simulated)" in table.origin


def test_table_of_another_machine_is_refused_naming_both_fingerprints(predictor, tmp_path):
    export(predictor, out=tmp_path, shapes=[("ag_gemm", 4096, 4096, 0, 0)], world_size=2, modes=["graph"])
    other = {"backend": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 2}
    with pytest.raises(FingerprintMismatch) as err:
        TableSource.load(tmp_path, machine=other)
    message = str(err.value)
    table = ScheduleTableFile.read(next(tmp_path.glob("*.json")))
    assert table.fingerprint in message and "sha256:" in message.split("this machine's is")[1]
    assert "NVIDIA H100 80GB HBM3" in message
    same = dict(table.header["fingerprint_fields"])
    assert TableSource.load(tmp_path, machine=same).tables


def test_vllm_and_autoheuristic_exports_carry_their_evaluation(predictor, tmp_path):
    shapes = [("ag_gemm", 14336, 4096, 0, 0), ("gemm_rs", 4096, 7168, 0, 0)]
    (vllm,) = export(predictor, out=tmp_path, shapes=shapes, world_size=2, modes=["graph"], fmt="vllm",
                     score_on=[REPO / "datasets" / "h200x2-heldout"])  # fmt: skip
    data = json.loads(vllm.read_text())
    assert {t["hidden_size"] for t in data["thresholds"]} == {4096}
    scored = data["evaluation"][str(REPO / "datasets" / "h200x2-heldout")]
    assert {"this_artifact", "vllm_sp_rule", "oracle_serial_or_async_tp"} <= set(scored)
    (module,) = export(predictor, out=tmp_path, shapes=shapes, world_size=2, modes=["graph"],
                       fmt="autoheuristic")  # fmt: skip
    namespace: dict = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    assert namespace["should_fuse"]("ag_gemm", 128, 999, 999) is False  # unknown shape: not fused
    assert isinstance(namespace["should_fuse"]("ag_gemm", 65536, 14336, 4096), bool)
