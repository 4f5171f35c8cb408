"""Command-line options generated from a settings dataclass: one source of names, defaults, help and bounds.

A field declared with :func:`option` (help and bounds in its metadata, as ``transformers.HfArgumentParser``
reads them) is the flag ``--field-name`` in every front end::

    @dataclass(frozen=True, kw_only=True)
    class Timing:
        rounds: int = option(5, "fewest interleaved rounds", min=1, max=100)

    add_arguments(parser, Timing)               # argparse: a worker, a benchmark
    timing = from_arguments(Timing, args, parser)
    @typer_options(Timing, "timing")            # typer: the parameter ``timing`` becomes --rounds ...
    def bench(timing: Timing, ...): ...

A value out of its bounds, or one the dataclass refuses, is a usage error naming the flag.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import Field, field, fields
from typing import Annotated, Any, TypeVar, get_type_hints

T = TypeVar("T")


def option(default: Any, help: str, *, min: float | None = None, max: float | None = None) -> Any:
    """A dataclass field with ``default`` that is also the option ``--<name>`` (``help``, bounds)."""
    return field(default=default, metadata={"help": help, "min": min, "max": max})


def flag(name: str) -> str:
    """The option of field ``name``: ``--max-rounds`` for ``max_rounds``."""
    return "--" + name.replace("_", "-")


def _options(cls: type) -> list[tuple[Field, type]]:
    """The option fields of ``cls`` with their types, in declaration order."""
    hints = get_type_hints(cls)
    return [(f, hints[f.name]) for f in fields(cls) if "help" in f.metadata]


def _build(cls: type[T], values: dict[str, Any]) -> T:
    """``cls(**values)`` after each option's bounds are checked; a ``ValueError`` names the flag
    (``--max-rounds``, where the dataclass says ``Timing.max_rounds``)."""
    for f, _ in _options(cls):
        low, high, value = f.metadata["min"], f.metadata["max"], values[f.name]
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{flag(f.name)} must be in [{low}, {high}]; got {value}")
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(re.sub(rf"\b{cls.__name__}\.(\w+)", lambda m: flag(m[1]), str(err))) from None


def add_arguments(parser: argparse.ArgumentParser, cls: type, **defaults: Any) -> None:
    """Add an option per option field of ``cls`` to ``parser``, with ``defaults`` (field name -> value)
    in place of the dataclass's own; :func:`from_arguments` reads them back."""
    for f, kind in _options(cls):
        value = defaults.get(f.name, f.default)
        parser.add_argument(flag(f.name), type=kind, default=value, help=f"{f.metadata['help']} ({value})")


def from_arguments(cls: type[T], args: argparse.Namespace, parser: argparse.ArgumentParser) -> T:
    """The ``cls`` of the options :func:`add_arguments` added; a bad value stops through ``parser.error``."""
    try:
        return _build(cls, {f.name: getattr(args, f.name) for f, _ in _options(cls)})
    except ValueError as err:
        parser.error(str(err))


def to_argv(settings: Any) -> list[str]:
    """The options that give the dataclass ``settings`` back, for a subprocess: ``["--rounds", "5", ...]``."""
    return [x for f, _ in _options(type(settings)) for x in (flag(f.name), str(getattr(settings, f.name)))]


def typer_options(cls: type, param: str, *, panel: str | None = None) -> Callable[[Callable], Callable]:
    """Decorate a typer command: its parameter ``param`` (a ``cls``) becomes one option per option field of
    ``cls`` (flag, default, help, bounds; under the help panel ``panel``), and the command is called with
    the ``cls`` they give (a ``typer.BadParameter`` for one the dataclass refuses)."""
    import typer

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        kind = signature.parameters[param].kind
        generated = [
            inspect.Parameter(
                f.name,
                kind,
                default=f.default,
                annotation=Annotated[hint, typer.Option(flag(f.name), rich_help_panel=panel, **f.metadata)],
            )
            for f, hint in _options(cls)
        ]
        names = [p.name for p in generated]
        given = signature.parameters.values()
        parameters = [q for p in given for q in (generated if p.name == param else [p])]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            try:
                kwargs[param] = _build(cls, {name: kwargs.pop(name) for name in names})
            except ValueError as err:
                raise typer.BadParameter(str(err)) from None
            return command(**kwargs)

        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate
