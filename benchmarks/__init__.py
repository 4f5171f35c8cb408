"""ficco's benchmark tools, run from the repository root as ``python -m benchmarks.<tool>``; finished studies
under ``benchmarks.studies`` (host studies under ``benchmarks.studies.host``)."""

import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from ficco.files import write_text_atomic
from ficco.harness.worker import SAFE_ENV

os.environ.update(SAFE_ENV)  # NVLink multicast off in every tool: before torch.distributed initialises NCCL

REPO = Path(__file__).resolve().parents[1]
"""The repository root (a source checkout: the benchmarks read its datasets and model configs)."""


def machine_id(world_size: int, cuda: bool = True) -> str:
    """The hardware id result files are named after: the GPU found (``features.hardware.hardware_id_of``,
    e.g. ``h200x4``, ``h100x4``) at ``world_size`` ranks; ``cpux<world_size>`` for a CPU (gloo) dry run."""
    if not cuda:
        return f"cpux{world_size}"
    import torch

    from ficco.features.hardware import hardware_id_of

    return hardware_id_of(torch.cuda.get_device_name(), world_size)


def say(text: str) -> None:
    """Print a progress line at once (a torchrun rank's output is otherwise buffered)."""
    print(text, flush=True)


def rerender(
    path: Path, render: Callable[[dict], str], plot: Callable[[dict, Path], None] | None = None
) -> Path:
    """``--render``: write the markdown of the results JSON ``path`` beside it, and with ``plot`` the
    ``.png`` beside that; the markdown's path."""
    result = json.loads(path.read_text())
    out = path.with_suffix(".md")
    write_text_atomic(out, render(result))
    if plot is None:
        say(f"wrote {out}")
        return out
    plot(result, path.with_suffix(".png"))
    say(f"wrote {out} and {path.with_suffix('.png')}")
    return out


def write_results(
    result: dict, path: Path, render: Callable[[dict], str], plot: Callable[[dict, Path], None]
) -> None:
    """Write the results JSON ``path``, its markdown beside it, and its plot beside that (when matplotlib
    is installed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    write_text_atomic(path.with_suffix(".md"), render(result))
    with contextlib.suppress(ImportError):
        plot(result, path.with_suffix(".png"))


def study_main(doc: str, out: Path, study: Callable[[], dict], *tables: Callable[[dict], str]) -> None:
    """The ``main`` of a study whose one option is ``--out`` (default ``out``): run ``study``, print each of
    ``tables`` of its results, and write the results there as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    results = study()
    for table in tables:
        print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


def torchrun_parser(
    prog: str, description: str, *, name: str, rounds: int, min_rounds: int = 5, dry_run: str = "gloo, tiny"
) -> Any:
    """An ``argparse`` parser with the options of every tool timed under torchrun that writes a results JSON:
    ``--out``, ``--name`` (default ``name``), ``--rounds`` (default ``rounds``, at least ``min_rounds``),
    ``--render`` and ``--cpu-dry-run`` (``dry_run`` says what it runs); :func:`parse_torchrun_args` checks
    them."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", type=Path, help="folder for the JSON and markdown results (rank 0 writes)")
    p.add_argument("--name", help=f"file stem of the outputs (default: {name})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"rounds (>= {min_rounds}; {rounds})")
    p.add_argument("--render", type=Path, help="only re-render the markdown of this JSON (no torchrun)")
    p.add_argument("--cpu-dry-run", action="store_true", help=f"check the script without a GPU ({dry_run})")
    p.set_defaults(min_rounds=min_rounds)
    return p


def parse_torchrun_args(parser: Any, argv: list[str] | None) -> Any:
    """``parser``'s arguments (:func:`torchrun_parser`'s), refusing a run without ``--out`` (unless
    ``--render``) and fewer rounds than its ``min_rounds`` (the medians are published)."""
    args = parser.parse_args(argv)
    if args.render is None and args.out is None:
        parser.error("--out is required (unless --render)")
    if args.rounds < args.min_rounds:
        parser.error(f"--rounds must be >= {args.min_rounds} (the medians are published); got {args.rounds}")
    return args


def torchrun_main(
    args: Any, run: Callable[[Any], Any], render: Callable[[dict], str], *, timeout: timedelta | None = None
) -> Any:
    """The ``main`` of a tool timed under torchrun: with ``--render``, only :func:`rerender`; else exit
    naming the torchrun command unless this process is a torchrun rank (or inside an initialised group),
    then ``run(args)`` in the rank's process group (gloo with ``--cpu-dry-run``; ``timeout`` per
    collective) and return its result (None after a render)."""
    if args.render is not None:
        rerender(args.render, render)
        return None
    import torch.distributed as dist

    from ficco import executor

    if "LOCAL_RANK" not in os.environ and not dist.is_initialized():
        sys.exit(
            "run under torchrun: python3 -m torch.distributed.run --nproc-per-node 2 " + " ".join(sys.argv)
        )
    with executor.process_group("cpu" if args.cpu_dry_run else "cuda", timeout=timeout):
        return run(args)


def plot_speedups(
    points: list[dict],
    path: Path,
    *,
    phases: Sequence[str],
    variants: Sequence[str],
    title: Callable[[str], str],
    panel_width: float = 6.5,
) -> None:
    """Write ``path`` (a PNG): each variant's speedup over serial (``step_ms["serial"] / step_ms[v]``)
    against tokens, one panel per phase of ``phases`` that ``points`` hold (titled ``title(phase)``), a
    colour per variant and a line style per model. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [phase for phase in phases if any(p["phase"] == phase for p in points)]
    if not shown:
        return
    fig, axes = plt.subplots(1, len(shown), figsize=(panel_width * len(shown), 4.5), squeeze=False)
    for ax, phase in zip(axes[0], shown, strict=True):
        pts = [p for p in points if p["phase"] == phase]
        for j, model in enumerate(sorted({p["model"] for p in pts})):
            mine = sorted((p for p in pts if p["model"] == model), key=lambda p: p["tokens"])
            for i, v in enumerate(variants):
                xy = [(p["tokens"], p["step_ms"]["serial"] / p["step_ms"][v]) for p in mine
                      if p["step_ms"].get(v) and p["step_ms"].get("serial")]  # fmt: skip
                if xy:
                    ax.plot(*zip(*xy, strict=True), ["-", "--", ":"][j % 3], color=f"C{i}", marker="o",
                            label=f"{model} {v}")  # fmt: skip
        speedup_axes(ax, title(phase), "speedup over serial NCCL")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def speedup_axes(ax: Any, title: str, ylabel: str) -> None:
    """A panel of speedups against tokens: 1x marked, tokens on a log2 axis, the title, a legend if any."""
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("tokens")
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
