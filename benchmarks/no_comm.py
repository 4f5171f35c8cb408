"""The overlap limit of a compiled step: an Inductor pass that removes its collectives.

:class:`NoCommPass` (on ``torch._inductor.config.post_grad_custom_post_pass``, per compile through
``torch.compile(options=...)``) rewrites every functional collective of the graphs Inductor compiles into a
local op of the same output shape, dtype and layout, and drops the waits:

- ``all_gather_into_tensor(x, w, group)`` -> ``x.repeat(w, 1, ...)``: the gathered shape, with the same
  bytes written as the gather writes (this rank's shard in every peer's place);
- ``reduce_scatter_tensor(x, op, w, group)`` -> the first ``1/w`` of ``x``'s rows (a view: nothing moves);
- ``all_reduce(x, op, group)`` -> ``x`` copied;
- ``wait_tensor(x)`` -> ``x``.

Everything else of the graph (the GEMMs, attention, the fused pointwise kernels, the reshapes around the
collectives) stays, so the step's time is what it would take if communication cost nothing: the most any
overlap of those collectives can save is ``serial_compile - no_comm``. The values are wrong (no peer's data
arrives, nothing is summed); the step's time does not depend on them. Inductor may fuse the local ops with
their neighbours where it could not fuse a collective: the limit can only come out lower for it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

aten = torch.ops.aten
_C10D = torch.ops._c10d_functional


class NoCommPass(CustomGraphPass):
    """The Inductor pass of the module docstring; :attr:`removed` counts what it replaced, by collective."""

    def __init__(self) -> None:
        self.removed: dict[str, int] = {}

    def uuid(self) -> bytes:
        """The pass's source: a cached graph was rewritten by this same code."""
        return get_hash_for_files((str(Path(__file__)),))

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            local = _local_op(node)
            if local is None:
                continue
            target, args = local
            with graph.inserting_before(node):
                new = graph.call_function(target, args=args)
            new.meta.update(node.meta)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            name = node.target._opname if hasattr(node.target, "_opname") else str(node.target)
            self.removed[name] = self.removed.get(name, 0) + 1
        for node in list(graph.nodes):
            if node.target is _C10D.wait_tensor.default:
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
        graph.lint()


def _local_op(node: torch.fx.Node) -> tuple[object, tuple] | None:
    """The local op and arguments standing in for a collective node, or None for any other node."""
    if node.target is _C10D.all_gather_into_tensor.default:
        x, world = node.args[0], node.args[1]
        return aten.repeat.default, (x, [world] + [1] * (x.meta["val"].dim() - 1))
    if node.target is _C10D.reduce_scatter_tensor.default:
        rows = node.meta["val"].shape[0]  # the input's rows / w
        return aten.slice.Tensor, (node.args[0], 0, 0, rows)
    if node.target is _C10D.all_reduce.default:
        return aten.clone.default, (node.args[0],)
    return None
