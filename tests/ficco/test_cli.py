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
