"""``ficco.runtime.compile``: the Inductor pass that puts ficco's ops where PyTorch's micro-pipeline pass
would put its fused ops.

Fast tests run the pass on graphs traced the way Inductor sees them (``make_fx`` with Inductor's
decompositions, views as reshapes) in a loopback world of 2 ranks (one process, a fake process group) and
check what it rewrote, what it left and why. The slow tests compile a debug Llama under torchtitan's
tensor-parallel plan (PyTorch's DTensor styles) on 2 gloo ranks and a dynamic-shape function, and compare
with eager.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from executor_world import run_world

import ficco.runtime.compile as ficco_compile
from ficco.runtime import FixedSource, Planner
from ficco.runtime.compile import FiccoPass

FICCO_AG = torch.ops.ficco._all_gather_matmul.default
FICCO_RS = torch.ops.ficco._matmul_reduce_scatter.default
FICCO_RSS = torch.ops.ficco._matmuls_reduce_scatter.default
C10D = ("all_gather_into_tensor", "reduce_scatter_tensor", "wait_tensor")
# torch 2.13 renamed the functional collectives; 2.11 (the GPU image) has only the old names
all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
TABLE = {"ag_gemm": "shard/dma", "gemm_rs": "serial/sm"}
"""Global data a schedule function may read (its answers then depend on state)."""
LLAMA_LAYERS = 2
"""Blocks of the compiled debug Llama (``benchmarks.llama.LlamaArgs``)."""


@pytest.fixture
def world():
    """This process as rank 0 of 2 (a fake group: the pass only reads the group's size)."""
    from benchmarks.support.loopback import loopback_world

    with loopback_world(2, "cpu"):
        yield dist.group.WORLD.group_name


def _trace(fn, *args, tracing_mode: str = "fake") -> torch.fx.GraphModule:
    """``fn``'s graph as Inductor's post-grad passes see it (decomposed, views as reshapes)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes.post_grad import view_to_reshape
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode=tracing_mode)(*args)
    view_to_reshape(gm)
    return gm


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _attention_like(group: str):
    """q/k/v-style column-parallel matmuls of one sequence-parallel gather, then a row-parallel one."""

    def fn(x, wq, wk, wo):
        a = all_gather(x, 1, group)  # [2, 8, 16] -> [2, 16, 16]
        y = F.linear(torch.relu(F.linear(a, wq) + F.linear(a, wk)), wo)
        return reduce_scatter(y, "sum", 1, group)

    return fn, (torch.randn(2, 8, 16), torch.randn(12, 16), torch.randn(12, 16), torch.randn(16, 12))


def test_matmuls_sharing_a_gather_become_one_op_and_the_row_parallel_one_another(world):
    fn, args = _attention_like(world)
    gm = _trace(fn, *args)
    seen = []
    ficco_pass = FiccoPass(lambda *shape: seen.append(shape) or "finer/dma/s2/chunk")
    ficco_pass(gm.graph)
    targets = _targets(gm)
    assert targets.count(FICCO_AG) == 1 and targets.count(FICCO_RS) == 1
    assert not [t for t in targets if any(c in str(t) for c in C10D)]  # no collective left
    assert torch.ops.aten.mm.default not in targets
    ag = next(n for n in gm.graph.nodes if n.target is FICCO_AG)
    assert len(ag.args[1]) == 2 and ag.args[2] == 1 and ag.args[3] == world
    assert ag.args[4] == "finer/dma/s2/chunk" and ag.kwargs == {"return_a": False}
    # the schedule source is asked with features.Scenario's conventions: n summed over the weights
    assert seen == [("ag_gemm", 32, 24, 16, "fp32", 2), ("gemm_rs", 32, 16, 12, "fp32", 2)]
    report = ficco_pass.report
    assert report.graphs == 1 and not report.left
    ag_row, rs_row = report.rewritten
    assert (ag_row.op, ag_row.m, ag_row.n, ag_row.k, ag_row.found) == ("ag_gemm", 32, (12, 12), 16, "pattern")
    assert (rs_row.op, rs_row.m, rs_row.n, rs_row.k, rs_row.direction) == ("gemm_rs", 32, (16,), 12, "fwd")
    assert "finer/dma/s2/chunk" in report.table() and "2 ops rewritten" in str(report)


def test_the_gathered_input_is_returned_when_something_else_reads_it(world):
    def fn(x, w):
        a = all_gather(x, 0, world)
        return F.linear(a, w), a.sum()

    gm = _trace(fn, torch.randn(8, 16), torch.randn(12, 16))
    FiccoPass("shard/sm")(gm.graph)
    ag = next(n for n in gm.graph.nodes if n.target is FICCO_AG)
    assert ag.kwargs == {"return_a": True} and ag.args[2] == 0


def test_a_matmul_between_a_gather_and_a_scatter_goes_to_the_gather(world):
    def fn(x, w):
        return reduce_scatter(all_gather(x, 0, world) @ w, "sum", 0, world)

    gm = _trace(fn, torch.randn(8, 16), torch.randn(16, 12))
    ficco_pass = FiccoPass("shard/dma")
    ficco_pass(gm.graph)
    assert [r.op for r in ficco_pass.report.rewritten] == ["ag_gemm"]
    assert [(x.op, x.reason) for x in ficco_pass.report.left] == [("gemm_rs", "layout")]
    assert _targets(gm).count(FICCO_AG) == 1 and torch.ops.aten.mm.default not in _targets(gm)


def test_a_gathered_weight_operand_is_not_a_site(world):
    """A backward's weight gradient multiplies by the gathered input (``grad^T @ A``): not an input
    gathered for a matmul, so not rewritten, listed as beside no matmul, and no warning."""

    def fn(x, grad):
        return grad.t() @ all_gather(x, 0, world)

    gm = _trace(fn, torch.randn(8, 16), torch.randn(16, 12))
    ficco_pass = FiccoPass("shard/dma")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ficco_pass(gm.graph)
    assert FICCO_AG not in _targets(gm)
    assert not ficco_pass.report.rewritten
    assert [(x.op, x.reason) for x in ficco_pass.report.left] == [("all_gather", "no matmul")]


def _sum_of_matmuls(group: str):
    """A column-parallel input gradient whose two weights share the input (gate/up): a sum of two matmuls'
    outputs, reduce-scattered along the sequence."""

    def fn(g1, g2, w1, w3):
        return reduce_scatter(g1 @ w1 + g2 @ w3, "sum", 1, group)

    return fn, (torch.randn(2, 8, 12), torch.randn(2, 8, 12), torch.randn(12, 16), torch.randn(12, 16))


def test_a_reduce_scatter_of_summed_matmuls_becomes_one_op_over_their_operands_without_concatenating(world):
    fn, args = _sum_of_matmuls(world)
    gm = _trace(fn, *args)
    ficco_pass = FiccoPass("finer/sm/s2/chunk")
    ficco_pass(gm.graph)
    targets = _targets(gm)
    assert (
        targets.count(FICCO_RSS) == 1 and FICCO_RS not in targets and torch.ops.aten.mm.default not in targets
    )
    assert not [t for t in targets if any(c in str(t) for c in C10D)]
    assert torch.ops.aten.add.Tensor not in targets and torch.ops.aten.cat.default not in targets
    rs = next(n for n in gm.graph.nodes if n.target is FICCO_RSS)
    a, b = rs.args[:2]
    assert [x.op for x in a + b] == ["placeholder"] * 4 and rs.args[3] == 1  # the operands themselves
    (row,) = ficco_pass.report.rewritten
    assert (row.op, row.found, row.m, row.n, row.k) == ("gemm_rs", "sum of matmuls", 16, (16,), 24)
    assert not ficco_pass.report.left


def test_a_sum_whose_part_is_read_elsewhere_is_left(world):
    def fn(g1, g2, w1, w3):
        part = g1 @ w1
        return reduce_scatter(part + g2 @ w3, "sum", 1, world), part.sum()

    _, args = _sum_of_matmuls(world)
    gm = _trace(fn, *args)
    ficco_pass = FiccoPass("shard/dma")
    with pytest.warns(RuntimeWarning, match="none was rewritten: shared output"):
        ficco_pass(gm.graph)
    assert [x.reason for x in ficco_pass.report.left] == ["shared output"] and FICCO_RS not in _targets(gm)


def test_every_collective_is_in_the_report(world):
    """An all-reduce (tensor parallelism without sequence parallelism) is left with a warning when nothing
    else was rewritten; a collective beside no matmul is listed without one; a rewritten graph warns of
    nothing."""

    def plain_tp(x, w):
        return funcol.all_reduce(x @ w, "sum", world)

    gm = _trace(plain_tp, torch.randn(8, 16), torch.randn(16, 12))
    ficco_pass = FiccoPass("shard/dma")
    with pytest.warns(RuntimeWarning, match="none was rewritten: all-reduce"):
        ficco_pass(gm.graph)
    assert [(x.op, x.reason) for x in ficco_pass.report.left] == [("all_reduce", "all-reduce")]

    def embedding_like(x, table):
        return reduce_scatter(table[x], "sum", 0, world), all_gather(table, 0, world).sum()

    gm = _trace(embedding_like, torch.randint(0, 8, (16,)), torch.randn(8, 4))
    ficco_pass = FiccoPass("shard/dma")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ficco_pass(gm.graph)
    assert sorted((x.op, x.reason) for x in ficco_pass.report.left) == [
        ("all_gather", "no matmul"),
        ("reduce_scatter", "no matmul"),
    ]


def test_enable_without_a_source_runs_this_machines_model_or_serial(monkeypatch, caplog):
    import logging

    from ficco.runtime import planner as planner_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(planner_module, "_planners", {})
    monkeypatch.setattr(planner_module, "_warned_serial", [])
    with caplog.at_level(logging.WARNING, "ficco.runtime.planner"):
        report = ficco_compile.enable()
        ficco_compile.enable()
    try:
        from torch._inductor import config

        (installed,) = [p for p in ficco_compile._installed() if isinstance(p, FiccoPass)]
        assert installed.report is not report and config.post_grad_custom_post_pass is installed
        assert installed.planner.source.origin == "fixed serial/sm" and installed.uuid() is not None
    finally:
        ficco_compile.disable()
    assert caplog.text.count("no measured model for this machine (no CUDA GPU here)") == 1


def _bias(group):
    def fn(x, w, b):
        return F.linear(all_gather(x, 1, group), w, b)

    return fn, (torch.randn(2, 8, 16), torch.randn(12, 16), torch.randn(12))


def _last_dim(group):
    def fn(x, w):  # gathers the matmul's reduction dim (k): not an overlap ficco's ops run
        return F.linear(all_gather(x, -1, group), w)

    return fn, (torch.randn(16, 8), torch.randn(12, 16))


def _float64(group):
    def fn(x, w):
        return F.linear(all_gather(x, 0, group), w)

    return fn, (torch.randn(8, 16, dtype=torch.float64), torch.randn(12, 16, dtype=torch.float64))


def _shared_output(group):
    def fn(a, w):  # the partial product is read beside the reduce-scatter
        y = a @ w
        return reduce_scatter(y, "sum", 0, group), y.sum()

    return fn, (torch.randn(16, 8), torch.randn(8, 12))


def _fp8(group):
    def fn(x, w, scale):
        a = all_gather(x, 0, group)
        return torch._scaled_mm(a, w, scale, scale, out_dtype=torch.bfloat16)

    x = torch.randn(16, 32).to(torch.float8_e4m3fn)
    w = torch.randn(16, 32).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    return fn, (x, w, torch.ones(()))


@pytest.mark.parametrize(
    "case, reason",
    [
        (_bias, "bias"),
        (_last_dim, "layout"),
        (_float64, "dtype"),
        (_shared_output, "shared output"),
        (_fp8, "fp8 scaled matmul"),
    ],
)
def test_what_it_cannot_run_is_left_with_the_reason_and_a_warning(world, case, reason):
    fn, args = case(world)
    gm = _trace(fn, *args)
    before = _targets(gm)
    ficco_pass = FiccoPass("shard/dma")
    with pytest.warns(RuntimeWarning, match=f"group '{world}' but none was rewritten: {reason}"):
        ficco_pass(gm.graph)
    assert _targets(gm) == before
    assert [x.reason for x in ficco_pass.report.left] == [reason]
    assert not ficco_pass.report.rewritten
    assert f"| left |  | {reason}:" in ficco_pass.report.table()


def test_a_gather_that_reaches_a_matmul_in_a_form_no_pattern_matches_is_reported(world):
    """Traced symbolically, the gather's size is read beside its wait (``sym_size``), which PyTorch's
    all-gather patterns do not allow: async-TP would miss it too. The pass says so instead of nothing."""

    def fn(x, w):
        return F.linear(all_gather(x, 1, world), w)

    gm = _trace(fn, torch.randn(2, 8, 16), torch.randn(12, 16), tracing_mode="symbolic")
    ficco_pass = FiccoPass("shard/dma")
    with pytest.warns(RuntimeWarning, match="none was rewritten: no pattern"):
        ficco_pass(gm.graph)
    (left,) = ficco_pass.report.left
    assert (left.op, left.reason) == ("ag_gemm", "no pattern") and "all_gather_into_tensor" in left.detail


def test_a_gather_whose_matmul_the_pattern_misses_at_batch_one_is_reported(world):
    """At one sequence per batch the gathered input reaches the matmul through two reshapes in a row;
    PyTorch's all-gather pattern matches the gather but finds no matmul behind it. The pass reports the
    gather as left (no pattern) instead of saying nothing."""

    def fn(x, w):
        return F.linear(all_gather(x, 1, world), w)

    gm = _trace(fn, torch.randn(1, 8, 16), torch.randn(12, 16))
    ficco_pass = FiccoPass("shard/dma")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ficco_pass(gm.graph)
    (left,) = [x for x in ficco_pass.report.left if x.op == "ag_gemm"]
    assert left.reason == "no pattern" and "all_gather_into_tensor" in left.detail


def test_a_group_outside_the_executors_sizes_is_left():
    from benchmarks.support.loopback import loopback_world

    with loopback_world(16, "cpu"):
        fn, args = _attention_like(dist.group.WORLD.group_name)
        args = (torch.randn(2, 1, 16), *args[1:])
        gm = _trace(fn, *args)
        ficco_pass = FiccoPass("shard/dma")
        with pytest.warns(RuntimeWarning, match="unsupported group"):
            ficco_pass(gm.graph)
    left = ficco_pass.report.left
    assert {x.reason for x in left} == {"unsupported group"} and len(left) == 2
    assert "has 16 ranks; ficco's ops run on 2 to 8" in left[0].detail


def test_pytorchs_fused_ops_are_rewritten_and_its_fp8_one_left(world):
    import torch.distributed._symmetric_memory  # registers torch.ops.symm_mem

    def fn(x, w1, w2, wo):
        _, (c1, c2) = torch.ops.symm_mem.fused_all_gather_matmul(x, [w1, w2], 1, world, return_A=False)
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(c1 + c2, wo, "sum", 1, world)

    gm = _trace(fn, torch.randn(2, 8, 16), torch.randn(16, 12), torch.randn(16, 12), torch.randn(12, 16))
    ficco_pass = FiccoPass("shard/dma")
    ficco_pass(gm.graph)
    targets = _targets(gm)
    assert FICCO_AG in targets and FICCO_RS in targets and not [t for t in targets if "symm_mem" in str(t)]
    assert [(r.op, r.found, r.m, r.n) for r in ficco_pass.report.rewritten] == [
        ("ag_gemm", "fused op", 32, (12, 12)),
        ("gemm_rs", "fused op", 32, (16,)),
    ]

    def fp8(x, w, scale):
        _, cs = torch.ops.symm_mem.fused_all_gather_scaled_matmul(
            x, [w], scale, [scale], 0, world, [None], [None], [torch.bfloat16], [False]
        )
        return cs[0]

    x = torch.randn(16, 32).to(torch.float8_e4m3fn)
    w = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    gm = _trace(fp8, x, w, torch.ones(()))
    with pytest.warns(RuntimeWarning, match="fp8 scaled matmul"):
        ficco_pass(gm.graph)
    assert ficco_pass.report.left[-1].reason == "fp8 scaled matmul" and ficco_pass.report.graphs == 2


def test_a_failing_schedule_function_costs_the_overlap_not_the_compile(world):
    def broken(op, m, n, k, dtype, world_size):
        raise KeyError("no such shape")

    fn, args = _attention_like(world)
    gm = _trace(fn, *args)
    ficco_pass = FiccoPass(broken)
    ficco_pass(gm.graph)
    assert {r.schedule for r in ficco_pass.report.rewritten} == {"serial/sm"}
    assert "the schedule function failed: KeyError" in ficco_pass.report.rewritten[0].note


def test_a_planner_decides_and_records_the_layers(world):
    planner = Planner(FixedSource("shard/dma"), hardware="h200x2")
    fn, args = _attention_like(world)
    gm = _trace(fn, *args)
    ficco_pass = FiccoPass(planner)
    ficco_pass(gm.graph)
    assert {r.schedule for r in ficco_pass.report.rewritten} == {"shard/dma"}
    assert {r["direction"] for r in planner.rows()} == {"fwd"} and len(planner.rows()) == 2


def test_a_four_rank_group_is_planned_by_the_four_gpu_model():
    """At a 4-rank group (a loopback world of 4) the pass rewrites the same sites, and the shipped h200x4
    model decides their schedules at world size 4."""
    from benchmarks.support.loopback import loopback_world
    from ficco.runtime import PredictorSource
    from ficco.training.predict.registry import current_version, default_model_root

    planner = Planner(PredictorSource.load(hardware_id="h200x4"))
    with loopback_world(4, "cpu"):
        fn, args = _attention_like(dist.group.WORLD.group_name)
        gm = _trace(fn, *(a.to(torch.bfloat16) for a in args))
        ficco_pass = FiccoPass(planner)
        ficco_pass(gm.graph)
    targets = _targets(gm)
    assert targets.count(FICCO_AG) == 1 and targets.count(FICCO_RS) == 1
    assert [(r.op, r.m) for r in ficco_pass.report.rewritten] == [("ag_gemm", 64), ("gemm_rs", 64)]
    assert {(key.world_size, key.dtype) for key in planner.decisions} == {(4, "bf16")}
    version = current_version(default_model_root(), "h200x4")
    assert {d.origin for d in planner.decisions.values()} == {f"model h200x4/{version} (measured)"}
    schedules = {str(d.schedule) for d in planner.decisions.values()}
    assert {r.schedule for r in ficco_pass.report.rewritten} == schedules


def test_the_graph_cache_keys_on_what_decides_the_schedules():
    def plain(op, m, n, k, dtype, world_size):
        return "shard/dma"

    def reads_a_table(op, m, n, k, dtype, world_size):
        return TABLE[op]

    offset = 1

    def closure(op, m, n, k, dtype, world_size):
        return "shard/dma" if m > offset else "serial/sm"

    keys = {s: FiccoPass(s).uuid() for s in ("shard/dma", "finer/dma/s2/chunk")}
    assert None not in keys.values() and len(set(keys.values())) == 2
    assert FiccoPass(plain).uuid() is not None
    assert FiccoPass("shard/dma", token_points=(64, 128)).uuid() != keys["shard/dma"]
    # a fixed schedule decides alike on every rank without agreeing, behind a planner or not
    assert FiccoPass(Planner(FixedSource("shard/dma"))).uuid() == FiccoPass(FixedSource("shard/dma")).uuid()
    assert FiccoPass("0:serial/sm;64:shard/dma").uuid() not in (None, keys["shard/dma"])
    # answers that may depend on state, or a collective decision (a model): the cache is bypassed
    assert FiccoPass(closure).uuid() is None
    assert FiccoPass(reads_a_table).uuid() is None
    assert FiccoPass(Planner(_ModelLike())).uuid() is None


class _ModelLike:
    """A source asked by rank 0 and agreed on (as a measured model or the service is)."""

    origin = "model-like"

    def recommend(self, scenarios, mode):
        from ficco.runtime import Answer

        return [Answer(schedule="shard/dma") for _ in scenarios]


def test_a_graph_from_the_cache_was_rewritten_with_the_same_schedules(world, tmp_path, monkeypatch):
    """Compiled once, the graph comes from Inductor's cache while the schedule source is the same (the
    report counts it as a cache hit); another schedule makes another key, and the pass runs again."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def fn(x, w):
        return all_gather(x, 0, world) @ w

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    seen = []
    for schedule in ("shard/dma", "shard/dma", "serial/sm"):
        torch._dynamo.reset()
        report = ficco_compile.enable(schedule)
        try:
            torch.compile(fn)(x, w)
        finally:
            ficco_compile.disable()
        seen.append((report.graphs, report.cache_hits, [r.schedule for r in report.rewritten], str(report)))
    assert seen[0][:3] == (1, 0, ["shard/dma"])
    assert seen[1][:3] == (0, 1, []) and "1 more loaded from the graph cache" in seen[1][3]
    assert seen[2][:3] == (1, 0, ["serial/sm"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"schedules": "shard/tcp"}, "executor"),
        ({"schedules": 3}, "schedules must be"),
        ({"schedules": "shard/dma", "token_points": (128, 64)}, "token_points"),
        ({"schedules": "shard/dma", "mode": "fast"}, "mode must be"),
    ],
)
def test_enable_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ficco_compile.enable(**kwargs)


def test_enable_installs_beside_other_passes_and_disable_removes_only_it():
    from torch._inductor import config

    def other(graph):
        pass

    with config.patch(post_grad_custom_post_pass=other):
        first = ficco_compile.enable("shard/dma")
        second = ficco_compile.enable("serial/sm")  # replaces the first ficco pass
        installed = config.post_grad_custom_post_pass
        assert isinstance(installed, tuple) and installed[0] is other and len(installed) == 2
        assert installed[1].report is second and first is not second
        ficco_compile.disable()
        assert config.post_grad_custom_post_pass is other


# Compiled, on gloo ------------------------------------------------------------------------------------------


def _compiled_world(rank: int, world_size: int) -> dict:
    """The debug Llama under torchtitan's plan, compiled (forward and backward) after enable() with a
    planner, against eager; then a dynamic-shape function at two token counts."""
    import torch.distributed.tensor.parallel as torch_styles
    from torch._inductor import config
    from torch.distributed.device_mesh import init_device_mesh

    from benchmarks import llama
    from ficco.executor import library
    from ficco.runtime import Answer, TableSource

    config.fx_graph_cache = False  # the pass must run here, not be skipped by a cached graph
    torch.manual_seed(0)
    args = llama.LlamaArgs()
    model = llama.Transformer(args)
    llama.apply_tp(model, init_device_mesh("cpu", (world_size,)), torch_styles)  # PyTorch's own styles
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))

    def pick(scenario, mode) -> Answer:  # a schedule of each family, by op
        return Answer(schedule="shard/dma" if scenario.op == "ag_gemm" else "finer/sm/s2/chunk")

    out = {"collectives": []}

    def count_collectives(graph: torch.fx.Graph) -> None:  # installed before ficco's pass: sees it all
        targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
        out["collectives"].append(sum("c10d_functional" in t and "wait_tensor" not in t for t in targets))

    planner = Planner(TableSource({}, on_missing=pick), hardware=f"h200x{world_size}")
    config.post_grad_custom_post_pass = count_collectives
    report = ficco_compile.enable(planner)
    try:
        eager = model(tokens)
        eager.float().pow(2).mean().backward()
        want = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        model.zero_grad()
        got = torch.compile(model)(tokens)
        got.float().pow(2).mean().backward()
        out["out_error"] = float((got - eager).abs().max() / eager.abs().max())
        out["grad_errors"] = {
            name: float((p.grad.full_tensor() - want[name]).abs().max() / want[name].abs().max())
            for name, p in model.named_parameters()
        }
        out["llama"] = report
        out["llama_ran"] = [[(r.m, r.ran) for r in report.ran(x)] for x in report.rewritten]
        out["llama_table"] = report.table()
    finally:
        ficco_compile.disable()
        config.post_grad_custom_post_pass = None

    # dynamic token count: a table baked into the op, its entry picked per call
    library.clear_run_report()
    group = dist.group.WORLD.group_name
    report = ficco_compile.enable(lambda op, m, n, k, dtype, w: "serial/sm" if m < 100 else "shard/dma")
    try:

        def block(x, w1, w2):
            a = all_gather(x, 0, group)
            return reduce_scatter(torch.relu(a @ w1) @ w2, "sum", 0, group)

        weights = torch.randn(16, 24), torch.randn(24, 16)
        compiled = torch.compile(block)
        errors = []
        for rows in (16, 128):  # m = 32 and 256 gathered
            x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(rank))
            torch._dynamo.mark_dynamic(x, 0)  # the token count only: the weights stay static
            errors.append(float((compiled(x, *weights) - block(x, *weights)).abs().max()))
        out["dynamic"] = report
        out["dynamic_errors"] = errors
        out["dynamic_ran"] = [[(r.m, r.ran) for r in report.ran(x)] for x in report.rewritten]
        out["dynamic_table"] = report.table()
    finally:
        ficco_compile.disable()
    return out


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    return run_world(2, _compiled_world, timeout_s=600)


@pytest.mark.slow
def test_compiled_llama_equals_eager_with_every_tp_matmul_rewritten(compiled):
    for rank in compiled:
        assert rank["out_error"] < 1e-5
        assert max(rank["grad_errors"].values()) < 1e-5, rank["grad_errors"]
        report = rank["llama"]
        assert report.graphs == 2
        # every collective the graphs held is in the report, rewritten or left (the embedding's scatter and
        # its gradient's gather, beside no matmul; the logits' gather, a matmul's output)
        assert rank["collectives"] == [
            sum(x.graph == g for x in report.rewritten + report.left) for g in range(report.graphs)
        ]
        assert sorted((x.direction, x.op, x.layers, x.reason) for x in report.left) == [
            ("bwd-input", "all_gather", ("tok_embeddings",), "no matmul"),
            ("fwd", "all_gather", ("output",), "no ficco op"),
            ("fwd", "reduce_scatter", ("tok_embeddings",), "no matmul"),
        ]
        fwd = [r for r in report.rewritten if r.direction == "fwd"]
        bwd = [r for r in report.rewritten if r.direction == "bwd-input"]
        # per layer: q/k/v sharing one gather, wo, w1/w3 sharing one, w2; and the output projection
        layers = {(r.op, r.layers) for r in fwd if r.layers[0].startswith("layers.0.")}
        assert layers == {
            ("ag_gemm", ("layers.0.attention.wq", "layers.0.attention.wk", "layers.0.attention.wv")),
            ("gemm_rs", ("layers.0.attention.wo",)),
            ("ag_gemm", ("layers.0.feed_forward.w1", "layers.0.feed_forward.w3")),
            ("gemm_rs", ("layers.0.feed_forward.w2",)),
        }
        assert len(fwd) == 4 * LLAMA_LAYERS + 1 and ("ag_gemm", ("output",)) in {
            (r.op, r.layers) for r in fwd
        }
        # backward: the row-parallel layers' input gradients gather, the column-parallel ones' scatter (q/k/v
        # and w1/w3 each one op over their summed matmuls), the output projection's scatters
        assert len(bwd) == LLAMA_LAYERS * 4 + 1
        summed = {frozenset(r.layers) for r in bwd if r.found == "sum of matmuls"}
        assert summed == {
            frozenset(f"layers.{i}.{module}.{n}" for n in names)
            for i in range(LLAMA_LAYERS)
            for module, names in (("attention", ("wq", "wk", "wv")), ("feed_forward", ("w1", "w3")))
        }
        assert {r.schedule for r in report.rewritten} == {"shard/dma", "finer/sm/s2/chunk"}
        # what each op ran: its schedule, at the one token count it ran at (no fallback)
        assert [[ran for _, ran in runs] for runs in rank["llama_ran"]] == [
            [r.schedule] for r in report.rewritten
        ]
        assert "| shard/dma | shard/dma |" in rank["llama_table"]


@pytest.mark.slow
def test_a_dynamic_token_count_gets_a_table_resolved_per_call(compiled):
    for rank in compiled:
        report = rank["dynamic"]
        assert [(r.op, r.m) for r in report.rewritten] == [("ag_gemm", None), ("gemm_rs", None)]
        # decided at 64 (serial) and 128 (shard): the switch at their geometric mean
        assert {r.schedule for r in report.rewritten} == {"0:serial/sm;91:shard/dma"}
        assert max(rank["dynamic_errors"]) < 1e-5
        # each op ran the table's entry at each token count
        assert rank["dynamic_ran"] == [[(32, "serial/sm"), (256, "shard/dma")]] * 2
        assert "m=32: serial/sm, m=256: shard/dma" in rank["dynamic_table"]
