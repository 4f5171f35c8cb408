"""The ficco command line shell."""

import subprocess
import sys

from typer.testing import CliRunner

from ficco import cli


def test_help_lists_registered_commands():
    result = CliRunner().invoke(cli.app, ["--help"])
    assert result.exit_code == 0
    for command in ("version", *[c.name for c in cli.app.registered_commands if c.name]):
        assert command in result.output


def test_version_prints_feature_schema():
    result = CliRunner().invoke(cli.app, ["version"])
    assert result.exit_code == 0
    from ficco.features import FEATURE_SCHEMA_VERSION

    assert f"feature schema {FEATURE_SCHEMA_VERSION}" in result.output


def test_console_script_help_does_not_import_torch():
    code = (
        "import sys; from ficco.cli import app; "
        "assert not {'torch', 'xgboost', 'fastapi', 'pandas'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_verbose_counts_raise_the_ficco_log_level(monkeypatch):
    import logging

    levels = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: levels.append(kw["level"]))
    ficco_logger = logging.getLogger("ficco")
    monkeypatch.setattr(ficco_logger, "level", ficco_logger.level)
    for args, level in ((["-v"], logging.INFO), (["-vv"], logging.DEBUG), (["-vvv"], logging.DEBUG)):
        assert CliRunner().invoke(cli.app, [*args, "version"]).exit_code == 0
        assert ficco_logger.level == level
    assert levels == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert CliRunner().invoke(cli.app, ["version"]).exit_code == 0 and len(levels) == 3  # quiet: untouched


def test_command_summaries_are_their_first_paragraph_on_one_line():
    for command in cli.app.registered_commands:
        first = (command.help or command.callback.__doc__).split("\n\n")[0]
        assert command.short_help == " ".join(first.split()), command.name
