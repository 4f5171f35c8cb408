"""``ficco export``: tables agree with the model at token counts it was never asked at and never answer a
schedule that cannot run; exports the model cannot back are refused in one line."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ficco.features import Scenario, Schedule, feature_matrix, get_hardware
from ficco.features.schedule import max_splits
from ficco.features.schedule_table import FingerprintMismatch, ScheduleTableFile
from ficco.runtime.sources import TableSource
from ficco.training.export import (
    BUILD_VERSION,
    ExportRefused,
    InvalidShapes,
    build_schedule_table,
    dataset_shapes,
    export,
    read_grid_table,
    token_grid,
)
from ficco.training.predict.registry import load_predictor

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
DATASETS = sorted(p for p in (REPO / "datasets").glob("h200x2*") if (p / "manifest.json").exists())
"""Every committed dataset of the hardware a model is registered for."""
SHAPES = [
    ("ag_gemm", 14336, 4096, 0, 0), ("gemm_rs", 4096, 7168, 0, 0), ("ag_gemm", 1024, 28672, 0, 0),
    ("gemm_rs", 1280, 1024, 0, 0), ("a2a_gemm", 2048, 4096, 8, 2), ("gemm_a2a", 4096, 1536, 128, 8),
]  # fmt: skip
"""Dense shapes of several sizes (a tiny GEMM at small m, a narrow deep reduce-scatter) and MoE shapes of
top_k 2 (every split class) and 8 (rows always split 8 ways)."""


@pytest.fixture(scope="module")
def predictor():
    return load_predictor(MODELS, "h200x2")


def random_token_counts(shape, world_size: int, count: int, seed: int) -> list[int]:
    """``count`` log-uniform token counts of ``shape`` in [1, 65536] that a scenario can have, none a point
    of ``token_grid`` (off the grid)."""
    rng = np.random.default_rng(seed)
    grid = set(token_grid(world_size).tolist())
    out: list[int] = []
    while len(out) < count:
        m = int(np.exp(rng.uniform(0, np.log(65536))))
        if m not in grid and (m * (shape[4] or 1)) % world_size == 0:
            out.append(m)
    return out


def scenario(shape, m: int, world_size: int = 2, hardware=None) -> Scenario:
    op, n, k, experts, top_k = shape
    return Scenario(op=op, m=m, n=n, k=k, experts=experts, top_k=top_k, world_size=world_size,
                    hardware=hardware or get_hardware("h200x2"))  # fmt: skip


def test_token_grid_is_sorted_multiples_of_the_world_size():
    for w in (2, 4, 6, 8):
        grid = token_grid(w)
        assert np.all(np.diff(grid) > 0) and np.all(grid % w == 0)
        if w in (2, 4, 8):  # other sizes round each point down to a multiple of w
            above = grid[:-1] >= 16 * w  # below, the step is the world size itself
            assert (np.diff(grid)[above] / grid[:-1][above]).max() <= 1 / 16 + 1e-9


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_lookups_at_random_token_counts_are_the_models_pick_and_run(predictor, mode):
    table = build_schedule_table(predictor, SHAPES, world_size=2, mode=mode, dtype="bf16")
    source = TableSource(tables=[table])
    scenarios = [scenario(s, m) for i, s in enumerate(SHAPES) for m in random_token_counts(s, 2, 150, i)]
    assert {max_splits(s.rows, 2) for s in scenarios} == {1, 2, 4, 8}  # every split class is met
    answers = [source.answer(s, mode) for s in scenarios]
    for s, a in zip(scenarios, answers, strict=True):
        Schedule.parse(a.schedule).check(s)  # raises for a schedule that cannot run at m
        assert a.neighbours is not None and a.neighbours >= 0
    model = predictor.decide(feature_matrix(scenarios), [mode] * len(scenarios)).schedules
    agree = np.mean(np.asarray([a.schedule for a in answers], dtype=object) == model)
    assert agree >= 0.98, f"{mode}: the table gives the model's pick at {agree:.2%} of random token counts"


def test_every_range_runs_over_its_whole_split_class_and_counts_neighbours(predictor):
    table = build_schedule_table(predictor, SHAPES, world_size=2, mode="graph", dtype="bf16")
    coverage = predictor.coverage
    for entry in table.entries.values():
        shape = entry.key
        for track in entry.tracks:
            for start, r in zip(track.breakpoints, track.ranges, strict=True):
                assert Schedule.parse(r.schedule).splits <= track.max_splits
                # the range's first token count of its class: the model's own answer and neighbour count
                rows = shape[4] or 1
                m = next(m for m in range(start, start + 64)
                         if max_splits(m * rows, 2) == track.max_splits and m * rows % 2 == 0)  # fmt: skip
                s = scenario(shape, m)
                assert table.entries[shape].lookup(m, 2) is r
                assert r.neighbours <= coverage.count([s], "graph")[0]
    for (*_, top_k), entry in table.entries.items():  # a track per class the shape meets
        rows = [m * (top_k or 1) for m in range(1, 64)]
        met = {max_splits(r, 2) for r in rows if r % 2 == 0}
        assert [t.max_splits for t in entry.tracks] == sorted(met, reverse=True)
    assert len(table.entries[("gemm_a2a", 4096, 1536, 128, 8)].tracks) == 2  # 8 rows a token: 8 or 4 ways


def test_table_decides_every_token_count_below_64_and_the_grid_exactly(predictor):
    shape = ("gemm_rs", 1280, 1024, 0, 0)
    table = build_schedule_table(predictor, [shape], world_size=2, mode="eager", dtype="bf16")
    ms = [m for m in range(2, 64, 2)] + token_grid(2).tolist()
    scenarios = [scenario(shape, m) for m in ms]
    model = predictor.decide(feature_matrix(scenarios), ["eager"] * len(ms)).schedules
    assert [table.entries[shape].lookup(m, 2).schedule for m in ms] == list(model)


@pytest.mark.heavy
@pytest.mark.slow
def test_exported_tables_reproduce_the_model_on_every_committed_dataset(predictor, tmp_path):
    from ficco.training.dataset_table import load_dataset_table

    shapes = sorted({s for d in DATASETS for s in dataset_shapes([d], tp=2, dtype="bf16")})[::4]
    paths = export(predictor, out=tmp_path, shapes=shapes, world_size=2)  # a quarter of the shapes: time
    source = TableSource.load(tmp_path, machine=None)
    for dataset in DATASETS:
        table = load_dataset_table(dataset).table
        keep = np.array([(s.op, s.n, s.k, s.experts, s.top_k) in set(shapes) for s in table.scenarios])
        if not keep.any():
            continue
        table = table.subset(keep)
        model = predictor.decide(table.X, table.modes).schedules
        looked_up = [source.answer(s, m).schedule for s, m in zip(table.scenarios, table.modes, strict=True)]
        agree = np.mean(np.asarray(looked_up, dtype=object) == model)
        assert agree >= 0.99, f"{dataset.name}: the table gives the model's pick on {agree:.2%} of rows"
    assert len(paths) == 2


def test_table_header_names_model_datasets_fingerprint_grid_and_neighbours(predictor, tmp_path):
    (path,) = export(predictor, out=tmp_path, shapes=[("gemm_rs", 4096, 7168, 0, 0)], world_size=2,
                     modes=["eager"])  # fmt: skip
    assert path.name == "op=tp_overlap,device_name=NVIDIA_H200,tp=2,mode=eager,dtype=bf16.json"
    data = json.loads(path.read_text())
    assert data["format_version"] == 2 and data["simulated"] is False
    assert data["model"]["version"] == predictor.version and data["model"]["coverage"] is True
    assert data["datasets"][0]["hash"] == predictor.card["dataset"]["hash"]
    assert data["fingerprint"].startswith("sha256:") and data["grid"]["points_per_octave"] == 16
    assert data["neighbours"] == {"factor": 2, "off_map_below": 0}
    (entry,) = data["entries"]
    assert [t["max_splits"] for t in entry["tracks"]] == [8, 4, 2, 1]
    track = entry["tracks"][0]
    assert track["breakpoints"] == sorted(track["breakpoints"]) and len(track["ranges"]) == len(
        track["breakpoints"]
    )
    assert {"schedule", "predicted_speedup", "margin", "confident", "runner_up", "neighbours"} <= set(
        track["ranges"][0]
    )
    assert ScheduleTableFile.read(path).to_dict() == data  # reads back


def test_export_refuses_world_sizes_the_model_was_not_trained_at_even_when_simulated_is_allowed(predictor):
    for allow in (False, True):
        with pytest.raises(
            ExportRefused, match=r"trained at world sizes \[2\], not 4.*--hardware h200x4-sim"
        ):
            build_schedule_table(predictor, [("ag_gemm", 4096, 4096, 0, 0)], world_size=4, mode="graph",
                                 dtype="bf16", allow_simulated=allow)  # fmt: skip


def test_shapes_no_table_can_hold_are_refused_naming_each(predictor):
    bad = [("ag_gemm", 4096, 4096, 0, 0), ("foo", 1, 1, 0, 0), ("a2a_gemm", 4096, 4096, 7, 2),
           ("gemm_rs", 0, 4096, 0, 0), ("ag_gemm", 4096, 1 << 22, 0, 0)]  # fmt: skip
    with pytest.raises(InvalidShapes) as err:
        build_schedule_table(predictor, bad, world_size=2, mode="graph", dtype="bf16")
    assert [i for i, _, _ in err.value.errors] == [1, 2, 3, 4]
    assert "op must be one of" in str(err.value) and "multiple of world_size" in str(err.value)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ficco.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.heavy
def test_a_simulated_model_exports_when_asked_marked_simulated(tmp_path):
    from tests.service.conftest import train_version

    train_version(tmp_path / "models", "h200x4-sim", world_size=4)
    common = ["export", "--model-root", str(tmp_path / "models"), "--hardware", "h200x4-sim", "--tp", "4",
              "--mode", "graph", "--shape", "ag_gemm:4096:4096", "--out", str(tmp_path / "t")]  # fmt: skip
    refused = run_cli(*common)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: ") and "--allow-simulated" in refused.stderr
    done = run_cli(*common, "--allow-simulated")
    assert done.returncode == 0, done.stderr
    data = json.loads(Path(done.stdout.strip()).read_text())
    assert data["simulated"] is True and data["world_size"] == 4 and data["hardware_id"] == "h200x4-sim"
    assert "(simulated)" in ScheduleTableFile.from_dict(data).origin
    two = run_cli(*common[:5], "--tp", "2", *common[7:], "--allow-simulated")
    assert two.returncode == 2 and "trained at world sizes [4], not 2" in two.stderr
    assert two.stderr.count("\n") == 1


@pytest.mark.heavy
def test_export_of_overlapping_datasets_and_bad_inputs_gives_one_line(tmp_path):
    v2, base = REPO / "datasets" / "h200x2-v2", REPO / "datasets" / "h200x2-swap-trial"  # the same scenarios
    shapes = dataset_shapes([v2, base], tp=2, dtype="bf16")
    assert shapes == dataset_shapes([v2], tp=2, dtype="bf16")  # shared scenarios give their shapes once
    broken = tmp_path / "broken.json"
    broken.write_text('{"model_type": "llama"')
    for args in (
        ["--dataset", str(REPO / "datasets" / "nothing-here")],
        ["--config", str(broken)],
        ["--shape", "ag_gemm:4096:4096", "--tp", "4"],
        ["--shape", "a2a_gemm:4096:4096:7:2"],
    ):
        done = run_cli("export", "--out", str(tmp_path / "t"), "--mode", "graph", *args)
        assert done.returncode == 2 and done.stderr.startswith("error: "), (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (args, done.stderr)


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


@pytest.mark.heavy
def test_vllm_and_autoheuristic_exports_carry_their_evaluation(predictor, tmp_path):
    shapes = [("ag_gemm", 14336, 4096, 0, 0), ("gemm_rs", 4096, 7168, 0, 0)]
    from ficco.training.dropin import write_dropin

    settings = {"out": tmp_path, "shapes": shapes, "world_size": 2, "modes": ["graph"], "dtype": "bf16",
                "host_factor": None, "allow_simulated": False}  # fmt: skip
    (vllm,) = write_dropin(predictor, "vllm", score_on=[REPO / "datasets" / "h200x2-heldout"], **settings)
    data = json.loads(vllm.read_text())
    assert {t["hidden_size"] for t in data["thresholds"]} == {4096}
    scored = data["evaluation"][str(REPO / "datasets" / "h200x2-heldout")]
    assert {"this_artifact", "vllm_sp_rule", "oracle_serial_or_async_tp"} <= set(scored)
    (module,) = write_dropin(predictor, "autoheuristic", score_on=[], **settings)
    namespace: dict = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    assert namespace["should_fuse"]("ag_gemm", 128, 999, 999) is False  # unknown shape: not fused
    assert isinstance(namespace["should_fuse"]("ag_gemm", 65536, 14336, 4096), bool)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_no_range_is_predicted_slower_than_serial_beyond_the_band_nor_flips_priority_for_a_tie(
    predictor, mode
):
    """The policy's guarantee holds in tables: every range's lowest predicted speedup is at least
    1 / (1 + noise band), and a boundary that only changes the stream priority starts a /hp range only where
    the /hp schedule is predicted faster than its twin beyond the band (a tie goes to the twin)."""
    from ficco.features.launch_cost import TWIN_OF
    from ficco.training.export import class_residues, next_in_class
    from ficco.training.predict.pairs import SCHEDULES

    shapes = [*SHAPES, ("ag_gemm", 3584, 5120, 0, 0), ("ag_gemm", 5120, 5120, 0, 0)]  # Qwen2.5-14B's
    table = build_schedule_table(predictor, shapes, world_size=2, mode=mode, dtype="bf16")
    policy = predictor.policy.of(mode)
    flips = []  # (shape, first token count of the /hp range, the /hp column)
    for entry in table.entries.values():
        for track in entry.tracks:
            assert all(r.min_speedup >= policy.slowest - 5e-5 for r in track.ranges), (entry.key, track)
            names = [SCHEDULES.index(r.schedule) for r in track.ranges]
            for i, (a, b) in enumerate(itertools.pairwise(names)):
                if a != b and TWIN_OF[a] == TWIN_OF[b]:  # the /hp range's first token count in its class
                    period, residues = class_residues(2, entry.top_k)
                    start = track.breakpoints[i + (b != TWIN_OF[b])]
                    flips.append(
                        (entry.key, next_in_class(start, period, residues[track.max_splits]), max(a, b))
                    )
    scenarios = [scenario(shape, m) for shape, m, _ in flips]
    if scenarios:
        d = predictor.decide(feature_matrix(scenarios), [mode] * len(scenarios))
        for i, (shape, m, hp) in enumerate(flips):
            plain = TWIN_OF[hp]
            gain = d.speedups[i, hp] / d.speedups[i, plain]
            assert gain > 1 + policy.noise_band or d.speedups[i, plain] < policy.slowest, (shape, m, gain)
    assert table.header["build_version"] == BUILD_VERSION


def test_grid_tables_written_into_the_model_are_read_back_only_while_current(
    predictor, tmp_path, monkeypatch
):
    """``ficco export --into-model``'s tables: read back for the same model, request and build version;
    None for another version, a stale build or a damaged file (the service then builds)."""
    import gzip

    from ficco.training import export as export_module

    monkeypatch.setattr(export_module, "grid_shapes", lambda: [("ag_gemm", 4096, 4096, 0, 0)])
    folder = tmp_path / "h200x2" / predictor.version
    paths = export_module.write_grid_tables(predictor, folder)
    assert [p.name for p in paths] == [
        f"op=tp_overlap,device_name=NVIDIA_H200,tp=2,mode={mode},dtype=bf16.json.gz"
        for mode in ("eager", "graph")
    ]
    found = read_grid_table(folder, predictor, tp=2, mode="graph", dtype="bf16")
    table = ScheduleTableFile.from_dict(json.loads(gzip.decompress(found)))
    assert found == paths[1].read_bytes() and table.mode == "graph" and len(table.entries) == 1
    assert read_grid_table(folder, predictor, tp=2, mode="graph", dtype="fp16") is None  # not written
    monkeypatch.setattr(export_module, "BUILD_VERSION", BUILD_VERSION + 1)
    assert read_grid_table(folder, predictor, tp=2, mode="graph", dtype="bf16") is None  # other rules
    monkeypatch.setattr(export_module, "BUILD_VERSION", BUILD_VERSION)
    paths[0].write_bytes(b"not gzip")
    assert read_grid_table(folder, predictor, tp=2, mode="eager", dtype="bf16") is None


@pytest.mark.parametrize("hardware_id", ["h200x2", "h200x4", "h200x8-sim", "h100x8-sim"])
def test_the_shipped_models_ship_their_current_grid_tables(hardware_id):
    """The grid tables GET /v1/tables serves are in each shipped model's folder (the simulated 8-rank ones
    too: the service's start-up prefetch builds none), built by this code's rules: a change of the rules
    that does not bump BUILD_VERSION shows here (a few shapes rebuilt)."""
    import gzip

    from ficco.training.export import grid_requests, grid_shapes

    predictor = load_predictor(MODELS, hardware_id)
    folder = MODELS / hardware_id / predictor.version
    assert grid_requests(predictor)
    for request in grid_requests(predictor):
        found = read_grid_table(
            folder, predictor, tp=request["tp"], mode=request["mode"], dtype=request["dtype"]
        )
        assert found is not None, (
            f"{request}: run `ficco export --into-model --hardware {hardware_id}` and commit it"
        )
        shipped = ScheduleTableFile.from_dict(json.loads(gzip.decompress(found)))
        shapes = grid_shapes()[::60]
        asked = {"world_size": request["tp"], "mode": request["mode"], "dtype": request["dtype"]}
        rebuilt = build_schedule_table(predictor, shapes, **asked, allow_simulated=request["allow_simulated"])
        for shape in shapes:  # the same ranges (speedups to rounding: XGBoost's or the numpy walk's sums)
            for old, new in zip(shipped.entries[shape].tracks, rebuilt.entries[shape].tracks, strict=True):
                assert (old.max_splits, old.breakpoints) == (new.max_splits, new.breakpoints), shape
                assert [r.schedule for r in old.ranges] == [r.schedule for r in new.ranges], shape
                np.testing.assert_allclose([r.predicted_speedup for r in old.ranges],
                                           [r.predicted_speedup for r in new.ranges], atol=2e-4)  # fmt: skip
