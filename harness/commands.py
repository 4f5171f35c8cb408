"""``ficco bench``: measure (or simulate) every candidate schedule of every planned scenario.

    ficco bench --out datasets/h200x2 --remeasure 64          # all local GPUs through torchrun
    ficco bench --out datasets/h200x2 --resume                # continue after a crash or Ctrl-C
    ficco bench --out datasets/h200x2-moe --include-moe       # the MoE configs' all-to-all pairs too
    ficco bench --backend sim --out /tmp/sim --include-moe    # no GPU: the analytic model
    ficco bench --backend sim --hardware h100x8 --tp 8 --calibrate-from datasets/h200x2 --out /tmp/h100
    ficco bench --card-only --out datasets/h200x2             # rewrite card.md and the plots
    ficco bench --tp 8 --out /shared/h100x8 --shard 2/16      # one shard (docs/fleet.md)
    ficco bench --tp 8 --out /shared/h100x8 --ray auto        # every shard on Ray, then gathered
    ficco bench --tp 8 --out /shared/h100x8 --emit slurm --shards 16   # a job array script
    ficco dataset gather /shared/h100x8/shards --out /shared/h100x8    # the shards into one dataset

Heavy imports (torch, pandas, matplotlib) happen inside the command.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ficco.errors import FAILURE, fail, fail_on_value_error
from ficco.features import DEFAULT_HARDWARE_ID, OPS
from ficco.harness.backend import BLOCK_MS, MAX_ROUNDS, ROUNDS, TIMED_MS, Timing
from ficco.harness.cpu_placement import DEFAULT_PIN, PinPolicy
from ficco.harness.emit import Engine
from ficco.harness.launch import (
    REPO_ROOT,
    BenchBackend,
    WorkerSettings,
    build_plan,
    check_tp,
    hardware_profile,
    parse_tokens,
    run_torchrun,
    sweep_complete,
)
from ficco.harness.plan import DEFAULT_GRID, DEFAULT_MAX_SERIAL_MS, DEFAULT_TOKENS

if TYPE_CHECKING:
    from ficco.features import HardwareProfile
    from ficco.harness.plan import Plan
    from ficco.harness.shards import Shard

log = logging.getLogger(__name__)


BENCH_HELP = (
    "Measure every candidate schedule of every planned scenario and write the labelled dataset.\n\n"
    "The plan: each model config in --configs expanded into the pairs of one layer (QKV and MLP up as "
    "all-gather -> GEMM, attention out and MLP down as GEMM -> reduce-scatter; with --include-moe, an MoE "
    "layer's dispatch and combine as all-to-all -> expert GEMMs and back) for every --tokens value, "
    "plus --grid log-uniform shapes between the models. The simulated GPU time of the sweep is printed "
    "first. The sweep resumes after a crash (--resume) and ends by writing card.md and the plots."
)


def _modes(value: str | None, backend: BenchBackend) -> tuple[str, ...]:
    """The execution modes of ``--modes``: a non-empty subset of ``MODES`` (gloo: ``eager`` only)."""
    from ficco.features import MODES

    if value is None:
        return ("eager",) if backend is BenchBackend.gloo else MODES
    modes = tuple(m.strip() for m in value.split(",") if m.strip())
    allowed = ("eager",) if backend is BenchBackend.gloo else MODES
    if not modes or any(m not in allowed for m in modes):
        raise fail(
            f"--modes must be comma-separated values of {list(allowed)} with --backend {backend}; "
            f"got {value!r}"
        )
    return tuple(m for m in MODES if m in modes)


def bench(
    ctx: typer.Context,
    backend: Annotated[
        BenchBackend,
        typer.Option(
            help="gpu: every local GPU through torchrun (NCCL + copy engines); gloo: CPU processes "
            "through torchrun (checks the pipeline, times mean nothing); sim: the analytic model."
        ),
    ] = BenchBackend.gpu,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Dataset directory. Default: datasets/<hardware> (gpu), datasets/<hardware>-sim, "
            "datasets/<hardware>-gloo, in the checkout (installed: in ~/.local/share/ficco)."
        ),
    ] = None,
    configs: Annotated[
        Path, typer.Option(help="Directory of Hugging Face config.json files, one per model family.")
    ] = REPO_ROOT / "datasets" / "model_configs",
    tp: Annotated[
        int,
        typer.Option(
            help="Tensor-parallel degree = world size of every scenario: 2 to the --hardware's GPU count "
            "(at most 8)."
        ),
    ] = 2,
    tokens: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated token counts per layer call, each a multiple of --tp. Default: "
            f"{','.join(map(str, DEFAULT_TOKENS))}, each rounded up to a multiple of --tp."
        ),
    ] = None,
    grid: Annotated[
        int, typer.Option(min=0, max=100_000, help="Log-uniform grid scenarios added between the models.")
    ] = DEFAULT_GRID,
    max_serial_ms: Annotated[
        float,
        typer.Option(help="Leave out model scenarios whose simulated serial time exceeds this (ms, > 0)."),
    ] = DEFAULT_MAX_SERIAL_MS,
    hardware: Annotated[
        str,
        typer.Option(
            help="Hardware profile id (h200x2, h100x8, or a custom one registered before) or a "
            "HardwareProfile JSON file, which registers its id for every command."
        ),
    ] = DEFAULT_HARDWARE_ID,
    include_moe: Annotated[
        bool,
        typer.Option(
            "--include-moe",
            help="Add the expert-parallel pairs of the MoE configs: all-to-all -> expert GEMMs (a2a_gemm) "
            "and expert GEMMs -> all-to-all (gemm_a2a), at balanced routing.",
        ),
    ] = False,
    ops: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated ops to keep (default: every op; ag_gemm, gemm_rs, a2a_gemm, gemm_a2a), "
            "e.g. a2a_gemm,gemm_a2a with --include-moe for MoE rows only."
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the dataset in --out (skips finished scenarios).")
    ] = False,
    remeasure: Annotated[
        int,
        typer.Option(
            min=0,
            max=100_000,
            help="After the sweep, measure this many finished scenarios again into noise.parquet, in a "
            "separate process and a shuffled order (the card's noise numbers; >= 64 for a dataset).",
        ),
    ] = 0,
    nproc: Annotated[
        int | None, typer.Option(help="Processes for gpu/gloo (default: detected GPUs, or --tp for gloo).")
    ] = None,
    modes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated execution modes to time: eager (calls launched from Python) and graph "
            "(replayed from a CUDA graph; not on gloo). Default: eager,graph (gpu, sim), eager (gloo)."
        ),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            max=100,
            help="Fewest interleaved rounds per scenario and mode (gpu/gloo); >= 5 for a dataset.",
        ),
    ] = ROUNDS,
    max_rounds: Annotated[
        int,
        typer.Option(
            min=1,
            max=1000,
            help="Most rounds per scenario and mode (gpu/gloo): cheap scenarios get more rounds, up to this, "
            "while their timed work stays under --timed-ms.",
        ),
    ] = MAX_ROUNDS,
    block_ms: Annotated[
        float,
        typer.Option(min=0.05, max=100.0, help="Target ms of one timed block of serial calls (gpu/gloo)."),
    ] = BLOCK_MS,
    timed_ms: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1e6,
            help="Target timed ms per scenario and mode (gpu/gloo): sets the rounds between --rounds and "
            "--max-rounds from the first round's length; eager mode gets 3x this, for its 10th-percentile "
            "labels (0: always --rounds).",
        ),
    ] = TIMED_MS,
    pin: Annotated[
        PinPolicy,
        typer.Option(
            help="Where each rank's threads run (gpu/gloo; harness.cpu_placement): none (the kernel "
            "decides), share (each rank an equal, disjoint share of the CPUs' physical cores; every committed "
            "dataset was measured so).",
        ),
    ] = DEFAULT_PIN,
    seed: Annotated[int, typer.Option(help="Seed of the grid and of the sim noise.")] = 0,
    noise: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Sim only: log-normal noise on every time.")
    ] = 0.0,
    calibrate_from: Annotated[
        Path | None,
        typer.Option(help="Sim only: refit the model's constants to this measured dataset first."),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=0, max=10_000_000, help="Measure only the first N planned scenarios (0: all).")
    ] = 0,
    sample: Annotated[
        int,
        typer.Option(
            min=0,
            max=10_000_000,
            help="Measure only N planned scenarios spread evenly over the plan (0: all): a quick check of "
            "a machine or a protocol, e.g. --sample 48 --remeasure 48 for its run-to-run noise.",
        ),
    ] = 0,
    flush_seconds: Annotated[
        float,
        typer.Option(min=0.0, max=3600.0, help="Seconds between dataset writes (what a crash can lose)."),
    ] = 10.0,
    time_budget: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1e6,
            help="Minutes after which no new scenario starts (0: no limit); the dataset stays consistent "
            "and the same command with --resume continues it. The re-measure runs only once the sweep is "
            "complete.",
        ),
    ] = 0.0,
    shard: Annotated[
        str | None,
        typer.Option(
            help="Measure only shard I/N of the plan (0 <= I < N; balanced by estimated GPU time) into "
            "OUT/shards/shard-I-of-N, resuming it if started; default: from SLURM_ARRAY_TASK_ID and "
            "SLURM_ARRAY_TASK_COUNT, or JOB_COMPLETION_INDEX and FICCO_SHARD_COUNT, when set. "
            "`ficco dataset gather OUT/shards --out OUT` unions the shards.",
            rich_help_panel="Fleet",
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS",
            help="Run every shard as a Ray task on the cluster at ADDRESS (auto: the running one; local: "
            "start one here), each in a placement group of one node, retried and resumed when it fails, "
            "then gather them into --out (needs ficco\\[fleet]).",
            rich_help_panel="Fleet",
        ),
    ] = None,
    emit: Annotated[
        Engine | None,
        typer.Option(
            help="Write the job that runs the shards on a cluster scheduler into OUT/shards/ (slurm: a job "
            "array script; k8s: an indexed Job manifest) and print the gather command to run after.",
            rich_help_panel="Fleet",
        ),
    ] = None,
    shards: Annotated[
        int,
        typer.Option(
            min=0,
            max=100_000,
            help="Shards of --ray and --emit (0: --ray, one per node that fits; --emit needs a count).",
            rich_help_panel="Fleet",
        ),
    ] = 0,
    share_nodes: Annotated[
        bool,
        typer.Option(
            "--share-nodes",
            help="Let shards of --ray/--emit share a GPU node (--tp GPUs each) instead of holding it whole: "
            "faster, but co-tenants share NVLink and host, which disturbs overlap timing (the card says so).",
            rich_help_panel="Fleet",
        ),
    ] = False,
    max_retries: Annotated[
        int,
        typer.Option(
            min=0, max=100, help="Retries of a failed shard (--ray, --emit k8s).", rich_help_panel="Fleet"
        ),
    ] = 3,
    image: Annotated[
        str,
        typer.Option(
            help="Container image of --emit k8s (ficco with a CUDA torch).", rich_help_panel="Fleet"
        ),
    ] = "ficco-bench:latest",
    card_only: Annotated[
        bool, typer.Option("--card-only", help="Only rewrite card.md and the plots of --out, then stop.")
    ] = False,
    relabel: Annotated[
        bool,
        typer.Option(
            "--relabel",
            help="With --card-only: first recompute in_best_set of every row from its stored rounds under "
            "the current label rule (eager: 10th percentile, graph: median), rewriting files that change.",
        ),
    ] = False,
) -> None:
    """Measure every candidate schedule of every scenario of the plan and write the labelled dataset
    (help text: ``BENCH_HELP``)."""
    hw = hardware_profile(hardware)
    suffix = {"gpu": "", "gloo": "-gloo", "sim": "-sim"}[backend.value]
    from ficco.files import work_root

    out = out or work_root() / "datasets" / f"{hw.id}{suffix}"
    if relabel and not card_only:
        raise fail("--relabel goes with --card-only (it rewrites the labels of an existing dataset)")
    if card_only:
        if relabel:
            _relabel(out)
        _write_card(out)
        return
    _check_options(backend, max_serial_ms=max_serial_ms, noise=noise)
    check_tp(tp, hw)
    if max_rounds < rounds:
        raise fail(f"--max-rounds must be >= --rounds={rounds}; got {max_rounds}")
    settings = WorkerSettings(
        modes=_modes(modes, backend),
        timing=Timing(rounds=rounds, max_rounds=max_rounds, block_ms=block_ms, timed_ms=timed_ms),
        remeasure=remeasure,
        flush_seconds=flush_seconds,
        deadline=time.time() + 60 * time_budget if time_budget else None,
        pin=pin.value,
    )
    plan = build_plan(
        configs,
        hw,
        tp=tp,
        tokens=parse_tokens(tokens, tp, DEFAULT_TOKENS),
        grid=grid,
        max_serial_ms=max_serial_ms,
        include_moe=include_moe,
        seed=seed,
        ops=[op.strip() for op in ops.split(",") if op.strip()] if ops else OPS,
        limit=limit,
        sample=sample,
    )
    if ray is not None or emit is not None:
        if shard is not None:
            raise fail("--shard runs one shard here; --ray and --emit run every shard (drop --shard)")
        _run_fleet(
            ctx, plan, out.resolve(), ray=ray, emit=emit, shards=shards, share_nodes=share_nodes,
            max_retries=max_retries, image=image, backend=backend, tp=tp,
        )  # fmt: skip
        return
    part = _shard(shard)
    if part is not None:
        plan, out, settings = _shard_run(plan, part, out, hw, settings)
        resume = True  # a shard's directory is always resumed
    _check_fresh_or_resume(out, resume)
    if resume:
        _check_same_plan_settings(out, plan)

    from ficco.harness.plan import estimate_sweep

    estimate = estimate_sweep(
        plan, hw, modes=settings.modes, timing=settings.timing, remeasure=settings.remeasure
    )
    plan = dataclasses.replace(
        plan, settings={**plan.settings, "estimated_minutes": round(estimate.seconds / 60, 2)}
    )
    typer.echo(
        f"plan: {len(plan)} scenarios from {len(plan.families)} "
        f"{'family' if len(plan.families) == 1 else 'families'} ({', '.join(plan.families)}); "
        f"{len(plan.dropped)} model scenarios over {max_serial_ms} ms left out",
        err=True,
    )
    typer.echo(f"GPU sweep estimate on {hw.id}: {estimate.summary()}", err=True)
    if backend is BenchBackend.sim:
        _run_sim(plan, out, seed=seed, noise=noise, calibrate_from=calibrate_from, settings=settings)
    else:
        run_torchrun(plan, out, backend=backend, tp=tp, nproc=nproc, settings=settings)
    if part is None:
        _write_card(out)
    else:
        from ficco.harness.emit import gather_command

        typer.echo(f"shard {part}: {out}; once every shard is done: {gather_command(out.parents[1])}")


def _shard(value: str | None) -> Shard | None:
    """The shard of ``--shard``, else of the job array environment (``harness.shards.shard_from_env``)."""
    import os

    from ficco.harness.shards import Shard, shard_from_env

    try:
        return Shard.parse(value) if value is not None else shard_from_env(os.environ)
    except ValueError as err:
        raise fail(f"--shard: {err}") from None


def _shard_run(
    plan: Plan, part: Shard, out: Path, hw: HardwareProfile, settings: WorkerSettings
) -> tuple[Plan, Path, WorkerSettings]:
    """``(plan, out, settings)`` of shard ``part``: its part of the plan, its directory (always resumed;
    refused if it holds another plan's shard), the settings with its share of the re-measure; records the
    run."""
    from ficco.features.dataset import PLAN, read_manifest
    from ficco.harness.plan import scenario_seconds
    from ficco.harness.shards import plan_hash, record_run, shard_dir, shard_plan

    sub = shard_plan(plan, part, scenario_seconds(plan, hw, modes=settings.modes, timing=settings.timing))
    directory = shard_dir(out, part)
    if (directory / PLAN).is_file():
        before = json.loads((directory / PLAN).read_text())["settings"].get("shard", {})
        if before.get("plan_hash") != plan_hash(sub):
            raise fail(
                f"{directory} holds shard {part} of another plan (hash {str(before.get('plan_hash'))[:16]}, "
                f"this one {plan_hash(sub)[:16]}): run it with the options it was started with, or choose "
                "another --out"
            )
    with fail_on_value_error():
        manifest = read_manifest(directory)
    record_run(directory, finished_before=0 if manifest is None else len(manifest["finished"]))
    typer.echo(f"shard {part}: {len(sub)} of {len(plan)} scenarios into {directory}", err=True)
    return sub, directory, dataclasses.replace(settings, remeasure=math.ceil(settings.remeasure / part.count))


FLEET_OPTIONS = (
    "shard", "ray", "emit", "shards", "share_nodes", "max_retries", "image", "out", "resume", "card_only",
    "relabel",
)  # fmt: skip
"""``ficco bench`` options that a shard's own command does not repeat (the fleet sets them)."""


def forwarded_options(ctx: typer.Context) -> list[str]:
    """The options of this ``ficco bench`` that each shard's command repeats: those given on the command
    line or in the environment, less ``FLEET_OPTIONS``, paths made absolute."""
    argv: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if param.param_type_name != "option" or name in FLEET_OPTIONS:
            continue
        source = ctx.get_parameter_source(name)
        if source is None or source.name == "DEFAULT":
            continue
        value = ctx.params[name]
        if param.is_flag:
            argv += [param.opts[0]] if value else []
            continue
        if isinstance(value, Path) or (name == "hardware" and str(value).endswith(".json")):
            value = Path(value).resolve()
        argv += [param.opts[0], str(getattr(value, "value", value))]
    return argv


def _run_fleet(
    ctx: typer.Context,
    plan: Plan,
    out: Path,
    *,
    ray: str | None,
    emit: Engine | None,
    shards: int,
    share_nodes: bool,
    max_retries: int,
    image: str,
    backend: BenchBackend,
    tp: int,
) -> None:
    """``--emit``: write the scheduler's job; ``--ray``: run the shards on Ray and gather them."""
    import sys

    argv = forwarded_options(ctx)
    if backend is BenchBackend.gpu and "--nproc" not in argv:  # a shard's node may hold more GPUs than --tp
        argv += ["--nproc", str(tp)]
    from ficco.harness.shards import ShardedSweep

    fleet = {"out": out, "backend": backend.value, "world_size": tp, "share_nodes": share_nodes}
    if emit is not None:
        from ficco.harness.emit import Engine, gather_command, write_job

        if ray is not None or shards < 1:
            raise fail("--emit writes a job for --shards N shards (N >= 1), without --ray")
        head = [sys.executable, "-m", "ficco.cli"] if emit is Engine.slurm else ["ficco"]
        command = [*head, "bench", *argv, "--out", str(out)]
        sweep = ShardedSweep(shards=shards, max_retries=max_retries, **fleet)
        path = write_job(emit, command, sweep, hardware_id=plan.settings["hardware_id"], image=image)
        typer.echo(f"wrote {path} ({shards} shards of {len(plan)} scenarios)")
        typer.echo(f"after every shard has finished: {gather_command(out)}")
        return
    from ficco.harness import fleet as ray_fleet
    from ficco.harness.gather import gather

    try:
        ray_fleet.connect(ray)
        count = shards or ray_fleet.default_shards(backend.value, tp, share_nodes)
        typer.echo(f"ray: {count} shards of {len(plan)} scenarios", err=True)
        sweep = ShardedSweep(shards=count, max_retries=max_retries, **fleet)
        dirs = ray_fleet.run_on_ray(ray, sweep, argv=argv, scenarios=len(plan))
        done = gather(dirs, out)
    except ConnectionError as err:  # no cluster to run on: a failure, not a bad value
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(FAILURE) from None
    except (ValueError, RuntimeError) as err:
        raise fail(str(err)) from None
    typer.echo(
        f"gathered {done.shards} shards into {out}: {done.rows} rows, content hash {done.rows_hash[:16]}"
    )


def _check_options(backend: BenchBackend, *, max_serial_ms: float, noise: float) -> None:
    """Raise a clean exit naming the first option not allowed with ``backend`` (typer checks the ranges)."""
    if not max_serial_ms > 0:
        raise fail(f"--max-serial-ms must be > 0; got {max_serial_ms:g}")
    if noise and backend is not BenchBackend.sim:
        raise fail(f"--noise applies to --backend sim only; got --backend {backend.value}")


def _check_fresh_or_resume(out: Path, resume: bool) -> None:
    """Refuse to add to an existing dataset unless ``--resume`` was given."""
    from ficco.features.dataset import read_manifest

    with fail_on_value_error():
        existing = read_manifest(out)
    if existing is not None and not resume:
        raise fail(
            f"{out} already holds a dataset ({len(existing['finished'])} scenarios); pass --resume to "
            "continue it, or choose another --out"
        )


PLAN_OPTIONS = {
    "tp": "--tp",
    "tokens": "--tokens",
    "grid_size": "--grid",
    "hardware_id": "--hardware",
    "include_moe": "--include-moe",
    "ops": "--ops",
    "max_serial_ms": "--max-serial-ms",
    "seed": "--seed",
    "configs": "--configs",
}
"""Plan settings (``plan.json``'s ``settings``) a resumed sweep must share, and the option giving each."""


def _option_value(value: Any) -> str:
    """A plan setting as it would be typed on the command line (lists comma-joined)."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _check_same_plan_settings(out: Path, plan: Plan) -> None:
    """Refuse ``--resume`` whose plan settings differ from the dataset's ``plan.json`` (the card would
    then contradict its own table); the message names each differing option with both values."""
    from ficco.features.dataset import PLAN

    path = out / PLAN
    if not path.is_file():
        return
    try:
        before = json.loads(path.read_text())["settings"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise fail(f"cannot read the plan of the dataset to resume, {path}: {err}") from None
    differ = [
        f"{option} {_option_value(plan.settings.get(key))} (the dataset's: {_option_value(before[key])})"
        for key, option in PLAN_OPTIONS.items()
        if key in before and before[key] != plan.settings.get(key)
    ]
    if differ:
        raise fail(
            f"--resume of {out} with other plan settings than it was started with: {'; '.join(differ)}. "
            "Resume with the dataset's settings, or choose another --out"
        )
    log.info("resuming %s with the same plan settings", out)


def _run_sim(
    plan: Plan,
    out: Path,
    *,
    seed: int,
    noise: float,
    calibrate_from: Path | None,
    settings: WorkerSettings,
) -> None:
    """Sweep in this process with the simulator (calibrated on ``calibrate_from`` when given), with the
    settings' modes, noise remeasures, flush interval and deadline (simulated times need no timing protocol
    and no CPU placement)."""
    from ficco.features.dataset import dataset_hardware, load_dataset
    from ficco.harness.sim import DEFAULT_CONSTANTS, SimBackend, calibrate
    from ficco.harness.sweep import run_noise, run_sweep

    constants = DEFAULT_CONSTANTS
    if calibrate_from is not None:
        try:
            constants = calibrate(load_dataset(calibrate_from), dataset_hardware(calibrate_from))
        except ValueError as err:
            raise fail(f"--calibrate-from {calibrate_from}: {err}") from None
        typer.echo(f"sim constants calibrated on {calibrate_from}: {constants}", err=True)
    hardware, modes = plan[0][1].hardware, settings.modes
    flush = {"flush_seconds": settings.flush_seconds, "deadline": settings.deadline}
    with fail_on_value_error():
        backend = SimBackend(hardware, seed=seed, noise=noise, constants=constants, modes=modes)
        run_sweep(plan, backend, out, **flush)
        if settings.remeasure and sweep_complete(plan, out):  # a fresh backend (a fresh process): other draws
            backend = SimBackend(hardware, seed=seed + 1, noise=noise, constants=constants, modes=modes)
            run_noise(plan, backend, out, settings.remeasure, **flush)


def _relabel(out: Path) -> None:
    from ficco.harness.dataset import relabel_dataset

    with fail_on_value_error():
        changed = relabel_dataset(out)
    typer.echo(f"relabelled {out}: in_best_set changed on {changed} rows")


def _write_card(out: Path) -> None:
    from ficco.harness.card import write_card

    with fail_on_value_error():
        card = write_card(out)
    typer.echo(f"dataset card: {card}")


class HostBackend(StrEnum):
    """The ``BenchBackend`` values that have a host to measure (the simulator has none)."""

    gpu = BenchBackend.gpu.value
    gloo = BenchBackend.gloo.value


def host_factor(
    backend: Annotated[
        HostBackend,
        typer.Option(
            help="gpu: every local GPU through torchrun (NCCL + copy engines); gloo: CPU processes (checks "
            "the command; the factor then means nothing)."
        ),
    ] = HostBackend.gpu,
    nproc: Annotated[
        int | None, typer.Option(min=2, help="Processes (default: the detected GPUs; gloo: 2).")
    ] = None,
    rounds: Annotated[
        int, typer.Option(min=3, max=1000, help="Shuffled rounds, a batch of every case each.")
    ] = 10,
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Calls per timed batch.")] = 50,
    pin: Annotated[
        PinPolicy,
        typer.Option(
            help="Where each rank's threads run, as in `ficco bench --pin`. Default share: a runtime's "
            "process stays on its CPUs, and that is the host a model is asked about."
        ),
    ] = DEFAULT_PIN,
    out: Annotated[Path | None, typer.Option(help="Also write the result as JSON here.")] = None,
) -> None:
    """Measure this machine's host factor within seconds: the executor's host time per eager call of tiny
    shapes over its price (harness/host_factor.py), the value `--host-factor` of `ficco recommend` and
    `ficco score`, and `host_factor` of the service and `runtime.PredictorSource`, take. A sweep's card
    gives the same figure from minutes of GPU time ("Host speed")."""
    from ficco.harness.launch import gpu_count, launch_env, process_count, torchrun_prefix

    bench_backend = BenchBackend(backend.value)
    count = nproc or (gpu_count() if bench_backend is BenchBackend.gpu else 2)
    count = process_count(bench_backend, count, count)
    device = "cuda" if bench_backend is BenchBackend.gpu else "cpu"
    command = [*torchrun_prefix(count), "-m", "ficco.harness.host_factor", "--device", device]
    command += ["--rounds", str(rounds), "--batch", str(batch), "--pin", pin.value]
    command += ["--out", str(out)] if out is not None else []
    typer.echo("running: " + " ".join(command), err=True)
    code = subprocess.run(command, env=launch_env(), cwd=REPO_ROOT, check=False).returncode
    if code:
        raise typer.Exit(code)


def gather_command(
    parts: Annotated[
        list[Path],
        typer.Argument(
            help="Shard directories (`ficco bench --shard I/N` writes OUT/shards/shard-I-of-N), or folders "
            "holding them (OUT or OUT/shards)."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Directory of the gathered dataset (new).")],
    partial: Annotated[
        bool,
        typer.Option(
            "--partial", help="Gather even when shards are missing or unfinished (the card says so)."
        ),
    ] = False,
) -> None:
    """Union the shards of one sweep into one dataset: refuses shards of different fingerprints, protocols
    or plans (naming the keys that differ) and missing or unfinished shards, keeps each row once, and
    writes the dataset, its card (shards, machines, GPU time) and the content hash of its rows."""
    from ficco.harness.gather import gather

    with fail_on_value_error():
        done = gather(parts, out, partial=partial)
    typer.echo(
        f"gathered {done.shards} shards into {done.out}: {done.rows} rows, content hash {done.rows_hash}"
        + (f"; {done.duplicates} duplicate rows dropped" if done.duplicates else "")
    )
    if done.missing_shards or done.unfinished:
        typer.echo(
            f"incomplete: missing shards {done.missing_shards}, unfinished {done.unfinished}", err=True
        )


def register(app: typer.Typer) -> None:
    """Add ``ficco bench``, ``ficco host-factor`` and ``ficco dataset gather`` to ``app``."""
    app.command("bench", help=BENCH_HELP)(bench)
    app.command("host-factor")(host_factor)
    dataset = typer.Typer(
        help="Work on measured datasets: gather the shards of a sweep into one.", no_args_is_help=True
    )
    dataset.command("gather")(gather_command)
    app.add_typer(dataset, name="dataset")
