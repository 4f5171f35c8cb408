"""``ficco bench``: measure (or simulate) every candidate schedule of every planned scenario; ``ficco dataset
card|compare|gather``; ``ficco host-factor`` (docs/cli.md). Heavy imports (torch, pandas, matplotlib) happen
inside the commands.

    ficco bench --out datasets/h200x2 --remeasure 64          # all local GPUs; again: continues the dataset
    ficco bench --backend sim --hardware h100x8 --tp 8 --calibrate-from datasets/h200x2 --out /tmp/h100
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import subprocess
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ficco.dataclass_options import to_argv, typer_options
from ficco.errors import fail, fail_on_value_error
from ficco.features import DEFAULT_HARDWARE_ID, DENSE_OPS, MOE_OPS, OPS
from ficco.files import work_root
from ficco.harness.backend import Timing
from ficco.harness.cpu_placement import DEFAULT_PIN, PinPolicy
from ficco.harness.host_factor import HostTiming
from ficco.harness.launch import (
    REPO_ROOT,
    BenchBackend,
    WorkerSettings,
    build_plan,
    check_machine_gpus,
    check_tp,
    parse_tokens,
    run_torchrun,
    sweep_complete,
    sweep_hardware,
)
from ficco.harness.plan import DEFAULT_GRID, DEFAULT_MAX_SERIAL_MS, DEFAULT_TOKENS

if TYPE_CHECKING:
    import click

    from ficco.features import HardwareProfile
    from ficco.harness.plan import Plan

log = logging.getLogger(__name__)


BENCH_HELP = (
    "Measure every candidate schedule of every planned scenario and write the labelled dataset.\n\n"
    "The plan: each model config in --configs expanded into the pairs of one layer (QKV and MLP up as "
    "all-gather -> GEMM, attention out and MLP down as GEMM -> reduce-scatter; with the MoE ops in --ops, "
    "an MoE layer's dispatch and combine as all-to-all -> expert GEMMs and back) for every --tokens value, "
    "plus --grid log-uniform shapes between the models. The simulated GPU time of the sweep is printed "
    "first. The same command again continues the dataset in --out (after a crash, Ctrl-C or "
    "--time-budget); the sweep ends by writing card.md and the plots. `ficco fleet` runs it as shards "
    "across machines."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepJob:
    """One sweep as ``ficco bench``'s options give it: the plan, where it goes and how it is measured."""

    plan: Plan
    out: Path
    hardware: HardwareProfile
    backend: BenchBackend
    settings: WorkerSettings
    seed: int
    """Seed of the grid (in the plan) and of the simulator's noise."""
    noise: float
    calibrate_from: Path | None


@typer_options(Timing, "timing", panel="Timing protocol (gpu/gloo)")
def sweep_job(
    *,
    backend: Annotated[
        BenchBackend,
        typer.Option(
            help="gpu: every local GPU through torchrun (NCCL + copy engines), --tp of them; gloo: --tp CPU "
            "processes through torchrun (checks the pipeline, times mean nothing); sim: the analytic model."
        ),
    ] = BenchBackend.gpu,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Dataset directory, new or one to continue. Default: datasets/<hardware> (gpu), "
            "datasets/<hardware>-sim, datasets/<hardware>-gloo, in the checkout (installed: in "
            "~/.local/share/ficco)."
        ),
    ] = None,
    configs: Annotated[
        Path, typer.Option(help="Directory of Hugging Face config.json files, one per model family.")
    ] = REPO_ROOT / "datasets" / "model_configs",
    tp: Annotated[
        int,
        typer.Option(
            help="Tensor-parallel degree = world size of every scenario = processes: 2 to the --hardware's "
            "GPU count (at most 8)."
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
        str | None,
        typer.Option(
            help="Hardware profile id (h200x2, h100x8, or a custom one registered before) or a "
            "HardwareProfile JSON file, which registers its id for every command. Default: this machine's "
            f"GPUs at --tp of them (ficco bench --backend gpu; e.g. h200x4), else {DEFAULT_HARDWARE_ID}. A "
            "gpu sweep refuses a profile of another GPU model before it measures.",
            show_default=False,
        ),
    ] = None,
    ops: Annotated[
        str,
        typer.Option(
            help=f"Comma-separated ops to measure, of {', '.join(OPS)}, or all. The MoE ops "
            f"({', '.join(MOE_OPS)}: all-to-all -> expert GEMMs and back, at balanced routing) add the MoE "
            "configs' expert-parallel pairs."
        ),
    ] = ",".join(DENSE_OPS),
    sample: Annotated[
        int,
        typer.Option(
            min=0,
            max=10_000_000,
            help="Measure only N planned scenarios spread evenly over the plan (0: all): a quick check, e.g. "
            "--sample 48 --remeasure 48 for the run-to-run noise.",
        ),
    ] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the grid and of the sim noise.")] = 0,
    remeasure: Annotated[
        int,
        typer.Option(
            min=0,
            max=100_000,
            help="After the sweep, measure this many finished scenarios again (another process and order) "
            "into noise.parquet: the card's noise numbers; >= 64 for a dataset.",
        ),
    ] = 0,
    modes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated execution modes to time: eager (calls launched from Python) and graph "
            "(replayed from a CUDA graph; not on gloo). Default: eager,graph (gpu, sim), eager (gloo)."
        ),
    ] = None,
    timing: Timing,
    pin: Annotated[
        PinPolicy,
        typer.Option(
            help="Where each rank's threads run (gpu/gloo; harness.cpu_placement): none (the kernel "
            "decides), share (each rank an equal, disjoint share of the CPUs' physical cores; every "
            "committed dataset was measured so).",
        ),
    ] = DEFAULT_PIN,
    flush_seconds: Annotated[
        float,
        typer.Option(min=0.0, max=3600.0, help="Seconds between dataset writes (what a crash can lose)."),
    ] = 10.0,
    time_budget: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1e6,
            help="Minutes after which no new scenario starts (0: no limit); the same command continues the "
            "dataset. The re-measure runs once the sweep is complete.",
        ),
    ] = 0.0,
    noise: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Sim only: log-normal noise on every time.")
    ] = 0.0,
    calibrate_from: Annotated[
        Path | None,
        typer.Option(help="Sim only: refit the model's constants to this measured dataset first."),
    ] = None,
) -> SweepJob:
    """The sweep ``ficco bench`` runs with these options (the fleet verbs' too, :func:`parse_sweep`)."""
    hw = sweep_hardware(hardware, backend is BenchBackend.gpu, tp)
    if not max_serial_ms > 0:
        raise fail(f"--max-serial-ms must be > 0; got {max_serial_ms:g}")
    if noise and backend is not BenchBackend.sim:
        raise fail(f"--noise applies to --backend sim only; got --backend {backend.value}")
    check_tp(tp, hw)
    measured = OPS if ops.strip() == "all" else tuple(op.strip() for op in ops.split(",") if op.strip())
    plan = build_plan(
        configs, hw, tp=tp, tokens=parse_tokens(tokens, tp, DEFAULT_TOKENS), grid=grid,
        max_serial_ms=max_serial_ms, include_moe=bool(set(measured) & set(MOE_OPS)), seed=seed,
        ops=measured, sample=sample,
    )  # fmt: skip
    deadline = time.time() + 60 * time_budget if time_budget else None
    settings = WorkerSettings(modes=_modes(modes, backend), timing=timing, remeasure=remeasure,
                              flush_seconds=flush_seconds, deadline=deadline, pin=pin.value)  # fmt: skip
    suffix = {"gpu": "", "gloo": "-gloo", "sim": "-sim"}[backend.value]
    out = out or work_root() / "datasets" / f"{hw.id}{suffix}"
    return SweepJob(plan=plan, out=out, hardware=hw, backend=backend, settings=settings, seed=seed,
                    noise=noise, calibrate_from=calibrate_from)  # fmt: skip


@functools.wraps(sweep_job)  # typer reads the options from sweep_job's signature
def bench(**options: Any) -> None:
    """Measure the sweep of ``options`` into its ``--out`` (continuing what is there), then write its card."""
    job = sweep_job(**options)
    measure(job)
    _write_card(job.out)


def parse_sweep(args: Sequence[str]) -> tuple[SweepJob, click.Context]:
    """The sweep of the ``ficco bench`` options ``args`` that a fleet verb was given, and the click context
    that parsed them; a bad option is a usage error naming ``ficco bench --help``."""
    app = typer.Typer()
    app.command()(sweep_job)
    command = typer.main.get_command(app)
    ctx = command.make_context("ficco bench", list(args))
    # a fleet's launcher is not the machine that measures: --hardware defaults to the default profile,
    # never to the launcher's GPUs (each shard checks its node's GPUs against it before measuring)
    params = {**ctx.params, "hardware": ctx.params["hardware"] or DEFAULT_HARDWARE_ID}
    return ctx.invoke(command.callback, **params), ctx


def measure(job: SweepJob) -> None:
    """Sweep ``job`` into ``job.out``, continuing the dataset there (refused when its plan settings
    differ, or on GPUs of another model than its profile's), after printing the plan and the GPU time it
    takes."""
    from ficco.harness.plan import estimate_sweep

    plan, settings = job.plan, job.settings
    if job.backend is BenchBackend.gpu:
        check_machine_gpus(job.hardware)
    _check_same_plan_settings(job.out, plan)
    estimate = estimate_sweep(
        plan, job.hardware, modes=settings.modes, timing=settings.timing, remeasure=settings.remeasure
    )
    plan = dataclasses.replace(
        plan, settings={**plan.settings, "estimated_minutes": round(estimate.seconds / 60, 2)}
    )
    typer.echo(
        f"plan: {len(plan)} scenarios from {len(plan.families)} "
        f"{'family' if len(plan.families) == 1 else 'families'} ({', '.join(plan.families)}); "
        f"{len(plan.dropped)} model scenarios over {plan.settings['max_serial_ms']} ms left out",
        err=True,
    )
    typer.echo(f"GPU sweep estimate on {job.hardware.id}: {estimate.summary()}", err=True)
    if job.backend is BenchBackend.sim:
        _run_sim(dataclasses.replace(job, plan=plan))
    else:
        tp = plan.settings["tp"]
        run_torchrun(plan, job.out, backend=job.backend, tp=tp, nproc=tp, settings=settings)


def _modes(value: str | None, backend: BenchBackend) -> tuple[str, ...]:
    """The execution modes of ``--modes``: a non-empty subset of ``MODES`` (gloo: ``eager`` only)."""
    from ficco.features import MODES

    allowed = ("eager",) if backend is BenchBackend.gloo else MODES
    if value is None:
        return allowed
    modes = tuple(m.strip() for m in value.split(",") if m.strip())
    if not modes or any(m not in allowed for m in modes):
        raise fail(
            f"--modes must be comma-separated values of {list(allowed)} with --backend {backend}; "
            f"got {value!r}"
        )
    return tuple(m for m in MODES if m in modes)


PLAN_OPTIONS = {
    "tp": "--tp",
    "tokens": "--tokens",
    "grid_size": "--grid",
    "hardware_id": "--hardware",
    "ops": "--ops",
    "max_serial_ms": "--max-serial-ms",
    "seed": "--seed",
    "configs": "--configs",
}
"""Plan settings (``plan.json``'s ``settings``) a continued sweep must share, and the option giving each."""


def _option_values(settings: dict[str, Any]) -> dict[str, str]:
    """The plan ``settings`` of ``PLAN_OPTIONS`` as typed on the command line (lists comma-joined; ``ops``:
    those measured, an MoE op only with the plan's ``include_moe``)."""
    ops = settings.get("ops")
    if ops is not None:
        settings = {**settings, "ops": [op for op in ops if op not in MOE_OPS or settings.get("include_moe")]}
    values = {key: settings.get(key) for key in PLAN_OPTIONS if key in settings}
    return {
        key: ",".join(map(str, v)) if isinstance(v, list | tuple) else str(v) for key, v in values.items()
    }


def _check_same_plan_settings(out: Path, plan: Plan) -> None:
    """Refuse to continue the dataset in ``out`` when its ``plan.json`` has other plan settings (the card
    would then contradict its own table); the message names each differing option with both values."""
    from ficco.features.dataset import PLAN

    path = out / PLAN
    if not path.is_file():
        return
    try:
        before = _option_values(json.loads(path.read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise fail(f"cannot read the plan of the dataset to continue, {path}: {err}") from None
    now = _option_values(plan.settings)
    differ = [
        f"{option} {now.get(key)} (the dataset's: {before[key]})"
        for key, option in PLAN_OPTIONS.items()
        if key in before and before[key] != now.get(key)
    ]
    if differ:
        raise fail(
            f"{out} holds a dataset of other plan settings: {'; '.join(differ)}. Give the dataset's "
            "settings to continue it, or choose another --out"
        )
    log.info("continuing %s with the same plan settings", out)


def _run_sim(job: SweepJob) -> None:
    """Sweep ``job`` in this process with the simulator (calibrated on ``job.calibrate_from`` when given);
    simulated times need no timing protocol and no CPU placement."""
    from ficco.features.dataset import dataset_hardware, load_dataset
    from ficco.harness.sim import DEFAULT_CONSTANTS, SimBackend
    from ficco.harness.sim_fit import calibrate
    from ficco.harness.sweep import run_noise, run_sweep

    constants, source, settings = DEFAULT_CONSTANTS, job.calibrate_from, job.settings
    if source is not None:
        try:
            constants = calibrate(load_dataset(source), dataset_hardware(source))
        except ValueError as err:
            raise fail(f"--calibrate-from {source}: {err}") from None
        typer.echo(f"sim constants calibrated on {source}: {constants}", err=True)
    flush = {"flush_seconds": settings.flush_seconds, "deadline": settings.deadline}
    sim = functools.partial(
        SimBackend, job.hardware, noise=job.noise, constants=constants, modes=settings.modes
    )
    with fail_on_value_error():
        run_sweep(job.plan, sim(seed=job.seed), job.out, **flush)
        if settings.remeasure and sweep_complete(job.plan, job.out):  # another process: other draws
            run_noise(job.plan, sim(seed=job.seed + 1), job.out, settings.remeasure, **flush)


def _write_card(out: Path) -> None:
    from ficco.harness.card import write_card

    with fail_on_value_error():
        card = write_card(out)
    typer.echo(f"dataset card: {card}")


def dataset_card(
    directory: Annotated[Path, typer.Argument(help="Dataset directory (written by `ficco bench`).")],
    relabel: Annotated[
        bool,
        typer.Option(
            "--relabel",
            help="First recompute in_best_set of every row from its stored rounds under the current label "
            "rule (eager: 10th percentile, graph: median), rewriting the files that change.",
        ),
    ] = False,
) -> None:
    """Rewrite a dataset's card.md and plots from its rows (after a protocol or card change)."""
    if relabel:
        from ficco.harness.dataset import relabel_dataset

        with fail_on_value_error():
            changed = relabel_dataset(directory)
        typer.echo(f"relabelled {directory}: in_best_set changed on {changed} rows")
    _write_card(directory)


class CompareFormat(StrEnum):
    """How ``ficco dataset compare`` prints: text tables or one JSON object."""

    table = "table"
    json = "json"


def compare_command(
    a: Annotated[
        Path, typer.Argument(metavar="A", help="Dataset directory A (e.g. the one a model was trained on).")
    ],
    b: Annotated[Path, typer.Argument(metavar="B", help="Dataset directory B, set against A.")],
    output: Annotated[
        CompareFormat, typer.Option("--format", help="table: text tables; json: one JSON object.")
    ] = CompareFormat.table,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (as --format json).")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the JSON object to this file.")
    ] = None,
    within: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Neighbourhood of a matched pair: rows, n and k each within this factor of A's scenario "
            "(1: the same sizes only).",
        ),
    ] = 2.0,
    other_hardware: Annotated[
        bool,
        typer.Option(
            "--other-hardware",
            help="Compare datasets of other GPUs or interconnects too (their time ratios; a world size must "
            "still be the same).",
        ),
    ] = False,
) -> None:
    """Compare two datasets where they measured the same or neighbouring scenarios: how their fastest
    schedules and time ratios (t / t_serial) differ, per op group, mode, schedule family and size of GEMM
    work, against the run-to-run noise of their re-measures; their label sources and differing protocol
    settings first. This is how an executor or protocol change that moved the measured truth shows."""
    from ficco.harness.compare import compare, render

    result = compare(a, b, within=within, other_hardware=other_hardware)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    json_out = as_json or output is CompareFormat.json
    typer.echo(json.dumps(result, indent=1) if json_out else render(result))


def gather_command(
    parts: Annotated[
        list[Path],
        typer.Argument(
            help="Shard directories (`ficco fleet shard` writes OUT/shards/shard-I-of-N), or folders "
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
    from ficco.harness.fleet.gather import gather

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


class HostBackend(StrEnum):
    """The ``BenchBackend`` values that have a host to measure (the simulator has none)."""

    gpu = BenchBackend.gpu.value
    gloo = BenchBackend.gloo.value


@typer_options(HostTiming, "timing")
def host_factor(
    *,
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
    timing: HostTiming,
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
    from ficco.harness.launch import gpu_names, launch_env, process_count, torchrun_prefix

    bench_backend = BenchBackend(backend.value)
    count = nproc or (len(gpu_names()) if bench_backend is BenchBackend.gpu else 2)
    count = process_count(bench_backend, count, count)
    device = "cuda" if bench_backend is BenchBackend.gpu else "cpu"
    command = [*torchrun_prefix(count), "-m", "ficco.harness.host_factor", "--device", device]
    command += [*to_argv(timing), "--pin", pin.value]
    command += ["--out", str(out)] if out is not None else []
    typer.echo("running: " + " ".join(command), err=True)
    code = subprocess.run(command, env=launch_env(), cwd=REPO_ROOT, check=False).returncode
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``ficco bench``, ``ficco dataset card|compare|gather`` and ``ficco host-factor`` to ``app``."""
    app.command("bench", help=BENCH_HELP)(bench)
    dataset = typer.Typer(
        help="Work on measured datasets: rewrite a card, compare two datasets, gather the shards of a sweep "
        "into one.",
        no_args_is_help=True,
    )
    dataset.command("card")(dataset_card)
    dataset.command("compare")(compare_command)
    dataset.command("gather")(gather_command)
    app.add_typer(dataset, name="dataset")
    app.command("host-factor")(host_factor)
