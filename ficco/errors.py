"""How every ``ficco`` subcommand reports a usage error: one line on stderr, exit status 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer


def fail(message: str) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the ``typer.Exit(2)`` for the caller to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@contextmanager
def fail_on_value_error() -> Iterator[None]:
    """Within it, a ``ValueError`` (a bad value found below the command) exits as :func:`fail` does, with
    the error's message as the line."""
    try:
        yield
    except ValueError as err:
        raise fail(str(err)) from None
