r"""torchtitan's Llama 3 blocks at TP=2 under the runtimes people use: serial NCCL, PyTorch async-TP,
ficco's parallel styles, ficco's compile pass and vLLM's rule, in training and CUDA-graph inference.

    # 2 GPUs, one process per GPU (< 10 minutes; resumable): OUT/runtimes-h200x2.{json,md,png}
    # (-h100x2 on H100s: the name comes from the GPU found at run time)
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.runtimes \
        --out benchmarks/results
    # one GPU as rank 0 of a pretend world of 2 (plumbing and host time only: no communication measured)
    python -m benchmarks.runtimes --loopback --out /tmp/runtimes
    # CPU, gloo, a debug-size Llama (what CI runs)
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m benchmarks.runtimes --device cpu \
        --out /tmp/runtimes
    # re-render the markdown and the plot of a finished JSON
    python -m benchmarks.runtimes --render benchmarks/results/runtimes-h200x2.json

The model: ``--layers`` decoder layers of torchtitan's Llama 3 (``benchmarks/llama.py``, torchtitan's module
names) at Llama-3.1-8B and -70B shapes (``datasets/model_configs``), bf16, parallelized by torchtitan's
per-layer plan (sequence parallel: ``Shard(1)`` on ``[batch, seq, dim]`` between the layers) on a TP group
of 2. T tokens are ``--batch`` sequences (default 2, causal attention within each); this rank's input is its
sequence shard ``[batch, T/(2 batch), dim]``. With a batch of 1 the gathered input reaches q/k/v and w1/w3
through two reshapes (``[2, T/2, dim] -> [1, T, dim] -> [T, dim]``), and PyTorch's pattern finder, which
both compiled variants use, finds the all-gather but no matmul behind it: neither pass overlaps those
gathers (the debug Llama on gloo: only the two reduce-scatters per layer rewritten, nothing reported left).

Phases: ``train`` (forward + backward, eager: how torchtitan trains) and ``inference`` (the forward replayed
from a CUDA graph, ``runtime.GraphedCall``; CPU: eager). Variants, on the same weights and inputs:

- ``serial``: PyTorch's DTensor styles, NCCL collectives, no overlap (eager).
- ``async_tp``: the same model compiled with ``torch._inductor.config._micro_pipeline_tp = True`` and
  symmetric memory enabled for the group, as torchtitan's ``maybe_enable_async_tp`` does (CUDA only).
- ``ficco_eager``: ``ficco.runtime.tp``'s styles under the same plan, schedules from a ``runtime.Planner``
  over the local model (``PredictorSource.load(hardware_id=...)``; mode ``eager`` for training, ``graph``
  for inference).
- ``ficco_compile``: PyTorch's styles, compiled after ``ficco.runtime.compile.enable(planner)``.
- ``vllm_rule``: vLLM's rule (``training.peer_rules.vllm_sp_rule``): async-TP from its token threshold on,
  serial below. It runs one of those two steps, so it is not timed again: its time is that variant's.

The compiled variants compile per point, the token count static, as a torchtitan job compiles its
sequence length (``--shapes static``, the default). ``--shapes dynamic`` compiles once per model and phase
with the token count dynamic (``torch._dynamo.mark_dynamic``; ficco's pass bakes a token-range table into
each op); there the all-gathers' matmuls are not found either (on the CPU run only the reduce-scatters are
rewritten; the compile report lists what was).

Before timing, every variant's output (training: also the input gradient and every parameter's gradient
shard) is compared with ``serial``'s (relative Frobenius error, the largest over tensors and ranks), and one
step of each is profiled for the collectives and fused ops it ran (``ops``: the ficco variants list what
each ficco op ran, from the planner's table and the compile report, both read from
``executor.library.run_report()``). Communication share: the step's collectives (as serial runs them, same
shapes and count: per layer 2 all-gathers and 2 reduce-scatters forward, as many backward) timed alone,
over the serial step. Timing: ``runtime.timing.time_interleaved`` (interleaved shuffled rounds, ranks
aligned, the slowest rank's time, the median step). Results are written after each point; a run skips the
points its JSON already has (``--fresh`` starts over) and starts no point after ``--budget-s``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import re
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import REPO, plot_speedups, rerender, write_results
from benchmarks.step_timing import add_step_timing, check_step_timing, timing_settings
from ficco.harness.worker import SAFE_ENV

# NVLink multicast stays off in NCCL, PyTorch symmetric memory and NVSHMEM: set before torch loads them.
os.environ.update(SAFE_ENV)

import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel as torch_styles
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

import ficco.runtime.compile as ficco_compile
from benchmarks import llama
from benchmarks.block_bench import _gmean, _nothing, device_name, load_models, log, rel_err
from ficco import executor
from ficco.executor.ops import all_gather_single, reduce_scatter_single
from ficco.features import Scenario
from ficco.features.hardware import KNOWN_HARDWARE
from ficco.runtime import Planner, PredictorSource
from ficco.runtime import tp as ficco_styles
from ficco.runtime.graphs import GraphedCall
from ficco.runtime.timing import time_interleaved
from ficco.tables import markdown_table
from ficco.training.peer_rules import compute_capability, vllm_sp_min_tokens, vllm_sp_rule

MODELS = ("Llama-3.1-8B", "Llama-3.1-70B")
"""Model configs (``datasets/model_configs/<name>.json``) whose layers are measured."""
TOKENS = (256, 1024, 4096, 16384)
"""Token counts of a GPU run (``--tokens``: any even counts, e.g. every power of two from 256 to 16384; each
point compiles the two compiled variants, so the default keeps one run within 10 minutes)."""
CPU_TOKENS = (32, 64)
"""Token counts of ``--device cpu`` (the debug Llama)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Phase:
    """What a point of one phase runs."""

    mode: str
    """The execution mode the planners are asked about (``eager`` or ``graph``)."""
    backward: bool
    """Forward and backward (a training step), or the forward alone."""
    graphed: bool
    """Replayed from a CUDA graph (CPU: eager)."""


PHASES = {
    "inference": Phase(mode="graph", backward=False, graphed=True),
    "train": Phase(mode="eager", backward=True, graphed=False),
}
VARIANTS = ("serial", "async_tp", "ficco_eager", "ficco_compile", "vllm_rule")
"""The ``step_ms`` keys of a point."""
FICCO_VARIANTS = ("ficco_eager", "ficco_compile")
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
"""Largest relative error of a variant's output and gradients against ``serial``: fp32 as the parallel
styles' tests (``tests/runtime/test_tp.py``), bf16 as the GPU tests of the ops and the compile pass."""
COMM_HEAVY = 0.2
"""The issue's goals are computed over the points whose communication share reaches this."""
GOALS = {"vs_async_tp": 1.1, "vs_vllm_rule": 1.1, "vs_serial_min": 0.98}
"""Done when: ficco over async-TP and over vLLM's rule (geomean, communication-heavy points), and ficco over
serial at its worst point."""
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


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


# A group: one model and phase, its models and compiled variants ---------------------------------------------


@dataclass(kw_only=True)
class Group:
    """The variants of one (model, phase): built once, used at each of its token counts."""

    modules: dict[str, torch.nn.Module]
    """Variant -> the module whose call is its step (compiled variants: the compiled wrapper)."""
    params: dict[str, list[torch.Tensor]]
    """Variant -> its parameters, by name (the compiled variants share ``serial``'s)."""
    planners: dict[str, Planner]
    report: Any
    """The compile pass's report (``ficco.runtime.compile.CompileReport``)."""
    unavailable: dict[str, str]
    """Variant -> why it does not run here."""


def build_group(
    base: llama.TransformerBlocks, mesh, phase: Phase, ctx: RunContext, source: PredictorSource
) -> Group:
    """The four runnable variants of one model and phase (``vllm_rule`` runs one of them)."""
    torch._dynamo.reset()  # the previous group's compiled graphs go
    planners = {
        v: Planner(source, mode=phase.mode, hardware=ctx.planner_hardware, timeout_s=ctx.planner_timeout_s)
        for v in FICCO_VARIANTS
    }
    serial = parallelized(base, mesh, torch_styles)
    eager = parallelized(base, mesh, styles_with(planners["ficco_eager"]))
    report = ficco_compile.enable(planners["ficco_compile"])  # acts on the compiles that follow
    dynamic = None if ctx.shapes == "dynamic" else False
    modules: dict[str, torch.nn.Module] = {"serial": serial, "ficco_eager": eager}
    unavailable = {}
    if ctx.async_tp_reason is None:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(mesh.get_group().group_name)
        # PyTorch's pass alone: ficco's pass (installed above) would rewrite its fused ops into ficco's
        options = {"_micro_pipeline_tp": True, "post_grad_custom_post_pass": None}
        modules["async_tp"] = torch.compile(serial, dynamic=dynamic, options=options)
    else:
        unavailable["async_tp"] = ctx.async_tp_reason
    modules["ficco_compile"] = torch.compile(serial, dynamic=dynamic)
    params = {v: [p for _, p in sorted(m.named_parameters())] for v, m in modules.items()}
    return Group(modules=modules, params=params, planners=planners, report=report, unavailable=unavailable)


@dataclass(kw_only=True)
class RunContext:
    """What every point of a run shares."""

    device: torch.device
    dtype: torch.dtype
    world_size: int
    graphs: bool
    """Inference replays CUDA graphs (a GPU run, loopback included)."""
    shapes: str
    """``dynamic`` or ``static`` token count in the compiled variants."""
    planner_hardware: str
    planner_timeout_s: float
    async_tp_reason: str | None
    """Why PyTorch's async-TP cannot run here; None where it can."""
    hardware: str
    """This machine's hardware id (``h200x2``), or ``cpu``."""
    batch: int
    """Sequences per step (the token count's split)."""
    timing: dict[str, Any]


# One point --------------------------------------------------------------------------------------------------


def run_point(
    model: str, phase_name: str, tokens: int, group: Group, cfg_dim: int, n_layers: int, ctx
) -> dict:
    """Check, profile and time every variant of ``group`` at ``tokens``: the point's JSON entry."""
    phase, w, device = PHASES[phase_name], ctx.world_size, ctx.device
    gen = torch.Generator(device=device).manual_seed(1000 + dist.get_rank())
    shape = (ctx.batch, tokens // (ctx.batch * w), cfg_dim)
    x = torch.randn(shape, generator=gen, device=device).to(ctx.dtype)
    g = torch.randn(shape, generator=gen, device=device).to(ctx.dtype)
    if ctx.shapes == "dynamic":
        torch._dynamo.mark_dynamic(x, 1)
    if phase.backward:
        x.requires_grad_()

    def make_step(name: str) -> Callable[[], torch.Tensor]:
        module, params = group.modules[name], group.params[name]
        if not phase.backward:
            return torch.no_grad()(lambda: module(x))

        def step() -> torch.Tensor:
            x.grad = None
            for p in params:
                p.grad = None
            y = module(x)
            y.backward(g)
            return y

        return step

    def outputs(name: str, y: torch.Tensor) -> list[torch.Tensor]:
        if not phase.backward:
            return [y.detach().clone()]
        return [y.detach().clone(), x.grad.clone(), *(local(p.grad).clone() for p in group.params[name])]

    steps = {name: make_step(name) for name in group.modules}
    steps["comm_only"] = collectives_step(tokens, cfg_dim, n_layers, phase.backward, ctx)
    errors, failures, ops, runnable, reference = {}, {}, {}, {}, None
    for name, step in steps.items():
        try:
            y = step()  # compiles a compiled variant; a ficco planner decides this shape's ops
            if name != "comm_only":
                ops[name] = {"calls": profiled_calls(step), **ran_ops(name, group, tokens)}
            call = GraphedCall(step) if phase.graphed and ctx.graphs else step
            if call is not step:
                y = call()
            if name == "serial":
                reference = outputs(name, y)
            elif name != "comm_only" and reference is not None:
                got = outputs(name, y)
                errors[name] = max(rel_err(a, b) for a, b in zip(got, reference, strict=True))
            del y
            runnable[name] = (_nothing, call)
        except Exception as err:  # the same on every rank (a compile or capture that fails): recorded
            failures[name] = f"{type(err).__name__}: {str(err)[:400]}"
    times, host = time_interleaved(runnable, device=device, **ctx.timing)
    runnable.clear()
    return make_point(model, phase_name, tokens, times, host, errors, failures, ops, group, ctx)


def collectives_step(tokens: int, dim: int, n_layers: int, backward: bool, ctx) -> Callable[[], None]:
    """The step's collectives alone, as serial runs them: per layer and direction, 2 all-gathers of the
    ``[T/w, dim]`` shard and 2 reduce-scatters of ``[T, dim]`` (CUDA: replayed from a graph in inference)."""
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


def ran_ops(name: str, group: Group, tokens: int) -> dict[str, Any]:
    """What each ficco op of a ficco variant ran at ``tokens`` (its planner's table, or the compile report
    with each op's run at this token count); nothing for the others."""
    if name == "ficco_eager":
        rows = group.planners[name].rows()
        return {"ran": [r for r in rows if f" m={tokens} " in f" {r['shape']} "]}
    if name == "ficco_compile":
        report = group.report
        ran = []
        for rw in report.rewritten:
            for r in report.ran(rw):
                if r.m == tokens:
                    ran.append(
                        {
                            "direction": rw.direction,
                            "op": rw.op,
                            "layers": ",".join(rw.layers),
                            "shape": f"m={r.m} n={r.n} k={r.k}",
                            "schedule": rw.schedule,
                            "ran": r.ran,
                            "note": r.reason or "",
                        }
                    )
        left = [{"op": x.op, "layers": ",".join(x.layers), "reason": x.reason} for x in report.left]
        return {"ran": ran, "rewritten": len(report.rewritten), "left": left}
    return {}


def vllm_choice(cfg_dim: int, tokens: int, ctx) -> str:
    """The variant vLLM's rule runs at ``tokens``: ``async_tp`` where its threshold admits every op of the
    block (all read the model width), else ``serial``."""
    hardware = KNOWN_HARDWARE.get(ctx.hardware)
    if hardware is None:  # the CPU, an unknown GPU: no compute capability vLLM's rule admits
        return "serial"
    w = ctx.world_size
    common = {"m": tokens, "dtype": "bf16", "world_size": w, "hardware": hardware}
    scenarios = (
        Scenario(op="ag_gemm", n=cfg_dim // w, k=cfg_dim, **common),
        Scenario(op="gemm_rs", n=cfg_dim, k=cfg_dim // w, **common),
    )
    return "async_tp" if bool(vllm_sp_rule(scenarios).all()) else "serial"


def make_point(model, phase, tokens, times, host, errors, failures, ops, group, ctx) -> dict:
    """One ``points`` entry (ms)."""
    step_ms = {v: times.get(v) for v in VARIANTS if v != "vllm_rule"}
    choice = vllm_choice(group_dim(group), tokens, ctx)
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
        "host_ms": host,
        "rel_err": errors,
        "errors": failures,
        "unavailable": group.unavailable,
        "ops": ops,
    }


def group_dim(group: Group) -> int:
    """The model width of ``group``'s layers."""
    return group.modules["serial"].layers["0"].attention_norm.weight.shape[0]


# The run ----------------------------------------------------------------------------------------------------


def hardware_id(device: torch.device, world_size: int) -> str:
    """This machine's hardware id: the built-in profile of its GPU model at ``world_size`` GPUs
    (``h200x2``, ``h100x2``), else the GPU's name as a slug with ``x<world_size>``; ``cpu`` on the CPU."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    for profile in KNOWN_HARDWARE.values():
        if profile.gpu_count == world_size and profile.gpu_name.split()[1] in name.split():
            return profile.id
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia ")).strip("-")
    return f"{slug}x{world_size}"


def planner_source(hardware: str) -> tuple[PredictorSource, str]:
    """The local model of ``hardware``, else the shipped ``h200x2`` model (and which one it is)."""
    from ficco.training.registry import ModelLoadError

    try:
        source = PredictorSource.load(hardware_id=hardware)
    except ModelLoadError:  # no model for this hardware in the registry
        source = PredictorSource.load(hardware_id="h200x2")
    return source, source.hardware_id or "h200x2"


def output_path(out: Path, ctx: RunContext, loopback: bool) -> Path:
    return out / f"runtimes-{ctx.hardware}{'-loopback' if loopback else ''}.json"


def load_previous(path: Path, meta: dict, fresh: bool) -> dict | None:
    """The results of an earlier run of the same configuration at ``path`` (to resume), else None."""
    if fresh or not path.exists():
        return None
    previous = json.loads(path.read_text())
    same = ("hardware", "loopback", "dtype", "layers", "batch", "shapes", "world_size")
    if any(previous.get("meta", {}).get(k) != meta[k] for k in same):
        return None
    return previous


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.render:
        rerender(args.render, markdown, plot)
        return None
    if args.loopback:
        from ficco.harness.loopback import loopback_world

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
    hardware = hardware_id(device, w)
    source, planner_hw = planner_source(hardware if not cpu else "h200x2")
    if cpu:
        models = {"debug": None}
        tokens = args.tokens or CPU_TOKENS
    else:
        models = load_models(tuple(args.models))
        tokens = args.tokens or TOKENS
    async_tp_reason = None
    if cpu:
        async_tp_reason = "PyTorch's async-TP needs CUDA symmetric memory"
    elif args.loopback:
        async_tp_reason = "PyTorch's async-TP needs symmetric memory over real peers (loopback world)"
    ctx = RunContext(
        device=device,
        dtype=torch.float32 if cpu else torch.bfloat16,
        world_size=w,
        graphs=not cpu,
        shapes=args.shapes,
        planner_hardware=planner_hw,
        planner_timeout_s=args.planner_timeout_s,
        async_tp_reason=async_tp_reason,
        hardware=hardware,
        batch=args.batch,
        timing=timing_settings(args),
    )
    # --shapes static: a cache entry per token count and compiled variant (torch < 2.7: cache_size_limit)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 64)
    meta = {
        "hardware": hardware,
        "device": device_name(device),
        "loopback": args.loopback,
        "world_size": w,
        "dtype": "fp32" if cpu else "bf16",
        "layers": args.layers,
        "batch": args.batch,
        "shapes": args.shapes,
        "planner": source.origin,
        "planner_hardware": planner_hw,
        "torch": torch.__version__,
        "timing": ctx.timing,
        "comm_share": "the step's collectives timed alone (as serial runs them) over the serial step",
        "vllm_min_tokens": {
            name: vllm_sp_min_tokens(cfg.hidden_size, w, 2, compute_capability(KNOWN_HARDWARE[hardware]))
            for name, cfg in models.items()
            if cfg is not None and hardware in KNOWN_HARDWARE
        },
    }
    path = output_path(args.out, ctx, args.loopback)
    result = load_previous(path, meta, args.fresh) or {"points": [], "compile_reports": {}}
    result["meta"], result["skipped"] = meta, []
    done = {(p["model"], p["phase"], p["tokens"]) for p in result["points"]}
    mesh = init_device_mesh(device.type, (w,))
    for name, cfg in models.items():
        args_ = (
            llama.LlamaArgs(n_layers=args.layers, max_seq_len=max(tokens))
            if cfg is None
            else llama.LlamaArgs.from_config(cfg, n_layers=args.layers, max_seq_len=max(tokens))
        )
        base = None
        for phase_name in args.phases:
            todo = [t for t in tokens if (name, phase_name, t) not in done]
            if not todo:
                continue
            if base is None:
                torch.manual_seed(0)  # the same weights on every rank
                with torch.device(device):
                    base = llama.TransformerBlocks(args_, tp_degree=w)
                base.layers.to(ctx.dtype)  # the rotary frequencies stay complex64
            group = None
            for t in todo:
                if time.monotonic() - started > args.budget_s:
                    result["skipped"].append({"model": name, "phase": phase_name, "tokens": t})
                    continue
                group = group or build_group(base, mesh, PHASES[phase_name], ctx, source)
                point = run_point(name, phase_name, t, group, args_.dim, args.layers, ctx)
                result["points"].append(point)
                log(rank0, point_line(point))
                result["compile_reports"][f"{name}/{phase_name}"] = group.report.rows()
                if rank0:
                    write_results(result, path, markdown, plot)
            del group
            executor.clear_buffers()
        del base
    ficco_compile.disable()
    result["summary"] = summarize(result["points"], meta["dtype"], loopback=args.loopback)
    meta["wall_s"] = time.monotonic() - started
    if rank0:
        write_results(result, path, markdown, plot)
        print(json.dumps(result["summary"], indent=1), flush=True)
    return result


def point_line(p: dict) -> str:
    ms = "  ".join(f"{k}={v:.3f}" for k, v in p["step_ms"].items() if v is not None)
    comm = "-" if p["comm_share"] is None else f"{p['comm_share']:.0%}"
    failed = f"  FAILED {p['errors']}" if p["errors"] else ""
    return f"{p['model']} {p['phase']} T={p['tokens']}: comm {comm}  {ms}{failed}"


# Results ----------------------------------------------------------------------------------------------------


def ficco_choice(points: list[dict]) -> dict[tuple[str, str], str]:
    """Per (model, phase): the ficco variant a user would configure for that job, the one of lower geomean
    step time over the points where both ran (one of them where only one ran)."""
    out = {}
    for key in {(p["model"], p["phase"]) for p in points}:
        mine = [p for p in points if (p["model"], p["phase"]) == key]
        both = [p for p in mine if all(p["step_ms"].get(v) for v in FICCO_VARIANTS)]
        if both:
            gm = {v: _gmean([p["step_ms"][v] for p in both]) for v in FICCO_VARIANTS}
            out[key] = min(gm, key=gm.get)
        else:
            ran = [v for v in FICCO_VARIANTS if any(p["step_ms"].get(v) for p in mine)]
            if ran:
                out[key] = ran[0]
    return out


def summarize(points: list[dict], dtype_name: str, *, loopback: bool = False) -> dict:
    """The issue's done-when numbers: ficco (per model and phase, its faster variant) over async-TP and over
    vLLM's rule, geomean over the communication-heavy points; ficco over serial at its worst point; each
    ficco variant's alone; and whether every ficco variant gave serial's outputs and gradients."""
    choice = ficco_choice(points)

    def ficco(p: dict) -> float | None:
        v = choice.get((p["model"], p["phase"]))
        return p["step_ms"].get(v) if v else None

    def ratios(other: str, pts: list[dict], mine: Callable[[dict], float | None]) -> list[float]:
        return [p["step_ms"][other] / mine(p) for p in pts if p["step_ms"].get(other) and mine(p)]

    heavy = [p for p in points if (p["comm_share"] or 0.0) >= COMM_HEAVY]
    by_variant = {
        v: {
            "vs_async_tp": _gmean(ratios("async_tp", heavy, lambda p, v=v: p["step_ms"].get(v))),
            "vs_vllm_rule": _gmean(ratios("vllm_rule", heavy, lambda p, v=v: p["step_ms"].get(v))),
            "vs_serial_min": min(ratios("serial", points, lambda p, v=v: p["step_ms"].get(v)), default=None),
        }
        for v in FICCO_VARIANTS
    }
    goals = {
        "vs_async_tp": _gmean(ratios("async_tp", heavy, ficco)),
        "vs_vllm_rule": _gmean(ratios("vllm_rule", heavy, ficco)),
        "vs_serial_min": min(ratios("serial", points, ficco), default=None),
    }
    errors = [p["rel_err"].get(v) for p in points for v in FICCO_VARIANTS]
    checked = [e for e in errors if e is not None]
    failed = sum(1 for p in points for v in FICCO_VARIANTS if v in p["errors"])
    grads_ok = (
        None if loopback or not checked else all(e <= TOLERANCE[dtype_name] for e in checked) and not failed
    )
    met = {k: None if loopback or goals[k] is None else goals[k] >= target for k, target in GOALS.items()}
    return {
        "comm_heavy_points": len(heavy),
        "points": len(points),
        "ficco_choice": {f"{m}/{ph}": v for (m, ph), v in sorted(choice.items())},
        "goals": goals,
        "goals_met": {**met, "gradients": grads_ok},
        "by_variant": by_variant,
        "max_rel_err": {
            v: max((p["rel_err"][v] for p in points if p["rel_err"].get(v) is not None), default=None)
            for v in ("async_tp", *FICCO_VARIANTS)
        },
        "tolerance": TOLERANCE[dtype_name],
        "failed_runs": sum(len(p["errors"]) for p in points),
    }


def markdown(result: dict) -> str:
    """Step times per point (ms), speedups, the done-when numbers, and what ran."""
    meta = result["meta"]
    summary = result.get("summary") or summarize(result["points"], meta["dtype"], loopback=meta["loopback"])
    choice = {tuple(k.split("/")): v for k, v in summary["ficco_choice"].items()}

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def x(a: float | None, b: float | None) -> str:
        return "-" if not a or not b else f"{a / b:.2f}x"

    header = ["model", "phase", "tokens", "comm share", "serial", "async-TP", "ficco eager", "ficco compile",
              "vLLM rule (runs)", "ficco vs serial", "vs async-TP", "vs vLLM", "max rel. err"]  # fmt: skip
    rows = []
    for p in result["points"]:
        s = p["step_ms"]
        f = s.get(choice.get((p["model"], p["phase"]), ""))
        errs = [e for e in p["rel_err"].values() if e is not None]
        rows.append(
            [
                p["model"],
                p["phase"],
                str(p["tokens"]),
                "-" if p["comm_share"] is None else f"{p['comm_share']:.0%}",
                *(ms(s.get(v)) for v in VARIANTS[:4]),
                f"{ms(s.get('vllm_rule'))} ({p['vllm_rule_runs']})",
                x(s.get("serial"), f),
                x(s.get("async_tp"), f),
                x(s.get("vllm_rule"), f),
                "-" if not errs else f"{max(errs):.1e}",
            ]
        )
    lines = [
        f"# Llama 3 layers at TP={meta['world_size']} under the runtimes: step time, ms ({meta['hardware']})",
        "",
    ]
    if meta["hardware"] == "cpu":
        lines += ["**CPU (gloo), a debug-size Llama: a check of the plumbing, not a GPU result.**", ""]
    if meta.get("loopback"):
        lines += [
            "**Loopback world: one process (one GPU) as rank 0 of a pretend world of 2. No communication is"
            " measured (every collective returns at once) and no peer's data arrives: these times show the"
            " plumbing and the host time, not overlap results; the errors against serial are not checks.**",
            "",
        ]
    lines += [
        f"{meta['layers']} decoder layer(s) of torchtitan's Llama 3, {meta['dtype']}, sequence parallel,"
        f" {meta['batch']} sequences per step;"
        f" {meta['device']}, torch {meta['torch']}; compiled token count: {meta['shapes']}. Planner:"
        f" {meta['planner']}. Step time: median, slowest rank. Comm share: {meta['comm_share']}. ficco:"
        " per model and phase, the faster of its eager styles and its compile pass (summary: `ficco_choice`);"
        " the last three columns are speedups of ficco. vLLM's rule runs async-TP or serial (in brackets).",
        "",
        markdown_table(header, rows),
        "",
        "## Done when (issue 41)",
        "",
        f"Over the {summary['comm_heavy_points']} points with comm share >= {COMM_HEAVY:.0%}:",
        "",
    ]
    for k, target in GOALS.items():
        v, met = summary["goals"][k], summary["goals_met"][k]
        shown = "-" if v is None else f"{v:.3f}x"
        lines.append(f"- ficco {k}: {shown} (goal >= {target}x; met: {met})")
    lines.append(
        "- every ficco variant gives serial's outputs and gradients (relative error <="
        f" {summary['tolerance']}):"
        f" {summary['goals_met']['gradients']}; largest: {json.dumps(summary['max_rel_err'])}"
    )
    lines += ["", "Each ficco variant alone:", ""]
    lines += [f"- {v}: {json.dumps(n)}" for v, n in summary["by_variant"].items()]
    failures = [(p["model"], p["phase"], p["tokens"], p["errors"]) for p in result["points"] if p["errors"]]
    unavailable = {v: r for p in result["points"] for v, r in p["unavailable"].items()}
    lines += ["", f"Not run here: {unavailable or 'none'}. Failed: {failures or 'none'}."]
    lines += [f"Skipped (budget): {result.get('skipped') or 'none'}.", ""]
    lines += ["## What ran (one profiled step per variant, first and last point of each model and phase)", ""]
    for p in _first_and_last(result["points"]):
        calls = {v: o.get("calls") for v, o in p["ops"].items()}
        lines.append(f"- {p['model']} {p['phase']} T={p['tokens']}: {json.dumps(calls)}")
        for v in FICCO_VARIANTS:
            ran = Counter(
                f"{r.get('op', r.get('shape', '').split()[0])} {r['ran']}"
                for r in p["ops"].get(v, {}).get("ran", [])
            )
            if ran:
                lines.append(f"  - {v} ran: {dict(ran)}")
    return "\n".join(lines) + "\n"


def _first_and_last(points: list[dict]) -> list[dict]:
    keys: dict[tuple, list[dict]] = {}
    for p in points:
        keys.setdefault((p["model"], p["phase"]), []).append(p)
    out = []
    for pts in keys.values():
        pts = sorted(pts, key=lambda p: p["tokens"])
        out += [pts[0]] if len(pts) == 1 else [pts[0], pts[-1]]
    return out


def plot(result: dict, path: Path) -> None:
    """Speedup over serial against tokens, one panel per phase; a colour per variant, a style per model."""
    loopback = " - loopback, not overlap" if result["meta"]["loopback"] else ""

    def title(phase: str) -> str:
        how = "forward + backward, eager" if PHASES[phase].backward else "forward, CUDA graph"
        return f"{phase} ({how}){loopback}"

    plot_speedups(result["points"], path, phases=list(PHASES), variants=VARIANTS[1:], title=title)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="results folder")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, the debug Llama")
    p.add_argument("--loopback", action="store_true", help="one process as rank 0 of a pretend world of 2")
    p.add_argument("--models", nargs="+", default=list(MODELS), help="model configs (GPU runs)")
    p.add_argument("--phases", nargs="+", choices=tuple(PHASES), default=list(PHASES))
    p.add_argument("--tokens", type=int, nargs="+", help=f"token counts (default {TOKENS}; cpu {CPU_TOKENS})")
    p.add_argument("--layers", type=int, default=1, help="decoder layers in the step")
    p.add_argument("--batch", type=int, default=2, help="sequences the tokens are split into")
    p.add_argument("--shapes", choices=("static", "dynamic"), default="static", help="compiled token count")
    add_step_timing(p, warmup=2, rounds=3, reps=3, timed_ms=150.0, max_rounds=20)
    p.add_argument("--budget-s", type=float, default=480.0, help="no point starts after this many seconds")
    p.add_argument("--planner-timeout-s", type=float, default=5.0, help="the planners' bound per call")
    p.add_argument("--fresh", action="store_true", help="ignore the points of an earlier run in --out")
    p.add_argument("--render", type=Path, help="re-render the markdown and plot of a JSON and exit")
    args = p.parse_args(argv)
    check_step_timing(p, args, "layers", "batch")
    if args.tokens and any(t % (2 * args.batch) or t < 4 * args.batch for t in args.tokens):
        p.error(
            f"--tokens must be multiples of 2 x --batch ({2 * args.batch}), >= 2 per sequence and rank; "
            f"got {args.tokens}"
        )
    unknown = [m for m in args.models if not (REPO / "datasets" / "model_configs" / f"{m}.json").exists()]
    if unknown:
        p.error(f"--models: no config for {unknown} under datasets/model_configs")
    return args


if __name__ == "__main__":
    main()
