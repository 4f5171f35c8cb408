"""Where the compile pass (``runtime.compile``) can put ficco's ops in an Inductor post-grad graph, and the
graph surgery that puts them there. The patterns are those of PyTorch's micro-pipeline TP pass (async-TP,
``torch/_inductor/fx_passes/micro_pipeline_tp.py``); the checks are ficco's, and each refusal says why.
:func:`find_sites` gives a :class:`Site` per rewrite it can make and a :class:`Skipped` per collective left,
so that the report accounts for every collective of the graph (docs/runtimes.md lists the reasons).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch._inductor.fx_passes.micro_pipeline_tp import (
    _AllGatherMatch,
    _find_consumer_matmuls,
    _find_producer_matmul,
    _Matmul,
    _ReduceScatterMatch,
    _ScaledMatmul,
    find_all_gather_patterns,
    find_reduce_scatter_patterns,
)
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from ficco.executor.checks import DTYPES
from ficco.executor.library import REDUCE_OPS  # importing it registers torch.ops.ficco
from ficco.features.scenario import MAX_WORLD_SIZE, MIN_WORLD_SIZE
from ficco.runtime.compile_report import Left, Op, Reason
from ficco.runtime.planner import Direction

aten = torch.ops.aten
_DTYPES_RUN = f"ficco's ops run {', '.join(map(str, DTYPES))}"


@dataclass(frozen=True, kw_only=True)
class Site:
    """A rewrite the pass can make: the op's shape, and how to make it once its schedule is known."""

    op: Op
    layers: tuple[str, ...]
    """The modules whose matmuls it replaces (``layers.0.attention.wq``), else node names."""
    found: Literal["pattern", "sum of matmuls", "fused op"]
    group: str
    world_size: int
    m: Any
    """Gathered (``ag_gemm``) or full (``gemm_rs``) rows: an int, or a SymInt for a dynamic token count."""
    n: tuple[int, ...]
    """Output columns of each weight."""
    k: int
    dtype: str
    apply: Callable[[str], None]
    """Rewrites the graph with the schedule (or table) string."""
    replaces: frozenset[torch.fx.Node] = frozenset()
    """The matmul nodes it replaces."""
    batch: int = 1
    """Sequences the rows hold: the elements of the dims before the gather (scatter) dim, where they are
    static (a dynamic one counts as 1: the planner then prices no layout)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Skipped:
    """A collective that the pass leaves, with the reason."""

    op: Op
    layers: tuple[str, ...]
    group: str
    reason: Reason
    detail: str

    def left(self, graph: int, direction: Direction) -> Left:
        """The report's entry for it in graph ``graph``."""
        return Left(graph=graph, direction=direction, **dataclasses.asdict(self))


class _Refused(Exception):
    """Raised by the checks of one site: why the pass leaves it."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail

    def skipped(self, op: Op, layers: tuple[str, ...], group: str) -> Skipped:
        return Skipped(op=op, layers=layers, group=str(group), reason=self.reason, detail=self.detail)


def find_sites(graph: torch.fx.Graph) -> list[Site | Skipped]:
    """Every rewrite the pass can make in ``graph`` and every collective it leaves, with the reason: PyTorch's
    fused ops first, then all-gather -> matmuls, then matmul (or a sum of matmuls) -> reduce-scatter, then
    the collectives that reach a matmul in a form PyTorch's patterns do not match, then every other
    collective of the graph (an all-reduce, a collective beside no matmul)."""
    all_gathers = find_all_gather_patterns(graph)
    reduce_scatters = find_reduce_scatter_patterns(graph)
    # a gather the pattern matched but whose matmul it did not find (e.g. reached through two reshapes at
    # one sequence per batch) counts as unmatched, so that the search below reports it
    consumers = [(ag, _gathered_matmuls(ag), _biased_users(ag.res_node)) for ag in all_gathers]
    fed = [c for c in consumers if c[1] or c[2]]
    matched = {ag.ag_node for ag, _, _ in fed} | {rs.reduce_scatter_node for rs in reduce_scatters}
    gathers = _all_gather_sites(fed)
    taken = {n for site in gathers if isinstance(site, Site) for n in site.replaces}
    scatters = [_not_taken(site, taken) for site in _reduce_scatter_sites(reduce_scatters)]
    unmatched = _unmatched(graph, matched)
    others = _other_collectives(graph, matched | {node for node, _ in unmatched})
    return _fused_op_sites(graph) + gathers + scatters + [x for _, x in unmatched] + others


def _not_taken(site: Site | Skipped, taken: set[torch.fx.Node]) -> Site | Skipped:
    """A reduce-scatter site whose matmul an all-gather site replaces (gathered input, scattered output) is
    left: one op takes the matmul, the gather's, as PyTorch's pass prefers."""
    if isinstance(site, Skipped) or not (site.replaces & taken):
        return site
    why = _Refused("layout", "its matmul's input is gathered too, and the all_gather_matmul takes the matmul")
    return why.skipped(site.op, site.layers, site.group)


# Shared checks ----------------------------------------------------------------------------------------------


def _val(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


def _module_name(node: torch.fx.Node) -> str:
    """The module a node came from (``layers.0.attention.wq``), from Dynamo's module stack (the forward's,
    in a backward graph); the node's name when the graph does not say."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return node.name
    path = str(list(stack.values())[-1][0])
    return re.sub(r"^L\[['\"][^'\"]*['\"]\]\.?", "", path) or node.name


def _matmul_name(matmul: _Matmul) -> str:
    return _module_name(matmul.nodes[len(matmul.nodes) // 2])  # the mm of reshape -> mm -> reshape


def _group_size(group_name: str) -> int:
    """The group's size; refused when this process cannot run ficco's ops on it."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        size = _resolve_process_group(group_name).size()
    except Exception as err:
        raise _Refused("unsupported group", f"group {group_name!r} does not resolve here ({err})") from None
    if not MIN_WORLD_SIZE <= size <= MAX_WORLD_SIZE:
        raise _Refused(
            "unsupported group",
            f"group {group_name!r} has {size} ranks; ficco's ops run on {MIN_WORLD_SIZE} to {MAX_WORLD_SIZE}",
        )
    return size


def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in DTYPES:
        raise _Refused("dtype", f"{t.dtype}; {_DTYPES_RUN}")
    return DTYPES[t.dtype]


def _static(value: Any, what: str) -> int:
    if not is_concrete_int(value):
        raise _Refused("dynamic shape", f"{what} is dynamic ({value}); only the token count may be")
    return int(value)


def _batch(shape: Sequence[Any], dim: int) -> int:
    """Sequences of a ``shape`` gathered or scattered along ``dim``: the product of the sizes before it,
    where every one is static (else 1)."""
    sizes = shape[:dim]
    return math.prod(int(x) for x in sizes) if all(is_concrete_int(x) for x in sizes) else 1


def _rows(shape: Sequence[Any]) -> Any:
    """Rows of a ``[..., features]`` shape (a SymInt when a leading size is dynamic)."""
    return math.prod(shape[:-1])


def _not_rows(dim: int, ndim: int, what: str) -> int:
    """``dim`` in ``[0, ndim)``; refused when it is the last dim (features, not rows)."""
    dim %= ndim
    if dim == ndim - 1:
        raise _Refused("layout", f"{what} along the last dim ({dim}), the matmul's features, not its rows")
    return dim


def _reduce_op(reduce_op: str) -> str:
    if reduce_op not in REDUCE_OPS:
        raise _Refused("reduce op", f"{reduce_op!r}; ficco's op reduces with {list(REDUCE_OPS)}")
    return reduce_op


# Graph surgery ----------------------------------------------------------------------------------------------


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


def _replace_node(node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> None:
    with node.graph.inserting_before(node):
        new = node.graph.call_function(target, args=args, kwargs=kwargs)
    node.replace_all_uses_with(new)
    node.graph.erase_node(node)


# all-gather -> matmuls --------------------------------------------------------------------------------------


def _biased_users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``addmm`` nodes (a matmul with a bias) whose input is ``node``, directly or through a reshape."""
    out = []
    for user in node.users:
        if user.target is aten.addmm.default and user.args[1] is node:
            out.append(user)
        elif user.target is aten.reshape.default:
            out += [u for u in user.users if u.target is aten.addmm.default and u.args[1] is user]
    return out


def _reads_as_input(matmul: _Matmul, node: torch.fx.Node) -> bool:
    """True when ``node`` is ``matmul``'s input (its ``A``, directly or through the reshape before the
    ``mm``), not its weight."""
    if len(matmul.nodes) == 1:
        return matmul.nodes[0].args[0] is node
    reshape, mm, _ = matmul.nodes
    return mm.args[0] is reshape and reshape.args[0] is node


def _all_gather_sites(
    fed: list[tuple[_AllGatherMatch, list[_Matmul], list[torch.fx.Node]]],
) -> list[Site | Skipped]:
    """One site per gather whose result feeds matmuls (all of them in one op), from each gather's
    ``(match, matmuls reading it as input, biased users)``; the matmuls it cannot take (a bias, fp8, a weight
    computed from the gathered input) are skipped beside it."""
    out: list[Site | Skipped] = []
    for ag, matmuls, biased in fed:
        group = ag.group_name
        if biased:
            why = _Refused("bias", f"{len(biased)} matmul(s) add a bias (addmm); ficco's ops take none")
            out.append(why.skipped("ag_gemm", tuple(map(_module_name, biased)), group))
        scaled = [mm for mm in matmuls if isinstance(mm, _ScaledMatmul)]
        if scaled:
            why = _Refused("fp8 scaled matmul", f"{len(scaled)} _scaled_mm consumer(s); {_DTYPES_RUN}")
            out.append(why.skipped("ag_gemm", tuple(map(_matmul_name, scaled)), group))
        plain = [mm for mm in matmuls if type(mm) is _Matmul]
        dependent = [mm for mm in plain if ag.res_node in mm.arg_ancestor_nodes]
        if dependent:
            why = _Refused("layout", "the weight is computed from the gathered input")
            out.append(why.skipped("ag_gemm", tuple(map(_matmul_name, dependent)), group))
        plain = [mm for mm in plain if mm not in dependent]
        if not plain:
            continue
        layers = tuple(map(_matmul_name, plain))
        try:
            out.append(_all_gather_site(ag, plain, layers))
        except _Refused as why:
            out.append(why.skipped("ag_gemm", layers, group))
    return out


def _gathered_matmuls(ag: _AllGatherMatch) -> list[_Matmul]:
    """The matmuls PyTorch's finder found reading the gathered tensor as their input. The finder also
    returns matmuls that take it as their weight (a backward's weight gradient): not an input gathered for
    a matmul, so left out."""
    return [mm for mm in _find_consumer_matmuls(ag.res_node) if _reads_as_input(mm, ag.res_node)]


def _all_gather_site(ag: _AllGatherMatch, matmuls: list[_Matmul], layers: tuple[str, ...]) -> Site:
    world_size = _group_size(ag.group_name)
    shard, gathered = _val(ag.shard_node), _val(ag.res_node)
    gather_dim = _not_rows(ag.gather_dim, gathered.dim(), "gathered")
    if shard.dtype != gathered.dtype:
        raise _Refused("layout", f"gathered as {shard.dtype} and viewed as {gathered.dtype}")
    n = tuple(_static(_val(mm.B_node).shape[-1], "n") for mm in matmuls)

    def apply(schedule: str) -> None:
        graph = ag.ag_node.graph
        with graph.inserting_before(ag.ag_node):
            fused = graph.call_function(
                torch.ops.ficco._all_gather_matmul.default,
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

    return Site(
        op="ag_gemm",
        layers=layers,
        found="pattern",
        group=str(ag.group_name),
        world_size=world_size,
        m=_rows(gathered.shape),
        n=n,
        k=_static(gathered.shape[-1], "k"),
        dtype=_dtype_name(gathered),
        apply=apply,
        replaces=frozenset(n for mm in matmuls for n in mm.nodes),
        batch=_batch(gathered.shape, gather_dim),
    )


# matmul -> reduce-scatter -----------------------------------------------------------------------------------


def _is_addmm(node: torch.fx.Node) -> bool:
    if node.target is aten.reshape.default and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node.target is aten.addmm.default


def _reduce_scatter_sites(reduce_scatters: list[_ReduceScatterMatch]) -> list[Site | Skipped]:
    """One entry per reduce-scatter: a site where it reduces a matmul's output, or a sum of matmuls' outputs
    (a column-parallel layer's input gradient when several weights share its input: q/k/v, gate/up);
    skipped with the reason otherwise."""
    out: list[Site | Skipped] = []
    for rs in reduce_scatters:
        matmul = _find_producer_matmul(rs.input_node)
        summed = _summed_matmuls(rs.input_node) if matmul is None else None
        if matmul is None and summed is None:
            if _is_addmm(rs.input_node):
                why = _Refused("bias", "the matmul adds a bias (addmm); ficco's ops take none")
                out.append(why.skipped("gemm_rs", (_module_name(rs.input_node),), rs.group_name))
                continue
            what = f"{rs.input_node.name} ({rs.input_node.target})"
            why = _Refused("no matmul", f"it reduces {what}, not a matmul's output or a sum of them")
            out.append(why.skipped("reduce_scatter", (_module_name(rs.input_node),), rs.group_name))
            continue
        matmuls, adds = ([matmul], []) if matmul is not None else summed
        layers = tuple(map(_matmul_name, matmuls))
        try:
            out.append(_reduce_scatter_site(rs, matmuls, adds, layers))
        except _Refused as why:
            out.append(why.skipped("gemm_rs", layers, rs.group_name))
    return out


def _summed_matmuls(node: torch.fx.Node) -> tuple[list[_Matmul], list[torch.fx.Node]] | None:
    """The matmuls whose outputs an ``add`` tree rooted at ``node`` sums (each output as PyTorch's producer
    finder sees it), and the tree's ``add`` nodes, root first; None where it is not such a tree."""
    if node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2:
        return None
    matmuls, adds = [], [node]
    for arg in node.args:
        if not isinstance(arg, torch.fx.Node):
            return None
        matmul = _find_producer_matmul(arg)
        if matmul is not None:
            matmuls.append(matmul)
            continue
        below = _summed_matmuls(arg)
        if below is None:
            return None
        matmuls += below[0]
        adds += below[1]
    return matmuls, adds


def _reduce_scatter_site(
    rs: _ReduceScatterMatch, matmuls: list[_Matmul], adds: list[torch.fx.Node], layers: tuple[str, ...]
) -> Site:
    """The site of a reduce-scatter of one matmul's output (``adds`` empty: one ``matmul_reduce_scatter``)
    or of the sum of several (the ``adds`` of :func:`_summed_matmuls`: one ``matmuls_reduce_scatter``, each
    block's matmuls accumulating in one buffer, as ficco's own backward runs a column-parallel input
    gradient)."""
    if any(isinstance(mm, _ScaledMatmul) for mm in matmuls):
        raise _Refused("fp8 scaled matmul", f"a _scaled_mm producer; {_DTYPES_RUN}")
    world_size = _group_size(rs.group_name)
    reduce_op = _reduce_op(rs.reduce_op)
    matched = rs.match.nodes if hasattr(rs.match, "nodes") else rs.match
    if any(u not in matched and u.target is not aten.sym_size.int for u in rs.input_node.users):
        raise _Refused("shared output", "the matmul's output has other users than the reduce-scatter")
    # a part of a sum read elsewhere (an inner add, a product, the mm inside a reshape -> mm -> reshape)
    parts = adds[1:] + [n for mm in matmuls for n in mm.nodes[1:] or mm.nodes] if adds else []
    inner = [n for n in parts if len(n.users) > 1]
    if inner:
        raise _Refused("shared output", f"{inner[0].name}, a part of the sum, has other users")
    if any(rs.wait_tensor_node in mm.arg_ancestor_nodes for mm in matmuls):
        raise _Refused("layout", "the weight is computed from the reduce-scatter's result")
    product = _val(rs.input_node)
    a_vals = [_val(mm.A_node) for mm in matmuls]
    for a in a_vals:
        if tuple(a.shape[:-1]) != tuple(product.shape[:-1]):
            shapes = f"input {list(a.shape)}, output {list(product.shape)}"
            raise _Refused("layout", f"the matmul's rows change between its input and output ({shapes})")
    if len({a.dtype for a in a_vals}) > 1:
        raise _Refused("dtype", f"the summed matmuls take {sorted({str(a.dtype) for a in a_vals})}")
    scatter_dim = _not_rows(rs.scatter_dim, product.dim(), "scattered")
    ks = [_static(a.shape[-1], "k") for a in a_vals]

    def apply(schedule: str) -> None:
        graph = rs.wait_tensor_node.graph
        with graph.inserting_before(rs.wait_tensor_node):
            if adds:  # every matmul accumulating into one buffer, no concatenated operands
                op = torch.ops.ficco._matmuls_reduce_scatter.default
                a, b = [mm.A_node for mm in matmuls], [mm.B_node for mm in matmuls]
            else:
                op = torch.ops.ficco._matmul_reduce_scatter.default
                a, b = matmuls[0].A_node, matmuls[0].B_node
            fused = graph.call_function(op, args=(a, b, reduce_op, scatter_dim, rs.group_name, schedule))
            rs.replace_with(fused)
            rs.erase()
            for add in adds:  # root first: each has no user left once the one above it is gone
                graph.erase_node(add)
            for mm in matmuls:
                mm.erase()
        _raise_ancestors(fused, [x for mm in matmuls for x in mm.arg_ancestor_nodes])

    return Site(
        op="gemm_rs",
        layers=layers,
        found="sum of matmuls" if adds else "pattern",
        group=str(rs.group_name),
        world_size=world_size,
        m=_rows(a_vals[0].shape),
        n=(_static(product.shape[-1], "n"),),
        k=sum(ks),
        dtype=_dtype_name(a_vals[0]),
        apply=apply,
        replaces=frozenset(n for mm in matmuls for n in mm.nodes),
        batch=_batch(product.shape, scatter_dim),
    )


# PyTorch's fused ops ----------------------------------------------------------------------------------------


def _fused_op_sites(graph: torch.fx.Graph) -> list[Site | Skipped]:
    """``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, where the micro-pipeline pass
    produced them; their fp8 variants are skipped."""
    symm = getattr(torch.ops, "symm_mem", None)
    if symm is None or not hasattr(symm, "fused_all_gather_matmul"):
        return []
    scaled = {
        symm.fused_all_gather_scaled_matmul.default: ("ag_gemm", 5),  # op, index of group_name
        symm.fused_scaled_matmul_reduce_scatter.default: ("gemm_rs", 7),
    }
    out: list[Site | Skipped] = []
    for node in list(graph.nodes):
        if node.target in scaled:
            op, group_arg = scaled[node.target]
            why = _Refused("fp8 scaled matmul", f"PyTorch's {node.target}")
            out.append(why.skipped(op, (node.name,), node.args[group_arg]))
            continue
        for target, op, group_arg, site in (
            (symm.fused_all_gather_matmul.default, "ag_gemm", 3, _fused_all_gather_site),
            (symm.fused_matmul_reduce_scatter.default, "gemm_rs", 4, _fused_reduce_scatter_site),
        ):
            if node.target is target:
                try:
                    out.append(site(node))
                except _Refused as why:
                    out.append(why.skipped(op, (node.name,), node.args[group_arg]))
    return out


def _fused_all_gather_site(node: torch.fx.Node) -> Site:
    shard_node, b_nodes, gather_dim, group = node.args[:4]
    return_a = node.kwargs.get("return_A", True)
    world_size = _group_size(group)
    shard = _val(shard_node)
    gather_dim = _not_rows(gather_dim, shard.dim(), "gathered")

    def apply(schedule: str) -> None:
        args = (shard_node, list(b_nodes), gather_dim, group, schedule)
        _replace_node(node, torch.ops.ficco._all_gather_matmul.default, args, {"return_a": return_a})

    return Site(
        op="ag_gemm",
        layers=(node.name,),
        found="fused op",
        group=str(group),
        world_size=world_size,
        m=_rows(shard.shape) * world_size,
        n=tuple(_static(_val(b).shape[-1], "n") for b in b_nodes),
        k=_static(shard.shape[-1], "k"),
        dtype=_dtype_name(shard),
        apply=apply,
        batch=_batch(shard.shape, gather_dim),
    )


def _fused_reduce_scatter_site(node: torch.fx.Node) -> Site:
    a_node, b_node, reduce_op, scatter_dim, group = node.args[:5]
    world_size = _group_size(group)
    reduce_op = _reduce_op(reduce_op)
    a = _val(a_node)
    scatter_dim = _not_rows(scatter_dim, a.dim(), "scattered")

    def apply(schedule: str) -> None:
        args = (a_node, b_node, reduce_op, scatter_dim, group, schedule)
        _replace_node(node, torch.ops.ficco._matmul_reduce_scatter.default, args, {})

    return Site(
        op="gemm_rs",
        layers=(node.name,),
        found="fused op",
        group=str(group),
        world_size=world_size,
        m=_rows(a.shape),
        n=(_static(_val(b_node).shape[-1], "n"),),
        k=_static(a.shape[-1], "k"),
        dtype=_dtype_name(a),
        apply=apply,
        batch=_batch(a.shape, scatter_dim),
    )


# Collectives no pattern matched ---------------------------------------------------------------------------

_C10D = torch.ops._c10d_functional
_MATMULS = (aten.mm.default, aten.addmm.default, aten._scaled_mm.default, aten.bmm.default)
_PASS_THROUGH = (
    _C10D.wait_tensor.default,
    aten.reshape.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.view.dtype,
    aten.cat.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.slice.Tensor,
    aten.clone.default,
    aten._to_copy.default,
    operator.getitem,
)
"""Ops that move, reshape or convert a collective's data without computing on it: a matmul reached through
them reads the gathered input (or produces the reduced product). A transpose is not among them: a matmul of
the gathered input's transpose is a weight gradient, not a tensor-parallel input."""
_HOPS = 8


def _unmatched(graph: torch.fx.Graph, matched: set[torch.fx.Node]) -> list[tuple[torch.fx.Node, Skipped]]:
    """The all-gathers whose data reaches a matmul's input, and the reduce-scatters whose data comes from a
    matmul's output, through data-moving ops only, that PyTorch's patterns did not match (what async-TP
    would miss too): skipped as ``no pattern``, so that a pass that found nothing says so."""
    out = []
    for node in graph.nodes:
        if node in matched:
            continue
        if node.target is _C10D.all_gather_into_tensor.default:
            op: Op = "ag_gemm"
            mm = _reach(node, lambda n: list(n.users), lambda mm, prev: _matmul_input(mm) is prev)
        elif node.target is _C10D.reduce_scatter_tensor.default:
            op = "gemm_rs"
            mm = _reach(node, lambda n: n.all_input_nodes[:1], lambda mm, prev: True)
        else:
            continue
        if mm is not None:
            group = node.kwargs.get("group_name", node.args[-1])
            detail = f"{node.name} reaches {mm.name} ({mm.target}) in a form PyTorch's patterns do not match"
            why = _Refused("no pattern", detail)
            out.append((node, why.skipped(op, (_module_name(mm),), group)))
    return out


_OTHER_COLLECTIVES: dict[Any, str] = {
    getattr(_C10D, name).default: op
    for name, op in (
        ("all_gather_into_tensor", "all_gather"),
        ("all_gather_into_tensor_coalesced", "all_gather"),
        ("reduce_scatter_tensor", "reduce_scatter"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("all_reduce", "all_reduce"),
        ("all_reduce_", "all_reduce"),
        ("all_reduce_coalesced", "all_reduce"),
        ("all_to_all_single", "all_to_all"),
    )
    if hasattr(_C10D, name)
}
"""The functional collectives a graph may hold -> their name in the report."""


def _other_collectives(graph: torch.fx.Graph, accounted: set[torch.fx.Node]) -> list[Skipped]:
    """Every collective of ``graph`` not in ``accounted``, left with its reason: an all-reduce (tensor
    parallelism without sequence parallelism: ficco overlaps none), an all-to-all or a gather of a matmul's
    output (no ficco op runs them), or a collective whose data neither feeds a matmul's input nor comes
    from a matmul (an embedding's, a norm's, a weight gradient's operand)."""
    out = []
    for node in graph.nodes:
        op = _OTHER_COLLECTIVES.get(node.target)
        if op is None or node in accounted:
            continue
        group = node.kwargs.get("group_name", node.args[-1])
        producer = _reach(node, lambda n: n.all_input_nodes[:1], lambda mm, prev: True)
        if op == "all_reduce":
            why = _Refused("all-reduce", f"{node.name}: ficco's ops overlap no all-reduce")
        elif op == "all_to_all":
            why = _Refused("no ficco op", f"{node.name}: the pass rewrites no all-to-all (ficco's MoE ops)")
        elif producer is not None and op == "all_gather":
            detail = (
                f"{node.name} gathers {producer.name}'s output (matmul -> all-gather): ficco gathers inputs"
            )
            why = _Refused("no ficco op", detail)
        else:
            detail = (
                f"{node.name} ({node.target}) neither feeds a matmul's input nor takes a matmul's output "
                f"within {_HOPS} data-moving steps: nothing for ficco's ops to overlap"
            )
            why = _Refused("no matmul", detail)
        out.append(why.skipped(op, (_module_name(producer or node),), group))
    return out


def _matmul_input(mm: torch.fx.Node) -> Any:
    """A matmul node's input operand (``addmm``'s second argument, after the bias)."""
    return mm.args[1] if mm.target is aten.addmm.default else mm.args[0]


def _reach(
    start: torch.fx.Node,
    step: Callable[[torch.fx.Node], list[torch.fx.Node]],
    is_input: Callable[[torch.fx.Node, torch.fx.Node], bool],
) -> torch.fx.Node | None:
    """The first matmul reached from ``start`` within ``_HOPS`` steps through data-moving ops (``step``
    gives a node's next nodes; ``is_input(matmul, previous)`` says whether the path enters it as its
    input), or None."""
    frontier, seen = [start], {start}
    for _ in range(_HOPS):
        ahead = []
        for node in frontier:
            for nxt in step(node):
                if nxt in seen:
                    continue
                seen.add(nxt)
                if nxt.target in _MATMULS and is_input(nxt, node):
                    return nxt
                if nxt.target in _PASS_THROUGH:
                    ahead.append(nxt)
        frontier = ahead
    return None
