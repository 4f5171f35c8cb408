"""``ficco.runtime.tp`` against PyTorch's parallel styles: a Llama 3 at debug size (``benchmarks/llama.py``:
torchtitan's module names and ``apply_tp``) parallelized once with PyTorch's styles and once with ficco's,
on gloo worlds of 2 and 4 ranks: the loss and every parameter gradient agree (fp32, 1e-5 relative) for a
schedule of every family, a token-range table and a planner, given as torchtitan gives float8 styles
(``functools.partial(ColwiseParallel, schedules=...)``); each block runs four ficco ops (q/k/v as one,
wo, w1/w3 as one, w2) plus the output layer's; the planner's table names what ran. ``test_tp_plans.py``
has the rule on other models and plans."""

from __future__ import annotations

import pytest
from executor_world import run_world

SCHEDULES = [
    "serial/sm",
    "serial/dma",
    "shard/sm",
    "shard/dma/hp",
    "finer/sm/s2/chunk",
    "finer/dma/s2/shard",
    "0:finer/sm/s8/chunk;64:shard/dma",
    "planner",
]
TOLERANCE = 1e-5
pytestmark = pytest.mark.slow  # every test runs gloo worlds of 2 and 4 ranks


def _tp_world(rank: int, world_size: int) -> dict:
    import copy
    import warnings

    import torch
    import torch.distributed.tensor.parallel as torch_styles
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from tp_plans import CountFiccoOps, ficco_styles_with

    from benchmarks import llama
    from ficco.executor import library
    from ficco.runtime import FixedSource, Planner
    from ficco.runtime import tp as ficco_styles

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)  # the same model on every rank
    base = llama.Transformer(llama.LlamaArgs())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (2, 32), generator=gen)
    labels = torch.randint(0, 64, (2, 32), generator=gen)

    def step(styles) -> tuple[float, dict[str, torch.Tensor], dict[str, int]]:
        model = copy.deepcopy(base)
        llama.apply_tp(model, mesh, styles)
        ficco_styles.name_modules(model)
        with CountFiccoOps() as counter:
            loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
            loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        grads = {n: g.full_tensor() if isinstance(g, DTensor) else g for n, g in grads.items()}
        return float(loss), grads, counter.counts

    ref_loss, ref_grads, ref_counts = step(torch_styles)
    out: dict = {"torch_counts": ref_counts, "cases": {}}
    for schedule in SCHEDULES:
        planner = Planner(FixedSource("finer/dma/s2/chunk")) if schedule == "planner" else None
        loss, grads, counts = step(ficco_styles_with(planner or schedule))
        errors = {n: float((grads[n] - g).norm() / g.norm()) for n, g in ref_grads.items()}
        loss_error = abs(loss - ref_loss) / abs(ref_loss)
        out["cases"][schedule] = {"loss": loss_error, "grads": errors, "counts": counts}
        if planner is not None:
            out["planner_rows"] = planner.rows()
    # inference (no autograd: the planner decides no backward op), schedules from the deprecated default
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref_logits = copy.deepcopy(base)
        llama.apply_tp(ref_logits, mesh, torch_styles)
        model = copy.deepcopy(base)
        ficco_styles.set_default_schedules("finer/sm/s2/chunk")
        llama.apply_tp(model, mesh, ficco_styles)
        want, got = ref_logits(tokens), model(tokens)
        out["inference"] = float((got - want).norm() / want.norm())
        out["inference_ran"] = [r.ran for r in library.run_report() if r.asked == "finer/sm/s2/chunk"]
        ficco_styles.set_default_schedules(None)
    out["deprecated"] = [str(w.message) for w in caught if w.category is DeprecationWarning]
    return out


@pytest.fixture(scope="module")
def worlds() -> dict[int, list[dict]]:
    return {w: run_world(w, _tp_world) for w in (2, 4)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_loss_and_every_gradient_match_pytorch_styles(worlds, world_size):
    for rank, report in enumerate(worlds[world_size]):
        assert list(report["cases"]) == SCHEDULES
        for schedule, case in report["cases"].items():
            assert case["loss"] <= TOLERANCE, (rank, schedule, case["loss"])
            assert len(case["grads"]) == 2 + 2 * 9 + 1  # embeddings, output, norm; 9 per block
            bad = {n: e for n, e in case["grads"].items() if not e <= TOLERANCE}
            assert not bad, f"rank {rank} {schedule}: relative gradient errors {bad}"


def test_each_block_runs_four_ficco_ops_and_pytorch_styles_none(worlds):
    report = worlds[2][0]
    assert report["torch_counts"] == {}
    for case in report["cases"].values():
        # forward: per block q/k/v and w1/w3 (one all-gather op each), wo and w2, plus the output layer;
        # backward: each op's gradient runs the other op of the pair (of q/k/v and w1/w3, the summed GEMMs'
        # matmuls_reduce_scatter). The dispatch mode sees each op's twin without autograd (the public op
        # decomposes into it above the mode)
        assert case["counts"] == {
            "ficco._all_gather_matmul.default": 2 * 2 + 1 + 2 * 2,
            "ficco._matmul_reduce_scatter.default": 2 * 2 + 1,
            "ficco._matmuls_reduce_scatter.default": 2 * 2,
        }, case["counts"]


def test_planner_table_names_each_layer_and_what_ran(worlds):
    rows = [r for r in worlds[2][0]["planner_rows"] if r["schedule"] != "-"]  # "-": a note, no op
    layers = {r["layer"] for r in rows}
    assert {"layers.0.attention.wq", "layers.1.feed_forward.w2", "output"} <= layers, layers
    assert all(r["ran"] == "finer/dma/s2/chunk" for r in rows if r["direction"] == "fwd"), rows


@pytest.mark.parametrize("world_size", [2, 4])
def test_inference_logits_match_pytorch_styles(worlds, world_size):
    assert all(report["inference"] <= TOLERANCE for report in worlds[world_size])


def test_the_deprecated_process_default_still_gives_the_styles_their_schedules(worlds):
    for report in worlds[2]:
        assert report["inference_ran"] and set(report["inference_ran"]) == {"finer/sm/s2/chunk"}
        assert (
            len(report["deprecated"]) == 2 and "functools.partial(ColwiseParallel" in report["deprecated"][0]
        )
