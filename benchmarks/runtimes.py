r"""torchtitan's Llama 3 layers under tensor parallelism, end to end: each way to overlap the collectives
against the baseline that differs from it only in that, and against the limit no overlap can pass.

    # 2 (or 4) GPUs, one process per GPU: OUT/runtimes-h200x2.{json,md,png} (-h100x2, -h200x4: from the GPUs
    # found). Resumable: the points already in the JSON are skipped; a call stops starting points after
    # --budget-s. benchmarks/gpu_runtimes.sh runs it within a wall-clock bound.
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.runtimes \
        --out benchmarks/results
    # one GPU as rank 0 of a pretend world of 2 (plumbing and host time only: no communication measured)
    python -m benchmarks.runtimes --loopback --out /tmp/runtimes
    # CPU, gloo, a debug-size Llama (what CI runs; --nproc-per-node 4 for TP=4)
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.runtimes --device cpu \
        --out /tmp/runtimes
    # re-render the markdown and the plot of a finished JSON
    python -m benchmarks.runtimes --render benchmarks/results/runtimes-h200x2.json

The model: ``--layers`` (default 4) decoder layers of torchtitan's Llama 3 (``benchmarks/llama.py``,
torchtitan's module names) at Llama-3.1-8B and -70B shapes (``datasets/model_configs``), bf16,
parallelized by torchtitan's per-layer plan (sequence parallel: ``Shard(1)`` on ``[batch, seq, dim]``
between the layers) over all the ranks (TP=2 or 4). T tokens are ``--batch`` sequences (default 2, causal
attention within each); this rank's input is its sequence shard ``[batch, T/(w batch), dim]``. With a batch
of 1 PyTorch's pattern finder, which the compiled variants use, finds no matmul behind the q/k/v and w1/w3
gathers (two reshapes in between), so keep the default.

Phases: ``train``, a training step as torchtitan runs it: forward, backward, the gradients' norm clipped
(``max_norm`` 1, the norm over the tensor-parallel shards) and AdamW's fused update (torchtitan's betas,
eps and weight decay; learning rate 0: the update's work, the weights left as every variant's check finds
them), eager or with each decoder layer compiled on its own (``torch.compile(block, fullgraph=True)``,
torchtitan's ``apply_compile``); and ``inference``, the forward replayed from a CUDA graph (CPU: eager):
prefill at hundreds to thousands of tokens, decode-like at 16-64 (T tokens through the layers, attention
over the step's own tokens, no KV cache). Variants, on the same weights and inputs:

- ``serial``: PyTorch's DTensor styles, NCCL collectives, eager. Baseline of the eager variants.
- ``ficco_eager``: ``ficco.runtime.tp``'s styles under the same plan, schedules from a planner over the
  local model (mode ``eager`` for training, ``graph`` for inference).
- ``serial_compile``: ``serial``'s model compiled per layer, neither the micro-pipeline pass nor ficco's.
  Baseline of the compiled variants.
- ``async_tp``: the same, compiled with ``torch._inductor.config._micro_pipeline_tp`` and symmetric memory
  for the group, as torchtitan's ``maybe_enable_async_tp`` does (CUDA only).
- ``ficco_compile``: the same, compiled with ficco's Inductor pass (``runtime.compile.FiccoPass``, what
  ``ficco.runtime.compile.enable`` installs), schedules from a planner over the local model.
- ``no_comm``: ``serial_compile`` with its collectives replaced by local ops of the same shapes
  (``benchmarks/no_comm.py``): the limit. ``serial_compile - no_comm`` is what overlap can save.
- ``vllm_rule``: vLLM's rule (``training.peer_rules.vllm_sp_rule``), which runs ``async_tp`` from its token
  threshold on and ``serial_compile`` below (vLLM compiles either way): not timed again.
- Diagnoses of ``ficco_eager`` in training (points up to ``--diagnose-max-tokens``): the same model under
  each restriction of ``benchmarks/restricted_planner.py`` (``ficco_eager:all_serial``, ``:bwd_serial``,
  ``:sm_only``, ``:min_gain_5``), and ``runtime.verify_plan``'s verdict on its plan in the step (the
  planned step, every op serial, each op alone serial: ``verify``). ``--eager-fix`` runs ``ficco_eager``
  itself under one of them.

``benchmarks/support/end_to_end.py`` holds the comparisons: each variant over its baseline, the limit share
``(serial_compile - no_comm) / serial_compile`` and the realized share of the limit, and the done-when.

Per point, before timing, every variant's output (training: also the input gradient and every parameter's
gradient shard, from a step without the update) is compared with ``serial``'s (relative Frobenius error,
the largest over tensors and ranks; ``no_comm`` is not: its values are wrong by design), and one step of
each is profiled for the collectives and fused ops it ran (``ops``; the ficco variants list what each
ficco op ran and the prediction behind it). After timing, one step of each is profiled on the GPU
(``profile``: GEMM, attention, communication, copies, other kernels and the GPU's idle time, the host's
gaps; ``benchmarks/step_profile.py``). ``comm_share``: the step's collectives alone (as serial runs them)
over the serial step. Timing: ``runtime.timing.time_interleaved`` (interleaved shuffled rounds, ranks
aligned, the slowest rank's time, the median step). Results are written after each point; a run skips the
points its JSON already has (``--fresh`` starts over) and starts no point it expects to end after
``--budget-s`` (expected: the longest point of the same phase so far in this run). After a change to
ficco's eager path, ``--redo ficco_eager ficco_eager:all_serial`` measures those variants again beside
serial at the points the JSON has (the others keep their numbers; ``redone`` says which), then runs the
points it lacks; ``--redo all`` measures those points again in full (every variant, compiled ones too).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import itertools
import json
import re
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel as torch_styles
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from benchmarks import REPO, llama, loopback_report, machine_id, rerender, write_results
from benchmarks.block_bench import _nothing, device_name, load_models, log, rel_err
from benchmarks.no_comm import NoCommPass
from benchmarks.restricted_planner import PLANNED, RESTRICTIONS, RestrictedPlanner
from benchmarks.runtimes_report import markdown, plot, point_line
from benchmarks.step_profile import profile_split
from benchmarks.step_timing import add_step_timing, timing_settings
from benchmarks.support import end_to_end as e2e
from ficco import executor
from ficco.executor.ops import all_gather_single, reduce_scatter_single
from ficco.features import Scenario
from ficco.features.hardware import KNOWN_HARDWARE
from ficco.runtime import Planner, PredictorSource, verify_plan
from ficco.runtime import tp as ficco_styles
from ficco.runtime.compile import FiccoPass
from ficco.runtime.graphs import GraphedCall
from ficco.runtime.planner import OpKey, OpRequest
from ficco.runtime.timing import time_interleaved
from ficco.training.peer_rules import compute_capability, vllm_sp_min_tokens, vllm_sp_rule

MODELS = ("Llama-3.1-8B", "Llama-3.1-70B")
"""Model configs (``datasets/model_configs/<name>.json``) whose layers are measured."""
PLAN: tuple[tuple[str, str, int], ...] = (
    ("Llama-3.1-70B", "train", 4096),
    ("Llama-3.1-8B", "inference", 1024),
    ("Llama-3.1-8B", "train", 16384),
    ("Llama-3.1-70B", "inference", 256),
    ("Llama-3.1-8B", "inference", 64),
    ("Llama-3.1-70B", "inference", 64),
    ("Llama-3.1-8B", "train", 32768),
    ("Llama-3.1-70B", "train", 32768),
    ("Llama-3.1-70B", "train", 16384),
    ("Llama-3.1-8B", "train", 4096),
    ("Llama-3.1-70B", "inference", 4096),
    ("Llama-3.1-8B", "inference", 16384),
    ("Llama-3.1-70B", "train", 1024),
    ("Llama-3.1-8B", "train", 1024),
    ("Llama-3.1-70B", "inference", 1024),
    ("Llama-3.1-8B", "inference", 256),
    ("Llama-3.1-8B", "inference", 16),
    ("Llama-3.1-70B", "inference", 16),
)
"""A GPU run's points (model, phase, tokens), most telling first: the eager slowdown's point (70B training
at 4096 tokens, with the diagnoses), the communication-heavy inference points, the training points people
run (16k-32k tokens), then the rest. A call measures the points its budget allows; the next resumes."""
CPU_TOKENS = (32, 64)
"""Token counts of ``--device cpu`` (the debug Llama)."""
DIAGNOSE_MAX_TOKENS = 16384
"""Training points up to this many tokens get the eager diagnoses (``--diagnose-max-tokens``)."""
MAX_NORM = 1.0
"""torchtitan's gradient clipping (``training.max_norm``)."""
ADAMW = {"lr": 0.0, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
"""torchtitan's AdamW (``optimizer``), but for the learning rate: 0, so that the update does all its work
and leaves the weights as they were (every point's check against serial starts from the same weights)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Phase:
    """What a point of one phase runs."""

    mode: str
    """The execution mode the planners are asked about (``eager`` or ``graph``)."""
    backward: bool
    """A training step (forward, backward, clipping, the optimizer's update), or the forward alone."""
    graphed: bool
    """Replayed from a CUDA graph (CPU: eager)."""


PHASES = {
    "inference": Phase(mode="graph", backward=False, graphed=True),
    "train": Phase(mode="eager", backward=True, graphed=False),
}
COMPILED = ("serial_compile", "async_tp", "ficco_compile", "no_comm")
"""The variants compiled per decoder layer, over ``serial``'s model."""
LOOPBACK_VARIANTS = ("ficco_eager", "serial_compile", "ficco_compile")
"""A loopback run's variants besides serial: async-TP needs real peers, and with the collectives faked the
no-communication limit is serial compile itself."""
DIAGNOSES = tuple(f"ficco_eager:{name}" for name in RESTRICTIONS if name != PLANNED)
"""The eager diagnoses: ``ficco_eager``'s model under each restriction."""
UNCHECKED = ("no_comm", "comm_only")
"""Timed but not compared with serial (their values are not the step's)."""
PROFILED = re.compile(r"^(ficco|symm_mem|_c10d_functional|c10d)::")
"""The op names a variant's profiled step counts (collectives, fused and ficco ops)."""


# The model --------------------------------------------------------------------------------------------------


def styles_with(planner: Planner) -> types.SimpleNamespace:
    """``ficco.runtime.tp``'s styles with ``planner`` as their schedule source (a ``styles`` module for
    ``llama.apply_block_tp``)."""
    return types.SimpleNamespace(
        ColwiseParallel=functools.partial(ficco_styles.ColwiseParallel, schedules=planner),
        RowwiseParallel=functools.partial(ficco_styles.RowwiseParallel, schedules=planner),
        PrepareModuleInput=ficco_styles.PrepareModuleInput,
        SequenceParallel=ficco_styles.SequenceParallel,
    )


def parallelized(base: llama.TransformerBlocks, mesh, styles) -> llama.TransformerBlocks:
    """A copy of ``base`` under torchtitan's per-layer plan over ``styles``."""
    model = copy.deepcopy(base)
    for block in model.layers.values():
        llama.apply_block_tp(block, mesh, styles)
    ficco_styles.name_modules(model)
    return model


def compiled_per_block(model: llama.TransformerBlocks, *, dynamic: bool | None, options: dict) -> nn.Module:
    """torchtitan's ``apply_compile`` without touching ``model``: a container sharing its modules whose
    decoder layers are each ``torch.compile(block, fullgraph=True)`` with Inductor ``options`` (the layers
    share one compiled graph per shape: they run the same code)."""
    out = copy.copy(model)
    out._modules = dict(model._modules)
    out.layers = nn.ModuleDict(
        {
            name: torch.compile(block, fullgraph=True, dynamic=dynamic, options=options)
            for name, block in model.layers.items()
        }
    )
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> None:
    """torchtitan's ``clip_grad_norm_`` without pipeline parallelism: the norm over every gradient (the
    tensor-parallel shards' norms combined: ``full_tensor``), then the gradients scaled to ``max_norm``."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, False, True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, True)


# A group: one model and phase, its models and compiled variants ---------------------------------------------


@dataclass(kw_only=True)
class Group:
    """The variants of one (model, phase): built once, used at each of its token counts."""

    modules: dict[str, nn.Module]
    """Variant -> the module whose call is its step (compiled variants: the per-layer compiled copy)."""
    owner: dict[str, str]
    """Variant -> the eager model whose parameters it runs (``serial`` or ``ficco_eager``)."""
    params: dict[str, list[torch.Tensor]]
    """Eager model -> its parameters, by name."""
    optimizers: dict[str, torch.optim.Optimizer]
    """Eager model -> its AdamW (training)."""
    planners: dict[str, Planner]
    ficco_pass: FiccoPass
    unavailable: dict[str, str]
    """Variant -> why it does not run here."""


def build_group(name: str, phase: Phase, ctx: RunContext) -> Group:
    """The variants of one model and phase (``vllm_rule`` runs one of them), on fresh weights (the same on
    every rank and at every build)."""
    torch._dynamo.reset()  # the previous group's compiled graphs go
    args = ctx.llama_args[name]
    torch.manual_seed(0)
    with torch.device(ctx.device):
        base = llama.TransformerBlocks(args, tp_degree=ctx.world_size)
    base.layers.to(ctx.dtype)  # the rotary frequencies stay complex64
    eager = RestrictedPlanner(ctx.source, mode=phase.mode, hardware=ctx.planner_hardware)
    eager.use(ctx.eager_fix)
    planners = {
        "ficco_eager": eager,
        "ficco_compile": Planner(ctx.source, mode=phase.mode, hardware=ctx.planner_hardware),
    }
    serial = parallelized(base, ctx.mesh, torch_styles)
    modules: dict[str, nn.Module] = {"serial": serial}
    if "ficco_eager" in ctx.variants:
        modules["ficco_eager"] = parallelized(base, ctx.mesh, styles_with(eager))
    del base
    ficco_pass = FiccoPass(planners["ficco_compile"], mode=phase.mode)
    dynamic = None if ctx.shapes == "dynamic" else False
    options = {
        "serial_compile": {"post_grad_custom_post_pass": None, "_micro_pipeline_tp": False},
        "async_tp": {"post_grad_custom_post_pass": None, "_micro_pipeline_tp": True},
        "ficco_compile": {"post_grad_custom_post_pass": ficco_pass, "_micro_pipeline_tp": False},
        "no_comm": {"post_grad_custom_post_pass": NoCommPass(), "_micro_pipeline_tp": False},
    }
    unavailable = {}
    for variant in COMPILED:
        if variant not in ctx.variants:
            continue
        if variant == "async_tp" and ctx.async_tp_reason is not None:
            unavailable[variant] = ctx.async_tp_reason
            continue
        if variant == "async_tp":
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group

            enable_symm_mem_for_group(ctx.mesh.get_group().group_name)
        modules[variant] = compiled_per_block(serial, dynamic=dynamic, options=options[variant])
    owner = {v: v if v in ("serial", "ficco_eager") else "serial" for v in modules}
    params = {v: [p for _, p in sorted(modules[v].named_parameters())] for v in modules if owner[v] == v}
    optimizers = {}
    if phase.backward:
        fused = {"fused": True} if ctx.device.type == "cuda" else {"foreach": True}
        optimizers = {v: torch.optim.AdamW(ps, **ADAMW, **fused) for v, ps in params.items()}
    return Group(modules=modules, owner=owner, params=params, optimizers=optimizers, planners=planners,
                 ficco_pass=ficco_pass, unavailable=unavailable)  # fmt: skip


@dataclass(kw_only=True)
class RunContext:
    """What every point of a run shares."""

    device: torch.device
    dtype: torch.dtype
    world_size: int
    mesh: Any
    graphs: bool
    """Inference replays CUDA graphs (a GPU run, loopback included)."""
    shapes: str
    """``dynamic`` or ``static`` token count in the compiled variants."""
    source: PredictorSource
    planner_hardware: str
    eager_fix: str
    """The restriction ``ficco_eager`` itself runs (``planned``: none)."""
    async_tp_reason: str | None
    """Why PyTorch's async-TP cannot run here; None where it can."""
    hardware: str
    """This machine's hardware id (``h200x2``), or ``cpu``."""
    batch: int
    """Sequences per step (the token count's split)."""
    llama_args: dict[str, llama.LlamaArgs]
    variants: tuple[str, ...]
    """The variants built besides ``serial`` (``--variants``)."""
    diagnose_max_tokens: int
    diagnoses: tuple[str, ...]
    """The diagnoses timed at the diagnosed points (:data:`DIAGNOSES`, or those ``--redo`` names)."""
    verify: bool
    timing: dict[str, Any]
    loopback: bool = False
    """One GPU as rank 0 of a pretend world: each point also times its ops alone (:func:`op_costs`)."""
    op_layouts: tuple[str, ...] = ()
    """Schedules each op is also timed under, in each batched layout (``--op-layouts``)."""
    ops_only: bool = False
    """Time the ops alone, not the steps (``--ops-only``)."""
    profile_calls: int = 1
    """Profiled calls per variant (the median's kept): 3 in a loopback run, whose GPU work is the result."""


# One point --------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Runnable:
    """One variant at one point: how to put it in place, its checked step and its timed step."""

    activate: Callable[[], None]
    check: Callable[[], torch.Tensor]
    """A step without the optimizer's update (outputs and gradients compared with serial's)."""
    step: Callable[[], Any]
    """What is timed: the whole step (training: with the update)."""


def runnables(group: Group, phase: Phase, x: torch.Tensor, g: torch.Tensor, diagnose: bool, ctx) -> dict:
    """Variant -> :class:`Runnable` at this point's input ``x`` (and output gradient ``g``)."""
    planner = group.planners["ficco_eager"]

    def make_step(name: str, update: bool) -> Callable[[], torch.Tensor]:
        module = group.modules[name]
        if not phase.backward:
            return torch.no_grad()(lambda: module(x))
        owner = group.owner[name]
        optimizer, params = group.optimizers[owner], group.params[owner]

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            x.grad = None
            y = module(x)
            y.backward(g)
            if update:
                clip_grad_norm(params, MAX_NORM)
                optimizer.step()
            return y

        return step

    out = {}
    for name in group.modules:
        activate = functools.partial(planner.use, ctx.eager_fix) if name == "ficco_eager" else _nothing
        out[name] = Runnable(activate=activate, check=make_step(name, False), step=make_step(name, True))
    if diagnose:
        for name in ctx.diagnoses:
            restriction = name.split(":", 1)[1]
            out[name] = Runnable(
                activate=functools.partial(planner.use, restriction),
                check=make_step("ficco_eager", False),
                step=make_step("ficco_eager", True),
            )
    return out


def run_point(model: str, phase_name: str, tokens: int, group: Group, ctx: RunContext) -> dict:
    """Check, profile and time every variant of ``group`` at ``tokens`` (with ``ctx.ops_only`` the ops alone
    only): the point's JSON entry."""
    started = time.monotonic()
    phase, w, device = PHASES[phase_name], ctx.world_size, ctx.device
    if ctx.ops_only:
        costs = op_costs(model, phase, tokens, group, ctx)
        return {"model": model, "phase": phase_name, "tokens": tokens, "step_ms": {}, "host_ms": {},
                "rel_err": {}, "errors": {}, "unavailable": {}, "ops": {}, "op_costs": costs,
                "wall_s": time.monotonic() - started}  # fmt: skip
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    dim, n_layers = ctx.llama_args[model].dim, ctx.llama_args[model].n_layers
    gen = torch.Generator(device=device).manual_seed(1000 + dist.get_rank())
    shape = (ctx.batch, tokens // (ctx.batch * w), dim)
    x = torch.randn(shape, generator=gen, device=device).to(ctx.dtype)
    g = torch.randn(shape, generator=gen, device=device).to(ctx.dtype)
    if ctx.shapes == "dynamic":
        torch._dynamo.mark_dynamic(x, 1)
    if phase.backward:
        x.requires_grad_()
    diagnose = phase.backward and tokens <= ctx.diagnose_max_tokens and "ficco_eager" in group.modules
    diagnose = diagnose and bool(ctx.diagnoses)
    graphs_before = group.ficco_pass.report.graphs

    def outputs(name: str, y: torch.Tensor) -> list[torch.Tensor]:
        if not phase.backward:
            return [y.detach().clone()]
        params = group.params[group.owner.get(name, "ficco_eager")]
        return [y.detach().clone(), x.grad.clone(), *(local(p.grad).clone() for p in params)]

    variants = runnables(group, phase, x, g, diagnose, ctx)
    comm = collectives_step(tokens, dim, n_layers, phase.backward, ctx)
    variants["comm_only"] = Runnable(activate=_nothing, check=comm, step=comm)
    errors, failures, ops, timed, reference = {}, {}, {}, {}, None
    for name, v in variants.items():
        try:
            v.activate()
            y = v.check()  # compiles a compiled variant; a ficco planner decides this shape's ops
            if name != "comm_only":
                ops[name] = {"calls": profiled_calls(v.check)}
            if name == "serial":
                reference = outputs(name, y)
            elif name not in UNCHECKED and reference is not None:
                got = outputs(name, y)
                errors[name] = max(rel_err(a, b) for a, b in zip(got, reference, strict=True))
            del y
            call = GraphedCall(v.step) if phase.graphed and ctx.graphs else v.step
            timed[name] = (v.activate, call)
        except Exception as err:  # the same on every rank (a compile or capture that fails): recorded
            failures[name] = f"{type(err).__name__}: {str(err)[:400]}"
    del reference
    for name in ("ficco_eager", "ficco_compile"):
        if name in ops:
            ops[name] |= ran_ops(name, group, tokens, graphs_before)
    times, host = time_interleaved(timed, device=device, **ctx.timing)
    profiles = {}
    if device.type == "cuda":
        for name, (activate, call) in timed.items():
            activate()
            profiles[name] = profile_split(call, device, calls=ctx.profile_calls)
    verdict = None
    if diagnose and ctx.verify and "ficco_eager" in timed:
        group.planners["ficco_eager"].use(ctx.eager_fix)
        step = variants["ficco_eager"].step
        verdict = verify_plan(group.planners["ficco_eager"], lambda: step, device=device, warmup=1,
                              rounds=3, reps=2).to_dict()  # fmt: skip
    timed.clear()
    point = make_point(model, phase_name, tokens, times, host, errors, failures, ops, group, ctx)
    point |= {"profile": profiles, "verify": verdict}
    if ctx.loopback:
        point["op_costs"] = op_costs(model, phase, tokens, group, ctx)
    point["wall_s"] = time.monotonic() - started
    if device.type == "cuda":
        point["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return point


# One op at a time (loopback runs) --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class OpSpec:
    """One op of a decoder layer's step, as ficco's styles run it: an all-gather of ``k`` features against
    the weights' ``ns`` columns, or the reduce-scatter of the summed products ``sum_i [m, ks[i]] @ [ks[i],
    n]`` (``ns`` one entry)."""

    layers: str
    direction: str
    op: str
    ns: tuple[int, ...]
    ks: tuple[int, ...]
    return_a: bool = False

    @property
    def n(self) -> int:
        return sum(self.ns) if self.op == "ag_gemm" else self.ns[0]

    @property
    def k(self) -> int:
        return self.ks[0] if self.op == "ag_gemm" else sum(self.ks)


def op_specs(args: llama.LlamaArgs, world_size: int, backward: bool) -> list[OpSpec]:
    """The ops of one decoder layer under ficco's styles (torchtitan's plan): q/k/v and w1/w3 as one gather
    each (the gathered input returned: the module gets it), wo and w2 scattered; with ``backward`` their
    input gradients' ops (wo's and w2's gathers keep the gathered gradient for the weight's)."""
    w, dim, hid = world_size, args.dim, args.hidden_dim
    kv = args.n_kv_heads * (dim // args.n_heads)
    qkv, w13 = (dim // w, kv // w, kv // w), (hid // w, hid // w)
    out = [
        OpSpec(layers="attention.wq,wk,wv", direction="fwd", op="ag_gemm", ns=qkv, ks=(dim,), return_a=True),
        OpSpec(layers="attention.wo", direction="fwd", op="gemm_rs", ns=(dim,), ks=(dim // w,)),
        OpSpec(layers="feed_forward.w1,w3", direction="fwd", op="ag_gemm", ns=w13, ks=(dim,), return_a=True),
        OpSpec(layers="feed_forward.w2", direction="fwd", op="gemm_rs", ns=(dim,), ks=(hid // w,)),
    ]
    if backward:
        out += [
            OpSpec(layers="attention.wq,wk,wv", direction="bwd-input", op="gemm_rs", ns=(dim,), ks=qkv),
            OpSpec(layers="attention.wo", direction="bwd-input", op="ag_gemm", ns=(dim // w,), ks=(dim,),
                   return_a=True),
            OpSpec(layers="feed_forward.w1,w3", direction="bwd-input", op="gemm_rs", ns=(dim,), ks=w13),
            OpSpec(layers="feed_forward.w2", direction="bwd-input", op="ag_gemm", ns=(hid // w,), ks=(dim,),
                   return_a=True),
        ]  # fmt: skip
    return out


def op_costs(model: str, phase: Phase, tokens: int, group: Group, ctx: RunContext) -> list[dict[str, Any]]:
    """Each op of a decoder layer at ``tokens`` (:func:`op_specs`) timed alone on this GPU: the GPU work of
    its kernels per call (``step_profile.split``'s ``kernel_ms`` and ``work_ms``, averaged over
    :data:`OP_CALLS` calls) and the host time per eager call, for PyTorch's path (DTensor's gather or
    scatter along the sequence beside ``F.linear``: the functional collective, its copy, the GEMMs),
    ``serial/sm``, the schedule ficco's eager planner picked, and ``ctx.op_layouts``'s schedules; each
    overlapped schedule under each batched layout (``executor.layout``) as well as the one it chooses."""
    from ficco.executor.layout import OVERLAPPED_LAYOUTS, forced

    planner = group.planners["ficco_eager"]
    rows = []
    for spec in op_specs(ctx.llama_args[model], ctx.world_size, phase.backward):
        pick = _picked(planner, spec, tokens, ctx)
        call = _op_calls(spec, tokens, ctx)
        variants = {"pytorch": _op_cost(call["pytorch"], ctx)}
        for schedule in dict.fromkeys(["serial/sm", pick, *ctx.op_layouts]):
            variants[schedule] = _op_cost(functools.partial(call["ficco"], schedule), ctx)
            if ctx.batch > 1 and not schedule.startswith("serial"):
                for layout in OVERLAPPED_LAYOUTS:
                    with forced(layout):
                        variants[f"{schedule}:{layout}"] = _op_cost(
                            functools.partial(call["ficco"], schedule), ctx
                        )
        chosen = {s: _layout(spec, tokens, s, ctx) for s in variants if s != "pytorch" and ":" not in s}
        rows.append({**dataclasses.asdict(spec), "m": tokens, "pick": pick, "variants": variants,
                     "layouts": chosen})  # fmt: skip
    return rows


def _layout(spec: OpSpec, tokens: int, schedule: str, ctx: RunContext) -> str:
    """The batched layout ficco's op chooses for ``spec`` under ``schedule`` (``executor.layout.choose``)."""
    from ficco.executor.layout import choose
    from ficco.executor.plan import make_plan
    from ficco.features import Schedule

    s = Schedule.parse(schedule)
    direction = "gather" if spec.op == "ag_gemm" else "scatter"
    plan = make_plan(direction, ctx.world_size, s.granularity, s.splits, s.grain)
    ns = spec.ns if spec.op == "ag_gemm" else (spec.n,)
    gpu = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else ""
    itemsize = torch.tensor([], dtype=ctx.dtype).element_size()
    return choose(plan, tokens // ctx.world_size, ctx.batch, ns, spec.k, itemsize, gpu)


OP_CALLS = 5
"""Calls per op and variant: profiled together (their GPU work averaged), and timed on the host."""


def _picked(planner: Planner, spec: OpSpec, tokens: int, ctx: RunContext) -> str:
    """The schedule ``planner`` runs for ``spec`` at ``tokens`` (decided now where the step has not run)."""
    dtype = "bf16" if ctx.dtype == torch.bfloat16 else "fp32"
    request = OpRequest(layer=spec.layers, direction=spec.direction, op=spec.op, m=tokens, n=spec.n,
                        k=spec.k, dtype=dtype, world_size=ctx.world_size, batch=ctx.batch)  # fmt: skip
    planner.prepare([request])
    return str(planner.schedule(request))


def _op_calls(spec: OpSpec, tokens: int, ctx: RunContext) -> dict[str, Callable]:
    """``pytorch``: a call of PyTorch's path for ``spec``; ``ficco``: ``f(schedule)``, a call of ficco's op
    (the twin without autograd, as the styles' forward and backward run it) on this rank's tensors
    ``[batch, tokens / (w batch), k]`` (gather) or ``[batch, tokens / batch, k_i]`` (scatter)."""
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F

    w, b, device, dtype = ctx.world_size, ctx.batch, ctx.device, ctx.dtype
    group = ctx.mesh.get_group().group_name
    gen = torch.Generator(device=device).manual_seed(7)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    if spec.op == "ag_gemm":
        shard = rand(b, tokens // (w * b), spec.k)
        weights = [rand(n, spec.k) for n in spec.ns]  # nn.Linear's layout; the op takes the transposes

        def pytorch() -> list[torch.Tensor]:
            gathered = funcol.wait_tensor(funcol.all_gather_tensor(shard, 1, group))
            return [F.linear(gathered, weight) for weight in weights]

        def ficco(schedule: str):
            ts = [weight.t() for weight in weights]
            return torch.ops.ficco._all_gather_matmul(shard, ts, 1, group, schedule, spec.return_a)

        return {"pytorch": pytorch, "ficco": ficco}
    parts = [rand(b, tokens // b, k) for k in spec.ks]
    weights = [rand(spec.ns[0], k) for k in spec.ks]

    def pytorch_rs() -> torch.Tensor:
        partial = F.linear(parts[0], weights[0])
        for x, weight in zip(parts[1:], weights[1:], strict=True):
            partial += F.linear(x, weight)  # autograd's accumulation of each weight's input gradient
        return funcol.wait_tensor(funcol.reduce_scatter_tensor(partial, "sum", 1, group))

    def ficco_rs(schedule: str):
        ts = [weight.t() for weight in weights]
        if len(parts) == 1:
            return torch.ops.ficco._matmul_reduce_scatter(parts[0], ts[0], "sum", 1, group, schedule)
        return torch.ops.ficco._matmuls_reduce_scatter(parts, ts, "sum", 1, group, schedule)

    return {"pytorch": pytorch_rs, "ficco": ficco_rs}


def _op_cost(call: Callable[[], Any], ctx: RunContext) -> dict[str, Any]:
    """The GPU work of one call (CUDA: ``kernel_ms``, ``work_ms``, the average over :data:`OP_CALLS` calls
    profiled together; None on the CPU) and its host time (``host_us``: the median of as many calls, each
    issued after a synchronisation and not waited for)."""
    cuda = ctx.device.type == "cuda"
    for _ in range(2):
        call()
    cost: dict[str, Any] = {"kernel_ms": None, "work_ms": {}}
    if cuda:  # one profiled session of OP_CALLS calls: the GPU work of a call, on average
        profile = profile_split(lambda: [call() for _ in range(OP_CALLS)], ctx.device)
        work = {kind: ms / OP_CALLS for kind, ms in profile["work_ms"].items()}
        cost = {"kernel_ms": profile["kernel_ms"] / OP_CALLS, "work_ms": work}
    host = []
    for _ in range(OP_CALLS):
        if cuda:
            torch.cuda.synchronize(ctx.device)
        start = time.perf_counter()
        call()
        host.append((time.perf_counter() - start) * 1e6)
    if cuda:
        torch.cuda.synchronize(ctx.device)
    return cost | {"host_us": sorted(host)[len(host) // 2]}


def collectives_step(tokens: int, dim: int, n_layers: int, backward: bool, ctx) -> Callable[[], None]:
    """The step's collectives alone, as serial runs them: per layer and direction, 2 all-gathers of the
    ``[T/w, dim]`` shard and 2 reduce-scatters of ``[T, dim]``."""
    w, device = ctx.world_size, ctx.device
    shard = torch.randn(tokens // w * dim, device=device).to(ctx.dtype)
    full = torch.randn(tokens * dim, device=device).to(ctx.dtype)
    gathered, scattered = torch.empty_like(full), torch.empty_like(shard)
    count = 2 * n_layers * (2 if backward else 1)

    def step() -> torch.Tensor:
        for _ in range(count):
            all_gather_single(gathered, shard)
            reduce_scatter_single(scattered, full)
        return scattered

    return step


def profiled_calls(step: Callable[[], Any]) -> dict[str, int]:
    """The collectives, PyTorch fused ops and ficco ops one eager ``step`` dispatched, by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return dict(Counter(e.name for e in prof.events() if PROFILED.match(e.name)))


def ran_ops(name: str, group: Group, tokens: int, graphs_before: int) -> dict[str, Any]:
    """What each ficco op of a ficco variant ran at ``tokens``, with the planner's predicted speedup: the
    eager planner's table, or the compile pass's report over the graphs compiled at this point (what it
    rewrote and what it left, with the reason)."""
    planner = group.planners[name]
    if name == "ficco_eager":
        return {"ran": [r for r in planner.rows() if f" m={tokens} " in f" {r['shape']} "]}
    report = group.ficco_pass.report
    ran = []
    for rw in report.rewritten:
        if rw.graph < graphs_before:
            continue
        key = OpKey(mode=planner.mode, op=rw.op, m=rw.m, n=sum(rw.n), k=rw.k, dtype=rw.dtype,
                    world_size=rw.world_size)  # fmt: skip
        decision = planner.decisions.get(key)
        for r in report.ran(rw):
            ran.append(
                {
                    "direction": rw.direction,
                    "op": rw.op,
                    "layers": ",".join(rw.layers),
                    "shape": f"m={r.m} n={r.n} k={r.k}",
                    "schedule": rw.schedule,
                    "predicted_speedup": decision.predicted_speedup if decision else None,
                    "ran": r.ran,
                    "note": r.reason or "",
                }
            )
    left = [
        {"op": x.op, "direction": x.direction, "layers": ",".join(x.layers), "reason": x.reason,
         "detail": x.detail}
        for x in report.left if x.graph >= graphs_before
    ]  # fmt: skip
    return {"ran": ran, "rewritten": len(ran), "left": left}


def vllm_choice(cfg_dim: int, tokens: int, ctx) -> str:
    """The variant vLLM's rule runs at ``tokens``: ``async_tp`` where its threshold admits every op of the
    block (all read the model width), else ``serial_compile`` (vLLM compiles its models either way)."""
    hardware = KNOWN_HARDWARE.get(ctx.hardware)
    if hardware is None:  # the CPU, an unknown GPU: no compute capability vLLM's rule admits
        return "serial_compile"
    w = ctx.world_size
    common = {"m": tokens, "dtype": "bf16", "world_size": w, "hardware": hardware}
    scenarios = (
        Scenario(op="ag_gemm", n=cfg_dim // w, k=cfg_dim, **common),
        Scenario(op="gemm_rs", n=cfg_dim, k=cfg_dim // w, **common),
    )
    return "async_tp" if bool(vllm_sp_rule(scenarios).all()) else "serial_compile"


def make_point(model, phase, tokens, times, host, errors, failures, ops, group, ctx) -> dict:
    """One ``points`` entry (ms)."""
    step_ms = {v: times.get(v) for v in (*e2e.VARIANTS, *DIAGNOSES) if v != "vllm_rule" and v in times}
    step_ms |= {v: None for v in e2e.VARIANTS if v not in step_ms}
    choice = vllm_choice(ctx.llama_args[model].dim, tokens, ctx)
    step_ms["vllm_rule"] = step_ms.get(choice)
    serial, comm = times.get("serial"), times.get("comm_only")
    return {
        "model": model,
        "phase": phase,
        "tokens": tokens,
        "comm_share": min(1.0, comm / serial) if serial and comm is not None else None,
        "comm_only_ms": comm,
        "step_ms": step_ms,
        "vllm_rule_runs": choice,
        "host_ms": {v: ms for v, ms in host.items() if v != "comm_only"},
        "rel_err": errors,
        "errors": failures,
        "unavailable": group.unavailable,
        "ops": ops,
    }


# The run ----------------------------------------------------------------------------------------------------


def hardware_id(device: torch.device, world_size: int) -> str:
    """This machine's hardware id (``benchmarks.machine_id``: ``h200x2``, ``h100x4``, ...); on the CPU ``cpu``
    at 2 ranks, ``cpux<world_size>`` otherwise."""
    if device.type != "cuda":
        return "cpu" if world_size == 2 else f"cpux{world_size}"
    return machine_id(world_size)


def planner_source(hardware: str, world_size: int, cpu: bool) -> tuple[PredictorSource, str]:
    """The local model of ``hardware`` and the hardware its questions name; else the shipped ``h200x2``
    model, which answers for ``h200x2`` only (on the CPU at more than 2 ranks every op then runs
    ``serial/sm``, with the reason in the log). A GPU run at more than 2 ranks without its hardware's model
    stops: every ficco op would run ``serial/sm``."""
    from ficco.training.predict.registry import ModelLoadError

    try:
        return PredictorSource.load(hardware_id=hardware), hardware
    except ModelLoadError as err:  # no model for this hardware in the registry
        if world_size > KNOWN_HARDWARE["h200x2"].gpu_count and not cpu:
            raise SystemExit(
                f"{err}\n(at TP={world_size} ficco's variants would all run serial/sm)"
            ) from None
    return PredictorSource.load(hardware_id="h200x2"), "h200x2"


def output_path(out: Path, hardware: str, loopback: bool) -> Path:
    """``runtimes-<hardware>.json``; a loopback run's ``runtimes-loopback-<gpu>.json`` (one GPU: ``h200``)."""
    if loopback:
        return out / f"runtimes-loopback-{hardware.split('x')[0]}.json"
    return out / f"runtimes-{hardware}.json"


def load_previous(path: Path, meta: dict, fresh: bool) -> dict | None:
    """The results of an earlier run of the same configuration at ``path`` (to resume), else None."""
    if fresh or not path.exists():
        return None
    previous = json.loads(path.read_text())
    same = ("hardware", "loopback", "dtype", "layers", "batch", "shapes", "world_size", "step")
    if any(previous.get("meta", {}).get(k) != meta[k] for k in same):
        return None
    return previous


def planned_points(args: argparse.Namespace, cpu: bool) -> list[tuple[str, str, int]]:
    """The points of this run in order: ``--models`` x ``--phases`` x ``--tokens`` where tokens are given,
    else :data:`PLAN` (on the CPU the debug model at :data:`CPU_TOKENS`) within ``--models`` and
    ``--phases``."""
    if cpu:
        return [("debug", ph, t) for ph in args.phases for t in args.tokens or CPU_TOKENS]
    if args.tokens:
        return list(itertools.product(args.models, args.phases, args.tokens))
    return [p for p in PLAN if p[0] in args.models and p[1] in args.phases]


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.render:
        rerender(args.render, markdown, plot)
        return None
    if args.loopback:
        from benchmarks.support.loopback import loopback_world

        world = loopback_world(2, args.device)
    else:
        world = executor.process_group(args.device)
    with world as device:
        return run(args, device)


def run(args: argparse.Namespace, device: torch.device) -> dict:
    """Every point not yet in ``--out``'s JSON; rank 0 writes the results after each point. Returns them."""
    started = time.monotonic()
    cpu = device.type == "cpu"
    w, rank0 = dist.get_world_size(), dist.get_rank() == 0
    points = planned_points(args, cpu)
    bad = sorted({t for _, _, t in points if t % (w * args.batch) or t < 2 * w * args.batch})
    if bad:
        raise SystemExit(
            f"tokens must be multiples of ranks x --batch ({w} x {args.batch}), >= 2 per sequence and rank; "
            f"got {bad}"
        )
    hardware = hardware_id(device, w)
    source, planner_hw = planner_source(hardware, w, cpu)
    models = {"debug": None} if cpu else load_models(tuple(args.models))
    max_tokens = max(t for _, _, t in points) if points else 64
    llama_args = {
        name: llama.LlamaArgs(n_layers=args.layers, max_seq_len=max_tokens)
        if cfg is None
        else llama.LlamaArgs.from_config(cfg, n_layers=args.layers, max_seq_len=max_tokens)
        for name, cfg in models.items()
    }
    async_tp_reason = None
    if cpu:
        async_tp_reason = "PyTorch's async-TP needs CUDA symmetric memory"
    elif args.loopback:
        async_tp_reason = "PyTorch's async-TP needs symmetric memory over real peers (loopback world)"
    ctx = RunContext(
        device=device,
        dtype=torch.float32 if cpu else torch.bfloat16,
        world_size=w,
        mesh=init_device_mesh(device.type, (w,)),
        graphs=not cpu,
        shapes=args.shapes,
        source=source,
        planner_hardware=planner_hw,
        eager_fix=args.eager_fix,
        async_tp_reason=async_tp_reason,
        hardware=hardware,
        batch=args.batch,
        llama_args=llama_args,
        variants=() if args.ops_only else tuple(args.variants),
        diagnose_max_tokens=args.diagnose_max_tokens,
        diagnoses=DIAGNOSES,
        verify=args.verify,
        timing=args.timing,
        loopback=args.loopback,
        op_layouts=tuple(args.op_layouts),
        ops_only=args.ops_only,
        profile_calls=3 if args.loopback else 1,
    )
    # --shapes static: a cache entry per token count and compiled variant (torch < 2.7: cache_size_limit)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 256)
    meta = {
        "hardware": hardware,
        "device": device_name(device),
        "loopback": args.loopback,
        "world_size": w,
        "dtype": "fp32" if cpu else "bf16",
        "layers": args.layers,
        "batch": args.batch,
        "shapes": args.shapes,
        "step": "train: forward, backward, clip_grad_norm_, fused AdamW; compiled per decoder layer",
        "planner": source.origin,
        "planner_hardware": planner_hw,
        "eager_fix": args.eager_fix,
        "torch": torch.__version__,
        "timing": ctx.timing,
        "comm_share": "the step's collectives timed alone (as serial runs them) over the serial step",
        "vllm_min_tokens": {
            name: vllm_sp_min_tokens(cfg.hidden_size, w, 2, compute_capability(KNOWN_HARDWARE[hardware]))
            for name, cfg in models.items()
            if cfg is not None and hardware in KNOWN_HARDWARE
        },
    }
    path = output_path(args.out, hardware, args.loopback)
    result = load_previous(path, meta, args.fresh) or {"points": []}
    result["meta"], result["skipped"] = meta, []
    done = {(p["model"], p["phase"], p["tokens"]): p for p in result["points"]}
    redo = tuple(args.redo)
    group_key, group = None, None
    longest: dict[str, float] = {}  # phase -> this run's longest point, s: what the next one may take
    for model, phase_name, tokens in points:
        previous = done.get((model, phase_name, tokens))
        if previous is not None and (not redo or previous.get("redone", {}).get("variants") == list(redo)):
            continue
        if time.monotonic() - started + longest.get(phase_name, 0.0) > args.budget_s:
            result["skipped"].append({"model": model, "phase": phase_name, "tokens": tokens})
            continue
        point_ctx = ctx if previous is None or redo == ("all",) else redo_context(ctx, redo)
        if group_key != (model, phase_name, point_ctx.variants):
            group = None
            release(device)
            group_key = (model, phase_name, point_ctx.variants)
            group = build_group(model, PHASES[phase_name], point_ctx)
        point = run_point(model, phase_name, tokens, group, point_ctx)
        longest[phase_name] = max(longest.get(phase_name, 0.0), point["wall_s"])
        if previous is None:
            result["points"].append(point)
        else:
            point = redone(previous, point, redo)
            result["points"][result["points"].index(previous)] = point
        log(rank0, point_line(point))
        if rank0:
            write_results(result, path, markdown, plot)
    group = None
    release(device)
    result["summary"] = (
        loopback_report.summarize(result["points"])
        if args.loopback
        else e2e.summarize(result["points"], meta["dtype"], loopback=False)
    )
    meta["wall_s"] = time.monotonic() - started
    if rank0:
        write_results(result, path, markdown, plot)
        print(json.dumps(result["summary"], indent=1), flush=True)
    return result


def redo_context(ctx: RunContext, redo: tuple[str, ...]) -> RunContext:
    """What a point measured before runs again (``--redo``): ``serial``, ``ficco_eager`` and the diagnoses
    ``redo`` names, nothing compiled and no plan verification."""
    diagnoses = tuple(v for v in redo if v in DIAGNOSES)
    return dataclasses.replace(ctx, variants=("ficco_eager",), diagnoses=diagnoses, verify=False)


def redone(previous: dict, point: dict, redo: tuple[str, ...]) -> dict:
    """``previous`` (a point of the JSON, updated in place) with ``serial``'s, the collectives' and the
    ``redo`` variants' numbers of ``point`` (measured again in the same rounds); the other variants keep
    theirs, and ``redone`` says which were measured again, when and how long it took. ``redo`` ``("all",)``:
    ``point`` itself, marked redone."""
    if redo == ("all",):
        point["redone"] = {"variants": ["all"], "torch": torch.__version__, "wall_s": point["wall_s"]}
        return point
    names = ("serial", *redo)
    for key in ("step_ms", "host_ms", "rel_err", "errors", "profile"):
        previous.setdefault(key, {})
        previous[key] |= {v: point[key][v] for v in names if v in point.get(key, {})}
    previous["ops"] |= {v: point["ops"][v] for v in names if v in point["ops"]}
    previous["comm_only_ms"], previous["comm_share"] = point["comm_only_ms"], point["comm_share"]
    previous["redone"] = {"variants": list(redo), "torch": torch.__version__, "wall_s": point["wall_s"]}
    return previous


def release(device: torch.device) -> None:
    """Free what the last group held (its models, optimizers, graphs, the executor's buffers)."""
    gc.collect()
    executor.clear_buffers()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="results folder")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, the debug Llama")
    p.add_argument("--loopback", action="store_true", help="one process as rank 0 of a pretend world of 2")
    p.add_argument("--models", nargs="+", default=list(MODELS), help="model configs (GPU runs)")
    p.add_argument("--phases", nargs="+", choices=tuple(PHASES), default=list(PHASES))
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        help="token counts, every model and phase at each (default: the plan of PLAN; cpu: "
        f"{CPU_TOKENS}); multiples of ranks x --batch",
    )
    p.add_argument("--layers", type=int, default=4, help="decoder layers in the step")
    p.add_argument("--batch", type=int, default=2, help="sequences the tokens are split into")
    p.add_argument("--shapes", choices=("static", "dynamic"), default="static", help="compiled token count")
    p.add_argument(
        "--diagnose-max-tokens",
        type=int,
        help="training points up to this many tokens also time ficco eager under each restriction (0: none; "
        f"default {DIAGNOSE_MAX_TOKENS}, 0 with --loopback)",
    )
    p.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at the diagnosed points, also runtime.verify_plan on ficco eager's plan",
    )
    p.add_argument(
        "--eager-fix",
        choices=tuple(RESTRICTIONS),
        default=PLANNED,
        help="the restriction ficco_eager itself runs (benchmarks/restricted_planner.py)",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=("ficco_eager", *COMPILED),
        help="the variants besides serial (always run: every check's reference; default: all, with "
        f"--loopback {' '.join(LOOPBACK_VARIANTS)})",
    )
    p.add_argument(
        "--op-layouts",
        nargs="*",
        default=[],
        metavar="SCHEDULE",
        help="loopback: also time each op alone under these schedules, in each batched layout "
        "(executor.layout), beside PyTorch's path, serial/sm and the planner's pick",
    )
    p.add_argument(
        "--ops-only",
        action="store_true",
        help="loopback: time each point's ops alone only (no steps)",
    )
    add_step_timing(p, warmup=2, rounds=3, reps=3, timed_ms=150.0, max_rounds=20)
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="no point starts that would end after this many seconds (as long as this run's longest point "
        "of its phase)",
    )
    p.add_argument("--fresh", action="store_true", help="ignore the points of an earlier run in --out")
    p.add_argument(
        "--redo",
        nargs="+",
        choices=("all", "ficco_eager", *DIAGNOSES),
        default=[],
        help="at the points --out's JSON already has (within --models/--phases/--tokens), measure these "
        "variants again beside serial (in the same rounds) and replace their numbers and serial's; the "
        "other variants keep theirs ('all': every variant again, compiled ones too). Once per point and set "
        "of variants (its 'redone' says which); the "
        "points not measured yet then run in full",
    )
    p.add_argument("--render", type=Path, help="re-render the markdown and plot of a JSON and exit")
    args = p.parse_args(argv)
    if "all" in args.redo and len(args.redo) > 1:
        p.error(f"--redo all measures every variant again; name it alone (got {' '.join(args.redo)})")
    args.timing = timing_settings(args, p)
    if args.variants is None:
        args.variants = list(LOOPBACK_VARIANTS if args.loopback else ("ficco_eager", *COMPILED))
    if args.diagnose_max_tokens is None:
        args.diagnose_max_tokens = 0 if args.loopback else DIAGNOSE_MAX_TOKENS
    if (args.ops_only or args.op_layouts) and not args.loopback:
        p.error("--ops-only and --op-layouts time ops alone on one GPU: give --loopback")
    for name in ("layers", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.tokens and any(t < 1 for t in args.tokens):
        p.error(f"--tokens must be positive; got {args.tokens}")
    unknown = [m for m in args.models if not (REPO / "datasets" / "model_configs" / f"{m}.json").exists()]
    if unknown:
        p.error(f"--models: no config for {unknown} under datasets/model_configs")
    return args


if __name__ == "__main__":
    main()
