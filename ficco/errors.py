"""How every ``ficco`` subcommand reports a usage error: one line on stderr, exit status 2."""

from __future__ import annotations

import typer


def fail(message: str) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the ``typer.Exit(2)`` for the caller to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)
