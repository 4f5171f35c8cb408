"""Options generated from a settings dataclass: argparse and typer get the same flags, defaults, help and
bounds from the fields, and a value either front end refuses names the flag."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from benchmarks.step_timing import StepTiming, add_step_timing, timing_settings
from ficco.dataclass_options import add_arguments, flag, from_arguments, to_argv, typer_options
from ficco.harness.backend import Timing
from ficco.harness.host_factor import HostTiming


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool", exit_on_error=False)
    add_arguments(parser, Timing)
    return parser


def _cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.command()
    @typer_options(Timing, "timing")
    def run(timing: Timing, name: str = "x") -> None:
        typer.echo(f"{name} {timing}")

    return app


def test_argparse_and_typer_share_names_defaults_and_help():
    parser = _parser()
    argparse_options = {a.option_strings[0]: (a.default, a.help) for a in parser._actions if a.dest != "help"}
    command = typer.main.get_command(_cli())
    generated = [p for p in command.params if p.name not in ("help", "name")]
    typer_options_ = {p.opts[0]: (p.default, p.help) for p in generated}
    fields = [f.name for f in dataclasses.fields(Timing)]
    assert list(argparse_options) == list(typer_options_) == [flag(name) for name in fields]
    for option, (default, help_text) in typer_options_.items():
        assert argparse_options[option] == (default, f"{help_text} ({default})")
    assert from_arguments(Timing, parser.parse_args([]), parser) == Timing()


def test_typer_builds_the_dataclass_and_keeps_the_other_options():
    done = CliRunner().invoke(_cli(), ["--rounds", "7", "--block-ms", "0.25", "--name", "y"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"y {Timing(rounds=7, block_ms=0.25)}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "0"], "--rounds must be in [1, 100]; got 0"),
        (["--block-ms", "200"], "--block-ms must be in [0.05, 100.0]; got 200.0"),
        (["--rounds", "6", "--max-rounds", "5"], "--max-rounds must be >= rounds=6; got 5"),
    ],
)
def test_a_refused_value_names_the_flag_in_both_front_ends(args, message, capsys):
    parser = _parser()
    with pytest.raises(SystemExit):
        from_arguments(Timing, parser.parse_args(args), parser)
    assert message in capsys.readouterr().err
    done = CliRunner().invoke(_cli(), args)
    assert done.exit_code == 2
    assert message.split(";")[0].split(" must")[0] in done.output


def test_each_benchmark_gives_its_own_step_timing_defaults():
    parser = argparse.ArgumentParser()
    add_step_timing(parser, warmup=2, rounds=3)
    args = parser.parse_args(["--reps", "9"])
    assert timing_settings(args, parser) == dataclasses.asdict(StepTiming(warmup=2, rounds=3, reps=9))
    with pytest.raises(SystemExit):
        timing_settings(parser.parse_args(["--max-rounds", "2"]), parser)


@pytest.mark.parametrize("settings", [Timing(rounds=7, timed_ms=0.0), HostTiming(rounds=4, batch=9)])
def test_to_argv_gives_a_subprocess_the_same_settings(settings):
    parser = argparse.ArgumentParser()
    add_arguments(parser, type(settings))
    assert from_arguments(type(settings), parser.parse_args(to_argv(settings)), parser) == settings
