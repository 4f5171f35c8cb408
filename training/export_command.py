"""``ficco export``: schedule tables and drop-in artifacts from a registered model (``training.export``);
examples in docs/tables.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ficco.errors import fail
from ficco.features import DEFAULT_HARDWARE_ID, MODES, OPS
from ficco.training.options import DTypeOption, HostFactorOption, RegistryOption

FORMATS = ("tables", "vllm", "autoheuristic")
"""``--format``: schedule tables (``training.export``) or a drop-in artifact (``training.dropin``)."""


def _shape(text: str) -> tuple[str, int, int, int, int] | None:
    """``op:n:k`` or ``op:n:k:experts:top_k`` as an export shape; None when it is neither."""
    parts = text.split(":")
    try:
        if len(parts) in (3, 5) and parts[0] in OPS:
            numbers = [int(p) for p in parts[1:]] + [0, 0][: 5 - len(parts)]
            if min(numbers[:2]) >= 1:
                return (parts[0], *numbers)  # type: ignore[return-value]
    except ValueError:
        pass
    return None


def _shapes(texts: list[str]) -> list[tuple[str, int, int, int, int]]:
    """Every ``--shape`` as an export shape; BadParameter naming each one that is not one, and the forms."""
    shapes = [_shape(text) for text in texts]
    bad = [text for text, shape in zip(texts, shapes, strict=True) if shape is None]
    if bad:
        raise typer.BadParameter(
            f"--shape must be op:n:k or op:n:k:experts:top_k with op one of {list(OPS)} and n, k >= 1 "
            f"(e.g. ag_gemm:14336:4096); got {', '.join(map(repr, bad))}"
        )
    return shapes  # type: ignore[return-value]  # none is None


def export_command(
    out: Annotated[
        Path | None, typer.Option("--out", help="Directory the files are written to (or --into-model).")
    ] = None,
    into_model: Annotated[
        bool,
        typer.Option(
            "--into-model",
            help="Write the grid tables `ficco serve` answers GET /v1/tables with (every world size, mode "
            "and training dtype of the model) into the model's registry folder, where the service loads them "
            "instead of building them at start-up; no other option but --hardware, --version, --model-root.",
        ),
    ] = False,
    hardware: Annotated[
        str, typer.Option("--hardware", help="Hardware id of the model.")
    ] = DEFAULT_HARDWARE_ID,
    version: Annotated[
        str | None, typer.Option("--version", help="Model version (default: the promoted one).")
    ] = None,
    registry: RegistryOption = None,
    config: Annotated[
        list[Path] | None,
        typer.Option(
            "--config", help="Hugging Face config.json, or a directory of them: their layers' shapes."
        ),
    ] = None,
    dataset: Annotated[
        list[Path] | None, typer.Option("--dataset", help="A dataset directory: its scenarios' (op, n, k).")
    ] = None,
    shape: Annotated[
        list[str] | None, typer.Option("--shape", help="op:n:k (dense) or op:n:k:experts:top_k (MoE).")
    ] = None,
    tp: Annotated[
        int | None,
        typer.Option(
            "--tp",
            min=2,
            max=8,
            help="World size (tensor-parallel degree); default: the hardware's GPU count.",
        ),
    ] = None,
    mode: Annotated[
        list[str] | None, typer.Option("--mode", help=f"Execution mode(s) {list(MODES)} (default: both).")
    ] = None,
    dtype: DTypeOption = "bf16",
    fmt: Annotated[
        str, typer.Option("--format", help="tables (schedule tables), vllm (SP thresholds) or autoheuristic.")
    ] = "tables",
    host_factor: HostFactorOption = None,
    allow_simulated: Annotated[
        bool,
        typer.Option(
            "--allow-simulated",
            help="Export a model trained on simulated data (e.g. --hardware h200x4-sim); its files are "
            "marked simulated. A world size the model was not trained at is refused whatever this flag.",
        ),
    ] = False,
    score_on: Annotated[
        list[Path] | None,
        typer.Option(
            "--score-on", help="vllm/autoheuristic: datasets their header's evaluation scores them on."
        ),
    ] = None,
) -> None:
    """Write a model's schedule tables (per world size, mode and dtype: token breakpoints of every (op, n, k))
    or drop-in thresholds for vLLM / PyTorch's async-TP pass, for runtimes to load at start-up."""
    from ficco.features.scenario import default_world_size
    from ficco.training.export import check_measured, config_shapes, dataset_shapes, export, write_grid_tables
    from ficco.training.predict.registry import ModelLoadError, default_model_root, load_predictor

    if (out is None) == (not into_model):
        raise fail("give --out DIR, or --into-model to write the served grid tables into the model's folder")
    root = registry or default_model_root()
    try:
        predictor = load_predictor(root, hardware, version)
    except ModelLoadError as err:
        raise fail(f"cannot export for hardware {hardware!r}: {err}") from None
    if into_model:
        if config or dataset or shape or mode or fmt != "tables" or host_factor is not None or score_on:
            raise fail(
                "--into-model writes the served grid tables as they are: drop the other export options"
            )
        try:
            paths = write_grid_tables(predictor, Path(root) / hardware / predictor.version)
        except (ValueError, OSError) as err:
            raise fail(str(err)) from None
        for path in paths:
            typer.echo(str(path))
        return
    if fmt not in FORMATS:
        raise fail(f"--format must be one of {list(FORMATS)}; got {fmt!r}")
    tp = tp or default_world_size(predictor.profile)
    try:  # a refusal, a bad config or dataset, a shape no table can hold: one line each
        check_measured(predictor.card, tp, allow_simulated=allow_simulated)
        shapes = list(dict.fromkeys([
            *(config_shapes(config, tp=tp, dtype=dtype, hardware=predictor.profile) if config else []),
            *(dataset_shapes(dataset, tp=tp, dtype=dtype) if dataset else []),
            *_shapes(shape or []),
        ]))  # fmt: skip
        settings = {"out": out, "shapes": shapes, "world_size": tp, "modes": mode or list(MODES),
                    "dtype": dtype, "host_factor": host_factor,
                    "allow_simulated": allow_simulated}  # fmt: skip
        if fmt == "tables":
            paths = export(predictor, **settings)
        else:
            from ficco.training.dropin import write_dropin

            paths = write_dropin(predictor, fmt, score_on=score_on or [], **settings)
    except (ValueError, OSError) as err:  # ExportRefused and InvalidShapes are ValueErrors
        raise fail(str(err)) from None
    for path in paths:
        typer.echo(str(path))
