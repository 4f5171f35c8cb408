"""The ``ficco`` command line: one app, each part of the project registers its own subcommands.

Command modules import their heavy dependencies (torch, xgboost, fastapi) inside the commands, so
``ficco --help`` stays fast and works with only the core installed. Each command first checks the extra it
needs (``ficco.extras``): a missing one is one ``error:`` line naming the ``pip install`` to run, exit 1.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ficco.extras import MissingExtraError, missing_message, require
from ficco.harness import commands as harness_commands
from ficco.service import commands as service_commands
from ficco.training import commands as training_commands

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

COMMAND_MODULES = (harness_commands, training_commands, service_commands)
"""Modules with a ``register(app)`` function that adds their subcommands, in help order."""

LOG_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)
"""Log level of the ``ficco`` loggers by the count of ``-v``: quiet, decisions, debug."""


@app.callback()
def main(
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="-v: one line per decision (schedule, buffers, skips); -vv: debug.",
        ),
    ] = 0,
) -> None:
    """Learned schedule predictor for compute/communication overlap on multi-GPU machines."""
    if (
        verbose
    ):  # quiet by default: Python's root logger shows WARNING and above (``ficco serve`` sets its own)
        level = LOG_LEVELS[min(verbose, len(LOG_LEVELS) - 1)]
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("ficco").setLevel(level)


def _one_line_summary(command: typer.models.CommandInfo) -> str | None:
    """The first paragraph of a command's help (its ``help=`` or docstring) on one line: the command list of
    ``ficco --help`` keeps a docstring's hard line breaks, which land mid-sentence in its narrow column."""
    text = command.help or (command.callback.__doc__ if command.callback else None)
    return " ".join(text.split("\n\n")[0].split()) if text else None


for _module in COMMAND_MODULES:
    _module.register(app)


@app.command("version")
def version() -> None:
    """Print the ficco version and the feature-schema version."""
    from ficco import __version__
    from ficco.features import FEATURE_SCHEMA_VERSION

    typer.echo(f"ficco {__version__} (feature schema {FEATURE_SCHEMA_VERSION})")


def _needing_extras(name: str, callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` of command ``name``, first checking its extra (``ficco.extras.require``) and turning an
    optional module missing later into the same one line (exit status 1) instead of a traceback."""

    @functools.wraps(callback)  # typer reads the options from the wrapped signature
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            require(name)
            return callback(*args, **kwargs)
        except MissingExtraError as err:
            message = str(err)
        except ModuleNotFoundError as err:
            message = missing_message(name, (err.name or "").partition(".")[0])
            if message is None:
                raise
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1)

    return run


for _command in app.registered_commands:
    _command.short_help = _command.short_help or _one_line_summary(_command)
    _command.callback = _needing_extras(_command.name or _command.callback.__name__, _command.callback)


if __name__ == "__main__":
    app()
