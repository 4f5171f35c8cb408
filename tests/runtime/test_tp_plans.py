"""``ficco.runtime.tp``'s rule on a matrix of models and plans (``tp_plans``): the output, the input's
gradient and every parameter's gradient equal those of the same plan under PyTorch's styles, same seed and
input (fp32 within 1e-5; bf16 within 1e-2 of the fp32 run, or twice PyTorch's own rounding error), with
PyTorch's gradient placements, and a replicated gradient identical on every rank wherever PyTorch's is.

The matrix, on gloo worlds of 2 and 4 ranks (one world per size, every case run in it): Llama, GPT-2 (fused
``c_attn``, biases everywhere), Gemma (extra norms), a Phi-3 fused gate/up MLP, an MLP that views its input
as tokens, one whose router reads its input beside its projections, an output projection 4 ranks shard
unevenly, linears with a forward of their own; sequence parallel (every mix of PyTorch's and ficco's
``PrepareModuleInput`` and linear styles, ``use_local_output`` both ways) and plain tensor parallel; batch
1, 2 and 3; ``[batch, seq, hidden]`` and ``[tokens, hidden]`` inputs; fp32 and bf16; a few more cases drawn
from the same space with a fixed seed; and at 4 ranks, tensor parallelism over one dimension of a 2 x 2
mesh. Beside it: which ficco ops ran (the rule is not met by running PyTorch's styles everywhere), shapes
the ranks cannot share evenly (a ``ValueError`` on every rank, before any collective), and what the log
and the planner's table say about modules left to PyTorch.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from executor_world import errors_of, run_world
from tp_plans import MODELS, Case, failures

pytestmark = pytest.mark.slow  # gloo worlds of 2 and 4 ranks
SCHEDULES = "0:shard/sm;16:finer/dma/s2/chunk"
"""ficco's schedules: both executors (batch 1 gathers 8 rows: shard/sm; more: finer/dma)."""
MIXES = [(prep, lin, local) for prep, lin in (("ficco", "ficco"), ("torch", "ficco"), ("ficco", "torch"))
         for local in (False, True)]  # fmt: skip
"""(whose PrepareModuleInput, whose linear styles, use_local_output) of the sequence-parallel cases."""
AG, RS = "ficco._all_gather_matmul.default", "ficco._matmul_reduce_scatter.default"
RS_SUMMED = "ficco._matmuls_reduce_scatter.default"
"""The reduce-scatter of summed GEMMs: the input gradient of a gather that fed several weights."""


def reduce_scatters_as_one(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` with both reduce-scatter ops counted under ``RS``."""
    out = {k: v for k, v in counts.items() if k != RS_SUMMED}
    if RS_SUMMED in counts:
        out[RS] = out.get(RS, 0) + counts[RS_SUMMED]
    return out


MESH_2D = [Case(model="gpt2", local=True), Case(model="llama", dtype="bf16", batch=3)]
"""Cases run again over the tensor-parallel dimension of a 2 x 2 mesh in the world of 4 ranks."""


MATRIX_MODELS = (
    "llama", "gpt2", "gemma", "odd_head", "own_forward_mlp", "routed_mlp", "phi3_mlp", "reshaping_mlp"
)  # fmt: skip
"""The models of the matrix (the others of ``tp_plans.MODELS`` are ``test_tp_usage.py``'s)."""


def cases() -> list[Case]:
    """Every model under each mix of sequence-parallel styles and plain tensor parallelism (a sequence of 7
    there: nothing is split along it), in bf16 at batch 1 and 3, flat where it takes hidden states; then 8
    cases drawn from the whole space (seeded)."""
    out = []
    for model in MATRIX_MODELS:
        roles = MODELS[model][1]
        mixes = [m for m in MIXES if m[2] or not roles.local_only]
        out += [Case(model=model, prepare=p, linears=lin, local=local) for p, lin, local in mixes]
        out += [
            Case(model=model, sp=False, seq=7),
            Case(model=model, batch=1, dtype="bf16", local=roles.local_only),
        ]
        out.append(Case(model=model, sp=False, batch=3, dtype="bf16"))
        if not (roles.embed or roles.local_only):
            out += [Case(model=model, flat=True, batch=3), Case(model=model, flat=True, sp=False, batch=1)]
    rng = random.Random(46)
    for _ in range(8):
        model = rng.choice(sorted(m for m in MATRIX_MODELS if not MODELS[m][1].local_only))
        prep, lin, local = rng.choice(MIXES)
        flat = not MODELS[model][1].embed and rng.random() < 0.5
        out.append(
            Case(
                model=model, sp=rng.random() < 0.7, prepare=prep, linears=lin, local=local,
                batch=rng.choice((1, 2, 3)), flat=flat, dtype=rng.choice(("fp32", "bf16")),
            )
        )  # fmt: skip
    return out


def _world(rank: int, world_size: int) -> dict:
    import logging

    import torch
    import tp_plans
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from ficco.runtime import FixedSource, Planner
    from ficco.runtime import tp as ficco_styles

    mesh = init_device_mesh("cpu", (world_size,))
    cpu = torch.device("cpu")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ficco.runtime.tp").addHandler(handler)
    logging.getLogger("ficco.runtime.tp").setLevel(logging.INFO)
    out: dict = {"cases": [tp_plans.check(case, mesh, SCHEDULES, cpu) for case in cases()]}
    if world_size == 4:  # tensor parallelism over one dimension of a 2-D (data x tensor) mesh
        tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]
        out["cases"] += [tp_plans.check(case, tp, SCHEDULES, cpu) for case in MESH_2D]

    # a model that views its prepared input: warned once, its gate/up left out of the op from the 2nd call
    case = Case(model="reshaping_mlp")
    model = tp_plans.MODELS[case.model][0]()
    tp_plans.apply_plan(model, mesh, tp_plans.plan(model, case, *tp_plans.styles_of(case, SCHEDULES)))
    x = tp_plans.inputs(case, rank, world_size, cpu)
    del records[:]
    calls = []
    for _ in range(2):
        with tp_plans.CountFiccoOps() as counted:
            model(x).sum().backward()
        calls.append(counted.counts)
    out["reshaping"] = {"calls": calls, "log": [r.getMessage() for r in records]}

    # shapes the ranks cannot share evenly: refused on every rank before any collective
    odd = Case(model="llama", seq=7 if world_size == 2 else 6)
    llama = tp_plans.MODELS["llama"][0]()
    tp_plans.apply_plan(llama, mesh, tp_plans.plan(llama, odd, *tp_plans.styles_of(odd, SCHEDULES)))
    ficco_styles.name_modules(llama)
    pair = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16))
    parallelize_module(
        pair,
        mesh,
        {"0": ficco_styles.ColwiseParallel(), "1": ficco_styles.RowwiseParallel(output_layouts=Shard(0))},
    )
    ficco_styles.name_modules(pair)
    tokens = tp_plans.inputs(odd, rank, world_size, cpu)
    out["uneven"] = errors_of(
        {"llama": lambda: llama(tokens), "rowwise": lambda: pair(torch.randn(world_size * 2 + 1, 16))}
    )

    # modules left to PyTorch's style: said once per module, in the log and the planner's table
    case = Case(model="gpt2", sp=False)
    planner = Planner(FixedSource("shard/sm"))
    gpt2 = tp_plans.MODELS["gpt2"][0]()
    tp_plans.apply_plan(gpt2, mesh, tp_plans.plan(gpt2, case, *tp_plans.styles_of(case, planner)))
    ficco_styles.name_modules(gpt2)
    del records[:]
    for _ in range(2):
        gpt2(tp_plans.inputs(case, rank, world_size, cpu)).sum().backward()
    out["pytorchs"] = {
        "log": [(r.levelname, r.getMessage()) for r in records],
        "rows": [r for r in planner.rows() if r["schedule"] == "-"],
    }
    logging.getLogger("ficco.runtime.tp").removeHandler(handler)
    return out


@pytest.fixture(scope="module")
def worlds() -> dict[int, list[dict]]:
    return {w: run_world(w, _world, timeout_s=600) for w in (2, 4)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_case_gives_pytorchs_outputs_and_gradients(worlds, world_size):
    for rank, report in enumerate(worlds[world_size]):
        assert len(report["cases"]) == len(cases()) + (len(MESH_2D) if world_size == 4 else 0)
        bad = {str(Case(**r["case"])): failures(r) for r in report["cases"] if failures(r)}
        assert not bad, f"rank {rank} of {world_size}: {bad}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_ficco_ops_run_where_the_plan_overlaps(worlds, world_size):
    """Sequence parallel with ficco's styles: one gathered op per prepared module (its column-parallel
    children as one) and one reduce-scatter op per row-parallel layer, forward and backward; plain tensor
    parallelism has no op to overlap; the odd projection runs PyTorch's style where 4 ranks split it."""
    raw = {str(Case(**r["case"])): r["ficco_ops"] for r in worlds[world_size][0]["cases"]}
    ops = {case: reduce_scatters_as_one(counts) for case, counts in raw.items()}
    # the input gradient of q/k/v and of w1/w3: one reduce-scatter of the summed GEMMs (no concatenation)
    assert raw[str(Case(model="llama"))][RS_SUMMED] == 2 * 2
    blocks = 2 * 2 + 1  # two prepared modules per block, two blocks, and the output projection
    for model in ("llama", "gpt2", "gemma"):
        for local in (False, True):
            assert ops[str(Case(model=model, local=local))] == {AG: blocks + 4, RS: 4 + blocks}, model
        assert ops[str(Case(model=model, sp=False, seq=7))] == {}, model
        # PyTorch's PrepareModuleInput: ficco's column-parallel layers run the local GEMM; the rows scatter
        assert ops[str(Case(model=model, prepare="torch"))] == {AG: 1 + 4, RS: 4 + 1}, model
    assert ops[str(Case(model="phi3_mlp", flat=True, batch=3))] == {AG: 2, RS: 2}
    assert ops[str(Case(model="odd_head"))] == ({AG: 1, RS: 1} if world_size == 2 else {})
    assert ops[str(Case(model="own_forward_mlp"))] == {}  # a forward of its own: PyTorch's style keeps it
    # the router reads the prepared input beside gate/up, which still take the op's outputs
    assert ops[str(Case(model="routed_mlp", local=True))] == {AG: 2, RS: 2}


def test_a_prepared_input_the_module_alters_is_computed_from_and_said_once(worlds):
    for report in worlds[2]:
        first, second = map(reduce_scatters_as_one, report["reshaping"]["calls"])
        assert first == {AG: 2, RS: 1}  # the op ran for gate/up, which took their inputs from the view
        assert second == {AG: 1, RS: 1}  # left out from then on: down_proj's gather in the backward
        (line,) = report["reshaping"]["log"]
        assert "gate_proj, up_proj did not get the prepared input as it was" in line


@pytest.mark.parametrize("world_size", [2, 4])
def test_uneven_shards_are_refused_on_every_rank_before_any_collective(worlds, world_size):
    size = 7 if world_size == 2 else 6
    for rank, report in enumerate(worlds[world_size]):
        llama, rowwise = dict(report["uneven"])["llama"], dict(report["uneven"])["rowwise"]
        assert llama.startswith("ValueError: ficco.runtime.tp: the output of tok_embeddings"), (rank, llama)
        assert f"split dim 1 of size {size} over the {world_size} ranks" in llama, (rank, llama)
        assert rowwise.startswith("ValueError: ficco.runtime.tp: the output of 1 (output_layouts=Shard(0))")
        assert f"dim 0 of size {world_size * 2 + 1} over the {world_size} ranks" in rowwise


def test_modules_left_to_pytorch_are_said_once_in_the_log_and_the_planners_table(worlds):
    report = worlds[2][0]["pytorchs"]
    rows = {(r["layer"], r["shape"]) for r in report["rows"]}
    left = "PyTorch's RowwiseParallel: output_layouts=Replicate() (an all-reduce; ficco has no op for it)"
    assert rows == {
        ("embed", "PyTorch's RowwiseParallel: no ficco op for Embedding"),
        *((f"layers.{i}.{m}.c_proj", left) for i in (0, 1) for m in ("attn", "mlp")),
    }
    assert len(report["rows"]) == len(rows)  # once each, over two steps
    assert len(report["log"]) == len(rows) and all(level == "INFO" for level, _ in report["log"])


def test_the_case_list_covers_the_matrix():
    listed = cases()
    assert {c.model for c in listed} == set(MATRIX_MODELS)
    assert {(c.prepare, c.linears, c.local) for c in listed if c.sp} == set(MIXES)
    assert {c.batch for c in listed} == {1, 2, 3} and {c.dtype for c in listed} == {"fp32", "bf16"}
    assert any(c.flat and c.sp for c in listed) and any(c.flat and not c.sp for c in listed)
    assert len({dataclasses.astuple(c) for c in listed}) >= len(listed) - 2  # the draws mostly add cases
