r"""End-to-end transformer block at TP=2 with sequence parallelism: ficco's planner against serial NCCL,
PyTorch async-TP, always ``shard/dma`` and the per-op oracle, in training and CUDA-graph inference.

    # the full run on 2 GPUs (<= 5 minutes on 2 x H200); writes OUT/block-h200x2.{json,md,png}
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.block_bench \
        --out benchmarks/results
    # a quicker run: 2 token counts per phase
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.block_bench --quick \
        --out OUT
    # plumbing check without a GPU (gloo, a tiny block; what CI runs)
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.block_bench --cpu-smoke \
        --out /tmp/block-smoke
    # on a CPU machine with xgboost and pandas: the planner's and the dataset oracle's answers for every op
    # the run needs, for a GPU machine that lacks them (the run reads it when it cannot ask them itself)
    python3 -m benchmarks.block_bench --write-plan benchmarks/results/block-plan-h200x2.json
    # re-render the markdown and the plot from a finished JSON (needs matplotlib for the plot)
    python3 -m benchmarks.block_bench --render benchmarks/results/block-h200x2.json

The block (Llama-3.1-8B and -70B shapes, bf16): RMSNorm -> QKV (column-parallel, all-gather -> GEMM) ->
causal ``scaled_dot_product_attention`` on the real heads (grouped-query; training packs sequences of
``SEQ_LEN`` tokens, inference is one prompt) -> attention out (row-parallel, GEMM -> reduce-scatter) ->
residual -> RMSNorm -> MLP gate/up (column-parallel) -> SiLU gate -> MLP down (row-parallel) -> residual.
Input and output are token shards ``[T/2, hidden]``.

Phases (:data:`PHASES`): ``inference`` (the forward replayed from a CUDA graph, 128-4096 tokens), ``train``
(forward + backward, eager, 2k-32k tokens) and ``train_graph`` (forward + backward replayed from CUDA graphs,
the gradients zeroed inside the step, 2k-8k tokens, without async-TP: how runtimes that capture whole
training steps run, where the host no longer bounds small steps). Variants, all on the same
weights and inputs (``runtime.apply_ops`` swaps the ops): ``serial`` (``serial/sm`` everywhere: NCCL
collective, then GEMM), ``async_tp`` (``torch.ops.symm_mem.fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``), ``shard_dma``, ``planner`` (the local predictor through ``runtime.Planner``,
mode ``eager`` for ``train`` and ``graph`` for the others), ``verified`` (the same planner after
``runtime.verify_plan`` timed its plan in the step against serial variants and pinned what lost to
``serial/sm``; its verdict is the point's ``verify``; the variant is then timed afresh with the others) and
``oracle`` (per op, the fastest schedule of the measured dataset at that (op, m, n, k, mode); a shape the
dataset lacks is measured here, over the schedules that win somewhere in the dataset, and the JSON says how
many ops came from each). Two more timings per point: ``compute_only`` (the collectives left out: ``comm_share
= 1 - compute_only / serial``) and, for ``train``, ``planner_regather`` (the column-parallel weight gradient
gathers its input again instead of keeping it).

Timing (``runtime.timing.time_interleaved``): per variant ``--warmup`` untimed steps, then rounds in which
every variant, in a new order each round, runs ``--reps`` steps between CUDA events (CPU: ``perf_counter``),
ranks aligned (synchronise, barrier) before each variant's steps, each rank's threads on its share of the
CPUs (``--pin``, as in ``ficco bench``); a step's time is the maximum over ranks
and a point's time the median over its ``rounds x reps`` steps. A point gets ``--rounds`` rounds, or more
for short steps, up to ``--max-rounds``: enough that every variant is timed for about ``--timed-ms`` (short,
host-bound steps vary most from round to round). Each point also keeps the
host time to queue one step (``host_ms``): where it nears the step time, the host is the bottleneck. Every
variant's output (and, in training, the input and weight gradients of its first step) is compared with
``serial``'s (relative error, ``rel_err``). Points run cheapest first; a point that would start after
``--budget-s`` is skipped and listed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks import REPO, plot_speedups, rerender, write_results
from benchmarks.step_timing import add_step_timing, timing_settings
from ficco import executor
from ficco.executor.ops import all_gather_single
from ficco.features import SERIAL, Scenario, Schedule, candidates, get_hardware
from ficco.features.model_config import ModelConfig, load_model_config
from ficco.harness.cpu_placement import DEFAULT_PIN, PIN_POLICIES, placement_from_env
from ficco.runtime import (
    Answer,
    ColumnParallelLinear,
    FixedSource,
    PlannedOps,
    Planner,
    PredictorSource,
    RowParallelLinear,
    TableSource,
    apply_ops,
    verify_plan,
)
from ficco.runtime.graphs import GraphedCall
from ficco.runtime.overlap import OverlapOps
from ficco.runtime.planner import Direction, OpRequest
from ficco.runtime.timing import time_interleaved
from ficco.tables import markdown_table

MODELS = ("Llama-3.1-8B", "Llama-3.1-70B")
"""Model configs (``datasets/model_configs/<name>.json``) whose block is measured."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Phase:
    """What a point of one phase runs, and at which token counts."""

    mode: str
    """The execution mode the planner is asked for (``eager`` or ``graph``)."""
    backward: bool
    """Forward and backward (a training step), or the forward alone."""
    tokens: tuple[int, ...]
    quick_tokens: tuple[int, ...]
    smoke_tokens: tuple[int, ...]
    """``--cpu-smoke``'s token counts (the tiny block)."""

    @property
    def graphed(self) -> bool:
        """Replayed from CUDA graphs (``runtime.GraphedCall``; on the CPU the step runs eagerly): the
        ``graph`` mode."""
        return self.mode == "graph"


PHASES = {
    "inference": Phase(
        mode="graph",
        backward=False,
        tokens=(128, 256, 512, 1024, 2048, 4096),
        quick_tokens=(256, 2048),
        smoke_tokens=(16, 32),
    ),
    "train": Phase(
        mode="eager",
        backward=True,
        tokens=(2048, 4096, 8192, 16384, 32768),
        quick_tokens=(4096, 16384),
        smoke_tokens=(32, 64),
    ),
    "train_graph": Phase(
        mode="graph",
        backward=True,
        tokens=(2048, 4096, 8192),
        quick_tokens=(4096,),
        smoke_tokens=(32,),
    ),
}
"""The phases, in the order their points run: CUDA-graph inference, the eager training step, and the training
step replayed from CUDA graphs (gradients zeroed inside the step: what runtimes that capture whole steps run,
where the host would otherwise bound small steps), last, so that a capture that fails cannot leave the
others a broken CUDA state."""
SEQ_LEN = 4096
"""Training packs sequences of this many tokens (causal attention within each); inference is one prompt."""
VARIANTS = ("serial", "async_tp", "shard_dma", "planner", "verified", "oracle")
"""The ``step_ms`` keys of a point."""
PLANNED_VARIANTS = ("planner", "verified")
"""The variants the issue's goals are computed for: the planner alone, and after ``runtime.verify_plan``."""
TOLERANCE = {"bf16": 2e-2, "fp32": 1e-4}
"""Largest relative error of a variant's output or gradients against ``serial`` (bf16: two roundings of
a long reduction, in different orders)."""
HARDWARE = "h200x2"
DATASET = REPO / "datasets" / HARDWARE
PLAN_FILE = REPO / "benchmarks" / "results" / f"block-plan-{HARDWARE}.json"
CPU_SMOKE = ModelConfig(
    name="tiny",
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
"""The block of ``--cpu-smoke`` (gloo), with tokens 32 and 64 and sequences of 16."""


# The block --------------------------------------------------------------------------------------------------


class Block(nn.Module):
    """A Llama-style decoder layer on a tensor-parallel group: ``x_shard [T/w, hidden] -> [T/w, hidden]``."""

    def __init__(self, cfg: ModelConfig, ops: Any, *, seq_len: int, device: Any, dtype: torch.dtype) -> None:
        super().__init__()
        w, hd, hidden = ops.world_size, cfg.head_dim, cfg.hidden_size
        self.hidden, self.seq_len, self.head_dim = hidden, seq_len, hd
        self.q_local = cfg.num_attention_heads // w
        self.kv_local = max(1, cfg.num_key_value_heads // w)  # a replica per rank when fewer KV heads
        layer = {"ops": ops, "device": device, "dtype": dtype}
        self.qkv = ColumnParallelLinear(
            hidden, (self.q_local + 2 * self.kv_local) * hd * w, name="attn.qkv", **layer
        )
        self.out = RowParallelLinear(cfg.num_attention_heads * hd, hidden, name="attn.out", **layer)
        self.gate_up = ColumnParallelLinear(hidden, 2 * cfg.intermediate_size, name="mlp.gate_up", **layer)
        self.down = RowParallelLinear(cfg.intermediate_size, hidden, name="mlp.down", **layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(F.rms_norm(x, (self.hidden,)))
        x = x + self.out(self._attention(qkv))
        gate, up = self.gate_up(F.rms_norm(x, (self.hidden,))).chunk(2, dim=1)
        return x + self.down(F.silu(gate) * up)

    def _attention(self, qkv: torch.Tensor) -> torch.Tensor:
        """Causal grouped-query attention of this rank's heads: ``[T, (q + 2 kv) * hd] -> [T, q * hd]``."""
        tokens, hd = qkv.shape[0], self.head_dim
        seq = min(tokens, self.seq_len)
        q, k, v = qkv.split([self.q_local * hd, self.kv_local * hd, self.kv_local * hd], dim=1)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            """``[T, n * hd] -> [sequences, q heads, seq, hd]``; each KV head repeated for its query group
            (what ``enable_gqa`` does, spelled out so that the flash kernel runs on every torch version)."""
            t = t.reshape(tokens // seq, seq, n, hd).transpose(1, 2)
            return t if n == self.q_local else t.repeat_interleave(self.q_local // n, dim=1)

        a = F.scaled_dot_product_attention(
            heads(q, self.q_local),
            heads(k, self.kv_local),
            heads(v, self.kv_local),
            is_causal=True,
        )
        return a.transpose(1, 2).reshape(tokens, self.q_local * hd)

    def op_requests(self, tokens: int, *, backward: bool) -> list:
        """Every overlapped op one step at ``tokens`` runs (``runtime.OpRequest``)."""
        layers = (self.qkv, self.out, self.gate_up, self.down)
        return [r for layer in layers for r in layer.requests(tokens, backward=backward)]


# Forward-only ops and their autograd -------------------------------------------------------------------


class ForwardOps(Protocol):
    """The forward values of the pair alone, on 2-D row shards (no autograd): what :class:`DifferentiableOps`
    wraps."""

    world_size: int
    rank: int

    def all_gather_matmul(
        self, a_shard: torch.Tensor, b: torch.Tensor, request: OpRequest | None, *, return_gathered: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``A @ b`` with ``A [m, k]`` gathered from ``a_shard [m/w, k]``; with ``return_gathered`` also A."""
        ...

    def matmul_reduce_scatter(
        self, a: torch.Tensor, b: torch.Tensor, request: OpRequest | None
    ) -> torch.Tensor:
        """This rank's rows ``[m/w, n]`` of the sum over ranks of ``a [m, k] @ b [k, n]``."""
        ...

    def start_all_gather(self, a_shard: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """Start gathering ``a_shard [m/w, k]`` into ``[m, k]``; returns it and ``wait()``."""
        ...


class DifferentiableOps(OverlapOps):
    """:class:`OverlapOps` over forward-only ops (``ForwardOps``), with the backward the ficco ops register
    (``executor.library``: each op's input gradient is the other op on the transposed weight; the weight
    gradient multiplies the gathered input, kept or gathered again beside that op), for the variants whose
    ops have no autograd of their own: PyTorch's async-TP ops and the compute-only ops."""

    def __init__(self, ops: ForwardOps) -> None:
        self.ops = ops
        self.world_size, self.rank = ops.world_size, ops.rank

    def all_gather_matmul(self, a_shard, bs, request, backward_request, *, return_gathered):
        (b,) = bs
        if not (torch.is_grad_enabled() and (a_shard.requires_grad or b.requires_grad)):
            out = self.ops.all_gather_matmul(a_shard, b, request, return_gathered=return_gathered)
            return (out[1], [out[0]]) if return_gathered else (a_shard.new_empty(0), [out])
        y, a = _ColumnFn.apply(a_shard, b, self.ops, request, backward_request, return_gathered)
        return a, [y]

    def matmul_reduce_scatter(self, a, b, request, backward_request):
        if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
            return self.ops.matmul_reduce_scatter(a, b, request)
        return _RowFn.apply(a, b, self.ops, request, backward_request)

    def note(self, layer: str, direction: Direction, what: str) -> None:
        note = getattr(self.ops, "note", None)
        if note is not None:
            note(layer, direction, what)


class _ColumnFn(torch.autograd.Function):
    """all-gather -> GEMM forward; backward GEMM -> reduce-scatter (input) and a GEMM (weight)."""

    @staticmethod
    def forward(ctx, a_shard, b, ops, request, backward_request, keep):
        if keep:
            y, a = ops.all_gather_matmul(a_shard, b, request, return_gathered=True)
        else:
            y, a = ops.all_gather_matmul(a_shard, b, request, return_gathered=False), a_shard.new_empty(0)
        ctx.save_for_backward(a if keep else a_shard, b)
        ctx.ops, ctx.backward_request, ctx.keep = ops, backward_request, keep
        ctx.mark_non_differentiable(a)
        return y, a

    @staticmethod
    def backward(ctx, grad_y, _grad_a):
        saved, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        grad_y = grad_y.contiguous()
        a, wait = saved, None
        if need_b and not ctx.keep:  # started before the input gradient's op, waited for after it
            a, wait = ctx.ops.start_all_gather(saved)
        grad_a = ctx.ops.matmul_reduce_scatter(grad_y, b.t(), ctx.backward_request) if need_a else None
        grad_b = None
        if need_b:
            if wait is not None:
                wait()
            grad_b = a.t() @ grad_y
        return grad_a, grad_b, None, None, None, None


class _RowFn(torch.autograd.Function):
    """GEMM -> reduce-scatter forward; backward all-gather -> GEMM (input), whose gathered gradient also
    feeds the weight's GEMM."""

    @staticmethod
    def forward(ctx, a, b, ops, request, backward_request):
        ctx.save_for_backward(a, b)
        ctx.ops, ctx.backward_request = ops, backward_request
        return ops.matmul_reduce_scatter(a, b, request)

    @staticmethod
    def backward(ctx, grad_shard):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        grad_shard = grad_shard.contiguous()
        if not need_b:
            grad_a = ctx.ops.all_gather_matmul(grad_shard, b.t(), ctx.backward_request, return_gathered=False)
            return (grad_a if need_a else None), None, None, None, None
        grad_a, grad = ctx.ops.all_gather_matmul(
            grad_shard, b.t(), ctx.backward_request, return_gathered=True
        )
        return (grad_a if need_a else None), a.t() @ grad, None, None, None


def start_all_gather_rows(
    a_shard: torch.Tensor, group: dist.ProcessGroup | None, world_size: int
) -> tuple[torch.Tensor, Callable[[], None]]:
    """Start ``[m/w, k]`` row shards -> ``[m, k]`` (rank order) with the group's all-gather collective, as
    async work: returns the destination and the work's ``wait`` (on GPUs it makes the caller's stream wait,
    so work issued in between overlaps the gather)."""
    a_shard = a_shard.contiguous()
    out = a_shard.new_empty((a_shard.shape[0] * world_size, a_shard.shape[1]))
    work = all_gather_single(out, a_shard, group=group, async_op=True)
    return out, work.wait


class AsyncTPOps:
    """PyTorch's async-TP ops as ``ForwardOps`` (``DifferentiableOps`` adds the autograd)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        import torch.distributed._symmetric_memory  # noqa: F401 (registers torch.ops.symm_mem)

        self.group = group
        self.group_name = (group or dist.group.WORLD).group_name
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def all_gather_matmul(self, a_shard, b, request, *, return_gathered):
        a, (c,) = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], 0, self.group_name)
        return (c, a) if return_gathered else c

    def matmul_reduce_scatter(self, a, b, request):
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, self.group_name)

    def start_all_gather(self, a_shard):
        return start_all_gather_rows(a_shard, self.group, self.world_size)

    def note(self, layer, direction, what):
        pass


class ComputeOnlyOps:
    """The same GEMMs with the collectives left out (for ``comm_share``): the gathered input is a local
    random buffer of its shape, and the reduce-scatter's result this rank's rows of its partial product."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self._gathered: dict[tuple, torch.Tensor] = {}

    def all_gather_matmul(self, a_shard, b, request, *, return_gathered):
        a = self._gathered_buffer(a_shard)
        c = a @ b
        return (c, a) if return_gathered else c

    def matmul_reduce_scatter(self, a, b, request):
        rows = a.shape[0] // self.world_size
        return (a @ b)[self.rank * rows : (self.rank + 1) * rows]

    def start_all_gather(self, a_shard):
        return self._gathered_buffer(a_shard), lambda: None

    def _gathered_buffer(self, a_shard):
        key = (a_shard.shape[0] * self.world_size, a_shard.shape[1], a_shard.dtype)
        if key not in self._gathered:
            # random, not zeros: an H200 runs an 8192^3 bf16 GEMM ~13% faster on zeros than on random data
            self._gathered[key] = torch.randn(key[:2], device=a_shard.device).to(a_shard.dtype)
        return self._gathered[key]

    def note(self, layer, direction, what):
        pass


class ShapeOnlyOps:
    """Enough of ``OverlapOps`` to build a block and list its ops (``runtime.apply_ops`` sets real ones)."""

    def __init__(self, world_size: int = 2, rank: int = 0) -> None:
        self.world_size, self.rank = world_size, rank


# Sources: the planner's model and the oracle's table --------------------------------------------------------


def _key_str(op: str, m: int, n: int, k: int, mode: str) -> str:
    return f"{op}/{m}/{n}/{k}/{mode}"


def needed_keys(
    models: dict[str, ModelConfig], tokens: dict[str, tuple[int, ...]], seq_len: int
) -> list[tuple]:
    """Every (op, m, n, k, mode) a run needs at ``tokens`` per phase of :data:`PHASES` (a training phase asks
    for its forward's and its backward's ops, in its mode)."""
    keys: dict[tuple, None] = {}
    for cfg in models.values():
        block = Block(cfg, ShapeOnlyOps(), seq_len=seq_len, device="meta", dtype=torch.bfloat16)
        for phase, counts in tokens.items():
            spec = PHASES[phase]
            for t in counts:
                for r in block.op_requests(t, backward=spec.backward):
                    keys[(r.op, r.m, r.n, r.k, spec.mode)] = None
    return list(keys)


def dataset_oracle(directory: Path) -> dict[tuple, Answer]:
    """The fastest schedule of every (op, m, n, k, mode) of a measured dataset (format 1 rows are eager)."""
    import pandas as pd

    from ficco.features.dataset import load_dataset
    from ficco.harness.dataset import label_table

    try:
        df = load_dataset(directory)
    except ValueError:  # format 1: no mode column, no best sets; its rows were timed eagerly
        df = pd.concat([pd.read_parquet(p) for p in sorted((directory / "parts").glob("*.parquet"))])
        df = df.assign(mode="eager", in_best_set=False)
    labels = label_table(df[df["world_size"] == 2])
    return {
        (r.op, int(r.m), int(r.n), int(r.k), r.mode): Answer(
            schedule=r.best_schedule, predicted_speedup=float(r.speedup), origin="dataset"
        )
        for r in labels.itertuples()
    }


def write_plan(path: Path) -> None:
    """``--write-plan``: the local predictor's and the dataset oracle's answers for every op of a full and a
    quick run, for a GPU machine without xgboost or pandas."""
    tokens = {name: phase.tokens + phase.quick_tokens for name, phase in PHASES.items()}
    keys = needed_keys(load_models(MODELS), tokens, SEQ_LEN)
    source = PredictorSource.load(hardware_id=HARDWARE)
    hardware = get_hardware(HARDWARE)
    planner: dict[str, dict] = {}
    for mode in ("eager", "graph"):
        mode_keys = [k for k in keys if k[4] == mode]
        scenarios = [
            Scenario(op=op, m=m, n=n, k=k, dtype="bf16", world_size=2, hardware=hardware)
            for op, m, n, k, _ in mode_keys
        ]
        for key, a in zip(mode_keys, source.recommend(scenarios, mode), strict=True):
            planner[_key_str(*key)] = _answer_dict(a)
    table = dataset_oracle(DATASET)
    oracle = {_key_str(*k): _answer_dict(a) for k, a in table.items() if k in set(keys)}
    plan = {
        "model": source.origin,
        "dataset": str(DATASET.relative_to(REPO)),
        "planner": planner,
        "oracle": oracle,
        "oracle_pool": winners(table),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: {len(planner)} planner answers, {len(oracle)} oracle answers of {len(keys)} ops")


def _answer_dict(a: Answer) -> dict:
    return {
        "schedule": a.schedule,
        "predicted_speedup": a.predicted_speedup,
        "fallback": a.fallback,
        "fallback_reason": a.fallback_reason,
        "origin": a.origin,
    }


def _plan_table(section: dict) -> dict[tuple, Answer]:
    out = {}
    for key, a in section.items():
        op, m, n, k, mode = key.split("/")
        out[(op, int(m), int(n), int(k), mode)] = Answer(**a)
    return out


def planner_source(plan_file: Path) -> tuple[Any, str]:
    """The local predictor, or (no xgboost here) its answers from the plan file; and which one it is."""
    try:
        source = PredictorSource.load(hardware_id=HARDWARE)
        return source, f"live {source.origin}"
    except Exception as err:  # ImportError (no xgboost), ModelLoadError
        if not plan_file.exists():
            raise SystemExit(
                f"cannot load the predictor ({err}) and there is no plan file {plan_file}; "
                "write one on a CPU machine with --write-plan"
            ) from None
        plan = json.loads(plan_file.read_text())
        return TableSource(_plan_table(plan["planner"]), origin=plan["model"]), f"plan file ({plan['model']})"


def oracle_answers(plan_file: Path) -> tuple[dict[tuple, Answer], list[str], str]:
    """The dataset's per-op best, or (no pandas here) the plan file's copy of it; the schedules that win
    somewhere in the dataset (what a missing op is measured over); and where they came from."""
    try:
        table = dataset_oracle(DATASET)
        return table, winners(table), f"dataset {DATASET.relative_to(REPO)}"
    except Exception as err:  # ImportError (no pandas), a missing dataset
        if not plan_file.exists():
            print(f"no oracle table ({err}): every op is measured here", flush=True)
            return {}, [], "none"
        plan = json.loads(plan_file.read_text())
        return _plan_table(plan["oracle"]), plan["oracle_pool"], f"plan file ({plan['dataset']})"


def winners(table: dict[tuple, Answer]) -> list[str]:
    """The schedules that are fastest somewhere in ``table``, with ``serial/sm`` and ``shard/dma``."""
    return sorted({a.schedule for a in table.values()} | {str(SERIAL), "shard/dma"})


def measure_missing(
    keys: list[tuple], pool: list[str] | None, device: torch.device, dtype: torch.dtype, reps: int
) -> dict[tuple, Answer]:
    """Time the schedules of ``pool`` (None: every candidate) on every key, in the key's mode; the fastest
    per key (collective: every rank measures the same keys in the same order)."""
    hardware = get_hardware("h200x8")  # any profile that admits the group size; shapes decide candidates
    w, rank = dist.get_world_size(), dist.get_rank()
    found = {}
    for op, m, n, k, mode in keys:
        scenario = Scenario(op=op, m=m, n=n, k=k, dtype="bf16", world_size=w, hardware=hardware)
        valid = {str(s) for s in candidates(scenario)}
        gen = torch.Generator(device=device).manual_seed(rank)
        rows = m // w if op == "ag_gemm" else m
        a = torch.randn(rows, k, generator=gen, device=device).to(dtype)
        b = torch.randn(k, n, generator=gen, device=device).to(dtype) / math.sqrt(k)
        fn = executor.all_gather_matmul if op == "ag_gemm" else executor.matmul_reduce_scatter
        times = {}
        for schedule in (s for s in (pool or sorted(valid)) if s in valid):
            call = functools.partial(fn, a, b, schedule)
            try:
                if mode == "graph" and device.type == "cuda":
                    call = GraphedCall(call)
                times[schedule] = time_ms(call, warmup=2, reps=reps, device=device)
            except Exception as err:  # the same on every rank; the oracle picks among the rest
                print(f"oracle: {schedule} failed on {op} m={m} n={n} k={k} {mode}: {err}", flush=True)
            del call
        best = min(times, key=times.get)
        found[(op, m, n, k, mode)] = Answer(
            schedule=best, predicted_speedup=times[str(SERIAL)] / times[best], origin="measured"
        )
    executor.clear_buffers()
    return found


# Timing -----------------------------------------------------------------------------------------------------


def time_ms(fn: Callable[[], Any], *, warmup: int, reps: int, device: torch.device) -> float:
    """Median over ``reps`` calls of ``fn`` (one round) of the slowest rank's time per call, ms."""
    times, _ = time_interleaved({"": (_nothing, fn)}, warmup=warmup, rounds=1, reps=reps, device=device)
    return times[""]


def _nothing() -> None:
    pass


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``||got - ref|| / ||ref||`` (Frobenius), the largest over ranks."""
    err = torch.stack([(got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)])
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return float(err)


# One point --------------------------------------------------------------------------------------------------


def maybe_prepare(ops: Any, requests: list) -> None:
    """Plan a point's ops before its first step (what a runtime does at start-up or before a capture)."""
    if isinstance(ops, PlannedOps):
        ops.planner.prepare(requests)


def run_train_point(
    block: Block, variants: dict[str, Any], tokens: int, args, device, dtype, *, graphed: bool = False
) -> dict:
    """Forward + backward of every variant at ``tokens``: step times, and errors against ``serial``.

    ``graphed``: the step replayed from CUDA graphs (``GraphedCall``, after its eager warm-up; CPU: eager),
    the gradients zeroed in place inside it, as runtimes that capture whole training steps do; otherwise an
    eager step that drops the gradients first."""
    w, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    x = torch.randn(tokens // w, block.hidden, generator=gen, device=device).to(dtype).requires_grad_()
    g = torch.randn(tokens // w, block.hidden, generator=gen, device=device).to(dtype)
    params = list(block.parameters())

    def step() -> torch.Tensor:
        x.grad = None
        for p in params:
            p.grad = None
        y = block(x)
        y.backward(g)
        return y

    def captured_step() -> torch.Tensor:
        for leaf in (x, *params):
            if leaf.grad is not None:
                leaf.grad.zero_()
        y = block(x)
        y.backward(g)
        # Detached: a captured output that kept its autograd graph would keep the capture's gradient
        # accumulators alive, on the capture's stream, into the next variant's eager warm-up.
        return y.detach()

    def capture() -> Callable[[], torch.Tensor]:
        if not graphed:
            return step
        return GraphedCall(captured_step) if device.type == "cuda" else captured_step

    def activate(ops: Any, keep: bool) -> None:
        apply_ops(block, ops)
        for layer in (block.qkv, block.gate_up):
            layer.keep_gathered = keep

    runnable, errors, failures, verdicts, reference = {}, {}, {}, {}, None
    for name, (ops, keep) in variants.items():
        activate(ops, keep)
        maybe_prepare(ops, block.op_requests(tokens, backward=True))
        try:
            if name == "verified":
                verdicts[name] = verify_plan(ops.planner, capture, device=device).to_dict()
            call = capture()
            y = call()
            result = [y.detach(), x.grad, *(p.grad for p in params)]
            if reference is None:
                reference = [t.clone() for t in result]
            elif name != "compute_only":  # its numbers are not the block's (no collectives)
                errors[name] = max(rel_err(a, b) for a, b in zip(result, reference, strict=True))
            del y, result
            runnable[name] = (functools.partial(activate, ops, keep), call)
        except Exception as err:  # the same on every rank (a refused or uncapturable op): recorded
            failures[name] = f"{type(err).__name__}: {str(err)[:300]}"
    times, host = time_interleaved(runnable, device=device, **args.timing)
    runnable.clear()  # the graphs go before the next point's
    return {"times": times, "host": host, "rel_err": errors, "errors": failures, "verify": verdicts}


def run_inference_point(block: Block, variants: dict[str, Any], tokens: int, args, device, dtype) -> dict:
    """The forward of every variant at ``tokens``, replayed from a CUDA graph (CPU: eager)."""
    w, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator(device=device).manual_seed(2000 + rank)
    x = torch.randn(tokens // w, block.hidden, generator=gen, device=device).to(dtype)

    @torch.no_grad()
    def forward() -> torch.Tensor:
        return block(x)

    def capture() -> Callable[[], torch.Tensor]:
        return GraphedCall(forward) if device.type == "cuda" else forward

    runnable, errors, failures, verdicts, reference = {}, {}, {}, {}, None
    for name, (ops, _) in variants.items():
        activate = functools.partial(apply_ops, block, ops)  # a replayed graph needs nothing; eager does
        activate()
        maybe_prepare(ops, block.op_requests(tokens, backward=False))
        try:
            if name == "verified":
                verdicts[name] = verify_plan(ops.planner, capture, device=device).to_dict()
            call = capture()
            y = call().clone()
            if reference is None:
                reference = y
            elif name != "compute_only":
                errors[name] = rel_err(y, reference)
            runnable[name] = (activate, call)
        except Exception as err:  # the same on every rank (e.g. an op that cannot be captured): recorded
            failures[name] = f"{type(err).__name__}: {str(err)[:300]}"
    times, host = time_interleaved(runnable, device=device, **args.timing)
    runnable.clear()  # the graphs go before the next point's
    return {"times": times, "host": host, "rel_err": errors, "errors": failures, "verify": verdicts}


# The run ----------------------------------------------------------------------------------------------------


def load_models(names: tuple[str, ...]) -> dict[str, ModelConfig]:
    return {name: load_model_config(REPO / "datasets" / "model_configs" / f"{name}.json") for name in names}


def make_variants(phase: str, sources: dict[str, Any], device: torch.device) -> dict[str, tuple[Any, bool]]:
    """Variant name -> (ops, keep the column-parallel gathered input); ``serial`` first (the reference)."""
    mode = PHASES[phase].mode

    def planned(source: Any) -> PlannedOps:
        return PlannedOps(Planner(source, mode=mode, hardware=HARDWARE))

    # A captured training step runs no async-TP (its fused ops' backward under capture is untested): a capture
    # that fails leaves the variants after it a broken CUDA state.
    captured_training = PHASES[phase].graphed and PHASES[phase].backward
    variants = {"serial": (planned(FixedSource(SERIAL)), True)}
    if device.type == "cuda" and not captured_training:
        variants["async_tp"] = (DifferentiableOps(AsyncTPOps()), True)
    variants["shard_dma"] = (planned(FixedSource(Schedule.parse("shard/dma"))), True)
    planner_ops = planned(sources["planner"])
    variants["planner"] = (planner_ops, True)
    variants["verified"] = (planned(sources["planner"]), True)  # the same source, checked in place
    variants["oracle"] = (planned(TableSource(sources["oracle"], origin="oracle")), True)
    variants["compute_only"] = (DifferentiableOps(ComputeOnlyOps()), True)
    if phase == "train":
        variants["planner_regather"] = (planner_ops, False)
    return variants


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.render:
        rerender(args.render, markdown, plot)
        return None
    if args.write_plan:
        write_plan(args.write_plan)
        return None
    cuda = not args.cpu_smoke
    placement = placement_from_env(args.pin, cuda)
    placement.confine()
    with executor.process_group("cuda" if cuda else "cpu") as device:
        placement.confine()
        try:
            return run(args, device)
        finally:
            log(dist.get_rank() == 0, f"CPU placement: {placement.describe()}")


def run(args: argparse.Namespace, device: torch.device) -> dict:
    """Every point of the benchmark on ``device``; rank 0 writes the results after each point and returns
    them (every rank returns its own copy)."""
    started = time.monotonic()
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    if args.cpu_smoke:
        models, seq_len = {"tiny": CPU_SMOKE}, 16
        phase_tokens = {name: phase.smoke_tokens for name, phase in PHASES.items()}
    else:
        models, seq_len = load_models(MODELS), SEQ_LEN
        phase_tokens = {name: p.quick_tokens if args.quick else p.tokens for name, p in PHASES.items()}
    rank0 = dist.get_rank() == 0
    planner, planner_from = planner_source(args.plan_file)
    oracle, pool, oracle_from = oracle_answers(args.plan_file)
    pool = None if args.oracle_all_candidates else pool
    keys = needed_keys(models, phase_tokens, seq_len)
    missing = [k for k in keys if k not in oracle]
    log(rank0, f"oracle: {len(keys) - len(missing)} ops from {oracle_from}, measuring {len(missing)} here")
    measured = measure_missing(missing, pool, device, dtype, reps=args.oracle_reps)
    oracle = {**oracle, **measured}
    sources = {"planner": planner, "oracle": oracle}
    out = args.out / (
        "block-smoke.json" if args.cpu_smoke else f"block-{HARDWARE}{'-quick' if args.quick else ''}.json"
    )
    result: dict[str, Any] = {
        "points": [],
        "skipped": [],
        "decisions": {},
        "meta": {
            "planner_source": planner_from,
            "oracle_source": oracle_from,
            "oracle_measured_ops": len(measured),
            "oracle_dataset_ops": len(keys) - len(missing),
            "oracle_pool": pool or "every candidate",
            **args.timing,
            "pin": args.pin,
            "seq_len": seq_len,
            "dtype": str(dtype),
            "world_size": dist.get_world_size(),
            "graphs": device.type == "cuda",
            "torch": torch.__version__,
            "device": device_name(device),
            "budget_s": args.budget_s,
        },
    }
    points = [(model, phase, t) for phase, counts in phase_tokens.items() for t in counts for model in models]
    shape_ops = ShapeOnlyOps(dist.get_world_size(), dist.get_rank())
    blocks = {
        name: Block(cfg, shape_ops, seq_len=seq_len, device=device, dtype=dtype)
        for name, cfg in models.items()
    }
    variants = {(m, p): make_variants(p, sources, device) for m in models for p in PHASES}
    for model, phase, tokens in points:
        if time.monotonic() - started > args.budget_s:
            result["skipped"].append({"model": model, "phase": phase, "tokens": tokens})
            continue
        block, vs = blocks[model], variants[(model, phase)]
        if PHASES[phase].backward:
            measure = functools.partial(run_train_point, graphed=PHASES[phase].graphed)
        else:
            measure = run_inference_point
        point = make_point(model, phase, tokens, measure(block, vs, tokens, args, device, dtype))
        executor.clear_buffers()
        result["points"].append(point)
        log(rank0, point_line(point))
        for v in ("planner", "verified", "oracle"):
            result["decisions"][f"{model}/{phase}/{v}"] = vs[v][0].planner.rows()
        if rank0:
            write_results(result, out, markdown, plot)
    result["summary"] = summarize(result["points"], dtype_name="fp32" if args.cpu_smoke else "bf16")
    result["meta"]["wall_s"] = time.monotonic() - started
    if rank0:
        write_results(result, out, markdown, plot)
        for key, rows in result["decisions"].items():
            print(f"\n{key}: {len(rows)} decisions; first: {rows[:1]}")
        print(json.dumps(result["summary"], indent=1))
    return result


def make_point(model: str, phase: str, tokens: int, got: dict) -> dict:
    """One ``points`` entry from a point's timings (ms), errors and failures."""
    times = got["times"]
    comm = None
    if times.get("compute_only") and times.get("serial"):
        comm = max(0.0, 1.0 - times["compute_only"] / times["serial"])
    return {
        "model": model,
        "phase": phase,
        "tokens": tokens,
        "comm_share": comm,
        "step_ms": {v: times.get(v) for v in VARIANTS},
        "extra_ms": {k: v for k, v in times.items() if k not in VARIANTS},
        "host_ms": got["host"],
        "rel_err": got["rel_err"],
        "errors": got["errors"],
        "verify": got["verify"].get("verified"),
    }


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def log(rank0: bool, line: str) -> None:
    if rank0:
        print(line, flush=True)


def point_line(p: dict) -> str:
    ms = "  ".join(f"{k}={v:.3f}" for k, v in {**p["step_ms"], **p["extra_ms"]}.items() if v is not None)
    comm = "-" if p["comm_share"] is None else f"{p['comm_share']:.0%}"
    failed = f"  FAILED {p['errors']}" if p["errors"] else ""
    return f"{p['model']} {p['phase']} T={p['tokens']}: comm {comm}  {ms}{failed}"


# Results ----------------------------------------------------------------------------------------------------


def _gmean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(points: list[dict], dtype_name: str = "bf16") -> dict:
    """The issue's goals for the planner alone and verified (``goals``): vs serial (training points with
    comm >= 20%, eager and, beside the issue's, replayed from CUDA graphs), vs async-TP (all points), the
    worst point vs serial, vs the oracle; and the largest error against serial."""

    def ratios(num: str, den: str, pts: list[dict]) -> list[float]:
        """``num / den`` step time at the points where both were measured."""
        return [
            p["step_ms"][num] / p["step_ms"][den]
            for p in pts
            if p["step_ms"].get(num) and p["step_ms"].get(den)
        ]

    def comm_heavy(phase: str) -> list[dict]:
        return [p for p in points if p["phase"] == phase and (p["comm_share"] or 0.0) >= 0.2]

    errors = [e for p in points for e in p["rel_err"].values()]
    goals = {
        v: {
            "vs_serial_comm_heavy_train": _gmean(ratios("serial", v, comm_heavy("train"))),
            "vs_serial_comm_heavy_train_graph": _gmean(ratios("serial", v, comm_heavy("train_graph"))),
            "vs_async_tp": _gmean(ratios("async_tp", v, points)),
            "vs_serial_min": min(ratios("serial", v, points), default=None),
            "vs_oracle": _gmean(ratios("oracle", v, points)),
        }
        for v in PLANNED_VARIANTS
    }
    return {
        "goals": goals,
        "comm_heavy_train_points": len(comm_heavy("train")),
        "comm_heavy_train_graph_points": len(comm_heavy("train_graph")),
        "speedup_vs_serial_gmean": {v: _gmean(ratios("serial", v, points)) for v in VARIANTS},
        "verify_pinned_points": sum(1 for p in points if (p.get("verify") or {}).get("pinned")),
        "max_rel_err": max(errors, default=None),
        "rel_err_ok": all(e <= TOLERANCE[dtype_name] for e in errors),
        "failed_runs": sum(len(p.get("errors") or {}) for p in points),
        "keep_vs_regather_train": _gmean(
            [
                p["extra_ms"]["planner_regather"] / p["step_ms"]["planner"]
                for p in points
                if p["extra_ms"].get("planner_regather") and p["step_ms"].get("planner")
            ]
        ),
    }


def markdown(result: dict) -> str:
    """Step times per point (ms), speedups over serial, and the summary."""
    header = [
        "model",
        "phase",
        "tokens",
        "comm share",
        "serial",
        "async-TP",
        "shard/dma",
        "planner",
        "verified",
        "oracle",
        "compute only",
        "planner (re-gather)",
        "host share: serial / planner",
        "pinned by verify",
        "speedup vs serial: planner / verified",
        "vs async-TP",
        "vs oracle",
    ]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def x(a: float | None, b: float | None) -> str:
        return "-" if not a or not b else f"{a / b:.2f}x"

    def share(p: dict, v: str) -> str:
        host, step = p.get("host_ms", {}).get(v), p["step_ms"].get(v)
        return "-" if not host or not step else f"{host / step:.0%}"

    def pinned(p: dict) -> str:
        verdict = p.get("verify")
        if not verdict or not verdict["times_ms"]:
            return "-"
        return "all" if verdict["winner"] == "serial" else str(len(verdict["pinned"]))

    rows = []
    for p in result["points"]:
        s, e = p["step_ms"], p["extra_ms"]
        comm = "-" if p["comm_share"] is None else f"{p['comm_share']:.0%}"
        rows.append(
            [
                p["model"],
                p["phase"],
                str(p["tokens"]),
                comm,
                *(ms(s.get(v)) for v in VARIANTS),
                ms(e.get("compute_only")),
                ms(e.get("planner_regather")),
                f"{share(p, 'serial')} / {share(p, 'planner')}",
                pinned(p),
                f"{x(s['serial'], s['planner'])} / {x(s['serial'], s.get('verified'))}",
                f"{x(s.get('async_tp'), s['planner'])} / {x(s.get('async_tp'), s.get('verified'))}",
                f"{x(s['oracle'], s['planner'])} / {x(s['oracle'], s.get('verified'))}",
            ]
        )
    lines = [
        "# Transformer block at TP=2: step time, ms (median; slowest rank)",
        "",
        "Planner: the model's picks as they come; verified: the same planner after `runtime.verify_plan`"
        " timed its plan in the step against serial variants and pinned the losing ops to serial/sm (pinned"
        " by verify: how many keys; all: the whole plan). Host share: the host time to queue a step over the"
        " step time (near 100%: the host is the bottleneck). The last three columns are speedups: the other"
        " variant's step time over the planner's / the verified planner's.",
        "",
        markdown_table(header, rows),
    ]
    summary = result.get("summary") or summarize(result["points"])
    lines += ["", "## Summary (issue 13 goals)", ""]
    lines += [f"- {k}: {json.dumps(v)}" for k, v in summary.items()]
    meta = result.get("meta", {})
    lines += [
        "",
        f"Planner: {meta.get('planner_source')}. Oracle: {meta.get('oracle_source')} "
        f"({meta.get('oracle_dataset_ops')} ops from it, {meta.get('oracle_measured_ops')} measured here). "
        f"Skipped: {result.get('skipped') or 'none'}.",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Speedup over serial per variant against tokens, one panel per phase, one line style per model."""
    graphs = result.get("meta", {}).get("graphs", True)

    def title(phase: str) -> str:
        work = "forward + backward" if PHASES[phase].backward else "forward"
        how = "CUDA graph" if PHASES[phase].graphed and graphs else "eager"
        return f"{phase} ({work}, {how})"

    plot_speedups(result["points"], path, phases=list(PHASES), variants=VARIANTS, title=title, panel_width=6)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="where results go")
    quick = " / ".join(f"{name} {phase.quick_tokens}" for name, phase in PHASES.items())
    p.add_argument("--quick", action="store_true", help=f"tokens: {quick}")
    p.add_argument("--cpu-smoke", action="store_true", help="gloo on the CPU, a tiny block (CI)")
    add_step_timing(p, warmup=3, rounds=5, reps=4, timed_ms=300.0, max_rounds=40)
    p.add_argument("--oracle-reps", type=int, default=5, help="timed calls per schedule of a measured op")
    p.add_argument("--pin", choices=PIN_POLICIES, default=DEFAULT_PIN, help="where each rank's threads run")
    p.add_argument(
        "--oracle-all-candidates",
        action="store_true",
        help="measure an op the dataset lacks over every candidate, not the dataset's winners",
    )
    p.add_argument("--budget-s", type=float, default=250.0, help="no point starts after this many seconds")
    p.add_argument("--plan-file", type=Path, default=PLAN_FILE, help="answers for a machine without xgboost")
    p.add_argument("--write-plan", type=Path, help="write the plan file (CPU, no torchrun) and exit")
    p.add_argument("--render", type=Path, help="re-render the markdown and plot of a JSON and exit")
    args = p.parse_args(argv)
    args.timing = timing_settings(args, p)
    return args


if __name__ == "__main__":
    main()
