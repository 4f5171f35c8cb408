r"""The memory traffic ficco's eager tensor-parallel styles add around their GEMMs: every aten op one
training step of torchtitan's Llama layers dispatches, forward and backward, with the bytes it writes,
under PyTorch's styles and under ficco's (``ficco.runtime.tp``) with every op ``serial/sm`` (the
``ficco_eager:all_serial`` diagnosis of ``benchmarks/runtimes.py``: the same collectives and GEMMs as
PyTorch's, so any difference is the styles' own copies and elementwise work).

    # CPU, gloo, 2 ranks: a table per variant, phase and batch; benchmarks/results/eager-copies-cpu.json
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.eager_copies
    python -m benchmarks.eager_copies --render benchmarks/results/eager-copies-cpu.json

Each aten op is counted once, at the level it runs (a DTensor op as the local ops it runs, a composite op
as what it decomposes into, a ficco op as the ops of its kernel), in one of the classes of :data:`CLASSES`;
views and allocations move nothing and are not counted. ``moved`` (``copy`` + ``elementwise``) is what the
GPU profile's "copy" and "other" kernels are: the number ficco's path must not exceed PyTorch's. The
collectives' own work is not counted (gloo's staging copies, on its threads or inside ``torch.distributed``'s
calls): NCCL has none of it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel as torch_styles
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import REPO, llama, rerender, say, write_results
from benchmarks.runtimes import parallelized, styles_with
from ficco.runtime import as_planner

VARIANTS = ("pytorch", "ficco_serial")
"""PyTorch's styles; ficco's with every op ``serial/sm``."""
PHASES = ("forward", "backward")
CLASSES = ("copy", "elementwise", "gemm", "attention", "comm")
"""What an op does: moves memory (``copy``: copies, concatenations, fills, index ops), computes element by
element or reduces (``elementwise``), multiplies matrices, runs attention, or communicates."""
COPY_OPS = frozenset(
    {
        "copy_", "clone", "cat", "stack", "_to_copy", "index_select", "index", "index_put_", "narrow_copy",
        "slice_backward", "select_backward", "slice_scatter", "select_scatter", "zeros", "zeros_like",
        "new_zeros", "zero_", "fill_", "constant_pad_nd", "expand_copy", "gather", "scatter", "scatter_add",
        "_unsafe_index", "full", "new_full", "ones_like", "_copy_from", "_copy_from_and_resize",
    }
)  # fmt: skip
GEMM_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "addbmm", "matmul", "dot", "mv", "_mm_out"})
MOVES_NOTHING = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_", "_unsafe_view"}
)
"""Allocations, and views whose schema does not say so."""
COLLECTIVES_FILE = "torch/distributed/distributed_c10d.py"
"""Where ``torch.distributed``'s collectives are: what runs inside them is the backend's work."""
SHAPES: tuple[tuple[int, int], ...] = ((1, 64), (2, 32))
"""(batch, tokens per sequence) of the step: the same 64 tokens as one sequence and as two."""
MODEL = llama.LlamaArgs(dim=128, n_layers=2, n_heads=8, n_kv_heads=2, hidden_dim=448, max_seq_len=64)
"""A small Llama with Llama-3.1-70B's proportions (GQA 4:1, MLP 3.5x the width; at :data:`SHAPES`, half as
many tokens as the width, as 70B's 4096-token step has): weights and activations weigh what they do there
relative to each other."""


@dataclass
class Traffic:
    """What the ops of one phase wrote: ``{class: bytes}``, ``{class: calls}``, ``{op: bytes}``."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    by_op: dict[str, int] = field(default_factory=dict)

    @property
    def moved(self) -> int:
        """Bytes the copies and elementwise ops wrote."""
        return self.bytes["copy"] + self.bytes["elementwise"]


def op_class(func) -> str | None:
    """The class of :data:`CLASSES` of the aten (or c10d) op ``func``; None for views and allocations."""
    if func.namespace in ("c10d", "_c10d_functional", "c10d_functional", "_dtensor"):
        return "comm"
    name = func._schema.name.split("::")[-1]
    if name in MOVES_NOTHING:
        return None
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return None  # a view
    if name in COPY_OPS:
        return "copy"
    if name in GEMM_OPS:
        return "gemm"
    if "attention" in name:
        return "attention"
    return "elementwise"


def _written(out) -> int:
    """Bytes of the tensors an op returned (``out=`` and in-place ops return what they wrote)."""
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if isinstance(out, list | tuple):
        return sum(_written(o) for o in out)
    return 0


def _in_collective() -> bool:
    """Whether the caller runs inside a ``torch.distributed`` collective (gloo finishes its reduce-scatter
    with a copy on the caller's thread, in ``Work.wait``: the collective's work, which NCCL does not do)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(COLLECTIVES_FILE):
            return True
        frame = frame.f_back
    return False


class CountTraffic(TorchDispatchMode):
    """Counts what the ops dispatched inside it write (:class:`Traffic`), on the thread that entered it,
    at the level they run: DTensor ops as their local ops, composite ops decomposed, ficco's ops as the ops
    of their kernel (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.traffic = Traffic()
        self._thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor's dispatch runs its local ops, which come back here
        if func.namespace == "ficco":  # the kernel's ops, counted here too
            with self:
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        kind = op_class(func)
        if kind is not None and threading.get_ident() == self._thread and not _in_collective():
            written = _written(out)
            t = self.traffic
            t.bytes[kind] += written
            t.calls[kind] += 1
            if kind in ("copy", "elementwise"):
                name = func._schema.name.split("::")[-1]
                t.by_op[name] = t.by_op.get(name, 0) + written
        return out


@contextlib.contextmanager
def counting() -> Iterator[Traffic]:
    """The :class:`Traffic` of what runs inside the ``with`` block (:class:`CountTraffic`)."""
    with CountTraffic() as counter:
        yield counter.traffic


def styles(variant: str):
    """The ``styles`` module of ``variant`` for ``llama.apply_block_tp``."""
    if variant == "pytorch":
        return torch_styles
    if variant == "ficco_serial":
        return styles_with(as_planner("serial/sm"))
    raise ValueError(f"variant must be one of {list(VARIANTS)}; got {variant!r}")


def step_traffic(variant: str, batch: int, seq: int, args: llama.LlamaArgs = MODEL) -> dict[str, Traffic]:
    """``{phase: Traffic}`` of one training step (forward; backward of a random output gradient) of
    ``args``' decoder layers under ``variant`` on this rank's sequence shard ``[batch, seq/w, dim]``, in
    the default (gloo) process group, after one step unmeasured (first-call work left out)."""
    w = dist.get_world_size()
    mesh = init_device_mesh("cpu", (w,))
    torch.manual_seed(0)
    base = llama.TransformerBlocks(args, tp_degree=w)
    model = parallelized(base, mesh, styles(variant))
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    x = torch.randn(batch, seq // w, args.dim, generator=gen, requires_grad=True)
    g = torch.randn(batch, seq // w, args.dim, generator=gen)
    model(x).backward(g)
    model.zero_grad(set_to_none=True)
    with counting() as forward:
        y = model(x)
    with counting() as backward:
        y.backward(g)
    return {"forward": forward, "backward": backward}


def measure(shapes=SHAPES, args: llama.LlamaArgs = MODEL) -> list[dict]:
    """Rows ``{variant, batch, seq, phase, bytes, calls, by_op, moved}`` of this rank at every shape."""
    rows = []
    for batch, seq in shapes:
        for variant in VARIANTS:
            for phase, t in step_traffic(variant, batch, seq, args).items():
                rows.append({"variant": variant, "batch": batch, "seq": seq, "phase": phase,
                             "moved": t.moved, **asdict(t)})  # fmt: skip
    return rows


def markdown(result: dict) -> str:
    """The tables of a result: moved bytes per (batch, phase) for both variants, then each op's bytes."""
    rows = result["rows"]
    lines = [
        "# Memory traffic of the eager tensor-parallel styles (CPU, gloo, 2 ranks)",
        "",
        f"torchtitan's Llama layers ({result['meta']['model']}), fp32, one training step on rank 0; KiB "
        "written. `moved` = copy + elementwise (views and allocations move nothing).",
        "",
        "| batch | seq | phase | variant | moved KiB | copy KiB | elementwise KiB | gemm KiB | copy calls "
        "| elementwise calls | ficco / pytorch moved |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref = {(r["batch"], r["phase"]): r["moved"] for r in rows if r["variant"] == "pytorch"}
    for r in rows:
        ratio = r["moved"] / ref[(r["batch"], r["phase"])] if ref.get((r["batch"], r["phase"])) else None
        lines.append(
            f"| {r['batch']} | {r['seq']} | {r['phase']} | {r['variant']} | {r['moved'] / 1024:.1f} "
            f"| {r['bytes']['copy'] / 1024:.1f} | {r['bytes']['elementwise'] / 1024:.1f} "
            f"| {r['bytes']['gemm'] / 1024:.1f} | {r['calls']['copy']} | {r['calls']['elementwise']} "
            f"| {'' if r['variant'] == 'pytorch' or ratio is None else f'{ratio:.3f}'} |"
        )
    lines += ["", "Per op (KiB written, copy and elementwise ops):", ""]
    lines += [
        "| batch | phase | op | " + " | ".join(VARIANTS) + " |",
        "|---|---|---|" + "---|" * len(VARIANTS),
    ]
    for batch in sorted({r["batch"] for r in rows}):
        for phase in PHASES:
            by = {r["variant"]: r["by_op"] for r in rows if r["batch"] == batch and r["phase"] == phase}
            for op in sorted(set().union(*by.values())):
                cells = " | ".join(f"{by.get(v, {}).get(op, 0) / 1024:.1f}" for v in VARIANTS)
                lines.append(f"| {batch} | {phase} | {op} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    """Measure every variant, phase and shape; rank 0 prints the tables and writes the JSON and markdown.
    Returns the result (None after ``--render``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "eager-copies-cpu.json")
    p.add_argument("--render", type=Path, help="re-render the markdown of a results JSON and exit")
    args = p.parse_args(argv)
    if args.render:
        rerender(args.render, markdown)
        return None
    from ficco import executor

    with executor.process_group("cpu"):
        shape = f"dim={MODEL.dim} ffn={MODEL.hidden_dim} heads={MODEL.n_heads}/{MODEL.n_kv_heads}"
        meta = {"model": f"{shape} layers={MODEL.n_layers}", "world_size": dist.get_world_size(),
                "torch": torch.__version__}  # fmt: skip
        result = {"meta": meta, "rows": measure()}
        if dist.get_rank() == 0:
            say(markdown(result))
            write_results(result, args.out, markdown, lambda *_: None)
    return result


if __name__ == "__main__":
    main()
