"""Column- and row-parallel layers against a plain serial reference, forward and backward, on gloo worlds of
2 and 4 ranks: a Megatron MLP (column -> GELU -> row) under several fixed schedules, both weight-gradient
options (gathered input kept or gathered again), fp32 and bf16, and the shipped predictor of the group's size
(h200x2 at 2 ranks, h200x4 at 4) as the planner."""

from __future__ import annotations

import pytest
from executor_world import run_world

TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}
SCHEDULES = {
    2: [
        "serial/sm",
        "shard/sm",
        "shard/dma",
        "finer/sm/s2/chunk",
        "finer/dma/s4/shard/hp",
        "finer/sm/s8/chunk",
    ],
    4: ["serial/sm", "shard/dma", "finer/sm/s2/shard", "finer/dma/s8/chunk"],
}
T, IN, HIDDEN, OUT = 64, 16, 24, 8
"""Tokens (all ranks together; divisible by world_size * 8) and the MLP's feature sizes."""


def _mlp_world(
    rank: int,
    world_size: int,
    model_root: str | None,
    device: str = "cpu",
    sizes: tuple[int, int, int, int] = (T, IN, HIDDEN, OUT),
    schedules: list[str] | None = None,
) -> dict:
    """Runs on every rank: each (schedule, keep, dtype) case's relative errors against the reference
    (``tests/runtime/gpu_layers_check.py`` runs it on GPUs with larger ``sizes``)."""
    import torch
    import torch.nn.functional as F

    from ficco.runtime import ColumnParallelLinear, FixedSource, PlannedOps, Planner, RowParallelLinear

    T, IN, HIDDEN, OUT = sizes  # the module constants by default
    schedules = schedules or SCHEDULES[world_size]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    gen = torch.Generator().manual_seed(7)  # the same full tensors on every rank
    full = {
        "x": torch.randn(T, IN, generator=gen),
        "w1": torch.randn(IN, HIDDEN, generator=gen) / IN**0.5,
        "w2": torch.randn(HIDDEN, OUT, generator=gen) / HIDDEN**0.5,
        "g": torch.randn(T, OUT, generator=gen),
    }
    rows = slice(rank * T // world_size, (rank + 1) * T // world_size)
    cols = slice(rank * HIDDEN // world_size, (rank + 1) * HIDDEN // world_size)

    def reference(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Serial fp32 math on the dtype-rounded inputs: y rows, and the grads of x rows, w1 cols, w2 rows."""
        t = {k: v.to(dtype).float().clone().requires_grad_(k != "g") for k, v in full.items()}
        y = F.gelu(t["x"] @ t["w1"]) @ t["w2"]
        (y * t["g"]).sum().backward()
        return {"y": y[rows], "x": t["x"].grad[rows], "w1": t["w1"].grad[:, cols], "w2": t["w2"].grad[cols]}

    def run(planner: Planner, keep: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        layer = {"schedules": planner, "dtype": dtype, "device": device}
        up = ColumnParallelLinear(IN, HIDDEN, name="up", keep_gathered=keep, **layer)
        down = RowParallelLinear(HIDDEN, OUT, name="down", **layer)
        up.load_full_weight(full["w1"].to(device, dtype))
        down.load_full_weight(full["w2"].to(device, dtype))
        x = full["x"][rows].to(device, dtype).requires_grad_()
        y = down(F.gelu(up(x)))
        (y.float() * full["g"][rows].to(device)).sum().backward()
        return {"y": y, "x": x.grad, "w1": up.weight.grad, "w2": down.weight.grad}

    def errors(got: dict, ref: dict) -> dict[str, float]:
        missing = [k for k in ref if got[k] is None]
        assert not missing, f"no gradient for {missing}"
        return {k: float((got[k].float().cpu() - ref[k]).norm() / ref[k].norm()) for k in ref}

    out: dict = {"cases": [], "inference": [], "planner": None}
    for dtype_name, dtype in dtypes.items():
        ref = reference(dtype)
        for schedule in schedules:
            for keep in (True, False):
                got = run(Planner(FixedSource(schedule)), keep, dtype)
                out["cases"].append((dtype_name, schedule, keep, errors(got, ref)))
        # inference (no autograd): the forward alone, a different path through the layers
        ops = PlannedOps(Planner(FixedSource(schedules[-1]), mode="graph"))
        up = ColumnParallelLinear(IN, HIDDEN, ops=ops, dtype=dtype, device=device)
        down = RowParallelLinear(HIDDEN, OUT, ops=ops, dtype=dtype, device=device)
        up.load_full_weight(full["w1"].to(device, dtype))
        down.load_full_weight(full["w2"].to(device, dtype))
        with torch.no_grad():
            y = down(F.gelu(up(full["x"][rows].to(device, dtype))))
        out["inference"].append((dtype_name, errors({"y": y}, {"y": ref["y"].detach()})["y"]))
    if model_root is not None:
        from ficco.features.hardware import hardware_of
        from ficco.runtime import PredictorSource

        hardware = hardware_of("NVIDIA H200", world_size)  # the shipped model of this group's size
        planner = Planner(PredictorSource.load(model_root, hardware.id))
        got = run(planner, True, torch.bfloat16)
        origins = sorted({d.origin for d in planner.decisions.values()})
        out["planner"] = (errors(got, reference(torch.bfloat16)), planner.rows(), origins)
    return out


@pytest.fixture(scope="module")
def worlds() -> dict[int, list[dict]]:
    from ficco.training.predict.registry import default_model_root

    root = str(default_model_root())
    return {w: run_world(w, _mlp_world, root) for w in (2, 4)}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_gradients_match_serial_reference(worlds, world_size):
    reports = worlds[world_size]
    expected = 2 * len(SCHEDULES[world_size]) * 2  # dtypes x schedules x keep
    for rank, report in enumerate(reports):
        assert len(report["cases"]) == expected
        for dtype, schedule, keep, errs in report["cases"]:
            bad = {k: e for k, e in errs.items() if not e <= TOLERANCE[dtype]}
            assert not bad, f"rank {rank} {dtype} {schedule} keep_gathered={keep}: relative errors {bad}"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_inference_forward_matches_serial_reference(worlds, world_size):
    for report in worlds[world_size]:
        for dtype, err in report["inference"]:
            assert err <= TOLERANCE[dtype], (dtype, err)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_shipped_predictor_plans_every_op_and_matches_reference(worlds, world_size):
    """The measured model of the group's size plans every op (h200x4's at 4 ranks), rank 0's decisions
    broadcast to every rank, and the layers match the serial reference."""
    from ficco.training.predict.registry import current_version, default_model_root

    hardware = f"h200x{world_size}"
    version = current_version(default_model_root(), hardware)
    for rank, report in enumerate(worlds[world_size]):
        errs, rows, origins = report["planner"]
        assert all(e <= TOLERANCE["bf16"] for e in errs.values()), (rank, errs)
        seen = {(r["layer"], r["direction"]) for r in rows}
        assert seen == {(layer, d) for layer in ("up", "down") for d in ("fwd", "bwd-input", "bwd-weight")}
        planned = [r for r in rows if r["direction"] != "bwd-weight"]
        assert all(r["schedule"] not in ("-", "(not decided)") for r in planned), rows
        assert origins == [f"model {hardware}/{version} (measured)"], origins
        assert report["planner"][1] == worlds[world_size][0]["planner"][1]  # the ranks ran the same schedules


def test_layer_rejects_bad_shapes():
    from ficco.runtime import ColumnParallelLinear, RowParallelLinear

    class TwoRanks:
        world_size, rank = 2, 0

    with pytest.raises(
        ValueError, match="out_features must be a positive multiple of the group size 2; got 7"
    ):
        ColumnParallelLinear(4, 7, ops=TwoRanks())
    with pytest.raises(
        ValueError, match="in_features must be a positive multiple of the group size 2; got 5"
    ):
        RowParallelLinear(5, 4, ops=TwoRanks())
    import torch

    layer = ColumnParallelLinear(4, 8, ops=TwoRanks())
    with pytest.raises(
        ValueError, match=r"input has shape \[3, 5\]; expected a 2-D tensor \[T/w, in\] with 4"
    ):
        layer(torch.randn(3, 5))


def test_a_layer_takes_schedules_or_ops_not_both():
    from benchmarks.support.loopback import loopback_world
    from ficco.runtime import ColumnParallelLinear, PlannedOps

    with loopback_world(2, "cpu"):
        layer = ColumnParallelLinear(4, 8, schedules="0:serial/sm;64:shard/dma")
        assert layer.ops.planner.source.origin == "fixed 0:serial/sm;64:shard/dma"
        with pytest.raises(ValueError, match=r"give schedules= .* or ops= .*, not both"):
            ColumnParallelLinear(4, 8, schedules="shard/dma", ops=PlannedOps("shard/dma"))


def test_both_layers_show_every_keyword_they_take_and_a_misspelt_one_names_the_layer():
    import inspect

    from ficco.runtime import ColumnParallelLinear, RowParallelLinear

    shared = {"schedules", "ops", "name", "device", "dtype"}
    assert shared | {"keep_gathered"} <= set(inspect.signature(ColumnParallelLinear).parameters)
    assert shared <= set(inspect.signature(RowParallelLinear).parameters)
    with pytest.raises(
        TypeError, match=r"ColumnParallelLinear.__init__\(\) got an unexpected keyword .*'schedule'"
    ):
        ColumnParallelLinear(8, 8, schedule="serial/sm")
