"""The ``ficco`` command line: one app, each part of the project registers its own subcommands.

Command modules import their heavy dependencies (torch, xgboost, fastapi) inside the commands, so
``ficco --help`` stays fast and works with only the core installed.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="ficco",
    help=(
        "Learned schedule predictor for compute/communication overlap on multi-GPU machines.\n\n"
        "Data flows one way: scenario -> executor timings (bench) -> dataset -> model (train, "
        "evaluate, retrain, report) -> recommendation (serve, score, recommend) -> executor."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES: tuple[str, ...] = (
    "ficco.harness.commands",
    "ficco.training.commands",
    "ficco.service.commands",
)
"""Modules with a ``register(app)`` function that adds their subcommands, in help order."""


@app.callback()
def main() -> None:
    """Learned schedule predictor for compute/communication overlap on multi-GPU machines."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


@app.command("version")
def version() -> None:
    """Print the ficco version and the feature-schema version."""
    from ficco import __version__
    from ficco.features import FEATURE_SCHEMA_VERSION

    typer.echo(f"ficco {__version__} (feature schema {FEATURE_SCHEMA_VERSION})")


if __name__ == "__main__":
    app()
