"""The ``ficco`` command line: one app, each part of the project registers its own subcommands.

Command modules import their heavy dependencies (torch, xgboost, fastapi) inside the commands, so
``ficco --help`` stays fast and works with only the core installed. A missing extra (``ficco.extras``) and
every other mistake (``ficco.errors``) are one ``error:`` line each; ``-vv`` logs the traceback behind it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ficco import renamed_options
from ficco.errors import BAD_ARGUMENT, FAILURE, ClickException, fail, os_error_line, usage_line
from ficco.extras import MissingExtraError, missing_message, require
from ficco.harness import commands as harness_commands
from ficco.harness import deprecated_bench
from ficco.harness.fleet import commands as fleet_commands
from ficco.service import commands as service_commands
from ficco.training import commands as training_commands

log = logging.getLogger("ficco.cli")


class FiccoGroup(TyperGroup):
    """The ``ficco`` group: a usage error of any subcommand (an unknown option, a value of the wrong type, a
    missing argument) is one ``error:`` line and exit status 2 instead of click's box; the last release's
    ``ficco bench`` spellings run as their new commands (``harness.deprecated_bench``), and its renamed
    options as their new spellings (``ficco.renamed_options``)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        args = deprecated_bench.rewrite(sys.argv[1:] if args is None else args, os.environ)
        args = renamed_options.rewrite(args)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as err:
            if type(err).__name__ == "NoArgsIsHelpError":  # `ficco` alone: the help
                err.show()  # type: ignore[attr-defined]
            else:
                typer.echo(f"error: {usage_line(err)}", err=True)
            sys.exit(err.exit_code)  # type: ignore[attr-defined]
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(FAILURE)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="ficco",
    cls=FiccoGroup,
    help=(
        "Learned schedule predictor for compute/communication overlap on multi-GPU machines.\n\n"
        "Data flows one way: scenario -> executor timings (bench) -> dataset -> model (train, "
        "evaluate, retrain, report) -> recommendation (serve, score, recommend) -> executor."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = (harness_commands, fleet_commands, training_commands, service_commands)
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
    # quiet by default: Python's root logger shows WARNING and above (``ficco serve`` sets its own)
    if verbose:
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


def _reported(name: str, callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` of command ``name``, first checking its extra (``ficco.extras.require``), with whatever
    mistake it lets through as one ``error:`` line (``ficco.errors``) instead of a traceback: a missing
    optional module (exit 1), a ``ValueError`` (a bad value found below the command, exit 2) or an
    ``OSError`` (a path that cannot be read or written: exit 2; another failure of the machine: exit 1)."""

    @functools.wraps(callback)  # typer reads the options from the wrapped signature
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            require(name, kwargs)
            return callback(*args, **kwargs)
        except MissingExtraError as err:
            message, code = str(err), FAILURE
        except ModuleNotFoundError as err:
            message = missing_message(name, (err.name or "").partition(".")[0], kwargs)
            if message is None:
                raise
            code = FAILURE
        except ValueError as err:
            message, code = str(err), BAD_ARGUMENT
        except OSError as err:
            message, code = os_error_line(err)
        log.debug("ficco %s stopped", name, exc_info=True)
        raise fail(message, code)

    return run


def _commands(group: typer.Typer, prefix: str = "") -> list[tuple[str, typer.models.CommandInfo]]:
    """Every command of ``group`` and its sub-groups, with its full name (``dataset gather``)."""
    found = [(prefix + (c.name or c.callback.__name__), c) for c in group.registered_commands]
    for sub in group.registered_groups:
        found += _commands(sub.typer_instance, f"{prefix}{sub.name} ")
    return found


for _name, _command in _commands(app):
    _command.short_help = _command.short_help or _one_line_summary(_command)
    _command.callback = _reported(_name, _command.callback)


if __name__ == "__main__":
    app()
