"""``ficco.runtime.tp`` as users bring it, on gloo worlds of 2 and 4 ranks (``tp_plans``): more model families
(GPT-NeoX's fused q/k/v with biases and parallel residual, Qwen2's grouped-query attention with biased
q/k/v, a Llama whose output projection is tied to its embeddings, an MLP whose output
``PrepareModuleOutput`` gathers again, ``Shard(0)`` layouts) and what users do around the model: the loss
under ``loss_parallel`` on vocab-sharded logits, a model called twice, gradient accumulation, ``no_grad``,
frozen weights, activation checkpointing, ``torch.autocast``, ``torch.compile`` per block, dtype changes
after the plan (``.double()``, ``.half()``, ``.to(torch.bfloat16)``) and FSDP2 over a 2 x 2 mesh. Each case
gives PyTorch's outputs and gradients, dtypes and placements included (``tp_plans.failures``).

Beside it: torchtitan's flow (the plan with ficco's styles, then ``torch.compile`` of each block) runs a
training step of the debug Llama (forward, loss, backward, AdamW) equal to the same step eager; under
autocast the ficco ops run (they follow it) and under ``.double()`` PyTorch's style runs, said once.
"""

from __future__ import annotations

import pytest
from executor_world import run_world
from tp_plans import Case, failures

pytestmark = pytest.mark.slow  # gloo worlds of 2 and 4 ranks
SCHEDULES = "0:shard/sm;16:finer/dma/s2/chunk"
"""ficco's schedules: both executors (batch 1 gathers 8 rows: shard/sm; more: finer/dma)."""

CASES = [
    # families
    Case(model="neox"),
    Case(model="qwen2"),
    Case(model="qwen2", dtype="bf16", local=True),
    Case(model="tied_llama"),
    Case(model="wrapped_mlp", flat=True, batch=3),
    # what users do around the model
    Case(model="llama", usage="loss_parallel"),
    Case(model="gpt2", usage="twice", local=True),
    Case(model="qwen2", usage="accumulate", batch=3),
    Case(model="llama", usage="no_grad"),
    Case(model="gpt2", usage="frozen"),
    Case(model="gemma", usage="checkpoint", local=True),
    Case(model="llama", usage="autocast"),
    Case(model="gpt2", usage="autocast", local=True),
    Case(model="qwen2", sp=False, usage="autocast"),
    Case(model="phi3_mlp", flat=True, batch=3, usage="autocast"),
    Case(model="llama", usage="double"),
    Case(model="llama", usage="half"),
    Case(model="gpt2", usage="to_bf16"),
]
COMPILED = {
    2: [Case(model="gpt2", usage="compile+autocast")],
    4: [Case(model="llama", usage="compile+autocast")],
}
"""Cases compiled per block (``aot_eager``; torchtitan's flow below compiles with Inductor), one per world:
every rank compiles on the runner's cores."""
FSDP = [Case(model="llama", usage="fsdp")]
"""At 4 ranks: tensor parallel over one dimension of a 2 x 2 mesh, FSDP2 over the other."""


def _world(rank: int, world_size: int) -> dict:
    import logging

    import torch
    import tp_plans
    from torch.distributed.device_mesh import init_device_mesh

    cpu = torch.device("cpu")
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict = {"cases": [tp_plans.check(c, mesh, SCHEDULES, cpu) for c in CASES + COMPILED[world_size]]}
    if world_size == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        out["cases"] += [tp_plans.check(c, mesh2["tp"], SCHEDULES, cpu, mesh2["dp"]) for c in FSDP]

    # .double() after the plan: PyTorch's style, said once per module in the log
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("ficco.runtime.tp")
    logger.addHandler(handler)
    try:
        tp_plans.check(Case(model="llama", usage="double"), mesh, SCHEDULES, cpu)
    finally:
        logger.removeHandler(handler)
    out["double_log"] = [r.getMessage() for r in records]
    return out


@pytest.fixture(scope="module")
def worlds() -> dict[int, list[dict]]:
    return {w: run_world(w, _world, timeout_s=900) for w in (2, 4)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_case_gives_pytorchs_outputs_gradients_and_dtypes(worlds, world_size):
    for rank, report in enumerate(worlds[world_size]):
        expected = len(CASES) + len(COMPILED[world_size]) + (len(FSDP) if world_size == 4 else 0)
        assert len(report["cases"]) == expected
        bad = {str(Case(**r["case"])): failures(r) for r in report["cases"] if failures(r)}
        assert not bad, f"rank {rank} of {world_size}: {bad}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_ficco_ops_run_under_autocast_and_pytorchs_style_under_double(worlds, world_size):
    ops = {str(Case(**r["case"])): r["ficco_ops"] for r in worlds[world_size][0]["cases"]}
    for case in CASES:
        overlapped = case.sp and case.prepare == "ficco" and case.model != "reshaping_mlp"
        if case.usage in ("autocast", "half", "to_bf16", "twice", "checkpoint") and overlapped:
            assert ops[str(case)], case  # the ops ran: not PyTorch's style
        if case.usage == "double":
            assert ops[str(case)] == {}, case  # fp64: PyTorch's style


def test_a_dtype_change_after_the_plan_is_said_once_per_module(worlds):
    log = worlds[2][0]["double_log"]
    assert log and all("runs PyTorch's" in line and "torch.float64" in line for line in log)
    assert len(log) == len(set(log))
    assert any("ficco's ops run torch.bfloat16, torch.float16, torch.float32" in line for line in log)


# torchtitan's flow: the plan, then torch.compile per block ------------------------------------------------


def _torchtitan_world(rank: int, world_size: int) -> dict:
    """The debug Llama planned with ficco's styles, each block compiled (Inductor, fullgraph, as
    torchtitan's ``apply_compile``), one training step (loss, backward, AdamW), against the same step eager
    and under PyTorch's styles; the ops the compiled step ran."""
    import copy

    import torch
    import torch.distributed.tensor.parallel as torch_styles
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from tp_plans import ficco_styles_with

    from benchmarks import llama
    from ficco.executor import library

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    base = llama.Transformer(llama.LlamaArgs())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (2, 32), generator=gen)
    labels = torch.randint(0, 64, (2, 32), generator=gen)

    def step(styles, compiled: bool) -> dict:
        model = copy.deepcopy(base)
        llama.apply_tp(model, mesh, styles)
        if compiled:
            for name, block in list(model.layers.named_children()):
                model.layers.register_module(name, torch.compile(block, fullgraph=True))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        grads = {n.replace("_orig_mod.", ""): p.grad.full_tensor() for n, p in model.named_parameters()}
        optimizer.step()
        params = {n.replace("_orig_mod.", ""): p.full_tensor() for n, p in model.named_parameters()}
        return {"loss": loss.detach(), "grads": grads, "params": params}

    ficco = ficco_styles_with("0:shard/sm;64:finer/dma/s2/chunk")
    library.clear_run_report()
    got = step(ficco, compiled=True)
    ran = sorted({(r.op, r.ran) for r in library.run_report()})
    eager, theirs = step(ficco, compiled=False), step(torch_styles, compiled=False)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    return {
        "ran": ran,
        "errors": {
            ref: max(
                [rel(got["loss"], want["loss"])]
                + [rel(got[k][n], want[k][n]) for k in ("grads", "params") for n in want[k]]
            )
            for ref, want in (("eager", eager), ("pytorch", theirs))
        },
    }


@pytest.mark.heavy
def test_torchtitans_flow_compiles_each_block_and_trains_as_eager():
    for report in run_world(2, _torchtitan_world, timeout_s=900):
        assert report["errors"]["eager"] <= 1e-5, report["errors"]
        assert report["errors"]["pytorch"] <= 1e-5, report["errors"]
        # the compiled blocks ran ficco's ops, their gradients' too (64 gathered rows: finer/dma)
        assert ("ag_gemm", "finer/dma/s2/chunk") in report["ran"], report["ran"]
        assert ("gemm_rs", "finer/dma/s2/chunk") in report["ran"], report["ran"]
