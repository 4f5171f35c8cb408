"""Options the training commands share (``ficco train``, ``evaluate``, ``retrain``, ``export``, ...), and
with ``ficco score`` and ``recommend`` (``--dtype``, ``--host-factor``), as ``Annotated`` aliases: one flag,
one help text."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

DatasetOption = Annotated[
    list[Path],
    typer.Option(
        "--dataset",
        help="Dataset directory written by `ficco bench --out` (manifest.json + parts/). Repeat it to "
        "combine datasets of the same hardware and disjoint scenarios (e.g. dense and MoE).",
    ),
]
RepeatOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--repeat",
        help="An independent repeat sweep (another session) of scenarios --dataset holds; each schedule's "
        "time becomes the geometric mean over the sweeps (eager labels of small shapes follow the host's "
        "speed, which drifts between sessions). Repeat it for several.",
    ),
]
ExtraOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--extra",
        help="More rows to learn from, never scored: a dataset of another label source (an older executor "
        "or timing protocol, another machine or world size; `ficco dataset compare` shows how its labels "
        "differ). Each row keeps its source's host factor and label version; folds, groups and metrics come "
        "from --dataset alone, so adding one never reshuffles the evaluation. Repeat it for several.",
    ),
]


class Learner(StrEnum):
    """How rows of several label sources are learned (``--learner``)."""

    sources = "sources"
    pooled = "pooled"


LearnerOption = Annotated[
    Learner,
    typer.Option(
        "--learner",
        help="sources: every row keeps its label source's host factor, and rows outside --dataset's "
        "sources weigh what cross-validation on --dataset's folds chooses (none, when they do not help); "
        "pooled: every row as one source at one host factor, refused when the datasets' label sources "
        "differ (executor label version, GPU, world size or backend; `ficco dataset compare` shows how).",
    ),
]
RegistryOption = Annotated[
    Path | None,
    typer.Option(
        "--model-root",
        help="Model registry root. Default: $FICCO_MODEL_ROOT, else models/ of the checkout, else "
        "(installed) ~/.local/share/ficco/models, made from the shipped one (--registry is its last "
        "release's spelling).",
    ),
]
SeedOption = Annotated[
    int, typer.Option("--seed", help="XGBoost seed; the same dataset and seed give the same model.")
]
JobsOption = Annotated[
    int,
    typer.Option(
        "--jobs", min=1, max=256, help="XGBoost threads (fixed, so results do not depend on the machine)."
    ),
]


def _dtype(value: str) -> str:
    """``--dtype`` when it is one of ``features.DTYPES``; else the usage error naming them."""
    from ficco.features import DTYPES

    if value not in DTYPES:
        raise typer.BadParameter(f"must be one of {list(DTYPES)}; got {value!r}")
    return value


DTypeOption = Annotated[
    str, typer.Option("--dtype", callback=_dtype, help="Element type: bf16, fp16 or fp32.")
]
HostFactorOption = Annotated[
    float | None,
    typer.Option(
        "--host-factor",
        help="Eager mode: this machine's host factor, in [0.25, 8] (the 'Host speed' of a dataset card "
        "measured on it; default: the model's training data's).",
    ),
]
