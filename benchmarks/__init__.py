"""ficco's benchmark tools, run from the repository root as ``python -m benchmarks.<tool>``; finished studies
under ``benchmarks.studies`` (host studies under ``benchmarks.studies.host``)."""

import json
from collections.abc import Callable
from pathlib import Path

from ficco.files import write_text_atomic

REPO = Path(__file__).resolve().parents[1]
"""The repository root (a source checkout: the benchmarks read its datasets and model configs)."""


def say(text: str) -> None:
    """Print a progress line at once (a torchrun rank's output is otherwise buffered)."""
    print(text, flush=True)


def rerender(path: Path, render: Callable[[dict], str]) -> Path:
    """``--render``: write the markdown of the results JSON ``path`` beside it; the markdown's path."""
    out = path.with_suffix(".md")
    write_text_atomic(out, render(json.loads(path.read_text())))
    say(f"wrote {out}")
    return out
