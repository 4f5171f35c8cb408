"""How every ``ficco`` subcommand reports a mistake: one ``error:`` line on stderr, then exit status 2 for a
bad argument (a value, a path or a file given) or 1 for a failure (a missing extra, a run that failed).

``ficco.cli`` applies this to click's usage errors, a ``ValueError`` and an ``OSError``, so no ordinary
mistake ends in a traceback; ``-vv`` logs the traceback behind the line.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

import typer

BAD_ARGUMENT = 2
"""Exit status of a bad argument (click's own for usage errors)."""
FAILURE = 1
"""Exit status of a command that could not do its work."""
BAD_PATH_ERRNOS = frozenset(
    {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
     errno.EROFS, errno.ELOOP}
)  # fmt: skip
"""``OSError`` numbers that say the path given is wrong (exit 2) rather than that the machine failed."""
ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
"""click's base of usage errors as the installed typer raises them (recent typers vendor click)."""


def fail(message: str, status: int = BAD_ARGUMENT) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the ``typer.Exit(status)`` for the caller to raise
    (2, a bad argument, unless told: :data:`FAILURE` for a failure)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(status)


@contextmanager
def fail_on_value_error() -> Iterator[None]:
    """Within it, a ``ValueError`` (a bad value found below the command) exits as :func:`fail` does, with
    the error's message as the line."""
    try:
        yield
    except ValueError as err:
        raise fail(str(err)) from None


def usage_line(err: Exception) -> str:
    """A click usage error (unknown option or command, a value of the wrong type, a missing argument) as one
    line naming the ``--help`` that lists what is allowed."""
    message = " ".join(err.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        message += f" (see `{ctx.command_path} --help`)"
    return message


def os_error_line(err: OSError) -> tuple[str, int]:
    """An ``OSError`` as (one line naming the path and the reason, exit status): 2 when the path given is
    wrong (missing, not a folder, no permission), else 1."""
    reason = err.strerror or str(err) or type(err).__name__
    paths = [str(p) for p in (err.filename, err.filename2) if p is not None]
    line = f"{' -> '.join(paths)}: {reason}" if paths else reason
    return line, BAD_ARGUMENT if paths and err.errno in BAD_PATH_ERRNOS else FAILURE
