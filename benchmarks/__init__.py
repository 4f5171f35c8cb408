"""ficco's benchmark tools, run from the repository root as ``python -m benchmarks.<tool>``; finished studies
under ``benchmarks.studies`` (host studies under ``benchmarks.studies.host``)."""

import contextlib
import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ficco.files import write_text_atomic

REPO = Path(__file__).resolve().parents[1]
"""The repository root (a source checkout: the benchmarks read its datasets and model configs)."""


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
