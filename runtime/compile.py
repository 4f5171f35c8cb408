"""torch.compile runs ficco's schedules, model code unchanged: an Inductor pass that rewrites what PyTorch's
micro-pipeline TP pass rewrites into ficco's ops.

    import ficco.runtime.compile

    report = ficco.runtime.compile.enable(planner)       # or a ScheduleSource, "shard/dma", a callable
    model = torch.compile(model)                         # a DTensor tensor-parallel plan, e.g. torchtitan's
    loss = model(tokens).sum(); loss.backward()          # compiles: every rewrite logs one line
    print(report.table())                                # what was rewritten, what was left and why

The pass (:class:`FiccoPass`, on ``torch._inductor.config.post_grad_custom_post_pass``) runs on every
graph Inductor compiles (forward, backward, inference) and rewrites, on a tensor-parallel group of 2 to 8
ranks:

- all-gather -> wait -> one or more matmuls of the gathered input (``q/k/v``, ``w1/w3``: several matmuls
  that share one gather become one op with several weights) into ``torch.ops.ficco.all_gather_matmul``;
- matmul -> reduce-scatter into ``torch.ops.ficco.matmul_reduce_scatter``;
- PyTorch's ``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, where the micro-pipeline
  pass (``torch._inductor.config._micro_pipeline_tp``) already produced them, into the same ficco ops.

The patterns are PyTorch's own (``find_all_gather_patterns``, ``find_reduce_scatter_patterns`` and the
matmul finders of ``torch/_inductor/fx_passes/micro_pipeline_tp.py``), so the pass sees what async-TP sees.

Each op gets its schedule at compile time. A static token count (the op's ``m``: gathered rows, batch
included) asks the schedule source once; a dynamic one asks it at each of ``token_points`` and bakes a
token-range table (``features.ScheduleTable``, ``"0:serial/sm;1448:shard/dma"``) into the op, which picks
its entry at run time with a bisect (no host round trip, CUDA-graph safe).

What was left, with the reason (``bias``, ``fp8 scaled matmul``, ``layout``, ``dtype``, ``dynamic shape``,
``unsupported group``, ``shared output``), is in the report beside what was rewritten; when a group's
matmuls were found in a graph but none was rewritten, the pass warns (no silent no-op).

Graph cache: the pass's ``uuid`` keys Inductor's FX graph cache on this file and on the schedule source
(a fixed schedule, a plain function's code), so a cached graph was rewritten with the same schedules when it
was first compiled; the report lists only graphs compiled in this process (:attr:`CompileReport.cache_hits`
counts the others). A planner or a ``ScheduleSource`` decides collectively (rank 0 asks, every rank of the
group agrees), so with one the pass bypasses the cache: a rank that found the graph cached while another
compiled it would leave the other waiting in that agreement.
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.fx_passes.micro_pipeline_tp import (
    _find_consumer_matmuls,
    _find_producer_matmul,
    _Matmul,
    _ScaledMatmul,
    find_all_gather_patterns,
    find_reduce_scatter_patterns,
)
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from ficco.executor.checks import DTYPES, as_schedule
from ficco.executor.library import REDUCE_OPS  # importing it registers torch.ops.ficco
from ficco.features import MODES, SERIAL, Mode, Schedule, ScheduleTable
from ficco.features.scenario import MAX_WORLD_SIZE, MIN_WORLD_SIZE
from ficco.runtime.planner import Direction, OpRequest, OpShape, Planner
from ficco.tables import markdown_table

log = logging.getLogger(__name__)
aten = torch.ops.aten

DEFAULT_TOKEN_POINTS: tuple[int, ...] = tuple(2**i for i in range(6, 18))
"""Token counts (the op's ``m``) a dynamic-shape op's schedule is decided at: 64 to 131072, doubling. The
table switches schedule at the geometric mean of two neighbouring points that decided differently."""
DECIDE_TIMEOUT_S = 60.0
"""Longest the pass waits for a planner's source per graph, seconds (compile time affords more than a
step; an answer that comes later cannot change a compiled graph)."""
Reason = Literal[
    "bias", "fp8 scaled matmul", "layout", "dtype", "dynamic shape", "unsupported group", "shared output"
]
_DTYPES_RUN = f"ficco's ops run {', '.join(map(str, DTYPES))}"
ScheduleFn = Callable[[str, int, int, int, str, int], "Schedule | str"]
"""``(op, m, n, k, dtype, world_size) -> schedule`` (``features.Scenario`` conventions)."""


# Report -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Rewrite:
    """One op the pass put in a graph."""

    op: Literal["ag_gemm", "gemm_rs"]
    """``ag_gemm`` (``ficco.all_gather_matmul``) or ``gemm_rs`` (``ficco.matmul_reduce_scatter``)."""
    graph: int
    """Which graph (0, 1, ... in the order Inductor compiled them in this process)."""
    direction: Direction
    """``fwd`` (a forward or inference graph) or ``bwd-input`` (a backward graph)."""
    layers: tuple[str, ...]
    """The modules whose matmuls it runs (``layers.0.attention.wq``), or the graph's node names."""
    found: Literal["pattern", "fused op"]
    """Matched as collective + matmuls, or from PyTorch's fused ``symm_mem`` op."""
    group: str
    """The c10d group name."""
    world_size: int
    m: int | None
    """Gathered (``ag_gemm``) or full (``gemm_rs``) rows, batch included; None when dynamic."""
    n: tuple[int, ...]
    """Output columns of each weight."""
    k: int
    dtype: str
    schedule: str
    """The schedule, or the token-range table for a dynamic ``m``, baked into the op."""
    note: str = ""
    """Why ``schedule`` is serial when the source's pick could not be had; empty otherwise."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Left:
    """A collective next to a matmul that the pass left as it was."""

    op: Literal["ag_gemm", "gemm_rs"]
    graph: int
    direction: Direction
    layers: tuple[str, ...]
    group: str
    reason: Reason
    detail: str
    """The reason in words, with the values that decided it."""


@dataclass
class CompileReport:
    """What :class:`FiccoPass` rewrote and left, over every graph it ran on (filled as graphs compile)."""

    rewritten: list[Rewrite] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)
    graphs: int = 0
    """Graphs the pass ran on (graphs loaded from Inductor's cache are not among them)."""
    _cache_hits_at_start: int = 0

    @property
    def cache_hits(self) -> int:
        """Graphs Inductor loaded from its FX graph cache since :func:`enable` (rewritten when first
        compiled, by a pass of the same uuid; not listed here)."""
        from torch._dynamo.utils import counters

        return counters["inductor"]["fxgraph_cache_hit"] - self._cache_hits_at_start

    def rows(self) -> list[dict[str, Any]]:
        """One row per rewrite, then one per op left, in graph order (the columns of :meth:`table`)."""
        rows = []
        for r in self.rewritten:
            shape = f"m={'dyn' if r.m is None else r.m} n={'+'.join(map(str, r.n))} k={r.k} {r.dtype}"
            rows.append(
                {
                    "graph": r.graph,
                    "direction": r.direction,
                    "op": r.op,
                    "layers": ",".join(r.layers),
                    "shape": f"{shape} w={r.world_size}",
                    "schedule": r.schedule,
                    "note": r.note or f"rewritten ({r.found})",
                }
            )
        for x in self.left:
            rows.append(
                {
                    "graph": x.graph,
                    "direction": x.direction,
                    "op": x.op,
                    "layers": ",".join(x.layers),
                    "shape": "",
                    "schedule": "left",
                    "note": f"{x.reason}: {x.detail}",
                }
            )
        return rows

    def table(self) -> str:
        """The report as a markdown table."""
        header = ["graph", "direction", "op", "layers", "shape", "schedule", "note"]
        return markdown_table(header, [[r[h] for h in header] for r in self.rows()])

    def __str__(self) -> str:
        ag = sum(r.op == "ag_gemm" for r in self.rewritten)
        return (
            f"ficco.runtime.compile: {len(self.rewritten)} ops rewritten ({ag} all_gather_matmul, "
            f"{len(self.rewritten) - ag} matmul_reduce_scatter), {len(self.left)} left, in {self.graphs} "
            f"graphs ({self.cache_hits} more loaded from the graph cache)"
        )


# Schedule sources -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class _Query:
    """One schedule the pass needs: an op's shape, where it is, and in which graph direction."""

    shape: OpShape
    layer: str
    direction: Direction


class _FunctionSchedules:
    """Schedules from ``fn(op, m, n, k, dtype, world_size)``, asked on each rank (deterministic)."""

    def __init__(self, fn: ScheduleFn, uuid: str | None) -> None:
        self.fn = fn
        self.uuid = uuid

    def decide(self, queries: Sequence[_Query]) -> list[tuple[Schedule, str]]:
        out = []
        for q in queries:
            s = q.shape
            try:
                out.append((as_schedule(self.fn(s.op, s.m, s.n, s.k, s.dtype, s.world_size)), ""))
            except Exception as err:  # a bad answer costs the overlap, not the compile
                out.append((SERIAL, f"the schedule function failed: {type(err).__name__}: {err}"))
        return out


class _PlannerSchedules:
    """Schedules from a ``Planner``: rank 0 of its group asks the source once per graph, every rank
    agrees (a collective at compile time: every rank compiles the same graph)."""

    uuid = None

    def __init__(self, planner: Planner, timeout_s: float) -> None:
        self.planner = planner
        self.timeout_s = timeout_s

    def decide(self, queries: Sequence[_Query]) -> list[tuple[Schedule, str]]:
        requests = [
            OpRequest(layer=q.layer, direction=q.direction, **_fields(q.shape, OpShape)) for q in queries
        ]
        self.planner.prepare(requests, timeout_s=self.timeout_s)
        out = []
        for r in requests:
            decision = self.planner.decisions[self.planner.key(r)]
            out.append((self.planner.schedule(r), decision.reason or ""))
        return out


def _schedules_of(
    schedules: Any, mode: Mode, hardware: str | None, timeout_s: float
) -> _FunctionSchedules | _PlannerSchedules:
    """The pass's view of what :func:`enable` was given (its docstring lists the forms)."""
    if isinstance(schedules, Planner):
        return _PlannerSchedules(schedules, timeout_s)
    if hasattr(schedules, "recommend"):
        return _PlannerSchedules(Planner(schedules, mode=mode, hardware=hardware), timeout_s)
    if isinstance(schedules, Schedule | str):
        fixed = as_schedule(schedules)  # a bad string is the caller's mistake: raised now
        return _FunctionSchedules(lambda *_: fixed, uuid=f"fixed {fixed}")
    if callable(schedules):
        return _FunctionSchedules(schedules, uuid=_code_key(schedules))
    raise ValueError(
        "schedules must be a runtime.Planner, a ScheduleSource (PredictorSource, ServiceSource, "
        "TableSource, FixedSource), a schedule string or features.Schedule, or a callable "
        f"(op, m, n, k, dtype, world_size) -> schedule; got {type(schedules).__name__}"
    )


def _code_key(fn: Callable) -> str | None:
    """What a plain function's answers depend on: its name, code and constants; None (no graph cache)
    for anything whose answers may depend on state (a closure, a bound method, a callable object)."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__closure__", None) or hasattr(fn, "__self__"):
        return None
    digest = hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]
    return f"function {fn.__module__}.{fn.__qualname__} {digest}"


def _fields(obj: Any, cls: type) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(obj, f.name) for f in fields(cls)}


# Finding the sites ------------------------------------------------------------------------------------------


@dataclass
class _Site:
    """A rewrite the pass can make: its shape, and how to make it once the schedule is known."""

    op: Literal["ag_gemm", "gemm_rs"]
    layers: tuple[str, ...]
    found: Literal["pattern", "fused op"]
    group: str
    world_size: int
    m: Any
    """An int, or a SymInt when the token count is dynamic."""
    n: tuple[int, ...]
    k: int
    dtype: str
    apply: Callable[[str], None]
    """Rewrites the graph with the schedule string."""


class _Skip(Exception):
    """A site the pass leaves, with the reason."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _val(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


def _module_name(node: torch.fx.Node) -> str:
    """The module a node came from (``layers.0.attention.wq``), from Dynamo's module stack; the node's name
    when the graph does not say."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return node.name
    path = list(stack.values())[-1][0]
    return re.sub(r"^L\[['\"][^'\"]*['\"]\]\.?", "", str(path)) or node.name


def _matmul_name(matmul: _Matmul) -> str:
    return _module_name(matmul.nodes[len(matmul.nodes) // 2])


def _group_size(group_name: str) -> int:
    """The group's size; _Skip when this process cannot run ficco's ops on it."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        size = _resolve_process_group(group_name).size()
    except Exception as err:
        raise _Skip("unsupported group", f"group {group_name!r} does not resolve here ({err})") from None
    if not MIN_WORLD_SIZE <= size <= MAX_WORLD_SIZE:
        raise _Skip(
            "unsupported group",
            f"group {group_name!r} has {size} ranks; ficco's ops run on {MIN_WORLD_SIZE} to {MAX_WORLD_SIZE}",
        )
    return size


def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in DTYPES:
        raise _Skip("dtype", f"{t.dtype}; {_DTYPES_RUN}")
    return DTYPES[t.dtype]


def _static(value: Any, what: str) -> int:
    if not is_concrete_int(value):
        raise _Skip("dynamic shape", f"{what} is dynamic ({value}); only the token count may be")
    return int(value)


def _rows(shape: Sequence[Any]) -> Any:
    """Rows of a ``[..., features]`` shape (an int, or a SymInt when a leading size is dynamic)."""
    return math.prod(shape[:-1])


def _biased_users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``addmm`` nodes (a matmul with a bias) whose input is ``node``, directly or through a reshape."""
    out = []
    for user in node.users:
        if user.target is aten.addmm.default and user.args[1] is node:
            out.append(user)
        elif user.target is aten.reshape.default:
            out += [u for u in user.users if u.target is aten.addmm.default and u.args[1] is user]
    return out


def _replace_matmul(matmul: _Matmul, new: torch.fx.Node, n: int) -> None:
    """Point the users of ``matmul``'s result at ``new`` (its N-D result); users of the 2-D ``mm`` inside a
    reshape -> mm -> reshape (saved for backward) get ``new`` flattened to ``[-1, n]``
    (``_Matmul.replace_with`` spells that shape out: raw SymInts in the graph when the token count is
    dynamic)."""
    if len(matmul.nodes) == 1:
        matmul.nodes[0].replace_all_uses_with(new)
        return
    _, mm, reshape = matmul.nodes
    reshape.replace_all_uses_with(new)
    if len(mm.users) > 1:
        with new.graph.inserting_after(new):
            flat = new.graph.call_function(aten.reshape.default, args=(new, [-1, n]))
        mm.replace_all_uses_with(flat)


def _raise_ancestors(fused: torch.fx.Node, ancestors: Sequence[torch.fx.Node]) -> None:
    """Move ``ancestors`` (the weights' producers) before ``fused`` where they came after it, in order (as
    the micro-pipeline pass does)."""
    order = {node: i for i, node in enumerate(fused.graph.nodes)}
    for node in sorted(ancestors, key=order.__getitem__):
        if order[node] > order[fused]:
            fused.prepend(node)


def _all_gather_sites(graph: torch.fx.Graph, add_left: Callable) -> list[_Site]:
    """all-gather -> wait -> matmuls of the gathered input, one site per gather."""
    sites = []
    for ag in find_all_gather_patterns(graph):
        matmuls = _find_consumer_matmuls(ag.res_node)
        biased = _biased_users(ag.res_node)
        if not matmuls and not biased:
            continue  # the gathered tensor feeds no matmul: not a tensor-parallel input
        if biased:
            add_left(
                "ag_gemm",
                tuple(map(_module_name, biased)),
                ag.group_name,
                _Skip("bias", f"{len(biased)} matmul(s) add a bias (addmm); ficco's ops take none"),
            )
        scaled = [mm for mm in matmuls if isinstance(mm, _ScaledMatmul)]
        if scaled:
            add_left(
                "ag_gemm",
                tuple(map(_matmul_name, scaled)),
                ag.group_name,
                _Skip(
                    "fp8 scaled matmul",
                    f"{len(scaled)} _scaled_mm consumer(s); ficco's ops run bf16/fp16/fp32",
                ),
            )
        plain = [mm for mm in matmuls if type(mm) is _Matmul]
        dependent = [mm for mm in plain if ag.res_node in mm.arg_ancestor_nodes]
        if dependent:
            add_left(
                "ag_gemm",
                tuple(map(_matmul_name, dependent)),
                ag.group_name,
                _Skip("layout", "the weight is computed from the gathered input"),
            )
        plain = [mm for mm in plain if mm not in dependent]
        if not plain:
            continue
        layers = tuple(map(_matmul_name, plain))
        try:
            sites.append(_all_gather_site(ag, plain, layers))
        except _Skip as skip:
            add_left("ag_gemm", layers, ag.group_name, skip)
    return sites


def _all_gather_site(ag: Any, matmuls: list[_Matmul], layers: tuple[str, ...]) -> _Site:
    world_size = _group_size(ag.group_name)
    shard, gathered = _val(ag.shard_node), _val(ag.res_node)
    gather_dim = ag.gather_dim % gathered.dim()
    if gather_dim == gathered.dim() - 1:
        raise _Skip("layout", f"gathered along the last dim ({gather_dim}), the matmul's reduction dim")
    if shard.dtype != gathered.dtype:
        raise _Skip("layout", f"gathered as {shard.dtype} and viewed as {gathered.dtype}")
    k = _static(gathered.shape[-1], "k")
    n = tuple(_static(_val(mm.B_node).shape[-1], "n") for mm in matmuls)

    def apply(schedule: str) -> None:
        graph = ag.ag_node.graph
        with graph.inserting_before(ag.ag_node):
            fused = graph.call_function(
                torch.ops.ficco.all_gather_matmul.default,
                args=(ag.shard_node, [mm.B_node for mm in matmuls], gather_dim, ag.group_name, schedule),
                kwargs={"return_a": True},
            )
            new_a = graph.call_function(operator.getitem, args=(fused, 0))
            outs = graph.call_function(operator.getitem, args=(fused, 1))
            for i, (mm, n_i) in enumerate(zip(matmuls, n, strict=True)):
                _replace_matmul(mm, graph.call_function(operator.getitem, args=(outs, i)), n_i)
                mm.erase()
            ag.replace_with(new_a)
            ag.erase()
            if not new_a.users:  # nothing else reads the gathered input: the op need not return it
                graph.erase_node(new_a)
                fused.kwargs = {"return_a": False}
        _raise_ancestors(fused, [x for mm in matmuls for x in mm.arg_ancestor_nodes])

    return _Site(
        op="ag_gemm",
        layers=layers,
        found="pattern",
        group=ag.group_name,
        world_size=world_size,
        m=_rows(gathered.shape),
        n=n,
        k=k,
        dtype=_dtype_name(gathered),
        apply=apply,
    )


def _reduce_scatter_sites(graph: torch.fx.Graph, add_left: Callable) -> list[_Site]:
    """matmul -> reduce-scatter, one site per reduce-scatter."""
    sites = []
    for rs in find_reduce_scatter_patterns(graph):
        matmul = _find_producer_matmul(rs.input_node)
        if matmul is None:
            biased = [rs.input_node] if _is_addmm(rs.input_node) else []
            if biased:
                skip = _Skip("bias", "the matmul adds a bias (addmm); ficco's ops take none")
                add_left("gemm_rs", (_module_name(rs.input_node),), rs.group_name, skip)
            continue  # reduces something else than a matmul (an embedding, a sum of matmuls)
        layers = (_matmul_name(matmul),)
        try:
            sites.append(_reduce_scatter_site(rs, matmul, layers))
        except _Skip as skip:
            add_left("gemm_rs", layers, rs.group_name, skip)
    return sites


def _is_addmm(node: torch.fx.Node) -> bool:
    if node.target is aten.reshape.default and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node.target is aten.addmm.default


def _reduce_scatter_site(rs: Any, matmul: _Matmul, layers: tuple[str, ...]) -> _Site:
    if isinstance(matmul, _ScaledMatmul):
        raise _Skip("fp8 scaled matmul", f"a _scaled_mm producer; {_DTYPES_RUN}")
    world_size = _group_size(rs.group_name)
    if rs.reduce_op not in REDUCE_OPS:
        raise _Skip("layout", f"reduce_op {rs.reduce_op!r}; ficco's op reduces with {REDUCE_OPS}")
    match_nodes = rs.match.nodes if hasattr(rs.match, "nodes") else rs.match
    if any(user not in match_nodes and user.target is not aten.sym_size.int for user in rs.input_node.users):
        raise _Skip("shared output", "the matmul's output has other users than the reduce-scatter")
    if rs.wait_tensor_node in matmul.arg_ancestor_nodes:
        raise _Skip("layout", "the weight is computed from the reduce-scatter's result")
    a, out = _val(matmul.A_node), _val(rs.input_node)
    if tuple(a.shape[:-1]) != tuple(out.shape[:-1]):
        raise _Skip(
            "layout", f"the matmul's input {list(a.shape)} and output {list(out.shape)} differ in rows"
        )
    scatter_dim = rs.scatter_dim % out.dim()
    if scatter_dim == out.dim() - 1:
        raise _Skip("layout", f"scattered along the last dim ({scatter_dim}), the output's columns")
    k = _static(a.shape[-1], "k")
    n = _static(_val(matmul.B_node).shape[-1], "n")

    def apply(schedule: str) -> None:
        graph = rs.wait_tensor_node.graph
        with graph.inserting_before(rs.wait_tensor_node):
            fused = graph.call_function(
                torch.ops.ficco.matmul_reduce_scatter.default,
                args=(matmul.A_node, matmul.B_node, rs.reduce_op, scatter_dim, rs.group_name, schedule),
            )
            rs.replace_with(fused)
            rs.erase()
            matmul.erase()
        _raise_ancestors(fused, list(matmul.arg_ancestor_nodes))

    return _Site(
        op="gemm_rs",
        layers=layers,
        found="pattern",
        group=rs.group_name,
        world_size=world_size,
        m=_rows(a.shape),
        n=(n,),
        k=k,
        dtype=_dtype_name(a),
        apply=apply,
    )


def _fused_op_sites(graph: torch.fx.Graph, add_left: Callable) -> list[_Site]:
    """PyTorch's fused ops, where the micro-pipeline pass produced them."""
    symm = getattr(torch.ops, "symm_mem", None)
    if symm is None or not hasattr(symm, "fused_all_gather_matmul"):
        return []
    sites = []
    for node in list(graph.nodes):
        if node.target in (
            symm.fused_all_gather_scaled_matmul.default,
            symm.fused_scaled_matmul_reduce_scatter.default,
        ):
            op = "ag_gemm" if "all_gather" in str(node.target) else "gemm_rs"
            group = node.args[5] if op == "ag_gemm" else node.args[7]
            add_left(op, (node.name,), group, _Skip("fp8 scaled matmul", f"PyTorch's {node.target}"))
        elif node.target is symm.fused_all_gather_matmul.default:
            try:
                sites.append(_fused_all_gather_site(node))
            except _Skip as skip:
                add_left("ag_gemm", (node.name,), node.args[3], skip)
        elif node.target is symm.fused_matmul_reduce_scatter.default:
            try:
                sites.append(_fused_reduce_scatter_site(node))
            except _Skip as skip:
                add_left("gemm_rs", (node.name,), node.args[4], skip)
    return sites


def _replace_node(node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> None:
    with node.graph.inserting_before(node):
        new = node.graph.call_function(target, args=args, kwargs=kwargs)
    node.replace_all_uses_with(new)
    node.graph.erase_node(node)


def _fused_all_gather_site(node: torch.fx.Node) -> _Site:
    shard_node, b_nodes, gather_dim, group = node.args[:4]
    return_a = node.kwargs.get("return_A", True)
    world_size = _group_size(group)
    shard = _val(shard_node)
    gather_dim = gather_dim % shard.dim()
    if gather_dim == shard.dim() - 1:
        raise _Skip("layout", f"gathered along the last dim ({gather_dim}), the matmul's reduction dim")
    m = (
        shard.shape[gather_dim]
        * world_size
        * math.prod(s for d, s in enumerate(shard.shape[:-1]) if d != gather_dim)
    )

    def apply(schedule: str) -> None:
        args = (shard_node, list(b_nodes), gather_dim, group, schedule)
        _replace_node(node, torch.ops.ficco.all_gather_matmul.default, args, {"return_a": return_a})

    return _Site(
        op="ag_gemm",
        layers=(node.name,),
        found="fused op",
        group=group,
        world_size=world_size,
        m=m,
        n=tuple(_static(_val(b).shape[-1], "n") for b in b_nodes),
        k=_static(shard.shape[-1], "k"),
        dtype=_dtype_name(shard),
        apply=apply,
    )


def _fused_reduce_scatter_site(node: torch.fx.Node) -> _Site:
    a_node, b_node, reduce_op, scatter_dim, group = node.args[:5]
    world_size = _group_size(group)
    a = _val(a_node)
    if reduce_op not in REDUCE_OPS:
        raise _Skip("layout", f"reduce_op {reduce_op!r}; ficco's op reduces with {REDUCE_OPS}")
    scatter_dim = scatter_dim % a.dim()
    if scatter_dim == a.dim() - 1:
        raise _Skip("layout", f"scattered along the last dim ({scatter_dim}), the output's columns")

    def apply(schedule: str) -> None:
        args = (a_node, b_node, reduce_op, scatter_dim, group, schedule)
        _replace_node(node, torch.ops.ficco.matmul_reduce_scatter.default, args, {})

    return _Site(
        op="gemm_rs",
        layers=(node.name,),
        found="fused op",
        group=group,
        world_size=world_size,
        m=_rows(a.shape),
        n=(_static(_val(b_node).shape[-1], "n"),),
        k=_static(a.shape[-1], "k"),
        dtype=_dtype_name(a),
        apply=apply,
    )


# The pass ---------------------------------------------------------------------------------------------------


class FiccoPass(CustomGraphPass):
    """The Inductor pass :func:`enable` installs (the module docstring says what it rewrites); its
    :attr:`report` fills as graphs compile. The parameters are :func:`enable`'s."""

    def __init__(
        self,
        schedules: Any,
        *,
        mode: Mode = "eager",
        hardware: str | None = None,
        token_points: Sequence[int] = DEFAULT_TOKEN_POINTS,
        timeout_s: float = DECIDE_TIMEOUT_S,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
        points = tuple(token_points)
        valid = all(isinstance(p, int) and p >= 1 for p in points) and list(points) == sorted(set(points))
        if not (points and valid):
            raise ValueError(f"token_points must be increasing positive ints; got {list(token_points)!r}")
        if not (isinstance(timeout_s, int | float) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a number of seconds > 0; got {timeout_s!r}")
        self.schedules = _schedules_of(schedules, mode, hardware, float(timeout_s))
        self.token_points = points
        from torch._dynamo.utils import counters

        self.report = CompileReport(_cache_hits_at_start=counters["inductor"]["fxgraph_cache_hit"])

    def uuid(self) -> bytes | None:
        """Keys the FX graph cache on this file, the schedule source and the token points; None (no cache)
        for a source decided collectively or whose answers may depend on state."""
        if self.schedules.uuid is None:
            return None
        extra = f"{self.schedules.uuid} points={self.token_points}"
        return get_hash_for_files((__file__,), extra)

    def __call__(self, graph: torch.fx.Graph) -> None:
        index = self.report.graphs
        self.report.graphs += 1
        direction: Direction = "bwd-input" if _is_backward(graph) else "fwd"
        left: list[Left] = []

        def add_left(op, layers, group, skip: _Skip) -> None:
            left.append(
                Left(
                    op=op,
                    graph=index,
                    direction=direction,
                    layers=layers,
                    group=str(group),
                    reason=skip.reason,
                    detail=skip.detail,
                )
            )

        sites = _fused_op_sites(graph, add_left)
        sites += _all_gather_sites(graph, add_left)
        sites += _reduce_scatter_sites(graph, add_left)
        schedules = self._decide(sites, direction)
        rewritten = []
        for site, (schedule, note) in zip(sites, schedules, strict=True):
            site.apply(schedule)
            rewrite = Rewrite(
                op=site.op,
                graph=index,
                direction=direction,
                layers=site.layers,
                found=site.found,
                group=str(site.group),
                world_size=site.world_size,
                m=int(site.m) if is_concrete_int(site.m) else None,
                n=site.n,
                k=site.k,
                dtype=site.dtype,
                schedule=schedule,
                note=note,
            )
            log.info(
                "ficco.runtime.compile: graph %d (%s) %s %s on group %s: m=%s n=%s k=%s %s -> %s%s",
                index,
                direction,
                rewrite.op,
                ",".join(rewrite.layers),
                rewrite.group,
                "dyn" if rewrite.m is None else rewrite.m,
                "+".join(map(str, rewrite.n)),
                rewrite.k,
                rewrite.dtype,
                schedule,
                f" ({note})" if note else "",
            )
            rewritten.append(rewrite)
        if sites:
            graph.lint()
        self.report.rewritten += rewritten
        self.report.left += left
        _warn_unrewritten(index, direction, rewritten, left)

    def _decide(self, sites: list[_Site], direction: Direction) -> list[tuple[str, str]]:
        """Each site's schedule string (a table for a dynamic token count) and note, in one batch."""
        queries, spans = [], []
        for site in sites:
            points = (
                [int(site.m)]
                if is_concrete_int(site.m)
                else sorted({-(-p // site.world_size) * site.world_size for p in self.token_points})
            )
            start = len(queries)
            for m in points:
                shape = OpShape(
                    op=site.op, m=m, n=sum(site.n), k=site.k, dtype=site.dtype, world_size=site.world_size
                )
                queries.append(_Query(shape=shape, layer=",".join(site.layers), direction=direction))
            spans.append((start, points))
        answers = self.schedules.decide(queries) if queries else []
        out = []
        for start, points in spans:
            picks = answers[start : start + len(points)]
            notes = sorted({note for _, note in picks if note})
            out.append((_table(points, [s for s, _ in picks]), "; ".join(notes)))
        return out


def _table(points: Sequence[int], schedules: Sequence[Schedule]) -> str:
    """One schedule string, or a token-range table switching at the geometric mean of two neighbouring
    points that decided differently."""
    bounds, picks = [0], [schedules[0]]
    for lo, hi, schedule in zip(points, points[1:], schedules[1:], strict=False):
        if schedule != picks[-1]:
            bounds.append(max(bounds[-1] + 1, round(math.sqrt(lo * hi))))
            picks.append(schedule)
    return str(ScheduleTable(bounds=tuple(bounds), schedules=tuple(picks)))


def _is_backward(graph: torch.fx.Graph) -> bool:
    """A backward graph takes the output gradients (AOTAutograd names them ``tangents_*``)."""
    return any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)


def _warn_unrewritten(index: int, direction: str, rewritten: list[Rewrite], left: list[Left]) -> None:
    """Warn for each group whose matmuls the graph has but none of which was rewritten."""
    done = {r.group for r in rewritten}
    for group in sorted({x.group for x in left} - done):
        reasons = sorted({f"{x.reason} ({x.detail})" for x in left if x.group == group})
        message = (
            f"ficco.runtime.compile: graph {index} ({direction}) has all-gather/reduce-scatter matmuls on "
            f"group {group!r} but none was rewritten: {'; '.join(reasons)}"
        )
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


# Installing -------------------------------------------------------------------------------------------------


def enable(
    schedules: Any,
    *,
    mode: Mode = "eager",
    hardware: str | None = None,
    token_points: Sequence[int] = DEFAULT_TOKEN_POINTS,
    timeout_s: float = DECIDE_TIMEOUT_S,
) -> CompileReport:
    """Install :class:`FiccoPass` on ``torch._inductor.config.post_grad_custom_post_pass`` (beside any
    pass already there; replacing a previous ficco pass) for every later ``torch.compile``.

    Parameters
    ----------
    schedules : Planner, ScheduleSource, Schedule, str or callable
        Where each op's schedule comes from: a ``runtime.Planner`` (its mode, hardware and group); a
        ``ScheduleSource`` (``PredictorSource``, ``ServiceSource``, ``TableSource``, ``FixedSource``), put
        behind a planner of ``mode`` and ``hardware``; one schedule for every op (``"shard/dma"``); or a
        function ``(op, m, n, k, dtype, world_size) -> schedule`` (``features.Scenario`` conventions,
        ``n`` summed over the weights of one gather), asked on every rank.
    mode : {"eager", "graph"}, default="eager"
        The execution mode a bare ``ScheduleSource`` is asked for (``graph`` under CUDA graphs, e.g.
        ``torch.compile(mode="reduce-overhead")``).
    hardware : str, optional
        Hardware id a bare ``ScheduleSource`` is asked about (default: the source's own, else ``h200x2``).
    token_points : sequence of int, default=DEFAULT_TOKEN_POINTS
        Token counts a dynamic-shape op is decided at (increasing).
    timeout_s : float, default=DECIDE_TIMEOUT_S
        Longest a planner's source is waited for per graph, seconds.

    Returns
    -------
    CompileReport
        Filled as graphs compile: what was rewritten, what was left and why.
    """
    ficco_pass = FiccoPass(
        schedules, mode=mode, hardware=hardware, token_points=token_points, timeout_s=timeout_s
    )
    others = [p for p in _installed() if not isinstance(p, FiccoPass)]
    inductor_config.post_grad_custom_post_pass = ficco_pass if not others else (*others, ficco_pass)
    return ficco_pass.report


def disable() -> None:
    """Remove the ficco pass (other custom passes stay)."""
    others = [p for p in _installed() if not isinstance(p, FiccoPass)]
    inductor_config.post_grad_custom_post_pass = (
        None if not others else others[0] if len(others) == 1 else tuple(others)
    )


def _installed() -> list:
    current = inductor_config.post_grad_custom_post_pass
    if current is None:
        return []
    return list(current) if isinstance(current, list | tuple) else [current]


__all__ = [
    "DEFAULT_TOKEN_POINTS",
    "CompileReport",
    "FiccoPass",
    "Left",
    "Rewrite",
    "disable",
    "enable",
]
