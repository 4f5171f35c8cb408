"""Launching the harness, shared by ``ficco bench`` and ``ficco retrain --backend gpu``: the hardware and
``--tokens`` options, the sweep plan of the model configs, and the torchrun job (one
``ficco.harness.worker`` process per rank) that measures it. Everything here is called with keywords.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ficco.errors import fail, fail_on_value_error
from ficco.features import DEFAULT_HARDWARE_ID, OPS
from ficco.harness.backend import Timing
from ficco.harness.cpu_placement import DEFAULT_PIN
from ficco.harness.plan import DEFAULT_MAX_SERIAL_MS

if TYPE_CHECKING:
    from ficco.features import HardwareProfile
    from ficco.harness.plan import Plan

REPO_ROOT = Path(__file__).resolve().parent.parent


class BenchBackend(StrEnum):
    """Where a sweep's times come from (``ficco bench --backend``)."""

    gpu = "gpu"
    gloo = "gloo"
    sim = "sim"


def hardware_profile(value: str, root: str | Path | None = None) -> HardwareProfile:
    """``--hardware``'s profile (``features.hardware.load_hardware``: a built-in id, a registered one, or a
    profile JSON file it registers under ``root``); a bad value exits with one ``error:`` line."""
    from ficco.features.hardware import load_hardware

    try:
        return load_hardware(value, root)
    except ValueError as err:
        raise fail(f"--hardware {value!r}: {err}") from None


def check_tp(tp: int, hw: HardwareProfile) -> int:
    """``tp`` when ``hw`` can run that world size (2 to its GPU count, at most 8); else a clean exit."""
    from ficco.features.scenario import MAX_WORLD_SIZE, MIN_WORLD_SIZE

    top = min(MAX_WORLD_SIZE, hw.gpu_count)
    if not MIN_WORLD_SIZE <= tp <= top:
        allowed = f"{top}" if top == MIN_WORLD_SIZE else f"an int in [{MIN_WORLD_SIZE}, {top}]"
        raise fail(
            f"--tp must be {allowed}: --hardware {hw.id} has gpu_count={hw.gpu_count}; got {tp}. Name a "
            "profile of more GPUs with --hardware (e.g. h200x8) to plan larger world sizes"
        )
    return tp


def parse_tokens(value: str | None, tp: int, default: Sequence[int]) -> list[int]:
    """The token counts of ``--tokens`` (None: ``default``, each rounded up to a multiple of ``tp``); a
    clean exit for a value that is not a list of positive integers."""
    if value is None:
        return sorted({-(-t // tp) * tp for t in default})
    try:
        tokens = [int(t) for t in value.split(",") if t.strip()]
    except ValueError:
        raise fail(f"--tokens must be comma-separated integers, e.g. 1024,4096; got {value!r}") from None
    if not tokens or min(tokens) < 1:
        raise fail(f"--tokens must hold positive integers; got {value!r}")
    return tokens


@functools.cache
def gpu_names() -> tuple[str, ...]:
    """The GPUs ``nvidia-smi -L`` lists, by name (``NVIDIA H200``); none without a driver. Read once per
    process (a sweep's launcher asks for the default profile, the process count and the model check)."""
    if shutil.which("nvidia-smi") is None:
        return ()
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return tuple(
        line.split(": ", 1)[1].split(" (UUID")[0] for line in out.splitlines() if line.startswith("GPU ")
    )


def sweep_hardware(value: str | None, on_gpus: bool, tp: int) -> HardwareProfile:
    """The profile a sweep files its rows under: ``--hardware``, else (``on_gpus``: it measures on this
    machine) this machine's GPUs at ``tp`` of them (``h200x4``), else the default profile; a bad value, or
    GPUs of no profile, exits with one ``error:`` line."""
    from ficco.features.hardware import hardware_id_of, load_hardware

    names = gpu_names() if on_gpus and value is None else ()
    if not names:
        return hardware_profile(value or DEFAULT_HARDWARE_ID)
    derived = hardware_id_of(names[0], tp)
    try:
        return load_hardware(derived)
    except ValueError:
        raise fail(
            f"this machine's {names[0]} GPUs have no hardware profile {derived!r}: pass --hardware with a "
            "profile JSON file that describes them (docs/new-hardware.md)"
        ) from None


def check_machine_gpus(hw: HardwareProfile) -> None:
    """Exit with one ``error:`` line, naming the profile that fits, where this machine's GPUs are another
    model than ``hw``'s (the rows measured here would be filed under another machine); nothing without
    GPUs. Called where a sweep is measured (``ficco bench``, ``fleet shard``, ``retrain``), before anything
    is read or written."""
    from ficco.features.hardware import check_gpu_model

    names = gpu_names()
    with fail_on_value_error():
        if names:
            check_gpu_model(hw, names[0])


def build_plan(
    configs: Path,
    hw: HardwareProfile,
    *,
    tp: int,
    tokens: list[int],
    grid: int,
    max_serial_ms: float = DEFAULT_MAX_SERIAL_MS,
    include_moe: bool,
    seed: int,
    ops: Sequence[str] = OPS,
    sample: int = 0,
) -> Plan:
    """The plan of ``configs`` at ``tp`` ranks on ``hw`` (``sample`` of its scenarios spread evenly over it
    when ``sample`` > 0); model configs that do not fit are skipped with a message naming why."""
    from ficco.features.model_config import load_model_configs
    from ficco.harness.plan import evenly_spaced, plan_scenarios

    with fail_on_value_error():
        plan = plan_scenarios(
            load_model_configs(configs),
            tp=tp,
            tokens=tokens,
            grid_size=grid,
            hardware=hw,
            include_moe=include_moe,
            max_serial_ms=max_serial_ms,
            seed=seed,
            ops=ops,
        )
    for name, why in plan.settings["skipped_configs"].items():
        typer.echo(f"skipping model config {name} at tp={tp}: {why}", err=True)
    if sample:
        plan = dataclasses.replace(plan, entries=tuple(evenly_spaced(plan.entries, sample)))
    if not len(plan):
        raise fail("the plan is empty: check --configs, --tokens, --grid and --max-serial-ms")
    return plan


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSettings:
    """What every ``ficco.harness.worker`` process of a sweep is told beside its plan: ``ficco bench``'s
    options of the same names (``deadline``: the ``time.time()`` after which no scenario starts)."""

    modes: tuple[str, ...]
    timing: Timing = dataclasses.field(default_factory=Timing)
    remeasure: int = 0
    flush_seconds: float = 10.0
    deadline: float | None = None
    pin: str = DEFAULT_PIN


def torchrun_command(
    out: Path, *, nproc: int, device: str, phase: str, settings: WorkerSettings
) -> list[str]:
    """The ``python -m torch.distributed.run`` command running ``ficco.harness.worker`` on ``nproc`` ranks
    for one ``phase`` (``sweep`` or ``noise``)."""
    from ficco.dataclass_options import to_argv
    from ficco.features.dataset import PLAN

    worker = ["-m", "ficco.harness.worker", "--plan", str(out / PLAN), "--out", str(out), "--device", device]
    options = {
        "--phase": phase,
        "--modes": ",".join(settings.modes),
        "--remeasure": settings.remeasure,
        "--flush-seconds": settings.flush_seconds,
        "--deadline": settings.deadline or 0.0,
        "--pin": settings.pin,
    }
    worker += [str(x) for pair in options.items() for x in pair]
    return [*torchrun_prefix(nproc), *worker, *to_argv(settings.timing)]


def torchrun_prefix(nproc: int) -> list[str]:
    """``python -m torch.distributed.run`` on this machine, ``nproc`` processes (append the module)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def launch_env() -> dict[str, str]:
    """The environment of a torchrun job: this one, NVLink multicast off, and a checkout importable (an
    installed ficco is importable as it is)."""
    from ficco import CHECKOUT
    from ficco.harness.worker import SAFE_ENV

    path = os.pathsep.join(p for p in (str(CHECKOUT or ""), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **SAFE_ENV, "PYTHONPATH": path}


def process_count(backend: BenchBackend, tp: int, nproc: int | None) -> int:
    """Processes to launch: ``--nproc``, else the detected GPUs (gpu) or ``--tp`` (gloo); must equal tp."""
    if backend is BenchBackend.gpu:
        found = len(gpu_names())
        nproc = nproc or found
        if found < max(nproc, 2):
            raise fail(f"--backend gpu needs {max(nproc, 2)} GPUs; nvidia-smi lists {found}")
    nproc = nproc or tp
    if nproc != tp:
        raise fail(
            f"--tp {tp} must equal the number of processes ({nproc}): every scenario spans the whole process "
            f"group; pass --nproc {tp} to use {tp} of the GPUs, or --tp {nproc}"
        )
    return nproc


def run_torchrun(
    plan: Plan, out: Path, *, backend: BenchBackend, tp: int, nproc: int | None, settings: WorkerSettings
) -> None:
    """Write the plan file and sweep it with one ``ficco.harness.worker`` process per rank under torchrun,
    then (``settings.remeasure`` > 0) re-measure in a second torchrun job: another process, another order."""
    from ficco.extras import DATA_MODULES, require_modules
    from ficco.features.dataset import PLAN
    from ficco.harness.dataset import write_json_atomic

    nproc = process_count(backend, tp, nproc)
    # Fail here with one error line when a module every rank imports is missing, not on every rank.
    require_modules(("torch", *DATA_MODULES))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / PLAN, json.loads(plan.to_json()))
    env = launch_env()
    device = "cuda" if backend is BenchBackend.gpu else "cpu"
    for phase in ("sweep", "noise") if settings.remeasure else ("sweep",):
        if phase == "noise" and not sweep_complete(plan, out):
            typer.echo("the sweep is not complete: the re-measure waits for the same command again", err=True)
            break
        command = torchrun_command(out, nproc=nproc, device=device, phase=phase, settings=settings)
        typer.echo("running: " + " ".join(command), err=True)
        code = subprocess.run(command, env=env, cwd=REPO_ROOT, check=False).returncode
        if code != 0:
            raise fail(
                f"torchrun ({phase}) exited with {code}; the same `ficco bench` continues where it stopped",
                code,
            )


def sweep_complete(plan: Plan, out: Path) -> bool:
    """Whether every scenario of ``plan`` is in the dataset at ``out``."""
    from ficco.features.dataset import read_manifest

    manifest = read_manifest(out)
    return manifest is not None and {s.key() for _, s in plan} <= set(manifest["finished"])
